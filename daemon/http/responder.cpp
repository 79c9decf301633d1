// Responder: how a handler answers one request, now or later.
#include "daemon/http/responder.h"

#include <utility>

#include "daemon/http/connection.h"
#include "runtime/base/log.h"

namespace sx::daemon::http {

Responder::Responder(Key, Connection* connection) : connection_(connection) {}

bool Responder::respond(int status, Headers headers, std::string body) {
  if (!connection_) return false;
  if (state_ != State::kNew) {
    log_warn("http: respond() on a response that was already started");
    return false;
  }
  state_ = State::kDone;
  return connection_->send_response(status, std::move(headers), std::move(body));
}

bool Responder::start_stream(int status, Headers headers) {
  if (!connection_) return false;
  if (state_ != State::kNew) {
    log_warn("http: start_stream() on a response that was already started");
    return false;
  }
  state_ = State::kStreaming;
  return connection_->send_stream_head(status, std::move(headers));
}

bool Responder::write_chunk(std::string data) {
  if (!connection_ || state_ != State::kStreaming) return false;
  return connection_->send_chunk(std::move(data));
}

bool Responder::end_stream() {
  if (!connection_ || state_ != State::kStreaming) return false;
  state_ = State::kDone;
  return connection_->send_stream_end();
}

void Responder::on_close(std::function<void()> callback) {
  if (!callback) return;
  if (closed()) {
    callback();
    return;
  }
  if (finished()) return;  // never fires
  on_close_.push_back(std::move(callback));
}

size_t Responder::queued_bytes() const { return connection_ ? connection_->queued_bytes() : 0; }

void Responder::detach_finished() {
  connection_ = nullptr;
  state_ = State::kDone;
  finished_.store(true, std::memory_order_release);
  on_close_.clear();
}

void Responder::detach_lost() {
  connection_ = nullptr;
  state_ = State::kDone;
  closed_.store(true, std::memory_order_release);
  std::vector<std::function<void()>> callbacks = std::move(on_close_);
  on_close_.clear();
  for (auto& cb : callbacks) cb();
}

}  // namespace sx::daemon::http
