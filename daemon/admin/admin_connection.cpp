// AdminConnection: one accepted connection of the admin socket.
#include "daemon/admin/admin_connection.h"

#include <poll.h>
#include <sys/socket.h>

#include <cerrno>
#include <cstring>
#include <exception>

#include <fmt/format.h>

#include "daemon/admin/protocol.h"
#include "daemon/loop/uv_status.h"
#include "runtime/base/log.h"

namespace sx::daemon::admin {

namespace {

// Response bytes queued beyond which the next buffered line waits for the client to read.
constexpr size_t kWriteHighWater = 1024 * 1024;
// Bytes buffered beyond max_line_bytes (pipelined lines waiting for an answer) before reading pauses.
constexpr size_t kExtraInputBytes = 64 * 1024;
// Draining: how long queued bytes may take to reach a client, and how long input is then
// discarded while waiting for its EOF.
constexpr uint64_t kFlushTimeoutMs = 10'000;
constexpr uint64_t kLingerMs = 500;

}  // namespace

// ---- AdminCounters, Reply ----

AdminStats AdminCounters::snapshot() const {
  AdminStats s;
  s.open_connections = open_connections.load(std::memory_order_relaxed);
  s.accepted_connections = accepted_connections.load(std::memory_order_relaxed);
  s.refused_peers = refused_peers.load(std::memory_order_relaxed);
  s.rejected_over_capacity = rejected_over_capacity.load(std::memory_order_relaxed);
  s.requests = requests.load(std::memory_order_relaxed);
  s.responses = responses.load(std::memory_order_relaxed);
  s.bad_requests = bad_requests.load(std::memory_order_relaxed);
  s.oversize_lines = oversize_lines.load(std::memory_order_relaxed);
  s.idle_timeouts = idle_timeouts.load(std::memory_order_relaxed);
  return s;
}

Reply::Slot::~Slot() {
  // Every copy of the Reply is gone and nobody answered: answer for the handler.
  if (connection != nullptr) {
    connection->deliver(this, internal_error("the \"{}\" command was dropped without a reply", cmd));
  }
}

void Reply::operator()(Result<nlohmann::json> result) const {
  if (slot_ && slot_->connection != nullptr) slot_->connection->deliver(slot_.get(), std::move(result));
}

bool Reply::pending() const { return slot_ && slot_->connection != nullptr; }

// ---- life cycle ----

struct AdminConnection::WriteOp {
  uv_write_t req{};
  AdminConnection* connection = nullptr;
  std::string bytes;
};

AdminConnection::AdminConnection(AdminContext& ctx) : ctx_(ctx) {}

AdminConnection::~AdminConnection() { detach_slot(); }

bool AdminConnection::open(uv_stream_t* listener) {
  // uv_timer_init cannot fail; count the handles before anything can close them.
  uv_timer_init(ctx_.loop, &timer_);
  uv_timer_init(ctx_.loop, &resume_timer_);
  timer_.data = this;
  resume_timer_.data = this;
  open_handles_ = 2;
  int rc = uv_pipe_init(ctx_.loop, &pipe_, 0);
  if (rc == 0) {
    pipe_open_ = true;
    pipe_.data = this;
    ++open_handles_;
    rc = uv_accept(listener, stream());
  }
  if (rc != 0) {
    log_warn("admin: accept failed: {}", uv_strerror(rc));
    close_now();
    return false;
  }
  shutdown_req_.data = this;
  return true;
}

Result<PeerCredentials> AdminConnection::peer_credentials() {
  uv_os_fd_t fd = -1;
  SX_RETURN_IF_ERROR(loop::uv_status(uv_fileno(reinterpret_cast<uv_handle_t*>(&pipe_), &fd),
                                     "admin socket: uv_fileno"));
  ucred cred{};
  socklen_t len = sizeof(cred);
  if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) != 0) {
    return internal_error("admin socket: cannot read the peer's credentials (SO_PEERCRED): {}",
                          std::strerror(errno));
  }
  return PeerCredentials{static_cast<uint32_t>(cred.uid), static_cast<uint32_t>(cred.gid),
                         static_cast<int32_t>(cred.pid)};
}

