// The grammar compile threads (compile_pool.h).
#include "daemon/serve/compile_pool.h"

#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>

namespace sx::daemon::serve {

namespace {

// A compile thread yields to the engine's and the loop's threads on a busy machine (Linux gives
// each thread its own nice value). Best effort: a failure changes nothing else.
void lower_priority() {
  const auto tid = static_cast<id_t>(::syscall(SYS_gettid));
  (void)::setpriority(PRIO_PROCESS, tid, 5);
}

}  // namespace

CompilePool::CompilePool(int threads) : threads_(static_cast<std::size_t>(std::max(threads, 1))) {
  for (std::size_t i = 0; i < threads_; ++i) workers_.emplace_back([this] { worker(); });
}

CompilePool::~CompilePool() { stop(); }

Status CompilePool::submit(std::unique_ptr<Job> job, std::size_t max_queued) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stopping_.load()) return unavailable_error("the server is stopping");
    // The jobs that would wait for a thread, this one included; a queued job whose client left
    // ends as soon as a thread takes it, and takes no place.
    const auto queued = static_cast<std::size_t>(
        std::count_if(queue_.begin(), queue_.end(), [](const std::unique_ptr<Job>& j) { return !j->abandoned(); }));
    const std::size_t idle = threads_ - running_;
    const std::size_t waiting = queued + 1 > idle ? queued + 1 - idle : 0;
    if (waiting > max_queued) {
      return resource_exhausted_error("{} grammar compiles already wait for one of {} threads", queued, threads_);
    }
    queue_.push_back(std::move(job));
  }
  wake_.notify_one();
  return ok_status();
}

void CompilePool::stop() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stopping_.load() && workers_.empty()) return;
    stopping_.store(true);
  }
  wake_.notify_all();
  for (std::thread& t : workers_) t.join();
  workers_.clear();
}

std::size_t CompilePool::queued() const {
  std::lock_guard<std::mutex> lock(mu_);
  return queue_.size();
}

std::size_t CompilePool::running() const {
  std::lock_guard<std::mutex> lock(mu_);
  return running_;
}

void CompilePool::worker() {
  lower_priority();
  for (;;) {
    std::unique_ptr<Job> job;
    {
      std::unique_lock<std::mutex> lock(mu_);
      wake_.wait(lock, [this] { return stopping_.load() || !queue_.empty(); });
      // Stopping: what is still queued runs now (each job sees `stopping` and reports back).
      if (queue_.empty()) return;
      job = std::move(queue_.front());
      queue_.pop_front();
      ++running_;
    }
    job->run(stopping_);
    job.reset();
    std::lock_guard<std::mutex> lock(mu_);
    --running_;
  }
}

}  // namespace sx::daemon::serve
