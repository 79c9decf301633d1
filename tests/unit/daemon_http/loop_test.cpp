// daemon/loop: AsyncQueue (cross-thread bridge that always drains), Timer and Signal wrappers.
// Every test runs its own loop and ends with uv_loop_close() == 0.
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <memory>
#include <optional>
#include <thread>
#include <utility>
#include <vector>

#include <gtest/gtest.h>

#include "daemon/loop/async_queue.h"
#include "daemon/loop/timer.h"
#include "daemon/loop/uv_status.h"
#include "loop_harness.h"

namespace sx::daemon::loop {
namespace {

using http::testing::hang_abort;

// Runs the loop on a thread and joins it within `timeout_s`, or aborts.
void run_bounded(uv_loop_t* loop, int timeout_s = 10) {
  std::promise<void> done;
  std::thread t([&] {
    uv_run(loop, UV_RUN_DEFAULT);
    done.set_value();
  });
  if (done.get_future().wait_for(std::chrono::seconds(timeout_s)) != std::future_status::ready) {
    hang_abort("uv_run to return");
  }
  t.join();
}

TEST(UvStatus, ConvertsLibuvErrors) {
  EXPECT_TRUE(uv_status(0, "x").ok());
  Status s = uv_status(UV_EADDRINUSE, "listen on 127.0.0.1:80");
  EXPECT_EQ(s.code(), StatusCode::kUnavailable);
  EXPECT_NE(s.message().find("listen on 127.0.0.1:80"), std::string::npos);
  EXPECT_NE(s.message().find("EADDRINUSE"), std::string::npos);
  EXPECT_EQ(uv_status(UV_EINVAL, "x").code(), StatusCode::kInvalidArgument);
}

TEST(AsyncQueue, DeliversEveryItemInOrderFromManyThreads) {
  uv_loop_t loop;
  ASSERT_EQ(uv_loop_init(&loop), 0);
  constexpr int kProducers = 4;
  constexpr int kItems = 5000;
  std::vector<std::vector<int>> received(kProducers);
  int total = 0;
  std::unique_ptr<AsyncQueue<std::pair<int, int>>> queue;
  auto created = AsyncQueue<std::pair<int, int>>::create(&loop, [&](std::pair<int, int> item) {
    received[item.first].push_back(item.second);
    if (++total == kProducers * kItems) queue->close();  // closing from the handler is allowed
  });
  ASSERT_TRUE(created.ok());
  queue = std::move(created).value();
  auto sender = queue->sender();
  std::vector<std::thread> producers;
  for (int p = 0; p < kProducers; ++p) {
    producers.emplace_back([sender, p] {
      for (int i = 0; i < kItems; ++i) EXPECT_TRUE(sender.push({p, i}));
    });
  }
  run_bounded(&loop);  // returns once the handler closed the queue
  for (auto& t : producers) t.join();
  EXPECT_EQ(total, kProducers * kItems);
  for (int p = 0; p < kProducers; ++p) {
    ASSERT_EQ(received[p].size(), static_cast<size_t>(kItems));
    for (int i = 0; i < kItems; ++i) ASSERT_EQ(received[p][i], i) << "producer " << p;
  }
  EXPECT_FALSE(sender.push({0, 0}));  // the sender outlives the queue safely
  queue.reset();
  EXPECT_EQ(uv_loop_close(&loop), 0);
}

TEST(AsyncQueue, OneWakeupDrainsEverythingPushedBeforeIt) {
  uv_loop_t loop;
  ASSERT_EQ(uv_loop_init(&loop), 0);
  int calls = 0;
  std::vector<int> got;
  auto queue = AsyncQueue<int>::create(&loop, [&](int v) {
    ++calls;
    got.push_back(v);
  });
  ASSERT_TRUE(queue.ok());
  for (int i = 0; i < 100; ++i) ASSERT_TRUE((*queue)->push(i));  // 100 sends coalesce
  uv_run(&loop, UV_RUN_NOWAIT);
  EXPECT_EQ(got.size(), 100u);
  EXPECT_EQ(calls, 100);
  (*queue)->close();
  uv_run(&loop, UV_RUN_DEFAULT);
  EXPECT_EQ(uv_loop_close(&loop), 0);
}

TEST(AsyncQueue, CloseDropsUndeliveredItemsAndRefusesPushes) {
  uv_loop_t loop;
  ASSERT_EQ(uv_loop_init(&loop), 0);
  auto token = std::make_shared<int>(7);
  std::weak_ptr<int> watch = token;
  int delivered = 0;
  auto queue = AsyncQueue<std::shared_ptr<int>>::create(&loop, [&](std::shared_ptr<int>) { ++delivered; });
  ASSERT_TRUE(queue.ok());
  auto sender = (*queue)->sender();
  ASSERT_TRUE(sender.push(std::move(token)));
  (*queue)->close();
  EXPECT_TRUE(watch.expired()) << "undelivered items are destroyed by close()";
  EXPECT_FALSE(sender.push(std::make_shared<int>(1)));
  EXPECT_FALSE((*queue)->push(std::make_shared<int>(1)));
  uv_run(&loop, UV_RUN_DEFAULT);
  EXPECT_EQ(delivered, 0);
  EXPECT_EQ(uv_loop_close(&loop), 0);
}

TEST(Timer, FiresRepeatsAndMayBeDestroyedInsideItsCallback) {
  uv_loop_t loop;
  ASSERT_EQ(uv_loop_init(&loop), 0);
  auto created = Timer::create(&loop);
  ASSERT_TRUE(created.ok());
  std::optional<Timer> timer(std::move(created).value());
  int fired = 0;
  auto start = std::chrono::steady_clock::now();
  ASSERT_TRUE(timer->start(20, 10, [&] {
                      if (++fired == 3) timer.reset();  // destroys the wrapper mid-callback
                    }).ok());
  run_bounded(&loop);
  auto elapsed = std::chrono::steady_clock::now() - start;
  EXPECT_EQ(fired, 3);
  EXPECT_GE(elapsed, std::chrono::milliseconds(35));
  EXPECT_EQ(uv_loop_close(&loop), 0);
}

TEST(Timer, StopAndCloseAreIdempotent) {
  uv_loop_t loop;
  ASSERT_EQ(uv_loop_init(&loop), 0);
  auto timer = Timer::create(&loop);
  ASSERT_TRUE(timer.ok());
  bool fired = false;
  ASSERT_TRUE(timer->start(1, 0, [&] { fired = true; }).ok());
  EXPECT_TRUE(timer->active());
  timer->stop();
  EXPECT_FALSE(timer->active());
  timer->close();
  timer->close();
  EXPECT_FALSE(timer->start(1, 0, [] {}).ok());
  uv_run(&loop, UV_RUN_DEFAULT);
  EXPECT_FALSE(fired);
  EXPECT_EQ(uv_loop_close(&loop), 0);
}

TEST(Signal, DeliversOnTheLoopThread) {
  uv_loop_t loop;
  ASSERT_EQ(uv_loop_init(&loop), 0);
  auto created = Signal::create(&loop);
  ASSERT_TRUE(created.ok());
  std::optional<Signal> sig(std::move(created).value());
  std::atomic<int> got{0};
  std::thread::id loop_thread;
  ASSERT_TRUE(sig->start(SIGUSR1, [&](int signum) {
                   got = signum;
                   loop_thread = std::this_thread::get_id();
                   sig.reset();
                 }).ok());
  std::promise<void> done;
  std::thread t([&] {
    uv_run(&loop, UV_RUN_DEFAULT);
    done.set_value();
  });
  std::thread::id runner = t.get_id();
  ::kill(::getpid(), SIGUSR1);
  if (done.get_future().wait_for(std::chrono::seconds(10)) != std::future_status::ready) {
    hang_abort("the signal");
  }
  t.join();
  EXPECT_EQ(got.load(), SIGUSR1);
  EXPECT_EQ(loop_thread, runner);
  EXPECT_EQ(uv_loop_close(&loop), 0);
}

}  // namespace
}  // namespace sx::daemon::loop
