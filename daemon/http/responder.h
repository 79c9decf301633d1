// Responder: how a handler answers one request, now or later (DESIGN.md §3 steps 1 and 6).
//
// A handler receives a ResponderPtr (shared_ptr) with each Request. It answers exactly once,
// either with respond() or with a stream: start_stream(), any number of write_chunk(), then
// end_stream(). It may do so synchronously inside the handler or later from the loop thread, e.g.
// when an engine result arrives through a loop::AsyncQueue. The server writes with uv_write from
// owned buffers; nothing blocks the loop.
//
// Framing is the server's: respond() sets Content-Length; a stream uses chunked transfer encoding
// (for HTTP/1.0 clients: raw bytes, then the connection closes). Handlers must not set
// Content-Length, Transfer-Encoding or Connection themselves (they are dropped), except that
// "Connection: close" in the handler's headers closes the connection after this response.
// For HEAD requests the body and chunks are not sent (Content-Length still reflects the body).
//
// Lifetime: the responder stays valid as long as someone holds the pointer, even after the
// connection is gone; every call on a responder whose connection is gone, or whose response has
// finished, is a no-op that returns false. The connection holds a reference until the response
// finishes or the connection closes, so a request that is never answered keeps its connection
// busy until the client leaves or Server::stop's grace period ends.
//
// on_close: callbacks registered with on_close() run once, on the loop thread, if the connection
// is lost before the response finished (client disconnect or EOF, timeout, write error, forced
// server stop). That is how a disconnect cancels engine work. They never run after a normal
// finish. Registering on a responder whose connection is already lost runs the callback at once.
// Callbacks may run synchronously inside a Responder call that hits a write error.
//
// Threading: every method runs on the loop thread, except closed() and finished(), which are
// atomic and may be polled from any thread (e.g. by an engine thread to stop early). The last
// reference may be dropped on any thread.
#pragma once

#include <atomic>
#include <cstddef>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "daemon/http/headers.h"

namespace sx::daemon::http {

class Connection;

class Responder {
 public:
  class Key {  // only a Connection creates responders
    friend class Connection;
    Key() = default;
  };
  Responder(Key, Connection* connection);
  Responder(const Responder&) = delete;
  Responder& operator=(const Responder&) = delete;

  // Sends a complete response. False when not allowed (already started/finished) or no-op.
  bool respond(int status, Headers headers, std::string body);

  // Starts a chunked response (e.g. "Content-Type: text/event-stream" for SSE).
  bool start_stream(int status, Headers headers);
  // Sends one chunk (empty data is ignored and returns true). Requires start_stream().
  bool write_chunk(std::string data);
  // Ends the stream (the terminating zero chunk); the response is finished.
  bool end_stream();

  // The connection was lost before the response finished.
  bool closed() const { return closed_.load(std::memory_order_acquire); }
  // The response finished (respond() or end_stream() was called).
  bool finished() const { return finished_.load(std::memory_order_acquire); }
  // start_stream() was called (and the response has not been closed since).
  bool streaming() const { return state_ == State::kStreaming; }

  // Runs `callback` once if the connection is lost before the response finishes (see above).
  void on_close(std::function<void()> callback);

  // Response bytes handed to libuv and not yet written to the socket (backpressure); 0 when
  // detached.
  size_t queued_bytes() const;

 private:
  friend class Connection;
  enum class State { kNew, kStreaming, kDone };

  // Called by the connection: the response finished normally.
  void detach_finished();
  // Called by the connection: it is closing before the response finished; fires on_close.
  void detach_lost();

  Connection* connection_;  // null once detached
  State state_ = State::kNew;
  std::atomic<bool> closed_{false};
  std::atomic<bool> finished_{false};
  std::vector<std::function<void()>> on_close_;
};

using ResponderPtr = std::shared_ptr<Responder>;

}  // namespace sx::daemon::http