void AdminConnection::start() {
  phase_ = Phase::kIdle;
  deadline_ = now() + ctx_.options.idle_timeout_ms;
  update_reading();
  rearm_timer();
}

void AdminConnection::refuse(const Status& status) {
  ctx_.stats.responses.fetch_add(1, std::memory_order_relaxed);
  if (queue_write(encode_error(status))) begin_drain();
}

void AdminConnection::begin_stop() {
  stopping_ = true;
  if (closing_ || phase_ == Phase::kDraining) return;
  if (phase_ == Phase::kHandling && slot_ != nullptr) {
    deliver(slot_, unavailable_error("the daemon is stopping; the \"{}\" command did not finish", slot_->cmd));
  }
  if (closing_) return;
  if (queued_bytes_ == 0) {
    close_now();
  } else {
    begin_drain();  // let the last answers reach the client
  }
}

void AdminConnection::close_now() {
  if (closing_) return;
  closing_ = true;
  reading_ = false;
  detach_slot();
  uv_timer_stop(&timer_);
  uv_timer_stop(&resume_timer_);
  uv_close(reinterpret_cast<uv_handle_t*>(&timer_), &AdminConnection::on_handle_closed);
  uv_close(reinterpret_cast<uv_handle_t*>(&resume_timer_), &AdminConnection::on_handle_closed);
  if (pipe_open_) uv_close(reinterpret_cast<uv_handle_t*>(&pipe_), &AdminConnection::on_handle_closed);
}

void AdminConnection::on_handle_closed(uv_handle_t* handle) {
  auto* c = static_cast<AdminConnection*>(handle->data);
  if (--c->open_handles_ == 0) c->ctx_.owner->connection_closed(c);  // frees c
}

void AdminConnection::detach_slot() {
  if (slot_ != nullptr) {
    slot_->connection = nullptr;
    slot_ = nullptr;
  }
}

void AdminConnection::begin_drain() {
  if (closing_ || phase_ == Phase::kDraining) return;
  detach_slot();
  phase_ = Phase::kDraining;
  input_.clear();
  input_pos_ = 0;
  // uv_shutdown waits for the queued writes, then shuts our write side down.
  int rc = uv_shutdown(&shutdown_req_, stream(), &AdminConnection::on_shutdown);
  if (rc < 0) {
    close_now();
    return;
  }
  deadline_ = now() + kFlushTimeoutMs;
  update_reading();
  rearm_timer();
}

void AdminConnection::on_shutdown(uv_shutdown_t* req, int status) {
  auto* c = static_cast<AdminConnection*>(req->data);
  if (c->closing_) return;  // cancelled by close_now(); the connection is still allocated
  if (status < 0 || c->peer_eof_ || c->stopping_) {
    c->close_now();  // failed, both directions done, or the server stops: no linger
    return;
  }
  // Discard input until the client closes, so it reads our last line rather than a reset.
  c->shutdown_done_ = true;
  c->deadline_ = c->now() + kLingerMs;
  c->rearm_timer();
}

// ---- writes ----

bool AdminConnection::queue_write(std::string bytes) {
  if (closing_ || phase_ == Phase::kDraining) return false;
  auto op = std::make_unique<WriteOp>();
  op->connection = this;
  op->bytes = std::move(bytes);
  op->req.data = op.get();
  uv_buf_t buf = uv_buf_init(op->bytes.data(), static_cast<unsigned int>(op->bytes.size()));
  int rc = uv_write(&op->req, stream(), &buf, 1, &AdminConnection::on_write);
  if (rc < 0) {
    log_debug("admin: uv_write: {}", uv_strerror(rc));
    close_now();
    return false;
  }
  queued_bytes_ += op->bytes.size();
  op.release();  // owned by the write request until on_write
  return true;
}

void AdminConnection::on_write(uv_write_t* req, int status) {
  std::unique_ptr<WriteOp> op(static_cast<WriteOp*>(req->data));
  AdminConnection* c = op->connection;
  c->queued_bytes_ -= op->bytes.size();
  if (c->closing_) return;
  if (status < 0) {
    log_debug("admin: write failed: {}", uv_strerror(status));
    c->close_now();
    return;
  }
  if (c->blocked_on_writes_ && c->queued_bytes_ <= kWriteHighWater) {
    c->blocked_on_writes_ = false;
    c->process_input();
  }
}

