// `sextant logs`: the starts `sextant serve` kept (daemon/serve/start_log.h). Without options, the
// list, newest first (time, pid, state, first error); --show [N] prints the N-th newest start's log
// (1: the last); --diff says what changed between the last two starts (config, version, devices,
// plan, first error). --dir DIR for another log.dir than the default.
#include <cstdio>
#include <fstream>
#include <sstream>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "daemon/commands/args.h"
#include "daemon/commands/commands.h"
#include "daemon/commands/model_session.h"
#include "daemon/serve/start_log.h"

namespace sx::daemon {

namespace {

Result<nlohmann::json> read_summary(const std::string& path) {
  std::ifstream f(path);
  if (!f) return not_found_error("{}: cannot open", path);
  nlohmann::json j = nlohmann::json::parse(f, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) return data_loss_error("{}: not a start summary", path);
  return j;
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
    std::printf("%s (%s) -> %s (%s)\n", older->value("started", "?").c_str(), older->value("state", "?").c_str(),
                newer->value("started", "?").c_str(), newer->value("state", "?").c_str());
    std::fputs(d.empty() ? "nothing changed (config, version, devices, plan, first error)\n" : d.c_str(), stdout);
    return 0;
  }
  if (args.has("--show")) {
    auto n = args.get_int("--show", 1, 1, static_cast<std::int64_t>(starts.size()));
    if (!n.ok()) return report_error("logs", n.status());
    const std::string& summary = starts[static_cast<std::size_t>(*n - 1)];
    std::ifstream f(summary.substr(0, summary.size() - 5) + ".log");
    std::stringstream text;
    text << f.rdbuf();
    std::fputs(text.str().c_str(), stdout);
    return 0;
  }
  for (const std::string& path : starts) {
    auto j = read_summary(path);
    if (!j.ok()) {
      std::printf("%s: %s\n", path.c_str(), j.status().message().c_str());
      continue;
    }
    const std::string error = j->value("first_error", std::string());
    std::printf("%s  pid %-7d %-8s %s\n", j->value("started", "?").c_str(), j->value("pid", 0),
                j->value("state", "?").c_str(), error.empty() ? j->value("plan", std::string()).c_str() : error.c_str());
  }
  return 0;
}

}  // namespace sx::daemon
