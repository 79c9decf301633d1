// daemon/serve/compile_pool.h: jobs run on the pool's threads in order; a job beyond the threads and
// `max_queued` waiting is refused (RESOURCE_EXHAUSTED) at once; stop() ends a running job through
// `stopping`, runs what is queued with `stopping` set, and refuses later jobs (UNAVAILABLE); a
// queued job whose client left (abandoned) holds no place in the queue's bound.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "daemon/serve/compile_pool.h"

namespace sx::daemon::serve {
namespace {

using namespace std::chrono_literals;

// What the jobs saw, shared by them.
struct Log {
  std::mutex mu;
  std::vector<int> ran;          // ids, in the order they started
  std::vector<int> stopped;      // ids that saw `stopping` set
  std::atomic<int> running{0};
};

// Runs until `release` is set or the pool stops.
class Job final : public CompilePool::Job {
 public:
  Job(int id, Log* log, const std::atomic<bool>* release, const std::atomic<bool>* gone = nullptr)
      : id_(id), log_(log), release_(release), gone_(gone) {}
  bool abandoned() const override { return gone_ != nullptr && gone_->load(); }
  void run(const std::atomic<bool>& stopping) override {
    {
      std::lock_guard<std::mutex> lock(log_->mu);
      log_->ran.push_back(id_);
    }
    ++log_->running;
    while (!stopping && !release_->load()) std::this_thread::sleep_for(1ms);
    if (stopping) {
      std::lock_guard<std::mutex> lock(log_->mu);
      log_->stopped.push_back(id_);
    }
    --log_->running;
  }

 private:
  int id_;
  Log* log_;
  const std::atomic<bool>* release_;
  const std::atomic<bool>* gone_;
};

void wait_running(const Log& log, int n) {
  for (int i = 0; i < 2000 && log.running.load() != n; ++i) std::this_thread::sleep_for(1ms);
  ASSERT_EQ(log.running.load(), n);
}

TEST(CompilePool, RefusesAJobBeyondItsThreadsAndQueueAtOnce) {
  Log log;
  std::atomic<bool> release{false};
  CompilePool pool(2);
  for (int id = 0; id < 2; ++id) EXPECT_TRUE(pool.submit(std::make_unique<Job>(id, &log, &release), 1).ok());
  wait_running(log, 2);
  EXPECT_TRUE(pool.submit(std::make_unique<Job>(2, &log, &release), 1).ok());  // waits
  EXPECT_EQ(pool.queued(), 1u);
  const Status full = pool.submit(std::make_unique<Job>(3, &log, &release), 1);
  EXPECT_EQ(full.code(), StatusCode::kResourceExhausted);
  EXPECT_EQ(full.message(), "1 grammar compiles already wait for one of 2 threads");
  release = true;
  for (int i = 0; i < 2000 && (pool.running() != 0 || pool.queued() != 0); ++i) std::this_thread::sleep_for(1ms);
  EXPECT_EQ(pool.running(), 0u);
  EXPECT_EQ(log.ran.size(), 3u);
  EXPECT_EQ(log.ran.back(), 2);
  // max_queued 0: a job runs when a thread is free, and is refused when none is.
  release = false;
  EXPECT_TRUE(pool.submit(std::make_unique<Job>(4, &log, &release), 0).ok());
  EXPECT_TRUE(pool.submit(std::make_unique<Job>(5, &log, &release), 0).ok());
  wait_running(log, 2);
  EXPECT_EQ(pool.submit(std::make_unique<Job>(6, &log, &release), 0).code(), StatusCode::kResourceExhausted);
  release = true;
}

TEST(CompilePool, AQueuedJobWhoseClientLeftHoldsNoPlace) {
  // Issue 53 item 5 under AddressSanitizer: two compiles whose clients had left (one running, one
  // queued) made the next request a 429 until the queued one had run.
  Log log;
  std::atomic<bool> release{false}, gone{false};
  CompilePool pool(1);
  EXPECT_TRUE(pool.submit(std::make_unique<Job>(0, &log, &release), 1).ok());
  wait_running(log, 1);
  EXPECT_TRUE(pool.submit(std::make_unique<Job>(1, &log, &release, &gone), 1).ok());
  EXPECT_EQ(pool.submit(std::make_unique<Job>(2, &log, &release), 1).code(), StatusCode::kResourceExhausted);
  gone = true;  // job 1's client leaves while it waits
  const Status taken = pool.submit(std::make_unique<Job>(3, &log, &release), 1);
  EXPECT_TRUE(taken.ok()) << taken.to_string();
  // The bound still holds for the jobs someone waits for.
  const Status full = pool.submit(std::make_unique<Job>(4, &log, &release), 1);
  EXPECT_EQ(full.code(), StatusCode::kResourceExhausted);
  EXPECT_EQ(full.message(), "1 grammar compiles already wait for one of 1 threads");
  release = true;
  for (int i = 0; i < 2000 && (pool.running() != 0 || pool.queued() != 0); ++i) std::this_thread::sleep_for(1ms);
  EXPECT_EQ(log.ran, (std::vector<int>{0, 1, 3}));  // the abandoned one still runs (and reports back)
}

TEST(CompilePool, StopEndsRunningJobsAndRunsQueuedOnesStopping) {
  Log log;
  std::atomic<bool> release{false};  // never set: only stop() ends them
  CompilePool pool(1);
  EXPECT_TRUE(pool.submit(std::make_unique<Job>(0, &log, &release), 4).ok());
  wait_running(log, 1);
  for (int id = 1; id < 4; ++id) EXPECT_TRUE(pool.submit(std::make_unique<Job>(id, &log, &release), 4).ok());
  const auto t0 = std::chrono::steady_clock::now();
  pool.stop();
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 1s);
  EXPECT_EQ(log.ran, (std::vector<int>{0, 1, 2, 3}));
  EXPECT_EQ(log.stopped, (std::vector<int>{0, 1, 2, 3}));
  EXPECT_EQ(pool.submit(std::make_unique<Job>(9, &log, &release), 4).code(), StatusCode::kUnavailable);
  pool.stop();  // again: nothing
}

}  // namespace
}  // namespace sx::daemon::serve
