// A fork-join thread pool for compute kernels.
//
// parallel_for(n, fn) runs fn(i) for i in [0, n) across the pool's threads plus the calling thread
// and returns when all are done. Workers spin briefly between jobs (decode issues hundreds of small
// jobs per token) and then sleep on a condition variable.
//
// Threading: one parallel_for at a time per pool (the owning device stream serialises calls);
// fn must not throw and must not call back into the same pool.
// Lifetime: the destructor joins the workers.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace sx {

class ThreadPool {
 public:
  // n_threads counts the caller: n_threads == 1 means no worker threads.
  explicit ThreadPool(int n_threads);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int size() const { return n_threads_; }

  // Runs fn(task) for task in [0, n_tasks), dynamically load-balanced.
  void parallel_for(std::int64_t n_tasks, const std::function<void(std::int64_t)>& fn);

  // Runs fn(thread_index, n_threads) once on each thread (static partitioning).
  void run_on_all(const std::function<void(int, int)>& fn);

 private:
  void worker(int index);
  void run_job(int index);
  // Publishes the job set up in task_fn_/all_fn_ to the workers, runs the caller's share, waits.
  void dispatch();

  int n_threads_;
  std::vector<std::thread> threads_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::atomic<std::uint64_t> generation_{0};
  std::atomic<int> pending_{0};
  std::atomic<std::int64_t> next_task_{0};
  std::atomic<bool> stop_{false};
  std::int64_t n_tasks_ = 0;
  const std::function<void(std::int64_t)>* task_fn_ = nullptr;
  const std::function<void(int, int)>* all_fn_ = nullptr;
};

// Number of hardware threads usable by this process (sched affinity aware), at least 1.
int hardware_threads();

}  // namespace sx
