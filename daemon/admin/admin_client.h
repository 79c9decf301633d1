// admin_call: a small blocking client of the admin socket (plain POSIX sockets, no libuv), used by
// `sextant ctl` and by tests.
//
// Connects to `socket_path`, writes `request` as one JSON line, reads one response line and closes.
// The protocol is in daemon/admin/protocol.h.
//
// Threading: any thread; no shared state. Blocks for at most about `timeout_ms` in total
// (connecting, writing and reading); timeout_ms <= 0 waits without a limit. Never raises SIGPIPE
// (MSG_NOSIGNAL).
//
// Errors: on {"ok": false, ...} the daemon's error as a Status (its code name mapped back to the
// StatusCode). Locally: UNAVAILABLE "no sextant daemon is listening on PATH (is `sextant serve`
// running? ...)" when the socket file does not exist, UNAVAILABLE when the file exists but nothing
// listens (connection refused: a stale socket), PERMISSION_DENIED when the socket's permissions
// refuse this user, DEADLINE_EXCEEDED when no answer came in time, UNAVAILABLE when the daemon
// closed the connection without an answer, DATA_LOSS for an answer that is not a response line,
// INVALID_ARGUMENT for an empty or over-long path.
#pragma once

#include <string>

#include <nlohmann/json.hpp>

#include "runtime/base/status.h"

namespace sx::daemon::admin {

inline constexpr int kDefaultAdminTimeoutMs = 30000;

// The "result" of a successful answer (null when the daemon sent none).
Result<nlohmann::json> admin_call(const std::string& socket_path, const nlohmann::json& request,
                                  int timeout_ms = kDefaultAdminTimeoutMs);

}  // namespace sx::daemon::admin
