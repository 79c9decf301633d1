// RankRunner: one job at a time on a dedicated thread.
#include "runtime/engine/rank_runner.h"

namespace sx::engine {

RankRunner::RankRunner() : thread_([this] { loop(); }) {}

RankRunner::~RankRunner() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

void RankRunner::start(std::function<Status()> job) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    job_ = std::move(job);
    has_job_ = true;
    done_ = false;
  }
  cv_.notify_all();
}

Status RankRunner::wait() {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait(lock, [this] { return done_; });
  return result_;
}

void RankRunner::loop() {
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    cv_.wait(lock, [this] { return stop_ || has_job_; });
    if (stop_) return;
    std::function<Status()> job = std::move(job_);
    has_job_ = false;
    lock.unlock();
    Status result = job();
    lock.lock();
    result_ = std::move(result);
    done_ = true;
    cv_.notify_all();
  }
}

}  // namespace sx::engine