// ---- reading ----

void AdminConnection::on_alloc(uv_handle_t* handle, size_t, uv_buf_t* buf) {
  auto* c = static_cast<AdminConnection*>(handle->data);
  *buf = uv_buf_init(c->ctx_.read_buffer.data(), static_cast<unsigned int>(c->ctx_.read_buffer.size()));
}

void AdminConnection::on_read(uv_stream_t* stream, ssize_t nread, const uv_buf_t* buf) {
  auto* c = static_cast<AdminConnection*>(stream->data);
  if (nread == 0 || c->closing_) return;
  if (nread < 0) {
    c->reading_ = false;  // libuv stops reading after EOF or an error
    c->peer_eof_ = true;
    if (nread != UV_EOF) {
      c->close_now();  // reset or error: nothing more can be delivered
      return;
    }
    if (c->phase_ == Phase::kDraining) {
      if (c->shutdown_done_) c->close_now();  // otherwise on_shutdown closes
      return;
    }
    if (c->peer_gone()) {
      c->close_now();  // nobody reads answers any more: a pending reply becomes a no-op
      return;
    }
    // A half-close: answer what was sent, a last line without '\n' included, then close.
    if (c->input_pos_ < c->input_.size() && c->input_.back() != '\n') c->input_.push_back('\n');
    c->process_input();
    return;
  }
  if (c->phase_ == Phase::kDraining) return;  // discarded
  c->input_.append(buf->base, static_cast<size_t>(nread));
  if (c->phase_ == Phase::kIdle) c->deadline_ = c->now() + c->ctx_.options.idle_timeout_ms;
  c->process_input();
}

bool AdminConnection::peer_gone() {
  // On Linux a Unix stream socket polls POLLHUP once the peer closed (or shut down both
  // directions); a half-close (shutdown(SHUT_WR)) only ends our input.
  uv_os_fd_t fd = -1;
  if (uv_fileno(reinterpret_cast<uv_handle_t*>(&pipe_), &fd) != 0) return false;
  pollfd p{fd, 0, 0};
  return ::poll(&p, 1, 0) == 1 && (p.revents & POLLHUP) != 0;
}

void AdminConnection::update_reading() {
  if (closing_ || peer_eof_ || !pipe_open_) return;
  size_t buffered = input_.size() - input_pos_;
  bool want = phase_ == Phase::kDraining || buffered <= ctx_.options.max_line_bytes + kExtraInputBytes;
  if (want && !reading_) {
    if (uv_read_start(stream(), &AdminConnection::on_alloc, &AdminConnection::on_read) < 0) {
      close_now();
      return;
    }
    reading_ = true;
  } else if (!want && reading_) {
    uv_read_stop(stream());
    reading_ = false;
  }
}

void AdminConnection::on_resume(uv_timer_t* timer) {
  static_cast<AdminConnection*>(timer->data)->process_input();
}

void AdminConnection::process_input() {
  if (processing_ || closing_) return;
  processing_ = true;
  const size_t max_line = ctx_.options.max_line_bytes;
  while (!closing_ && phase_ == Phase::kIdle && input_pos_ < input_.size()) {
    if (queued_bytes_ > kWriteHighWater) {
      blocked_on_writes_ = true;  // on_write resumes
      break;
    }
    std::string_view rest(input_.data() + input_pos_, input_.size() - input_pos_);
    size_t newline = rest.find('\n');
    if (newline == std::string_view::npos) {
      if (rest.size() > max_line) oversize();
      break;
    }
    std::string_view line = rest.substr(0, newline);
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    if (line.size() > max_line) {
      oversize();
      break;
    }
    input_pos_ += newline + 1;
    if (line.find_first_not_of(" \t") == std::string_view::npos) continue;  // blank line
    handle_line(line);  // parsed before anything can change input_
  }
  if (phase_ != Phase::kDraining) {
    if (input_pos_ >= input_.size()) {
      input_.clear();
      input_pos_ = 0;
    } else if (input_pos_ > kExtraInputBytes) {
      input_.erase(0, input_pos_);
      input_pos_ = 0;
    }
  }
  processing_ = false;
  if (closing_) return;
  if (peer_eof_ && phase_ == Phase::kIdle && input_pos_ >= input_.size()) {
    // The client sent everything and every line is answered: close once the answers are out.
    if (queued_bytes_ == 0) {
      close_now();
    } else {
      begin_drain();
    }
    return;
  }
  update_reading();
  rearm_timer();
}

