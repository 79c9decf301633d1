// Options and statistics of the HTTP/1.1 server (daemon/http/server.h).
//
// Every limit is enforced per connection on the loop thread. Timeouts are deadlines measured with
// the loop clock (uv_now, milliseconds):
//   header_timeout_ms    the request line and all headers must arrive within this time, counted
//                        from the connection's accept for its first request and from the
//                        request's first byte afterwards (slow-loris). Expiry: 408, then close; a
//                        fresh connection that sent nothing is closed without a response.
//   body_timeout_ms      the whole body must arrive within this time after the headers. Expiry:
//                        408, then close.
//   keepalive_timeout_ms an idle keep-alive connection (previous response finished, no byte of a
//                        next request yet) is closed after this time, without a response.
//   write_timeout_ms     while response bytes are queued, the client must accept some of them
//                        within this time, else the connection is closed (a client that stops
//                        reading).
//   linger_ms            after the last response of a connection that closes (Connection: close,
//                        errors, stop), the server half-closes and discards input for up to this
//                        long so that the client reads the response instead of a reset.
//
// Threading: plain values. ServerStats is a snapshot.
#pragma once

#include <cstddef>
#include <cstdint>
#include <limits>
#include <string>

#include "runtime/base/status.h"

namespace sx::daemon::http {

struct ServerOptions {
  std::string host = "127.0.0.1";  // IPv4 or IPv6 literal
  uint16_t port = 0;               // 0: an ephemeral port, see Server::bound_port()
  // A listening TCP socket to take over instead of binding host:port (handed over by the daemon
  // this one replaces, or by systemd); -1: bind. The server owns it from start() on.
  int listen_fd = -1;
  // False: the socket is set up but no connection is accepted until Server::start_accepting()
  // (a replacing daemon leaves them to the old one until it is ready).
  bool accept_now = true;
  int backlog = 511;
  size_t max_connections = 1024;       // more: the excess gets 503 and is closed
  // Sockets the server may hold at once, served and refused together: beyond it a new connection
  // is closed at once without a 503, so the process keeps descriptors for everything else (the
  // admin socket, files) however many clients connect. The daemon derives it from RLIMIT_NOFILE.
  size_t max_sockets = SIZE_MAX;
  size_t max_header_bytes = 16 * 1024;  // request line + headers; more: 431
  size_t max_body_bytes = 16 * 1024 * 1024;  // more (announced or received): 413
  // A JSON body (RequestParser::Limits) nested deeper or holding more values: 400 as soon as the
  // bytes that cross the bound arrive. 0: no bound.
  size_t max_json_depth = 0;
  size_t max_json_values = 0;
  uint64_t header_timeout_ms = 10'000;
  uint64_t body_timeout_ms = 60'000;
  uint64_t keepalive_timeout_ms = 30'000;
  uint64_t write_timeout_ms = 60'000;
  uint64_t linger_ms = 1'000;
  // Response bytes queued on one connection beyond which a new write closes the connection (a
  // single response larger than this is still sent when nothing else is queued).
  size_t max_queued_write_bytes = 64 * 1024 * 1024;

  // INVALID_ARGUMENT naming the field when a value is unusable (zero limits, empty host).
  Status validate() const;
};

struct ServerStats {
  uint64_t open_connections = 0;      // accepted, not rejected, not yet closed
  uint64_t accepted_connections = 0;  // total accepted (including rejected ones)
  uint64_t requests = 0;              // complete requests handed to the router
  uint64_t responses = 0;             // responses finished by handlers (respond / end_stream)
  uint64_t rejected_over_capacity = 0;   // 503 (or closed at once) over max_connections
  uint64_t rejected_bad_request = 0;     // 400: malformed request
  uint64_t rejected_header_too_large = 0;  // 431
  uint64_t rejected_body_too_large = 0;    // 413
  uint64_t header_timeouts = 0;  // 408 while reading headers
  uint64_t body_timeouts = 0;    // 408 while reading a body
  uint64_t idle_timeouts = 0;    // idle keep-alive / silent fresh connections closed
  uint64_t write_timeouts = 0;   // client stopped reading (write_timeout_ms)
  uint64_t write_overflows = 0;  // max_queued_write_bytes exceeded
  uint64_t client_disconnects = 0;  // connection lost before its response finished
};

}  // namespace sx::daemon::http
