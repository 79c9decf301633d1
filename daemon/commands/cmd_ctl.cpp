// `sextant ctl`: sends one command to a running `sextant serve` over its admin socket and prints
// the result (daemon/admin/admin_client.h; the formatting is in ctl_format.h).
// Exit code: 0 ok, 1 the daemon (or the connection) reported an error, 2 usage errors.
#include <climits>
#include <filesystem>
#include <cstdint>
#include <cstdio>
#include <optional>
#include <string>
#include <string_view>

#include "daemon/admin/admin_client.h"
#include "daemon/commands/args.h"
#include "daemon/commands/commands.h"
#include "daemon/commands/ctl_format.h"
#include "daemon/config/serve_config.h"

namespace sx::daemon {

namespace {

constexpr const char* kCommandsHelp =
    "\ncommands (any name is forwarded to the daemon; these are the ones it knows):\n"
    "  status       the daemon's state, replicas, queues, memory and counters\n"
    "  plan         the shard and memory plan being served\n"
    "  config       the effective configuration (API keys redacted)\n"
    "  logs         this start's log (lines=N: the last N, default 200) and where it is kept\n"
    "  drain        stop admitting requests; those in flight finish\n"
    "  resume       admit requests again after a drain\n"
    "  shutdown     drain, then stop the daemon\n"
    "  upgrade      hand the listening sockets to a new binary (--binary PATH; default: this\n"
    "               daemon's own): it loads beside this one and takes over when ready, then this one\n"
    "               finishes its requests and exits 0; a binary that fails to start changes nothing\n"
    "  reload       build the replicas anew beside the serving ones and switch when they are ready;\n"
    "               the config file and flags the daemon started with are read again (as on SIGHUP),\n"
    "               --config FILE reads another file, --model PATH serves another model; a reload\n"
    "               that fails changes nothing (exit 1 with the cause)\n"
    "\nkey=value arguments become fields of the request; values that are JSON literals (numbers,\n"
    "true/false, null, [..], {..}, \"..\") are sent as such, anything else as a string.\n";

constexpr const char* kShortUsage =
    "usage: sextant ctl [--socket PATH] [--json] [--timeout-ms N] <command> [key=value ...]\n"
    "(see sextant ctl --help)\n";

int usage_error(std::string_view message) {
  constexpr std::string_view kPrefix = "sextant ctl: ";
  if (message.starts_with(kPrefix)) message.remove_prefix(kPrefix.size());  // Args' own messages
  std::fprintf(stderr, "sextant ctl: %.*s\n%s", static_cast<int>(message.size()), message.data(), kShortUsage);
  return 2;
}

}  // namespace

int cmd_ctl(int argc, char** argv) {
  Args args("ctl", "Send a command to a running `sextant serve` over its admin socket and print the result.",
            {
                {{"--socket"}, true, false,
                 "the daemon's admin socket (default: " + config::default_admin_socket_path() + ")", "PATH"},
                {{"--json"}, false, false, "print the result as JSON (pretty, 2 spaces)", ""},
                {{"--timeout-ms"}, true, false,
                 "give up waiting for the answer after N ms (default 30000; 0: wait forever)", "N"},
                {{"--model"}, true, false, "reload: serve this model file instead", "PATH"},
                {{"--config"}, true, false, "reload: read this config file instead of the one the daemon started with",
                 "FILE"},
                {{"--binary"}, true, false, "upgrade: the new sextant binary", "PATH"},
                {{"--daemon-uid"}, true, false,
                 "also trust a daemon running as UID (by default only your own uid and root are; a socket "
                 "another user listens on is refused)",
                 "UID"},
            },
            "<command> [key=value ...]");
  if (Status s = args.parse(argc, argv); !s.ok()) return usage_error(s.message());
  if (args.has("--help")) {
    std::fputs(args.usage().c_str(), stdout);
    std::fputs(kCommandsHelp, stdout);
    return 0;
  }
  if (args.positional().empty()) return usage_error("missing <command> (e.g. sextant ctl status)");
  Result<std::string> socket = args.get_string("--socket", config::default_admin_socket_path());
  if (!socket.ok()) return usage_error(socket.status().message());
  if (socket->empty()) return usage_error("--socket: empty path");
  const bool reload = args.positional()[0] == "reload";
  const bool upgrade = args.positional()[0] == "upgrade";
  // A reload answers once the new replicas are loaded: minutes for a large model.
  constexpr std::int64_t kReloadTimeoutMs = 30 * 60 * 1000;
  Result<std::int64_t> timeout =
      args.get_int("--timeout-ms", reload || upgrade ? kReloadTimeoutMs : admin::kDefaultAdminTimeoutMs, 0, INT_MAX);
  if (!timeout.ok()) return usage_error(timeout.status().message());
  std::optional<std::uint32_t> daemon_uid;
  if (args.has("--daemon-uid")) {
    Result<std::int64_t> uid = args.get_int("--daemon-uid", 0, 0, UINT32_MAX - 1);
    if (!uid.ok()) return usage_error(uid.status().message());
    daemon_uid = static_cast<std::uint32_t>(*uid);
  }

  const std::vector<std::string>& words = args.positional();
  const std::string& command = words[0];
  if (command.empty() || command.find('=') != std::string::npos) {
    return usage_error("the first argument must be the command name (got '" + command + "')");
  }
  nlohmann::json request = {{"cmd", command}};
  // Paths are the caller's: made absolute here, since the daemon's working directory may differ.
  for (const char* flag : {"--model", "--config", "--binary"}) {
    if (!args.has(flag)) continue;
    const bool binary = std::string_view(flag) == "--binary";
    if (binary ? !upgrade : !reload) {
      return usage_error(std::string(flag) + " is an option of " + (binary ? "upgrade" : "reload") + " only");
    }
    Result<std::string> path = args.get_string(flag, "");
    if (!path.ok()) return usage_error(path.status().message());
    if (path->empty()) return usage_error(std::string(flag) + ": empty path");
    std::error_code ec;
    const std::filesystem::path abs = std::filesystem::absolute(*path, ec);
    request[flag + 2] = ec ? *path : abs.string();
  }
  for (size_t i = 1; i < words.size(); ++i) {
    auto field = parse_ctl_argument(words[i]);
    if (!field.ok()) return usage_error(field.status().message());
    if (request.contains(field->first)) return usage_error("'" + field->first + "' given twice");
    request[field->first] = std::move(field->second);
  }

  Result<nlohmann::json> result = admin::admin_call(*socket, request, static_cast<int>(*timeout), daemon_uid);
  if (!result.ok()) {
    std::fprintf(stderr, "sextant ctl: %s\n", result.status().message().c_str());
    return 1;
  }
  if (args.has("--json")) {
    std::string text = result->dump(2, ' ', false, nlohmann::json::error_handler_t::replace);
    std::printf("%s\n", text.c_str());
  } else {
    std::fputs(format_ctl_human(*result).c_str(), stdout);
  }
  return std::fflush(stdout) == 0 ? 0 : 1;
}

}  // namespace sx::daemon
