// AdminConnection: one accepted connection of the admin socket (internal to daemon/admin).
//
// Owns a uv_pipe_t, a deadline timer and a zero-delay "resume" timer. Input is split into lines;
// one line at a time is parsed and handed to the CommandHandler (phase kHandling) and the next
// line waits until its Reply arrived, so responses leave in request order. Bytes that arrive
// meanwhile are buffered (up to max_line_bytes plus 64 KiB, then reading pauses). After an error
// that ends the connection (oversize line, refused peer, over capacity, stop) the connection
// drains: uv_shutdown after the queued writes, input discarded, close on EOF or after a short
// linger (none when the server stops). EOF from the client is a half-close (the lines sent are
// still answered) unless the socket reports POLLHUP, i.e. the client closed entirely: then the
// connection closes at once and a pending Reply becomes a no-op.
//
// Lifetime: created and owned by AdminServer::Impl (AdminContext::owner); its memory is freed only
// after the close callbacks of all its handles ran (ConnectionOwner::connection_closed). Write
// requests carry owned bytes and complete (or are cancelled) before the close callbacks. A
// Reply::Slot points back at its connection while the request is pending; closing the connection
// detaches it (later replies are no-ops).
//
// Threading: loop thread only.
#pragma once

#include <array>
#include <atomic>
#include <cstdint>
#include <memory>
#include <string>

#include <nlohmann/json.hpp>
#include <uv.h>

#include "daemon/admin/admin_server.h"
#include "runtime/base/status.h"

namespace sx::daemon::admin {

class AdminConnection;

// Counters behind AdminStats: written on the loop thread, readable from any thread.
struct AdminCounters {
  std::atomic<uint64_t> open_connections{0};
  std::atomic<uint64_t> accepted_connections{0};
  std::atomic<uint64_t> refused_peers{0};
  std::atomic<uint64_t> rejected_over_capacity{0};
  std::atomic<uint64_t> requests{0};
  std::atomic<uint64_t> responses{0};
  std::atomic<uint64_t> bad_requests{0};
  std::atomic<uint64_t> oversize_lines{0};
  std::atomic<uint64_t> idle_timeouts{0};

  AdminStats snapshot() const;
};

class ConnectionOwner {
 public:
  // All handles of `connection` are closed; the owner frees it (and must not use it after).
  virtual void connection_closed(AdminConnection* connection) = 0;

 protected:
  ~ConnectionOwner() = default;
};

// What connections share with their server. Owned by AdminServer::Impl; outlives every
// connection.
struct AdminContext {
  uv_loop_t* loop = nullptr;
  ConnectionOwner* owner = nullptr;
  AdminOptions options;
  CommandHandler handler;
  AdminCounters stats;
  // One read buffer for the loop: libuv calls alloc and read back to back; connections copy.
  std::array<char, 64 * 1024> read_buffer{};
};

// The shared state of one pending request (see Reply in admin_server.h).
struct Reply::Slot {
  AdminConnection* connection = nullptr;  // null once answered or the connection closed
  std::string cmd;                        // for the "dropped without a reply" message
  ~Slot();
};

struct PeerCredentials {
  uint32_t uid = 0;
  uint32_t gid = 0;
  int32_t pid = 0;
};

class AdminConnection {
 public:
  explicit AdminConnection(AdminContext& ctx);
  ~AdminConnection();
  AdminConnection(const AdminConnection&) = delete;
  AdminConnection& operator=(const AdminConnection&) = delete;

  // Initialises the handles and accepts a pending connection from `listener`. Once this is
  // called the connection always ends through ConnectionOwner::connection_closed, even when it
  // returns false (accept failed and the connection is already closing).
  bool open(uv_stream_t* listener);
  // The peer's credentials (SO_PEERCRED on the accepted socket).
  Result<PeerCredentials> peer_credentials();
  // Starts reading requests (idle deadline counted from now).
  void start();
  // Writes one error line without reading a request, then closes (refused peer, over capacity).
  void refuse(const Status& status);
  // AdminServer::stop(): answers a request in progress with UNAVAILABLE, flushes what is queued,
  // then closes.
  void begin_stop();
  // Closes now; queued bytes and a pending reply are lost.
  void close_now();

  // Reply::operator() and Reply::Slot::~Slot(): the answer to the pending request of `slot`.
  void deliver(Reply::Slot* slot, Result<nlohmann::json> result);

 private:
  enum class Phase { kIdle, kHandling, kDraining };
  struct WriteOp;

  static void on_alloc(uv_handle_t* handle, size_t suggested, uv_buf_t* buf);
  static void on_read(uv_stream_t* stream, ssize_t nread, const uv_buf_t* buf);
  static void on_write(uv_write_t* req, int status);
  static void on_shutdown(uv_shutdown_t* req, int status);
  static void on_timer(uv_timer_t* timer);
  static void on_resume(uv_timer_t* timer);
  static void on_handle_closed(uv_handle_t* handle);

  uv_stream_t* stream() { return reinterpret_cast<uv_stream_t*>(&pipe_); }
  uint64_t now() const { return uv_now(ctx_.loop); }

  void process_input();
  void handle_line(std::string_view line);
  void dispatch(nlohmann::json request);
  void oversize();
  bool queue_write(std::string bytes);
  void begin_drain();
  void update_reading();
  void rearm_timer();
  void detach_slot();
  // After EOF: true when the client closed entirely (not a half-close).
  bool peer_gone();

  AdminContext& ctx_;
  uv_pipe_t pipe_{};
  uv_timer_t timer_{};
  uv_timer_t resume_timer_{};
  uv_shutdown_t shutdown_req_{};
  int open_handles_ = 0;
  bool pipe_open_ = false;
  bool closing_ = false;
  bool reading_ = false;
  bool processing_ = false;         // inside process_input()
  bool peer_eof_ = false;           // the client sent EOF (half-close or close)
  bool shutdown_done_ = false;      // our write side is shut down (draining)
  bool stopping_ = false;           // AdminServer::stop(): no linger after the last answer
  bool blocked_on_writes_ = false;  // process_input() waits for queued bytes to drain
  Phase phase_ = Phase::kIdle;
  std::string input_;
  size_t input_pos_ = 0;
  size_t queued_bytes_ = 0;
  uint64_t deadline_ = 0;  // idle deadline (kIdle) or flush / linger deadline (kDraining)
  Reply::Slot* slot_ = nullptr;  // the pending request (kHandling)
};

}  // namespace sx::daemon::admin
