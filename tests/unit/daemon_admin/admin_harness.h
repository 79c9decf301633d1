// Helpers for the daemon/admin tests: a temporary directory, a libuv loop on its own thread with
// an AdminServer on it, and a blocking Unix-socket line client.
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
#include <optional>
#include <string>
#include <string_view>
#include <thread>
#include <type_traits>
#include <utility>
#include <vector>

#include <gtest/gtest.h>
#include <uv.h>

#include "daemon/admin/admin_server.h"
#include "daemon/loop/async_queue.h"

namespace sx::daemon::admin::testing {

[[noreturn]] inline void hang_abort(const char* what) {
  std::fprintf(stderr, "daemon_admin test: timed out waiting for %s\n", what);
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

// A fresh directory under /tmp (short enough for sun_path), removed with its contents.
class TempDir {
 public:
  TempDir();
  ~TempDir();
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const std::string& path() const { return path_; }
  std::string file(std::string_view name) const { return path_ + "/" + std::string(name); }

 private:
  std::string path_;
};

// Permission bits (st_mode & 07777) of a path, or -1 when it does not exist; lstat.
int mode_of(const std::string& path);
bool is_socket(const std::string& path);
bool exists(const std::string& path);

// Leaves a socket file at `path` that nobody listens on (bind, then close without unlink).
bool make_stale_socket(const std::string& path);

class LineClient {
 public:
  // Connects to the Unix socket at `path`; check connected().
  explicit LineClient(const std::string& path, int timeout_ms = 5000);
  ~LineClient();
  LineClient(const LineClient&) = delete;
  LineClient& operator=(const LineClient&) = delete;

  bool connected() const { return fd_ >= 0; }
  bool send(std::string_view data);
  // Half-closes the write side (the server sees EOF).
  void shutdown_write();
  // One line without its '\n'; nullopt on EOF, error or timeout.
  std::optional<std::string> read_line();
  // True when the server closes (EOF or reset) within the timeout with no unread line pending.
  bool wait_closed();
  void close();

 private:
  int fd_ = -1;
  int timeout_ms_;
  std::string buf_;
};

class AdminHarness {
 public:
  using Task = std::function<void()>;

  AdminHarness() {
    ::signal(SIGPIPE, SIG_IGN);
    EXPECT_EQ(uv_loop_init(&loop_), 0);
    auto tasks = loop::AsyncQueue<Task>::create(&loop_, [](Task t) { t(); });
    EXPECT_TRUE(tasks.ok());
    tasks_ = std::move(tasks).value();
    tasks_sender_ = tasks_->sender();
  }

  ~AdminHarness() {
    if (thread_.joinable()) {
      shutdown();
    } else if (!closed_) {
      close_without_thread();
    }
  }

  // Before run(): starts the server on this thread.
  Result<bool> try_start(AdminOptions options, CommandHandler handler) {
    auto server = AdminServer::start(&loop_, std::move(options), std::move(handler));
    if (!server.ok()) return server.status();
    server_ = std::move(server).value();
    return true;
  }
  bool start(AdminOptions options, CommandHandler handler) {
    auto started = try_start(std::move(options), std::move(handler));
    EXPECT_TRUE(started.ok()) << started.status().to_string();
    return started.ok();
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

  // Stops the server, waits for on_stopped, joins the loop thread and checks that the loop closes.
  void shutdown() {
    if (!thread_.joinable()) {
      if (!closed_) close_without_thread();
      return;
    }
    tasks_sender_.push([this] { stop_on_loop(); });
    if (done_.get_future().wait_for(std::chrono::seconds(15)) != std::future_status::ready) {
      hang_abort("the loop to finish after AdminServer::stop");
    }
    thread_.join();
    closed_ = true;
    EXPECT_TRUE(stopped_);
    EXPECT_EQ(uv_loop_close(&loop_), 0) << "handles left open on the loop";
  }

  // Destroys the server on the loop thread without stop() (~AdminServer closes everything).
  void destroy_server() {
    call([this] {
      std::lock_guard<std::mutex> lock(server_mu_);
      if (server_) last_stats_ = server_->stats();
      server_.reset();
    });
  }

  uv_loop_t* loop() { return &loop_; }
  AdminServer* server() { return server_.get(); }
  // The server's counters (the last ones once the server is gone); any thread.
  AdminStats stats() {
    std::lock_guard<std::mutex> lock(server_mu_);
    return server_ ? server_->stats() : last_stats_;
  }

 private:
  uv_loop_t loop_{};
  std::unique_ptr<loop::AsyncQueue<Task>> tasks_;
  loop::AsyncQueue<Task>::Sender tasks_sender_;
  std::unique_ptr<AdminServer> server_;
  std::thread thread_;
  std::promise<void> done_;
  std::vector<Task> cleanups_;
  bool stop_begun_ = false;  // loop thread
  bool stopped_ = false;
  bool closed_ = false;
  std::mutex server_mu_;
  AdminStats last_stats_;

  // The loop never ran on a thread (a test that only checks start() failing): stop on this thread.
  void close_without_thread() {
    stop_on_loop();
    uv_run(&loop_, UV_RUN_DEFAULT);
    closed_ = true;
    EXPECT_TRUE(stopped_);
    EXPECT_EQ(uv_loop_close(&loop_), 0) << "handles left open on the loop";
  }

  void stop_on_loop() {
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
      server_->stop(finish);
    } else {
      finish();
    }
  }
};

}  // namespace sx::daemon::admin::testing
