// AdminServer: the Unix-socket admin API of `sextant serve` (DESIGN.md §2 daemon/admin, §7.6).
//
// Protocol (daemon/admin/protocol.h): newline-delimited JSON. Each line is a request object
// {"cmd": "<name>", ...args}; each gets exactly one response line, in request order:
//   {"ok": true, "result": <any>}  or  {"ok": false, "error": {"code": "INVALID_ARGUMENT", "message": "..."}}
// Lines of one connection are handled one at a time: the next line goes to the handler only after
// the previous one was answered, so a pipelined "drain" then "status" sees the drain finished.
// Empty (whitespace-only) lines are ignored; a last line ended by the client's EOF (half-close)
// instead of '\n' is still answered, then the connection closes once its answers are written.
// Malformed JSON, a non-object, a missing / empty / non-string "cmd" get an INVALID_ARGUMENT line
// and the connection stays open. A line longer than max_line_bytes (or that many bytes without a
// newline) gets a RESOURCE_EXHAUSTED line, then the connection closes.
//
// Access: the socket file gets permission bits `mode` (0600: only the daemon's user can connect),
// and on accept the peer's uid (SO_PEERCRED) must be the daemon's effective uid or listed in
// allowed_uids; any other peer gets one PERMISSION_DENIED line and is closed. Connections beyond
// max_connections get one RESOURCE_EXHAUSTED line and are closed. A connection with no request in
// progress that stays silent for idle_timeout_ms is closed without a response.
//
// Socket directory: start() creates the socket's directory if missing (each missing level mode
// 0700, umask notwithstanding). The directory (created or found) is then opened with O_NOFOLLOW and
// checked with fstat: it must not be a symlink, must be owned by the daemon's euid or by root, and
// must not be writable by group or others (sticky or not: /tmp itself is refused), so nobody else
// can have made it or add their own socket to it; a mode like 0755 is fine (others need search
// permission to reach a socket opened to them with admin.mode and admin.allowed_uids). Only that
// directory is checked, not the ones above it. This is what makes the default /tmp/sextant-<uid>
// safe: if another user made it first, start() refuses.
//
// Lifetime: start() prepares the directory (above), refuses to run when another process is
// listening on the path, removes a stale socket file, binds, chmods and listens; the returned AdminServer owns every handle. stop() closes the listener and unlinks the
// socket file at once, answers a request still in progress with UNAVAILABLE ("the daemon is
// stopping"), lets queued response bytes flush (bounded), and runs `on_stopped` on the loop thread
// once every handle is closed, so uv_loop_close() can succeed after it (the AdminServer may be
// destroyed inside on_stopped). Destroying an AdminServer that has not finished stopping
// force-closes everything (and unlinks the socket) without calling on_stopped; memory is then
// freed in the close callbacks, so the loop must run again before uv_loop_close(). The socket file
// is unlinked only while it is still the one this server bound (same device and inode).
//
// Threading: start(), stop(), the destructor, the handler and every Reply call run on the loop
// thread (start() may also run before the loop runs on another thread). stats() and
// socket_path() may be called from any thread. The process must ignore SIGPIPE.
//
// Errors: start() returns INVALID_ARGUMENT for unusable options, FAILED_PRECONDITION naming the
// path when another daemon listens there ("another sextant daemon is listening on PATH") or the
// path is not a socket, FAILED_PRECONDITION "refusing the admin socket directory DIR: it is owned
// by uid X, not by the daemon's uid Y ... | it has mode 0777 (writable by others) ... | it is a
// symlink (to T) ...; remove it, or set admin.socket (or XDG_RUNTIME_DIR) to ..." for a directory
// that fails the check above, and the system error (directory creation, bind, chmod, listen) otherwise;
// on failure the handles already opened are closed asynchronously (run the loop before
// uv_loop_close()). Request errors are answered on the wire and counted in AdminStats.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>
#include <uv.h>

