// admin_call: a small blocking client of the admin socket (plain POSIX sockets, no libuv), used by
// `sextant ctl` and by tests.
//
// Connects to `socket_path`, checks who listens there, writes `request` as one JSON line, reads
// one response line and closes. The protocol is in daemon/admin/protocol.h.
//
// Who answers: right after connect, before anything is sent, the listening process' uid is read
// with SO_PEERCRED and must pass check_daemon_uid(): this client's own euid, root, or `daemon_uid`
// when given (a daemon run by a service user that lists this user in admin.allowed_uids). Anyone
// else could have put their socket at the path (e.g. in a /tmp directory they made), so their
// answers are not trusted: PERMISSION_DENIED naming the socket and the uid.
//
// Threading: any thread; no shared state. Blocks for at most about `timeout_ms` in total
// (connecting, writing and reading); timeout_ms <= 0 waits without a limit. Never raises SIGPIPE
// (MSG_NOSIGNAL).
//
// Errors: on {"ok": false, ...} the daemon's error as a Status (its code name mapped back to the
// StatusCode). Locally: UNAVAILABLE "no sextant daemon is listening on PATH (is `sextant serve`
// running? ...)" when the socket file does not exist, UNAVAILABLE when the file exists but nothing
// listens (connection refused: a stale socket), PERMISSION_DENIED when the socket's permissions
// refuse this user or the listener is of another uid (above), DEADLINE_EXCEEDED when no answer came in time, UNAVAILABLE when the daemon
// closed the connection without an answer, DATA_LOSS for an answer that is not a response line,
// INVALID_ARGUMENT for an empty or over-long path.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include <nlohmann/json.hpp>

#include "runtime/base/status.h"

namespace sx::daemon::admin {

inline constexpr int kDefaultAdminTimeoutMs = 30000;

// The "result" of a successful answer (null when the daemon sent none).
Result<nlohmann::json> admin_call(const std::string& socket_path, const nlohmann::json& request,
                                  int timeout_ms = kDefaultAdminTimeoutMs,
                                  std::optional<std::uint32_t> daemon_uid = std::nullopt);

// The trust rule for the process listening on the admin socket (pure; admin_call applies it to
// SO_PEERCRED's uid): OK when `peer_uid` is `own_uid`, 0 (root), or `daemon_uid` when given;
// otherwise PERMISSION_DENIED "refusing the admin socket PATH: the process listening on it runs as
// uid N, not as ...".
Status check_daemon_uid(const std::string& socket_path, std::uint32_t peer_uid, std::uint32_t own_uid,
                        std::optional<std::uint32_t> daemon_uid);

}  // namespace sx::daemon::admin
