// Server: the HTTP/1.1 server on libuv + llhttp.
#include "daemon/http/server.h"

#include <unordered_map>

#include "daemon/http/connection.h"
#include "daemon/loop/uv_status.h"
#include "runtime/base/log.h"

namespace sx::daemon::http {

Status ServerOptions::validate() const {
  if (host.empty()) return invalid_argument_error("http.host: empty");
  if (backlog <= 0) return invalid_argument_error("server.backlog: must be > 0 (got {})", backlog);
  if (max_connections == 0) return invalid_argument_error("server.max_connections: must be > 0");
  if (max_header_bytes < 256) {
    return invalid_argument_error("server.max_header_bytes: must be >= 256 (got {})", max_header_bytes);
  }
  if (max_queued_write_bytes == 0) return invalid_argument_error("server.max_queued_write_bytes: must be > 0");
  struct {
    const char* name;
    uint64_t value;
  } timeouts[] = {{"header_timeout_ms", header_timeout_ms},
                  {"body_timeout_ms", body_timeout_ms},
                  {"keepalive_timeout_ms", keepalive_timeout_ms},
                  {"write_timeout_ms", write_timeout_ms},
                  {"linger_ms", linger_ms}};
  for (const auto& t : timeouts) {
    if (t.value == 0) return invalid_argument_error("server.{}: must be > 0", t.name);
  }
  return ok_status();
}

class Server::Impl final : public ConnectionOwner {
 public:
  Impl(uv_loop_t* loop, ServerOptions options, Router router) {
    ctx_.loop = loop;
    ctx_.owner = this;
    ctx_.options = std::move(options);
    ctx_.router = std::move(router);
    uv_timer_init(loop, &grace_timer_);  // cannot fail
    grace_timer_.data = this;
    ++open_handles_;
  }

  Status listen() {
    const ServerOptions& o = ctx_.options;
    sockaddr_storage addr{};
    if (uv_ip4_addr(o.host.c_str(), o.port, reinterpret_cast<sockaddr_in*>(&addr)) != 0 &&
        uv_ip6_addr(o.host.c_str(), o.port, reinterpret_cast<sockaddr_in6*>(&addr)) != 0) {
      return invalid_argument_error("http.host: '{}' is not an IPv4 or IPv6 address", o.host);
    }
    SX_RETURN_IF_ERROR(loop::uv_status(uv_tcp_init(ctx_.loop, &listener_), "uv_tcp_init"));
    listener_.data = this;
    listener_open_ = true;
    ++open_handles_;
    std::string where = fmt::format("listen on {}:{}", o.host, o.port);
    if (o.listen_fd >= 0) {
      where = fmt::format("take over the listening socket (descriptor {})", o.listen_fd);
      SX_RETURN_IF_ERROR(loop::uv_status(uv_tcp_open(&listener_, o.listen_fd), where));
    } else {
      SX_RETURN_IF_ERROR(loop::uv_status(uv_tcp_bind(&listener_, reinterpret_cast<sockaddr*>(&addr), 0), where));
    }
    if (o.accept_now) SX_RETURN_IF_ERROR(start_accepting());
    sockaddr_storage bound{};
    int len = sizeof(bound);
    SX_RETURN_IF_ERROR(loop::uv_status(
        uv_tcp_getsockname(&listener_, reinterpret_cast<sockaddr*>(&bound), &len), "uv_tcp_getsockname"));
    port_ = ntohs(bound.ss_family == AF_INET6 ? reinterpret_cast<sockaddr_in6*>(&bound)->sin6_port
                                              : reinterpret_cast<sockaddr_in*>(&bound)->sin_port);
    return ok_status();
  }

  Status start_accepting() {
    if (accepting_ || !listener_open_ || stop_requested_) return ok_status();
    SX_RETURN_IF_ERROR(loop::uv_status(
        uv_listen(reinterpret_cast<uv_stream_t*>(&listener_), ctx_.options.backlog, &Impl::on_connection),
        fmt::format("listen on {}:{}", ctx_.options.host, port_ != 0 ? port_ : ctx_.options.port)));
    accepting_ = true;
    return ok_status();
  }

  int listen_fd() const {
    return listener_open_ ? loop::handle_fd(reinterpret_cast<const uv_handle_t*>(&listener_)) : -1;
  }

  uint16_t port() const { return port_; }
  const StatsCounters& stats() const { return ctx_.stats; }
  bool finished() const { return finished_; }

  void stop(std::function<void()> on_stopped, uint64_t grace_ms, Server::StopMode mode) {
    if (on_stopped) {
      if (on_stopped_) {
        on_stopped_ = [a = std::move(on_stopped_), b = std::move(on_stopped)] { a(); b(); };
      } else {
        on_stopped_ = std::move(on_stopped);
      }
    }
    if (!stop_requested_) {
      stop_requested_ = true;
      ctx_.stopping = true;
      ctx_.finish_arriving = mode == Server::StopMode::kFinishArriving;
      if (listener_open_ && !listener_closing_) {
        listener_closing_ = true;
        uv_close(reinterpret_cast<uv_handle_t*>(&listener_), &Impl::on_handle_closed);
      }
      // close_now() only schedules closes; the map changes in close callbacks, not here.
      for (auto& entry : connections_) entry.first->begin_stop();
    }
    if (grace_ms == 0) {
      for (auto& entry : connections_) entry.first->close_now();
    } else if (grace_ms != kNoGraceLimit && !grace_closing_) {
      uv_timer_start(&grace_timer_, &Impl::on_grace, grace_ms, 0);
    }
    maybe_finish();
  }

