// Connection: one accepted TCP connection of the HTTP/1.1 server (internal to daemon/http).
//
// Owns a uv_tcp_t, a deadline timer, a zero-delay "resume" timer, a probe timer and a
// RequestParser. Requests are parsed one at a time: when a request is complete the parser stops
// and the request is dispatched to the router; bytes of pipelined requests that arrive meanwhile
// are buffered (up to a cap, then reading pauses) and parsed only after the response finished, so
// responses go out in request order. Reading continues while a response is in progress so that a
// client that goes away is noticed at once: a reset or read error closes the connection and
// cancels the response (Responder::on_close).
//
// A clean EOF is a half-close (RFC 9112 §9.6: the client sends nothing more, and may still read):
// the request in progress is answered, bytes already queued are delivered, then the connection
// closes. Whether the client closed entirely shows only when bytes reach it: the next write of a
// stream fails, and a response not begun yet is preceded by interim "100 Continue" probes (HTTP/1.1
// clients) whose reset cancels it.
//
// Phases: kIdle (between requests) -> kHeaders -> kBody -> kHandling (router called, response not
// finished) -> kIdle again, or kDraining: the last response is queued, the write side is shut
// down after it, input is discarded until EOF or linger_ms, then the connection closes.
//
// Lifetime: created and owned by Server::Impl (ServerContext::owner); its memory is freed only
// after the close callbacks of all its handles ran (ConnectionOwner::connection_closed). Write
// requests carry owned buffers and complete (or are cancelled) before the close callbacks.
//
// Threading: loop thread only.
#pragma once

#include <array>
#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <uv.h>

#include "daemon/http/request.h"
#include "daemon/http/request_parser.h"
#include "daemon/http/responder.h"
#include "daemon/http/router.h"
#include "daemon/http/server_options.h"

namespace sx::daemon::http {

class Connection;

// Counters behind ServerStats: written on the loop thread, readable from any thread.
struct StatsCounters {
  std::atomic<uint64_t> open_connections{0};
  std::atomic<uint64_t> accepted_connections{0};
  std::atomic<uint64_t> requests{0};
  std::atomic<uint64_t> responses{0};
  std::atomic<uint64_t> rejected_over_capacity{0};
  std::atomic<uint64_t> rejected_bad_request{0};
  std::atomic<uint64_t> rejected_header_too_large{0};
  std::atomic<uint64_t> rejected_body_too_large{0};
  std::atomic<uint64_t> header_timeouts{0};
  std::atomic<uint64_t> body_timeouts{0};
  std::atomic<uint64_t> idle_timeouts{0};
  std::atomic<uint64_t> write_timeouts{0};
  std::atomic<uint64_t> write_overflows{0};
  std::atomic<uint64_t> client_disconnects{0};

  ServerStats snapshot() const;
};

class ConnectionOwner {
 public:
  // All handles of `connection` are closed; the owner frees it (and must not use it after).
  virtual void connection_closed(Connection* connection) = 0;

 protected:
  ~ConnectionOwner() = default;
};

// What connections share with their server. Owned by Server::Impl; outlives every connection.
struct ServerContext {
  uv_loop_t* loop = nullptr;
  ConnectionOwner* owner = nullptr;
  ServerOptions options;
  Router router;
  StatsCounters stats;
  bool stopping = false;  // Server::stop() was called: no more keep-alive
  bool finish_arriving = false;  // ... with StopMode::kFinishArriving
  // One read buffer for the whole loop: libuv calls alloc and read callbacks back to back, and a
  // connection copies what it keeps.
  std::array<char, 64 * 1024> read_buffer{};

  // The Date header value, recomputed at most once per second.
  const std::string& date();

 private:
  int64_t date_second_ = -1;
  std::string date_;
};

class Connection final : private RequestParser::Listener {
 public:
  // `rejected`: accepted over capacity; only reject() or close_now() follow open().
  Connection(ServerContext& ctx, bool rejected);
  ~Connection();
  Connection(const Connection&) = delete;
  Connection& operator=(const Connection&) = delete;

  // Initialises the handles and accepts a pending connection from `listener`. Once this is
  // called the connection always ends through ConnectionOwner::connection_closed, even when it
  // returns false (accept failed and the connection is already closing).
  bool open(uv_stream_t* listener);
  // Starts reading requests (header deadline counted from now).
  void start();
  // Answers `status` with "Connection: close" without reading a request, then closes (used for
  // 503 over capacity).
  void reject(int status);
  // Server::stop(): closes an idle connection now (after flushing queued bytes); a connection
  // with a response in progress closes after that response.
  void begin_stop();
  // Closes now; a response in progress is lost (its on_close callbacks run).
  void close_now();

