// CompilePool: the threads that compile structured output's grammars (requests.cpp), apart from
// libuv's thread pool, which parses and tokenizes every request: a compile may take seconds on a
// large vocabulary, and none may make a plain request wait (issue 53 item 5). A few threads at a
// lower CPU priority (nice +5 each: the engine and the loop go first on a busy machine) behind a
// bounded FIFO queue.
//
// Lifetime: stop() (also run by the destructor) marks the pool stopping, runs every job still
// queued at once (each sees `stopping` set and reports back without compiling), waits for the
// running ones (a compile polls `stopping` and ends within milliseconds) and joins the threads.
// Jobs are destroyed on the pool thread that ran them.
// Threading: submit() and stop() on one thread (the loop); a job's run() on a pool thread.
// Errors: submit() refuses a job with RESOURCE_EXHAUSTED when `max_queued` jobs already wait, and
// with UNAVAILABLE once stopped; a refused job is destroyed on the caller's thread.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstddef>
#include <deque>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "runtime/base/status.h"

namespace sx::daemon::serve {

class CompilePool {
 public:
  class Job {
   public:
    virtual ~Job() = default;
    // On a pool thread, once. `stopping` turns true when the pool stops: the job ends early.
    virtual void run(const std::atomic<bool>& stopping) = 0;
    // Whether nobody waits for the job's result any more (its client left): such a job ends as
    // soon as it runs, so while queued it holds no place in the queue's bound. Asked of queued
    // jobs only (never once run() began), under the pool's lock, from submit()'s thread.
    virtual bool abandoned() const { return false; }
  };

  // `threads` at least 1.
  explicit CompilePool(int threads);
  ~CompilePool();
  CompilePool(const CompilePool&) = delete;
  CompilePool& operator=(const CompilePool&) = delete;

  // Queues `job` unless `max_queued` jobs already wait for a thread (0: none may wait, a job runs
  // only when a thread is free). Abandoned queued jobs do not count as waiting.
  Status submit(std::unique_ptr<Job> job, std::size_t max_queued);
  void stop();

  // Jobs waiting for a thread, and jobs running.
  std::size_t queued() const;
  std::size_t running() const;

 private:
  void worker();

  mutable std::mutex mu_;
  std::condition_variable wake_;
  std::deque<std::unique_ptr<Job>> queue_;  // guarded by mu_
  std::size_t running_ = 0;                  // guarded by mu_
  std::size_t threads_ = 0;
  std::atomic<bool> stopping_{false};
  std::vector<std::thread> workers_;
};

}  // namespace sx::daemon::serve