void AdminConnection::oversize() {
  ctx_.stats.oversize_lines.fetch_add(1, std::memory_order_relaxed);
  ctx_.stats.responses.fetch_add(1, std::memory_order_relaxed);
  Status error = resource_exhausted_error(
      "the request line is longer than {} bytes (max_line_bytes); closing the connection",
      ctx_.options.max_line_bytes);
  if (queue_write(encode_error(error))) begin_drain();
}

void AdminConnection::handle_line(std::string_view line) {
  Result<nlohmann::json> request = decode_request(line);
  if (!request.ok()) {
    ctx_.stats.bad_requests.fetch_add(1, std::memory_order_relaxed);
    ctx_.stats.responses.fetch_add(1, std::memory_order_relaxed);
    queue_write(encode_error(request.status()));
    return;
  }
  dispatch(std::move(request).value());
}

void AdminConnection::dispatch(nlohmann::json request) {
  ctx_.stats.requests.fetch_add(1, std::memory_order_relaxed);
  phase_ = Phase::kHandling;
  auto slot = std::make_shared<Reply::Slot>();
  slot->connection = this;
  slot->cmd = request["cmd"].get<std::string>();
  slot_ = slot.get();
  rearm_timer();  // no idle deadline while the handler works
  // This copy outlives the handler call, so an exception is answered before a dropped reply is.
  Reply reply(std::move(slot));
  try {
    if (ctx_.handler) {
      ctx_.handler(request, reply);
    } else {
      reply(unimplemented_error("the admin socket has no command handler"));
    }
  } catch (const std::exception& e) {
    log_warn("admin: the \"{}\" handler threw: {}", request["cmd"].get<std::string>(), e.what());
    reply(internal_error("the \"{}\" command failed: {}", request["cmd"].get<std::string>(), e.what()));
  } catch (...) {
    reply(internal_error("the \"{}\" command failed with an unknown exception", request["cmd"].get<std::string>()));
  }
}

void AdminConnection::deliver(Reply::Slot* slot, Result<nlohmann::json> result) {
  if (slot != slot_ || closing_) return;  // a stale or second answer
  detach_slot();
  ctx_.stats.responses.fetch_add(1, std::memory_order_relaxed);
  if (!queue_write(encode_response(result))) return;
  phase_ = Phase::kIdle;
  deadline_ = now() + ctx_.options.idle_timeout_ms;
  // Inside process_input() (an answer given before the handler returned) the loop goes on by
  // itself; otherwise the next buffered line is handled from the loop, not inside this call.
  if (!processing_) uv_timer_start(&resume_timer_, &AdminConnection::on_resume, 0, 0);
  update_reading();
  rearm_timer();
}

// ---- timers ----

void AdminConnection::rearm_timer() {
  if (closing_) return;
  if (phase_ == Phase::kHandling) {
    uv_timer_stop(&timer_);
    return;
  }
  uint64_t t = now();
  uv_timer_start(&timer_, &AdminConnection::on_timer, deadline_ > t ? deadline_ - t : 0, 0);
}

void AdminConnection::on_timer(uv_timer_t* timer) {
  auto* c = static_cast<AdminConnection*>(timer->data);
  if (c->closing_ || c->phase_ == Phase::kHandling) return;
  if (c->now() < c->deadline_) {
    c->rearm_timer();  // woke early (clock granularity)
    return;
  }
  if (c->phase_ == Phase::kIdle) {
    c->ctx_.stats.idle_timeouts.fetch_add(1, std::memory_order_relaxed);
    log_debug("admin: closing a connection idle for {} ms", c->ctx_.options.idle_timeout_ms);
  }
  c->close_now();  // idle, or the flush / linger time is over
}

}  // namespace sx::daemon::admin
