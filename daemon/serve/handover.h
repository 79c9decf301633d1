// Handing the listening sockets to a new `sextant serve` (ctl upgrade), and taking them over.
//
// The old daemon starts the new binary with the same arguments after `serve`, its listening HTTP
// and admin sockets as descriptors 3 and 4 and the write end of a pipe as descriptor 5, named in
// SEXTANT_LISTEN_FDS=http:3,admin:4 and SEXTANT_READY_FD=5. The new one takes the sockets over
// without binding, loads its replicas while the old one goes on accepting (it accepts nothing
// before it is ready), then starts accepting and writes "ready" to the pipe, or on failure the
// line "error <its first error>" and exits. The old daemon then stops accepting, finishes what it
// has and exits 0; on failure it keeps serving and reports the line. systemd's socket activation
// (LISTEN_PID, LISTEN_FDS, LISTEN_FDNAMES: "http" and "admin", or the first two descriptors in
// that order) is taken over the same way, accepting at once.
//
// Threading: take_inherited_listeners() before the loop runs; Successor on the loop thread.
// Errors: a malformed variable is INVALID_ARGUMENT naming it; a spawn that fails is the libuv
// error; everything after the spawn arrives through the Successor's callback.
#pragma once

#include <uv.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "runtime/base/status.h"

namespace sx::daemon::serve {

struct InheritedListeners {
  int http = -1, admin = -1;  // listening sockets to take over; -1: bind as usual
  int ready = -1;             // the pipe to report readiness on (a replaced daemon); -1: none
  std::string source;         // "ctl upgrade" or "systemd", for the log; "" when nothing was inherited
  bool from_daemon() const { return ready >= 0; }
};

// Reads and unsets the variables above (so that processes this one starts do not see them) and
// marks the descriptors close-on-exec.
Result<InheritedListeners> take_inherited_listeners();

// Writes `line` and a newline to the ready pipe and closes it; nothing when fd is -1.
void report_to_parent(int& fd, std::string_view line);

// The new process of an upgrade, seen from the old one, which supervises it until it is ready: a
// new process that does not report ready within `ready_timeout_ms`, reports an error, says
// anything but "ready", writes more than a line's worth (4 KiB) without a newline, or closes its
// pipe, is ended (SIGTERM, then SIGKILL after kKillGraceMs) and reaped: never left running with
// the listening sockets, never a zombie.
class Successor {
 public:
  static constexpr std::uint64_t kKillGraceMs = 5000;
  // `done` runs once on the loop thread: OK when the new process reported ready, else why not
  // (its error line, its exit status, the pipe's end, the deadline).
  using Done = std::function<void(Status status)>;
  static Result<std::unique_ptr<Successor>> start(uv_loop_t* loop, const std::string& binary,
                                                  const std::vector<std::string>& serve_args, int http_fd,
                                                  int admin_fd, std::uint64_t ready_timeout_ms, Done done);
  // A successor that reported ready runs on (it is the daemon now): its handles close. One that did
  // not is ended, and its handles stay open on the loop until it has exited and been reaped, so a
  // loop run to its end (the daemon's exit) waits for it (at most kKillGraceMs after SIGTERM).
  ~Successor();
  Successor(const Successor&) = delete;
  Successor& operator=(const Successor&) = delete;
  // The process id while it runs (or once it is the daemon); -1 after it has exited.
  int pid() const;

  struct Impl;

 private:
  explicit Successor(Impl* impl) : impl_(impl) {}
  Impl* impl_;  // freed by its handles' close callbacks
};

}  // namespace sx::daemon::serve
