// EngineService: the engine thread of `sextant serve` (DESIGN.md §3 steps 3-6, §7.5).
//
// One thread runs Engine::step() while the engine has work and sleeps on a condition variable
// otherwise; submit() and cancel() wake it. Event callbacks run on that thread: the caller's
// callback must only hand the event over (e.g. push it onto a loop::AsyncQueue), never block.
//
// Threading: submit(), cancel(), stats() from any thread. Lifetime: the engine must outlive the
// service; stop() (or the destructor) joins the thread after the current step; requests still in
// the engine then get no more events.
// Errors: submit() returns the engine's INVALID_ARGUMENT (bad parameters, prompt too long) and
// UNAVAILABLE after stop(). A failed step finishes its requests with kError events (the engine
// does that) and is logged; the thread goes on with the next requests.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <thread>
#include <vector>

#include "runtime/base/status.h"
#include "runtime/engine/engine.h"

namespace sx::daemon::serve {

class EngineService {
 public:
  explicit EngineService(engine::Engine& engine);
  ~EngineService();
  EngineService(const EngineService&) = delete;
  EngineService& operator=(const EngineService&) = delete;

  Result<std::uint64_t> submit(std::vector<std::int32_t> prompt, engine::RequestOptions options,
                               engine::EventCallback on_event);
  void cancel(std::uint64_t id);
  engine::EngineStats stats() { return engine_.stats(); }
  // Steps that failed (device errors), for status and metrics.
  std::uint64_t failed_steps() const;
  void stop();

 private:
  void run();
  void wake();

  engine::Engine& engine_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  bool stopping_ = false;
  bool pending_ = false;  // work arrived since the thread last looked
  std::uint64_t failed_steps_ = 0;
  std::thread thread_;
};

}  // namespace sx::daemon::serve
