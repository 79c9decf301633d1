// ThreadPool implementation: generation counter + spin-then-sleep workers.
#include "runtime/base/thread_pool.h"

#include <sched.h>

#include <chrono>

namespace sx {

namespace {
inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#endif
}
// Waiting strategy: spin briefly (a job follows within microseconds during decode), then yield the
// core (so an oversubscribed machine still makes progress), then sleep (workers only).
constexpr int kSpinIterations = 1 << 12;
constexpr int kYieldIterations = 1 << 10;

// Waits until done() holds: spins, then yields the processor between checks.
template <typename Done>
void spin_then_yield(Done done) {
  for (int i = 0; !done(); ++i) {
    if (i < kSpinIterations) {
      cpu_relax();
    } else {
      std::this_thread::yield();
    }
  }
}
}  // namespace

int hardware_threads() {
  cpu_set_t set;
  if (sched_getaffinity(0, sizeof(set), &set) == 0) {
    int n = CPU_COUNT(&set);
    if (n > 0) return n;
  }
  unsigned n = std::thread::hardware_concurrency();
  return n > 0 ? static_cast<int>(n) : 1;
}

ThreadPool::ThreadPool(int n_threads) : n_threads_(n_threads < 1 ? 1 : n_threads) {
  threads_.reserve(n_threads_ - 1);
  for (int i = 1; i < n_threads_; ++i) threads_.emplace_back([this, i] { worker(i); });
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_.store(true);
    generation_.fetch_add(1);
  }
  cv_.notify_all();
  for (auto& t : threads_) t.join();
}

void ThreadPool::run_job(int index) {
  if (all_fn_ != nullptr) {
    (*all_fn_)(index, n_threads_);
    return;
  }
  for (;;) {
    std::int64_t t = next_task_.fetch_add(1, std::memory_order_relaxed);
    if (t >= n_tasks_) break;
    (*task_fn_)(t);
  }
}

void ThreadPool::worker(int index) {
  std::uint64_t seen = 0;
  for (;;) {
    std::uint64_t g = generation_.load(std::memory_order_acquire);
    int spins = 0;
    while (g == seen) {
      ++spins;
      if (spins < kSpinIterations) {
        cpu_relax();
      } else if (spins < kSpinIterations + kYieldIterations) {
        std::this_thread::yield();
      } else {
        std::unique_lock<std::mutex> lock(mu_);
        cv_.wait(lock, [&] { return generation_.load(std::memory_order_acquire) != seen; });
      }
      g = generation_.load(std::memory_order_acquire);
    }
    seen = g;
    if (stop_.load()) return;
    run_job(index);
    pending_.fetch_sub(1, std::memory_order_acq_rel);
  }
}

void ThreadPool::dispatch() {
  pending_.store(n_threads_ - 1, std::memory_order_relaxed);
  {
    std::lock_guard<std::mutex> lock(mu_);
    generation_.fetch_add(1, std::memory_order_release);
  }
  cv_.notify_all();
  run_job(0);
  spin_then_yield([&] { return pending_.load(std::memory_order_acquire) == 0; });
  task_fn_ = nullptr;
  all_fn_ = nullptr;
}

void ThreadPool::parallel_for(std::int64_t n_tasks, const std::function<void(std::int64_t)>& fn) {
  if (n_tasks <= 0) return;
  if (n_threads_ == 1 || n_tasks == 1) {
    for (std::int64_t i = 0; i < n_tasks; ++i) fn(i);
    return;
  }
  task_fn_ = &fn;
  all_fn_ = nullptr;
  n_tasks_ = n_tasks;
  next_task_.store(0, std::memory_order_relaxed);
  dispatch();
}

void ThreadPool::run_on_all(const std::function<void(int, int)>& fn) {
  if (n_threads_ == 1) {
    fn(0, 1);
    return;
  }
  all_fn_ = &fn;
  task_fn_ = nullptr;
  dispatch();
}

}  // namespace sx