  bool rejected() const { return rejected_; }
  bool closing() const { return closing_; }

  // Used by Responder (loop thread); preconditions checked there.
  bool send_response(int status, Headers headers, std::string body);
  bool send_stream_head(int status, Headers headers);
  bool send_chunk(std::string data);
  bool send_stream_end();
  size_t queued_bytes() const { return queued_bytes_; }

 private:
  enum class Phase { kIdle, kHeaders, kBody, kHandling, kDraining };
  struct WriteOp;
  struct ResponseState {
    bool head_only = false;  // HEAD request: no body bytes
    bool http10 = false;     // HTTP/1.0 client: no chunked encoding
    bool chunked = false;    // the stream uses chunked encoding
  };

  // RequestParser::Listener
  void on_request_begin() override;
  void on_request_head(const Request& request, bool expects_body) override;

  static void on_alloc(uv_handle_t* handle, size_t suggested, uv_buf_t* buf);
  static void on_read(uv_stream_t* stream, ssize_t nread, const uv_buf_t* buf);
  static void on_write(uv_write_t* req, int status);
  static void on_shutdown(uv_shutdown_t* req, int status);
  static void on_timer(uv_timer_t* timer);
  static void on_probe(uv_timer_t* timer);
  static void on_resume(uv_timer_t* timer);
  static void on_handle_closed(uv_handle_t* handle);

  uv_stream_t* stream() { return reinterpret_cast<uv_stream_t*>(&tcp_); }
  uint64_t now() const { return uv_now(ctx_.loop); }

  void on_peer_eof(bool clean);
  // The client half-closed and nothing it sent is left to answer: flush, then close.
  void end_after_eof();
  void process_input();
  void dispatch();
  void handler_failed(const char* what);
  // Answers `status` (with `reason` in the body when given) and closes after it.
  void fail_request(int status, const std::string& reason = {});
  void finish_response();
  void begin_drain();
  bool queue_write(std::vector<std::string> pieces);
  bool keep_alive_after_response() const;
  void update_reading();
  void rearm_timer();
  // After a half-close while a response is being prepared: an interim "100 Continue" now and
  // then (allowed before any final response, RFC 9110 §15.2) makes a peer that closed entirely
  // answer with a reset, so its request is cancelled instead of computed for nobody.
  void probe_peer();

  ServerContext& ctx_;
  uv_tcp_t tcp_{};
  uv_timer_t timer_{};         // read / write / linger deadlines
  uv_timer_t resume_timer_{};  // parses buffered input after an asynchronous response finished
  uv_timer_t probe_timer_{};   // probe_peer() while a half-closed client waits for its response
  uint64_t probe_interval_ms_ = 0;
  uv_shutdown_t shutdown_req_{};
  int open_handles_ = 0;
  bool tcp_open_ = false;

  std::unique_ptr<RequestParser> parser_;
  Phase phase_ = Phase::kIdle;
  bool closing_ = false;   // uv_close called
  bool draining_ = false;  // last response queued; shutting down
  bool shutdown_done_ = false;
  bool reading_ = false;
  bool peer_eof_ = false;  // the client sent EOF (or the read side failed)
  bool processing_ = false;  // inside process_input()
  bool blocked_on_writes_ = false;
  bool close_after_response_ = false;
  std::uint64_t served_ = 0;  // requests dispatched on this connection
  bool rejected_ = false;
  std::string peer_;

  // Input not yet parsed: [input_pos_, input_.size()).
  std::string input_;
  size_t input_pos_ = 0;

  uint64_t messages_begun_ = 0;

  // Deadlines in uv_now() milliseconds.
  uint64_t deadline_ = 0;        // header, body or keep-alive idle, by phase
  uint64_t write_deadline_ = 0;  // next write progress due (while bytes are queued)
  uint64_t drain_deadline_ = 0;  // flush, then linger, while draining

  // The response in progress.
  std::shared_ptr<Responder> responder_;
  ResponseState response_;
  size_t queued_bytes_ = 0;
  size_t last_unsent_ = 0;  // libuv's unsent byte count when progress was last seen
};

}  // namespace sx::daemon::http
