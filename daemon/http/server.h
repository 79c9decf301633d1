// Server: the HTTP/1.1 server of `sextant serve` on libuv + llhttp (DESIGN.md §3, §7.5, §7.6).
//
// Knows nothing about OpenAI or the engine: requests go to a Router, handlers answer through a
// Responder (daemon/http/responder.h), possibly later from the loop thread. Supports keep-alive
// (HTTP/1.1 default, HTTP/1.0 with "Connection: keep-alive"), Connection: close, chunked request
// bodies, pipelined requests (answered in order, one at a time), Expect: 100-continue, and the
// limits and timeouts of ServerOptions (daemon/http/server_options.h):
//   malformed request -> 400, header block too large -> 431, body too large (announced by
//   Content-Length, before reading it, or while reading a chunked body) -> 413, slow headers or
//   body -> 408; each followed by closing the connection. Connections over max_connections get
//   503 and are closed (or are closed at once when too many are already being rejected).
// Every write is a uv_write of owned buffers; queued bytes are tracked per connection
// (Responder::queued_bytes) and bounded by max_queued_write_bytes and write_timeout_ms.
//
// Lifetime: start() opens the listening socket and returns the owner object. stop() stops
// accepting, closes idle connections, lets responses in progress finish (their connections
// close after them) and force-closes what remains after `grace_ms`; `on_stopped` runs on the loop
// thread once every handle of the server is closed, so uv_loop_close() can succeed after it (the
// Server object may be destroyed inside on_stopped). Destroying a Server that has not finished
// stopping force-closes everything without calling on_stopped; the memory is then freed by the
// close callbacks, so the loop must run again before uv_loop_close().
//
// Threading: start(), stop() and the destructor run on the loop thread (start() may also run
// before the loop runs on another thread). Handlers and on_stopped run on the loop thread.
// bound_port() and stats() may be called from any thread. The process must ignore SIGPIPE
// (writes to a reset connection then fail with EPIPE instead of killing the process).
//
// Errors: start() returns INVALID_ARGUMENT for bad options or host, and the libuv bind/listen
// error (e.g. UNAVAILABLE "address already in use") otherwise; on failure the handles already
// opened are closed asynchronously (run the loop before uv_loop_close()). Request errors are
// answered on the wire and counted in ServerStats, never returned or thrown.
#pragma once

#include <cstdint>
#include <functional>
#include <limits>
#include <memory>

#include <uv.h>

#include "daemon/http/router.h"
#include "daemon/http/server_options.h"
#include "runtime/base/status.h"

namespace sx::daemon::http {

class Server {
 public:
  static constexpr uint64_t kNoGraceLimit = std::numeric_limits<uint64_t>::max();

  static Result<std::unique_ptr<Server>> start(uv_loop_t* loop, ServerOptions options,
                                               Router router);

  class Impl;
  Server(std::unique_ptr<Impl> impl);  // used by start()
  ~Server();
  Server(const Server&) = delete;
  Server& operator=(const Server&) = delete;

  // The port the listener is bound to (the ephemeral one when options.port was 0).
  uint16_t bound_port() const { return port_; }

  // Accepts connections from now on (options.accept_now was false); OK when already accepting.
  Status start_accepting();
  // The listening socket's descriptor (to hand to a replacing process), -1 once closed. The
  // server still owns it.
  int listen_fd() const;

  // kCloseArriving: connections with no request dispatched (just accepted, or a request half
  // received) are closed at once. kFinishArriving (a hand-over to another process that now
  // accepts on the same socket): those get their request answered, then close, within the header
  // and body timeouts; only idle keep-alive connections close at once.
  enum class StopMode { kCloseArriving, kFinishArriving };

  // Begins a graceful stop (see above). A second call before on_stopped ran may shorten the
  // grace period (0: close everything now) and adds its callback; after that it does nothing.
  void stop(std::function<void()> on_stopped, uint64_t grace_ms = kNoGraceLimit,
            StopMode mode = StopMode::kCloseArriving);

  // A snapshot of the counters; any thread.
  ServerStats stats() const;

 private:
  std::unique_ptr<Impl> impl_;
  uint16_t port_ = 0;
};

}  // namespace sx::daemon::http