#include "runtime/base/status.h"

namespace sx::daemon::admin {

struct AdminOptions {
  std::string socket_path;             // required; at most 107 bytes (sun_path)
  unsigned mode = 0600;                // permission bits of the socket file (<= 0777)
  std::vector<uint32_t> allowed_uids;  // peers allowed besides the daemon's own euid (always allowed)
  size_t max_line_bytes = 65536;       // longest request line, newline excluded (>= 64)
  int max_connections = 64;            // open admin connections at once (> 0)
  uint64_t idle_timeout_ms = 300000;   // silence on an idle connection before it is closed (> 0)
  // A listening Unix socket (bound to socket_path) to take over instead of binding, from the
  // daemon this one replaces; -1: bind. Owned by the server from start() on.
  int listen_fd = -1;
  bool accept_now = true;              // false: accept nothing until start_accepting()

  // INVALID_ARGUMENT naming the field when a value is unusable.
  Status validate() const;
};

struct AdminStats {
  uint64_t open_connections = 0;        // accepted and serving requests (not refused), not closed
  uint64_t accepted_connections = 0;    // every accepted connection, refused ones included
  uint64_t refused_peers = 0;           // peer uid not allowed (PERMISSION_DENIED)
  uint64_t rejected_over_capacity = 0;  // over max_connections (RESOURCE_EXHAUSTED)
  uint64_t requests = 0;                // valid request lines handed to the handler
  uint64_t responses = 0;               // response lines queued (handler answers and errors)
  uint64_t bad_requests = 0;            // malformed JSON, not an object, no "cmd"
  uint64_t oversize_lines = 0;          // lines over max_line_bytes
  uint64_t idle_timeouts = 0;           // connections closed for idleness
};

// The answer to one request. Copyable (copies share one slot); the first call writes the response
// line, later calls are no-ops, and so are calls after the connection closed (or the server
// stopped). If every copy is destroyed without a call, the request is answered with INTERNAL
// ("... dropped without a reply") so the client never waits forever.
// Threading: call and destroy on the loop thread only.
class Reply {
 public:
  struct Slot;  // internal (admin_connection.h)

  Reply() = default;  // detached: calls do nothing
  explicit Reply(std::shared_ptr<Slot> slot) : slot_(std::move(slot)) {}

  void operator()(Result<nlohmann::json> result) const;
  // True until the request was answered or its connection went away.
  bool pending() const;

 private:
  std::shared_ptr<Slot> slot_;
};

// Called once per valid request line with the parsed object (its "cmd" is a non-empty string).
// Must eventually call (or drop) `reply`; may do so before returning or later from the loop thread.
// An exception escaping the handler is answered with INTERNAL and does not leave the server.
using CommandHandler = std::function<void(const nlohmann::json& request, Reply reply)>;

class AdminServer {
 public:
  static Result<std::unique_ptr<AdminServer>> start(uv_loop_t* loop, AdminOptions options,
                                                    CommandHandler handler);

  class Impl;
  explicit AdminServer(std::unique_ptr<Impl> impl);  // used by start()
  ~AdminServer();
  AdminServer(const AdminServer&) = delete;
  AdminServer& operator=(const AdminServer&) = delete;

  const std::string& socket_path() const { return path_; }

  // Stops (see above). Later calls add their callback until on_stopped ran; after that they call
  // their callback at once.
  void stop(std::function<void()> on_stopped);
  // Accepts connections from now on (options.accept_now was false).
  Status start_accepting();
  // The listening socket's descriptor (to hand to a replacing process), -1 once closed.
  int listen_fd() const;
  // The socket file now belongs to the process the listener was handed to: stop() leaves it.
  void keep_socket_file();

  // A snapshot of the counters; any thread.
  AdminStats stats() const;

 private:
  std::unique_ptr<Impl> impl_;
  std::string path_;
};

}  // namespace sx::daemon::admin
