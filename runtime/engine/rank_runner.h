// A rank's runner thread: runs one job at a time (a step of that rank's shard) for the thread that
// drives the model, which starts every rank's job and then waits for all of them.
//
// Threading: start() and wait() from the driving thread only, alternating. Lifetime: the
// destructor stops and joins the thread (after the current job, if any, returns).
#pragma once

#include <condition_variable>
#include <functional>
#include <mutex>
#include <thread>

#include "runtime/base/status.h"

namespace sx::engine {

class RankRunner {
 public:
  RankRunner();
  ~RankRunner();
  RankRunner(const RankRunner&) = delete;
  RankRunner& operator=(const RankRunner&) = delete;

  void start(std::function<Status()> job);
  Status wait();

 private:
  void loop();
  std::mutex mu_;
  std::condition_variable cv_;
  std::function<Status()> job_;
  bool has_job_ = false;
  bool done_ = false;
  bool stop_ = false;
  Status result_;
  std::thread thread_;
};

}  // namespace sx::engine
