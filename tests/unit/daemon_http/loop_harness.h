// LoopHarness: a libuv loop on its own thread, a Server on it, and bounded waits, for the
// daemon/http tests.
//
// The server is started on the test thread before the loop thread runs; afterwards everything
// that touches handles goes through call()/post() (an AsyncQueue of closures). shutdown() stops
// the server, closes the harness' queue, joins the loop thread and checks uv_loop_close() == 0.
// Every wait is bounded: a hang aborts the test binary with a message instead of blocking CI.
#pragma once

#include <signal.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <future>
#include <memory>
#include <mutex>
#include <thread>
#include <type_traits>
#include <utility>
#include <vector>

#include <gtest/gtest.h>
#include <uv.h>

#include "daemon/http/server.h"
#include "daemon/loop/async_queue.h"

namespace sx::daemon::http::testing {

[[noreturn]] inline void hang_abort(const char* what) {
  std::fprintf(stderr, "daemon_http test: timed out waiting for %s\n", what);
  std::fflush(stderr);
  std::abort();
}

// Polls `pred` every 5 ms for up to `timeout_ms`.
template <typename Pred>
bool wait_until(Pred pred, int timeout_ms = 3000) {
  auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
  while (std::chrono::steady_clock::now() < deadline) {
    if (pred()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return pred();
}

class LoopHarness {
 public:
  using Task = std::function<void()>;

  LoopHarness() {
    ::signal(SIGPIPE, SIG_IGN);
    EXPECT_EQ(uv_loop_init(&loop_), 0);
    auto tasks = loop::AsyncQueue<Task>::create(&loop_, [](Task t) { t(); });
    EXPECT_TRUE(tasks.ok());
    tasks_ = std::move(tasks).value();
    tasks_sender_ = tasks_->sender();
  }

  ~LoopHarness() {
    if (thread_.joinable()) shutdown();
  }

  // Before run(): starts the server on this thread.
  bool start_server(ServerOptions options, Router router) {
    auto server = Server::start(&loop_, std::move(options), std::move(router));
    EXPECT_TRUE(server.ok()) << server.status().to_string();
    if (!server.ok()) return false;
    server_ = std::move(server).value();
    port_ = server_->bound_port();
    return true;
  }

  void run() {
    thread_ = std::thread([this] {
      uv_run(&loop_, UV_RUN_DEFAULT);
      done_.set_value();
    });
  }

  // Runs `f` on the loop thread and returns its result (bounded wait).
  template <typename F>
  auto call(F f) -> std::invoke_result_t<F> {
    using R = std::invoke_result_t<F>;
    auto promise = std::make_shared<std::promise<R>>();
    std::future<R> future = promise->get_future();
    post([promise, f = std::move(f)]() mutable {
      if constexpr (std::is_void_v<R>) {
        f();
        promise->set_value();
      } else {
        promise->set_value(f());
      }
    });
    if (future.wait_for(std::chrono::seconds(10)) != std::future_status::ready) hang_abort("a loop call");
    return future.get();
  }

  void post(Task task) { EXPECT_TRUE(tasks_sender_.push(std::move(task))); }

  // Registers loop-thread cleanup (closing a test's own handles) run before the server stops.
  void at_shutdown(Task task) { cleanups_.push_back(std::move(task)); }

  // Begins Server::stop(grace_ms) from the test thread without waiting (shutdown() then waits).
  void begin_stop(uint64_t grace_ms = Server::kNoGraceLimit,
                  Server::StopMode mode = Server::StopMode::kCloseArriving) {
    post([this, grace_ms, mode] { stop_on_loop(grace_ms, mode); });
  }

  // Stops the server with `grace_ms` (unless begin_stop() did), waits for on_stopped, joins the
  // loop thread and checks that the loop closes.
  void shutdown(uint64_t grace_ms = Server::kNoGraceLimit) {
    if (!thread_.joinable()) return;
    // Refused when a begin_stop() already finished (the queue is closed): nothing left to do.
    tasks_sender_.push([this, grace_ms] { stop_on_loop(grace_ms); });
    if (done_.get_future().wait_for(std::chrono::seconds(15)) != std::future_status::ready) {
      hang_abort("the loop to finish after Server::stop");
    }
    thread_.join();
    EXPECT_TRUE(stopped_);
    EXPECT_EQ(uv_loop_close(&loop_), 0) << "handles left open on the loop";
  }

  uv_loop_t* loop() { return &loop_; }
  Server* server() { return server_.get(); }
  uint16_t port() const { return port_; }
  // The server's counters (the last ones once the server is gone); any thread.
  ServerStats stats() {
    std::lock_guard<std::mutex> lock(server_mu_);
    return server_ ? server_->stats() : last_stats_;
  }


 private:
  uv_loop_t loop_{};
  std::unique_ptr<loop::AsyncQueue<Task>> tasks_;
  loop::AsyncQueue<Task>::Sender tasks_sender_;
  std::unique_ptr<Server> server_;
  uint16_t port_ = 0;
  std::thread thread_;
  std::promise<void> done_;
  std::vector<Task> cleanups_;
  bool stop_begun_ = false;  // loop thread
  bool stopped_ = false;
  std::mutex server_mu_;  // guards server_ against stats() from the test thread
  ServerStats last_stats_;

  void stop_on_loop(uint64_t grace_ms, Server::StopMode mode = Server::StopMode::kCloseArriving) {
    if (stop_begun_) return;
    stop_begun_ = true;
    for (auto& c : cleanups_) c();
    cleanups_.clear();
    auto finish = [this] {
      stopped_ = true;
      std::lock_guard<std::mutex> lock(server_mu_);
      if (server_) last_stats_ = server_->stats();
      server_.reset();  // destroying the server inside on_stopped is allowed
      tasks_->close();
    };
    if (server_) {
      server_->stop(finish, grace_ms, mode);
    } else {
      finish();
    }
  }
};

}  // namespace sx::daemon::http::testing