  // The owner is gone: close everything; this object frees itself when the last handle closed.
  static void abandon(std::unique_ptr<Impl> impl) {
    Impl* raw = impl.get();
    raw->on_stopped_ = nullptr;
    raw->self_ = std::move(impl);
    raw->stop(nullptr, 0, Server::StopMode::kCloseArriving);
  }

  void connection_closed(Connection* c) override {
    if (c->rejected()) {
      --rejecting_;
    } else {
      --active_;
      ctx_.stats.open_connections.store(active_, std::memory_order_relaxed);
    }
    connections_.erase(c);
    maybe_finish();  // may free this object: nothing after
  }

 private:
  static void on_connection(uv_stream_t* listener, int status) {
    auto* self = static_cast<Impl*>(listener->data);
    if (status < 0) {
      log_warn("http: accept: {}", uv_strerror(status));
      return;
    }
    self->accept_one(listener);
  }

  void accept_one(uv_stream_t* listener) {
    bool over = active_ >= ctx_.options.max_connections;
    auto owned = std::make_unique<Connection>(ctx_, /*rejected=*/over);
    Connection* c = owned.get();
    connections_.emplace(c, std::move(owned));
    ctx_.stats.accepted_connections.fetch_add(1, std::memory_order_relaxed);
    if (over) {
      ++rejecting_;
    } else {
      ++active_;
      ctx_.stats.open_connections.store(active_, std::memory_order_relaxed);
    }
    // From here on `c` ends through connection_closed(), whatever happens.
    if (!c->open(listener)) return;
    if (!over) {
      c->start();
      return;
    }
    ctx_.stats.rejected_over_capacity.fetch_add(1, std::memory_order_relaxed);
    if (rejecting_ > std::max<size_t>(16, ctx_.options.max_connections) ||
        active_ + rejecting_ > ctx_.options.max_sockets) {
      c->close_now();  // a flood: do not spend buffers and time on 503s
    } else {
      c->reject(503);
    }
  }

  static void on_grace(uv_timer_t* timer) {
    auto* self = static_cast<Impl*>(timer->data);
    if (!self->connections_.empty()) {
      log_warn("http: stop: grace period over, closing {} connection(s)", self->connections_.size());
    }
    for (auto& entry : self->connections_) entry.first->close_now();
  }

  static void on_handle_closed(uv_handle_t* handle) {
    auto* self = static_cast<Impl*>(handle->data);
    --self->open_handles_;
    self->maybe_finish();  // may free self
  }

  void maybe_finish() {
    if (!stop_requested_ || finished_) return;
    if (connections_.empty() && !grace_closing_) {
      grace_closing_ = true;
      uv_timer_stop(&grace_timer_);
      uv_close(reinterpret_cast<uv_handle_t*>(&grace_timer_), &Impl::on_handle_closed);
    }
    if (open_handles_ > 0 || !connections_.empty()) return;
    finished_ = true;
    std::function<void()> callback = std::move(on_stopped_);
    if (self_) {
      std::unique_ptr<Impl> self = std::move(self_);  // abandoned: free now, no callback
      return;
    }
    if (callback) callback();  // may destroy the Server and this object
  }

  ServerContext ctx_;
  uv_tcp_t listener_{};
  uv_timer_t grace_timer_{};
  int open_handles_ = 0;
  bool listener_open_ = false;
  bool listener_closing_ = false;
  bool accepting_ = false;
  bool grace_closing_ = false;
  std::unordered_map<Connection*, std::unique_ptr<Connection>> connections_;
  size_t active_ = 0;     // accepted, not rejected, not closed
  size_t rejecting_ = 0;  // rejected, not closed yet
  uint16_t port_ = 0;
  bool stop_requested_ = false;
  bool finished_ = false;
  std::function<void()> on_stopped_;
  std::unique_ptr<Impl> self_;  // set by abandon()
};

Result<std::unique_ptr<Server>> Server::start(uv_loop_t* loop, ServerOptions options, Router router) {
  SX_RETURN_IF_ERROR(options.validate());
  auto impl = std::make_unique<Impl>(loop, std::move(options), std::move(router));
  Status status = impl->listen();
  if (!status.ok()) {
    Impl::abandon(std::move(impl));
    return status;
  }
  return std::make_unique<Server>(std::move(impl));
}

Server::Server(std::unique_ptr<Impl> impl) : impl_(std::move(impl)), port_(impl_->port()) {}

Server::~Server() {
  if (!impl_ || impl_->finished()) return;
  Impl::abandon(std::move(impl_));
}

Status Server::start_accepting() { return impl_ ? impl_->start_accepting() : ok_status(); }

int Server::listen_fd() const { return impl_ ? impl_->listen_fd() : -1; }

void Server::stop(std::function<void()> on_stopped, uint64_t grace_ms, StopMode mode) {
  if (impl_) impl_->stop(std::move(on_stopped), grace_ms, mode);
}

ServerStats Server::stats() const { return impl_ ? impl_->stats().snapshot() : ServerStats{}; }

}  // namespace sx::daemon::http
