// Connection: one accepted TCP connection of the HTTP/1.1 server.
#include "daemon/http/connection.h"

#include <algorithm>
#include <ctime>
#include <exception>
#include <limits>

#include <fmt/format.h>

#include "daemon/http/response_head.h"
#include "runtime/base/log.h"

namespace sx::daemon::http {

namespace {

constexpr uint64_t kNever = std::numeric_limits<uint64_t>::max();
// Pipelined input buffered while a response is in progress before reading pauses.
constexpr size_t kMaxBufferedInput = 64 * 1024;
// Response bytes queued beyond which the next pipelined request waits for the client to read.
constexpr size_t kWriteHighWater = 1024 * 1024;
// probe_peer(): the first interim response at once, then at doubling intervals up to the last.
constexpr uint64_t kFirstProbeMs = 100;
constexpr uint64_t kMaxProbeMs = 5000;

std::string peer_name(uv_tcp_t* tcp) {
  sockaddr_storage addr{};
  int len = sizeof(addr);
  if (uv_tcp_getpeername(tcp, reinterpret_cast<sockaddr*>(&addr), &len) != 0) return "unknown";
  char ip[64] = {0};
  if (addr.ss_family == AF_INET6) {
    auto* a6 = reinterpret_cast<sockaddr_in6*>(&addr);
    uv_ip6_name(a6, ip, sizeof(ip));
    return fmt::format("[{}]:{}", ip, ntohs(a6->sin6_port));
  }
  auto* a4 = reinterpret_cast<sockaddr_in*>(&addr);
  uv_ip4_name(a4, ip, sizeof(ip));
  return fmt::format("{}:{}", ip, ntohs(a4->sin_port));
}

}  // namespace

// ---- StatsCounters / ServerContext ----

ServerStats StatsCounters::snapshot() const {
  ServerStats s;
  s.open_connections = open_connections.load(std::memory_order_relaxed);
  s.accepted_connections = accepted_connections.load(std::memory_order_relaxed);
  s.requests = requests.load(std::memory_order_relaxed);
  s.responses = responses.load(std::memory_order_relaxed);
  s.rejected_over_capacity = rejected_over_capacity.load(std::memory_order_relaxed);
  s.rejected_bad_request = rejected_bad_request.load(std::memory_order_relaxed);
  s.rejected_header_too_large = rejected_header_too_large.load(std::memory_order_relaxed);
  s.rejected_body_too_large = rejected_body_too_large.load(std::memory_order_relaxed);
  s.header_timeouts = header_timeouts.load(std::memory_order_relaxed);
  s.body_timeouts = body_timeouts.load(std::memory_order_relaxed);
  s.idle_timeouts = idle_timeouts.load(std::memory_order_relaxed);
  s.write_timeouts = write_timeouts.load(std::memory_order_relaxed);
  s.write_overflows = write_overflows.load(std::memory_order_relaxed);
  s.client_disconnects = client_disconnects.load(std::memory_order_relaxed);
  return s;
}

const std::string& ServerContext::date() {
  int64_t second = static_cast<int64_t>(std::time(nullptr));
  if (second != date_second_) {
    date_second_ = second;
    date_ = http_date();
  }
  return date_;
}

// ---- writes ----

struct Connection::WriteOp {
  uv_write_t req{};
  Connection* connection = nullptr;
  std::vector<std::string> pieces;  // owned bytes; uv_buf_t point into them
  size_t bytes = 0;
};

bool Connection::queue_write(std::vector<std::string> pieces) {
  if (closing_ || draining_) return false;
  auto op = std::make_unique<WriteOp>();
  op->connection = this;
  op->pieces = std::move(pieces);
  std::vector<uv_buf_t> bufs;
  bufs.reserve(op->pieces.size());
  for (std::string& p : op->pieces) {
    if (p.empty()) continue;
    bufs.push_back(uv_buf_init(p.data(), static_cast<unsigned int>(p.size())));
    op->bytes += p.size();
  }
  if (bufs.empty()) return true;
  if (queued_bytes_ > 0 && queued_bytes_ + op->bytes > ctx_.options.max_queued_write_bytes) {
    ctx_.stats.write_overflows.fetch_add(1, std::memory_order_relaxed);
    log_warn("http: {}: client is not reading ({} bytes queued); closing", peer_, queued_bytes_);
    close_now();
    return false;
  }
  if (queued_bytes_ == 0) write_deadline_ = now() + ctx_.options.write_timeout_ms;
  op->req.data = op.get();
  int rc = uv_write(&op->req, stream(), bufs.data(), static_cast<unsigned int>(bufs.size()),
                    &Connection::on_write);
  if (rc < 0) {
    log_debug("http: {}: uv_write: {}", peer_, uv_strerror(rc));
    close_now();
    return false;
  }
  queued_bytes_ += op->bytes;
  last_unsent_ = uv_stream_get_write_queue_size(stream());
  op.release();  // owned by the write request until on_write
  rearm_timer();
  return true;
}

void Connection::on_write(uv_write_t* req, int status) {
  std::unique_ptr<WriteOp> op(static_cast<WriteOp*>(req->data));
  Connection* c = op->connection;
  c->queued_bytes_ -= op->bytes;
  if (c->closing_) return;
  if (status < 0) {
    log_debug("http: {}: write failed: {}", c->peer_, uv_strerror(status));
    c->close_now();
    return;
  }
  c->write_deadline_ = c->now() + c->ctx_.options.write_timeout_ms;
  c->last_unsent_ = uv_stream_get_write_queue_size(c->stream());
  if (c->blocked_on_writes_ && c->queued_bytes_ <= kWriteHighWater) {
    c->blocked_on_writes_ = false;
    c->process_input();
  } else {
    c->rearm_timer();
  }
}

// ---- life cycle ----

Connection::Connection(ServerContext& ctx, bool rejected) : ctx_(ctx), rejected_(rejected) {}

Connection::~Connection() = default;

bool Connection::open(uv_stream_t* listener) {
  // uv_timer_init cannot fail; count the handles before anything can close them.
  uv_timer_init(ctx_.loop, &timer_);
  uv_timer_init(ctx_.loop, &resume_timer_);
  uv_timer_init(ctx_.loop, &probe_timer_);
  timer_.data = this;
  resume_timer_.data = this;
  probe_timer_.data = this;
  open_handles_ = 3;
  int rc = uv_tcp_init(ctx_.loop, &tcp_);
  if (rc == 0) {
    tcp_open_ = true;
    tcp_.data = this;
    ++open_handles_;
    rc = uv_accept(listener, stream());
  }
  if (rc != 0) {
    log_warn("http: accept failed: {}", uv_strerror(rc));
    close_now();
    return false;
  }
  uv_tcp_nodelay(&tcp_, 1);
  peer_ = peer_name(&tcp_);
  shutdown_req_.data = this;
  parser_ = std::make_unique<RequestParser>(
      RequestParser::Limits{ctx_.options.max_header_bytes, ctx_.options.max_body_bytes, ctx_.options.max_json_depth,
                            ctx_.options.max_json_values},
      static_cast<RequestParser::Listener*>(this));
  return true;
}

void Connection::start() {
  phase_ = Phase::kIdle;
  deadline_ = now() + ctx_.options.header_timeout_ms;
  update_reading();
  rearm_timer();
}

void Connection::reject(int status) {
  std::string body = fmt::format("{} {}\n", status, status_reason(status));
  HeadFraming framing;
  framing.content_length = body.size();
  framing.keep_alive = false;
  framing.date = ctx_.date();
  if (queue_write({build_response_head(status, {{"Content-Type", "text/plain; charset=utf-8"}}, framing),
                   std::move(body)})) {
    begin_drain();
  }
}

void Connection::begin_stop() {
  if (closing_ || draining_) return;
  if (phase_ == Phase::kHandling) {
    close_after_response_ = true;  // finish_response() drains
  } else if (phase_ == Phase::kIdle && queued_bytes_ > 0) {
    begin_drain();  // let the last response reach the client
  } else if (ctx_.finish_arriving && (phase_ != Phase::kIdle || served_ == 0)) {
    // A hand-over: a request under way, or a connection just accepted whose first request is on
    // its way, would see a reset if closed now (its bytes unread). It is answered, then closed;
    // the header and body timeouts bound a client that sends nothing.
    close_after_response_ = true;
  } else {
    close_now();  // idle, or a request not dispatched yet
  }
}

void Connection::close_now() {
  if (closing_) return;
  closing_ = true;
  reading_ = false;
  if (std::shared_ptr<Responder> lost = std::move(responder_)) {
    ctx_.stats.client_disconnects.fetch_add(1, std::memory_order_relaxed);
    lost->detach_lost();
  }
  uv_timer_stop(&timer_);
  uv_timer_stop(&resume_timer_);
  uv_timer_stop(&probe_timer_);
  uv_close(reinterpret_cast<uv_handle_t*>(&timer_), &Connection::on_handle_closed);
  uv_close(reinterpret_cast<uv_handle_t*>(&resume_timer_), &Connection::on_handle_closed);
  uv_close(reinterpret_cast<uv_handle_t*>(&probe_timer_), &Connection::on_handle_closed);
  if (tcp_open_) uv_close(reinterpret_cast<uv_handle_t*>(&tcp_), &Connection::on_handle_closed);
}

void Connection::on_handle_closed(uv_handle_t* handle) {
  auto* c = static_cast<Connection*>(handle->data);
  if (--c->open_handles_ == 0) c->ctx_.owner->connection_closed(c);  // frees c
}

void Connection::begin_drain() {
  if (closing_ || draining_) return;
  draining_ = true;
  phase_ = Phase::kDraining;
  input_.clear();
  input_pos_ = 0;
  // uv_shutdown waits for the queued writes, then sends FIN.
  int rc = uv_shutdown(&shutdown_req_, stream(), &Connection::on_shutdown);
  if (rc < 0) {
    close_now();
    return;
  }
  drain_deadline_ = now() + ctx_.options.write_timeout_ms;
  update_reading();
  rearm_timer();
}

void Connection::on_shutdown(uv_shutdown_t* req, int status) {
  auto* c = static_cast<Connection*>(req->data);
  if (c->closing_) return;
  if (status < 0) {
    c->close_now();
    return;
  }
  if (c->peer_eof_) {
    c->close_now();  // both directions are done
    return;
  }
  // Linger: read and discard until the client closes, so it sees our response, not a reset.
  c->shutdown_done_ = true;
  c->drain_deadline_ = c->now() + c->ctx_.options.linger_ms;
  c->rearm_timer();
}

// ---- reading ----

void Connection::on_alloc(uv_handle_t* handle, size_t, uv_buf_t* buf) {
  auto* c = static_cast<Connection*>(handle->data);
  *buf = uv_buf_init(c->ctx_.read_buffer.data(), static_cast<unsigned int>(c->ctx_.read_buffer.size()));
}

void Connection::on_read(uv_stream_t* stream, ssize_t nread, const uv_buf_t* buf) {
  auto* c = static_cast<Connection*>(stream->data);
  if (nread == 0 || c->closing_) return;
  if (nread < 0) {
    c->on_peer_eof(nread == UV_EOF);
    return;
  }
  if (c->draining_) return;  // discarded
  c->input_.append(buf->base, static_cast<size_t>(nread));
  c->process_input();
}

void Connection::on_peer_eof(bool clean) {
  reading_ = false;  // libuv stops reading after EOF or a read error
  peer_eof_ = true;
  if (!clean) {
    close_now();  // reset or error: nothing more can be delivered
    return;
  }
  // A half-close: the client sends nothing more but may still read. The request in progress is
  // answered (finish_response() continues from here); complete pipelined requests too.
  if (draining_) {
    if (shutdown_done_ || queued_bytes_ == 0) close_now();  // else on_shutdown closes
    return;
  }
  if (phase_ == Phase::kHandling) {
    if (!response_.http10 && responder_ && responder_->state_ == Responder::State::kNew) {
      probe_interval_ms_ = kFirstProbeMs;
      probe_peer();
    }
    return;
  }
  if (!processing_ && !blocked_on_writes_) end_after_eof();
}

void Connection::end_after_eof() {
  // Everything complete that the client sent was answered; a partial request never completes.
  if (queued_bytes_ == 0) {
    close_now();
  } else {
    begin_drain();  // deliver what is queued, then close
  }
}

void Connection::probe_peer() {
  if (closing_ || draining_ || phase_ != Phase::kHandling || !responder_ ||
      responder_->state_ != Responder::State::kNew) {
    return;
  }
  if (!queue_write({std::string("HTTP/1.1 100 Continue\r\n\r\n")})) return;  // a failure closes
  uv_timer_start(&probe_timer_, &Connection::on_probe, probe_interval_ms_, 0);
  probe_interval_ms_ = std::min(probe_interval_ms_ * 2, kMaxProbeMs);
}

void Connection::on_probe(uv_timer_t* timer) { static_cast<Connection*>(timer->data)->probe_peer(); }

void Connection::update_reading() {
  if (closing_ || peer_eof_) return;
  size_t cap = std::max(kMaxBufferedInput, ctx_.options.max_header_bytes);
  bool want = draining_ || (input_.size() - input_pos_) < cap;
  if (want && !reading_) {
    int rc = uv_read_start(stream(), &Connection::on_alloc, &Connection::on_read);
    if (rc < 0) {
      close_now();
      return;
    }
    reading_ = true;
  } else if (!want && reading_) {
    uv_read_stop(stream());
    reading_ = false;
  }
}

void Connection::on_resume(uv_timer_t* timer) {
  static_cast<Connection*>(timer->data)->process_input();
}

void Connection::process_input() {
  if (processing_ || closing_) return;
  processing_ = true;
  while (!closing_ && !draining_ && phase_ != Phase::kHandling && input_pos_ < input_.size()) {
    if (phase_ == Phase::kIdle && queued_bytes_ > kWriteHighWater) {
      blocked_on_writes_ = true;  // on_write resumes
      break;
    }
    size_t used = 0;
    const RequestParser::Result r = parser_->feed(input_.data() + input_pos_, input_.size() - input_pos_, &used);
    if (closing_) break;  // a write inside a parser callback failed
    input_pos_ += used;
    if (r == RequestParser::Result::kNeedMore) break;
    if (r == RequestParser::Result::kComplete) {
      dispatch();  // the response may finish synchronously: then the loop goes on
      continue;
    }
    log_debug("http: {}: bad request ({}): {}", peer_, parser_->error_status(), parser_->error_reason());
    fail_request(parser_->error_status(), parser_->error_reason());
    break;
  }
  if (input_pos_ >= input_.size()) {
    input_.clear();
    input_pos_ = 0;
  }
  processing_ = false;
  if (peer_eof_ && !closing_ && !draining_ && phase_ != Phase::kHandling && !blocked_on_writes_) {
    end_after_eof();
    return;
  }
  update_reading();
  rearm_timer();
}

void Connection::fail_request(int status, const std::string& reason) {
  switch (status) {
    case 400: ctx_.stats.rejected_bad_request.fetch_add(1, std::memory_order_relaxed); break;
    case 413: ctx_.stats.rejected_body_too_large.fetch_add(1, std::memory_order_relaxed); break;
    case 431: ctx_.stats.rejected_header_too_large.fetch_add(1, std::memory_order_relaxed); break;
    default: break;
  }
  std::string body = reason.empty() ? fmt::format("{} {}\n", status, status_reason(status))
                                    : fmt::format("{} {}: {}\n", status, status_reason(status), reason);
  HeadFraming framing;
  framing.content_length = body.size();
  framing.keep_alive = false;
  framing.date = ctx_.date();
  if (queue_write({build_response_head(status, {{"Content-Type", "text/plain; charset=utf-8"}}, framing),
                   std::move(body)})) {
    begin_drain();
  }
}

// ---- timers ----

void Connection::rearm_timer() {
  if (closing_) return;
  uint64_t due = kNever;
  if (draining_) {
    // Before FIN: the client must keep accepting bytes; after it: the linger time.
    due = (!shutdown_done_ && queued_bytes_ > 0) ? write_deadline_ : drain_deadline_;
  } else {
    if (queued_bytes_ > 0) due = write_deadline_;
    if (phase_ != Phase::kHandling) due = std::min(due, deadline_);
  }
  if (due == kNever) {
    uv_timer_stop(&timer_);
    return;
  }
  uint64_t t = now();
  uv_timer_start(&timer_, &Connection::on_timer, due > t ? due - t : 0, 0);
}

void Connection::on_timer(uv_timer_t* timer) {
  auto* c = static_cast<Connection*>(timer->data);
  if (c->closing_) return;
  uint64_t t = c->now();
  if (c->draining_) {
    if (!c->shutdown_done_ && c->queued_bytes_ > 0 &&
        uv_stream_get_write_queue_size(c->stream()) < c->last_unsent_) {
      c->last_unsent_ = uv_stream_get_write_queue_size(c->stream());
      c->write_deadline_ = t + c->ctx_.options.write_timeout_ms;
      c->rearm_timer();
      return;
    }
    c->close_now();  // flush or linger time is over
    return;
  }
  if (c->queued_bytes_ > 0 && t >= c->write_deadline_) {
    // A large write completes late: bytes leaving libuv's queue count as progress too.
    size_t unsent = uv_stream_get_write_queue_size(c->stream());
    if (unsent < c->last_unsent_) {
      c->last_unsent_ = unsent;
      c->write_deadline_ = t + c->ctx_.options.write_timeout_ms;
      c->rearm_timer();
      return;
    }
    c->ctx_.stats.write_timeouts.fetch_add(1, std::memory_order_relaxed);
    log_debug("http: {}: write timeout", c->peer_);
    c->close_now();
    return;
  }
  if (c->phase_ != Phase::kHandling && t >= c->deadline_) {
    switch (c->phase_) {
      case Phase::kIdle:
        c->ctx_.stats.idle_timeouts.fetch_add(1, std::memory_order_relaxed);
        c->close_now();
        return;
      case Phase::kHeaders:
        c->ctx_.stats.header_timeouts.fetch_add(1, std::memory_order_relaxed);
        c->fail_request(408);
        return;
      case Phase::kBody:
        c->ctx_.stats.body_timeouts.fetch_add(1, std::memory_order_relaxed);
        c->fail_request(408);
        return;
      default:
        break;
    }
  }
  c->rearm_timer();  // woke early (clock granularity)
}

// ---- dispatch and responses ----

void Connection::dispatch() {
  phase_ = Phase::kHandling;
  ++served_;
  ctx_.stats.requests.fetch_add(1, std::memory_order_relaxed);
  Request request = parser_->take();
  request.peer = peer_;
  response_ = ResponseState{};
  response_.head_only = request.method == "HEAD";
  response_.http10 = request.http_major == 1 && request.http_minor == 0;
  if (!request.keep_alive) close_after_response_ = true;
  auto responder = std::make_shared<Responder>(Responder::Key{}, this);
  responder_ = responder;
  rearm_timer();  // no read deadline while the handler works
  try {
    ctx_.router.dispatch(std::move(request), std::move(responder));
  } catch (const std::exception& e) {
    handler_failed(e.what());
  } catch (...) {
    handler_failed("unknown exception");
  }
}

void Connection::handler_failed(const char* what) {
  log_warn("http: {}: handler threw: {}", peer_, what);
  std::shared_ptr<Responder> r = responder_;
  if (!r || closing_) return;
  if (r->state_ == Responder::State::kNew) {
    r->respond(500, {{"Content-Type", "text/plain; charset=utf-8"}}, "500 Internal Server Error\n");
  } else {
    close_now();  // a stream was started: truncate it so the client sees the failure
  }
}

bool Connection::keep_alive_after_response() const {
  return !close_after_response_ && !ctx_.stopping;
}

bool Connection::send_response(int status, Headers headers, std::string body) {
  uv_timer_stop(&probe_timer_);
  if (headers.has_token("Connection", "close")) close_after_response_ = true;
  bool no_body = status_has_no_body(status);
  HeadFraming framing;
  if (!no_body) framing.content_length = body.size();
  framing.keep_alive = keep_alive_after_response();
  framing.http10_client = response_.http10;
  framing.date = ctx_.date();
  // Counted before the bytes can reach the client (stats readers may be on another thread).
  ctx_.stats.responses.fetch_add(1, std::memory_order_relaxed);
  std::vector<std::string> pieces;
  pieces.push_back(build_response_head(status, headers, framing));
  if (!no_body && !response_.head_only) pieces.push_back(std::move(body));
  if (!queue_write(std::move(pieces))) return false;
  finish_response();
  return true;
}

bool Connection::send_stream_head(int status, Headers headers) {
  uv_timer_stop(&probe_timer_);
  if (headers.has_token("Connection", "close")) close_after_response_ = true;
  // HTTP/1.0 has no chunked encoding: the body ends when the connection closes.
  if (response_.http10) close_after_response_ = true;
  response_.chunked = !response_.http10;
  HeadFraming framing;
  framing.chunked = response_.chunked;
  framing.keep_alive = keep_alive_after_response();
  framing.http10_client = response_.http10;
  framing.date = ctx_.date();
  return queue_write({build_response_head(status, headers, framing)});
}

bool Connection::send_chunk(std::string data) {
  if (data.empty() || response_.head_only) return !closing_;
  if (!response_.chunked) return queue_write({std::move(data)});
  std::string size_line = fmt::format("{:x}\r\n", data.size());
  return queue_write({std::move(size_line), std::move(data), std::string("\r\n")});
}

bool Connection::send_stream_end() {
  ctx_.stats.responses.fetch_add(1, std::memory_order_relaxed);
  if (response_.chunked && !response_.head_only) {
    if (!queue_write({std::string("0\r\n\r\n")})) return false;
  }
  finish_response();
  return true;
}

void Connection::finish_response() {
  if (std::shared_ptr<Responder> done = std::move(responder_)) done->detach_finished();
  if (close_after_response_ || ctx_.stopping) {
    begin_drain();
    return;
  }
  phase_ = Phase::kIdle;
  deadline_ = now() + ctx_.options.keepalive_timeout_ms;
  if (peer_eof_ && !processing_ && input_pos_ >= input_.size()) {
    end_after_eof();  // a half-closed client with nothing more to answer
    return;
  }
  // Inside process_input() (a synchronous answer) the parse loop continues by itself; otherwise
  // parse buffered pipelined requests from the loop, not from inside the handler's call.
  if (!processing_) uv_timer_start(&resume_timer_, &Connection::on_resume, 0, 0);
  update_reading();
  rearm_timer();
}

// ---- the parser's phases ----

void Connection::on_request_begin() {
  phase_ = Phase::kHeaders;
  // The first request's header deadline runs from accept; later ones from their first byte.
  if (messages_begun_++ > 0) deadline_ = now() + ctx_.options.header_timeout_ms;
  rearm_timer();
}

void Connection::on_request_head(const Request& request, bool expects_body) {
  phase_ = Phase::kBody;
  deadline_ = now() + ctx_.options.body_timeout_ms;
  rearm_timer();
  if (expects_body && request.http_minor >= 1 && request.headers.has_token("Expect", "100-continue")) {
    queue_write({std::string("HTTP/1.1 100 Continue\r\n\r\n")});
  }
}

}  // namespace sx::daemon::http
