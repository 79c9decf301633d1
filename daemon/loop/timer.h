// RAII wrappers over uv_timer_t and uv_signal_t (DESIGN.md §7.6).
//
// Lifetime: a Timer/Signal owns a heap box holding the libuv handle and its callback. Destroying
// or close()-ing the wrapper closes the handle; the box is freed in the close callback, so it is
// safe to destroy the wrapper from inside its own callback. The loop must run once more after
// close() (any uv_run) before uv_loop_close() returns 0.
//
// Threading: create, start, stop, close and destroy on the loop thread only (or before the loop
// runs on another thread). Callbacks run on the loop thread.
//
// Errors: create() and start() return libuv failures as Status; nothing here throws or aborts on
// input.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>

#include <uv.h>

#include "runtime/base/status.h"

namespace sx::daemon::loop {

class Timer {
 public:
  using Callback = std::function<void()>;

  static Result<Timer> create(uv_loop_t* loop);

  Timer() = default;  // empty: every call is a no-op, start() fails
  Timer(Timer&&) noexcept = default;
  Timer& operator=(Timer&& other) noexcept;
  Timer(const Timer&) = delete;
  Timer& operator=(const Timer&) = delete;
  ~Timer() { close(); }

  // Fires `callback` after `timeout_ms`, then every `repeat_ms` if non-zero. Restarting replaces
  // the callback and the schedule.
  Status start(uint64_t timeout_ms, uint64_t repeat_ms, Callback callback);
  void stop();
  bool active() const;
  // Lets the loop exit while this timer is the only active handle (uv_unref).
  void unref();
  // Closes the handle (idempotent); the callback is never called again.
  void close();
  bool valid() const { return box_ != nullptr; }

 private:
  struct Box {
    uv_timer_t handle;
    Callback callback;
  };
  std::unique_ptr<Box> box_;
};

class Signal {
 public:
  using Callback = std::function<void(int signum)>;

  static Result<Signal> create(uv_loop_t* loop);

  Signal() = default;
  Signal(Signal&&) noexcept = default;
  Signal& operator=(Signal&& other) noexcept;
  Signal(const Signal&) = delete;
  Signal& operator=(const Signal&) = delete;
  ~Signal() { close(); }

  // Calls `callback` on the loop thread each time `signum` is delivered to the process.
  Status start(int signum, Callback callback);
  void stop();
  void unref();
  void close();
  bool valid() const { return box_ != nullptr; }

 private:
  struct Box {
    uv_signal_t handle;
    Callback callback;
  };
  std::unique_ptr<Box> box_;
};

}  // namespace sx::daemon::loop
