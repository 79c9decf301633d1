// `sextant logs`: the starts `sextant serve` kept (daemon/serve/start_log.h). Without options, the
// list, newest first (time, pid, state, first error); --show [N] prints the N-th newest start's log
// (1: the last); --diff says what changed between the last two starts (config, version, devices,
// plan, first error). --dir DIR for another log.dir than the default.
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "daemon/commands/args.h"
#include "daemon/commands/commands.h"
#include "daemon/commands/model_session.h"
#include "daemon/serve/start_log.h"
#include "runtime/base/log.h"
#include "runtime/base/regular_file.h"

namespace sx::daemon {

namespace {

using serve::summary_field;

// A summary is a few KiB (the config it quotes is at most 1 MiB).
constexpr std::uint64_t kMaxSummaryBytes = 8u << 20;

// Through read_regular_file: a FIFO or a device in the log directory is refused, never waited on.
Result<nlohmann::json> read_summary(const std::string& path) {
  SX_ASSIGN_OR_RETURN(std::string text, read_regular_file(path, kMaxSummaryBytes));
  nlohmann::json j = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) return data_loss_error("{}: not a start summary", path);
  return j;
}

// The log of a start, copied to stdout as it is read (a long-running daemon's log may be large).
Status print_log(const std::string& path) {
  SX_ASSIGN_OR_RETURN(RegularFile file, open_regular_file(path));
  char buf[65536];
  for (;;) {
    const ssize_t n = ::read(file.fd.get(), buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return data_loss_error("{}: cannot read: {}", path, std::strerror(errno));
    if (n == 0) return ok_status();
    std::fwrite(buf, 1, static_cast<std::size_t>(n), stdout);
  }
}

}  // namespace

int cmd_logs(int argc, char** argv) {
  Args args("logs",
            "The starts of `sextant serve` kept in log.dir (each start's log and summary): the list, newest first; "
            "--show N prints a start's log; --diff what changed between the last two starts.",
            {
                {{"--dir"}, true, false, "the log directory (default: serve's default log.dir)", "DIR"},
                {{"--show"}, true, false, "print the log of the N-th newest start (1: the last)", "N"},
                {{"--diff"}, false, false, "what changed between the last two starts", ""},
            });
  if (Status s = args.parse(argc, argv); !s.ok()) return report_error("logs", s);
  if (args.has("--help")) {
    std::fputs(args.usage().c_str(), stdout);
    return 0;
  }
  const std::string dir = args.get("--dir").value_or(serve::default_log_dir());
  const std::vector<std::string> starts = serve::list_starts(dir);
  if (starts.empty()) {
    return report_error("logs", not_found_error("no start of sextant serve is kept in {}", dir));
  }
  if (args.has("--diff")) {
    if (starts.size() < 2) return report_error("logs", not_found_error("only one start is kept in {}", dir));
    auto newer = read_summary(starts[0]);
    auto older = read_summary(starts[1]);
    if (!newer.ok()) return report_error("logs", newer.status());
    if (!older.ok()) return report_error("logs", older.status());
    const std::string d = serve::diff_starts(*older, *newer);
    std::printf("%s (%s) -> %s (%s)\n", printable_text(summary_field(*older, "started", "?")).c_str(),
                printable_text(summary_field(*older, "state", "?")).c_str(),
                printable_text(summary_field(*newer, "started", "?")).c_str(),
                printable_text(summary_field(*newer, "state", "?")).c_str());
    std::fputs(d.empty() ? "nothing changed (config, version, devices, plan, first error)\n" : printable_text(d).c_str(),
               stdout);
    return 0;
  }
  if (args.has("--show")) {
    auto n = args.get_int("--show", 1, 1, static_cast<std::int64_t>(starts.size()));
    if (!n.ok()) return report_error("logs", n.status());
    const std::string& summary = starts[static_cast<std::size_t>(*n - 1)];
    if (Status s = print_log(summary.substr(0, summary.size() - 5) + ".log"); !s.ok()) return report_error("logs", s);
    return 0;
  }
  for (const std::string& path : starts) {
    auto j = read_summary(path);
    if (!j.ok()) {
      std::printf("%s\n", printable_text(j.status().message()).c_str());
      continue;
    }
    const std::string error = summary_field(*j, "first_error", "");
    const std::string line =
        fmt::format("{}  pid {:<7} {:<8} {}", summary_field(*j, "started", "?"), summary_field(*j, "pid", "?"),
                    summary_field(*j, "state", "?"), error.empty() ? summary_field(*j, "plan", "") : error);
    std::printf("%s\n", printable_text(line).c_str());
  }
  return 0;
}

}  // namespace sx::daemon
