// RAII wrappers over uv_timer_t and uv_signal_t.
#include "daemon/loop/timer.h"

#include "daemon/loop/uv_status.h"

namespace sx::daemon::loop {

// ---- Timer ----

Result<Timer> Timer::create(uv_loop_t* loop) {
  auto box = std::make_unique<Box>();
  SX_RETURN_IF_ERROR(uv_status(uv_timer_init(loop, &box->handle), "uv_timer_init"));
  box->handle.data = box.get();
  Timer timer;
  timer.box_ = std::move(box);
  return timer;
}

Timer& Timer::operator=(Timer&& other) noexcept {
  if (this != &other) {
    close();
    box_ = std::move(other.box_);
  }
  return *this;
}

Status Timer::start(uint64_t timeout_ms, uint64_t repeat_ms, Callback callback) {
  if (!box_) return failed_precondition_error("Timer::start on a closed timer");
  box_->callback = std::move(callback);
  return uv_status(uv_timer_start(&box_->handle,
                                  [](uv_timer_t* h) {
                                    auto* box = static_cast<Box*>(h->data);
                                    // Copy: the callback may restart this timer (replacing
                                    // box->callback) while it runs.
                                    Callback cb = box->callback;
                                    if (cb) cb();
                                  },
                                  timeout_ms, repeat_ms),
                   "uv_timer_start");
}

void Timer::stop() {
  if (box_) uv_timer_stop(&box_->handle);
}

bool Timer::active() const {
  return box_ && uv_is_active(reinterpret_cast<const uv_handle_t*>(&box_->handle)) != 0;
}

void Timer::unref() {
  if (box_) uv_unref(reinterpret_cast<uv_handle_t*>(&box_->handle));
}

void Timer::close() {
  if (!box_) return;
  uv_timer_stop(&box_->handle);
  close_and_free(std::move(box_), &Box::handle);
}

// ---- Signal ----

Result<Signal> Signal::create(uv_loop_t* loop) {
  auto box = std::make_unique<Box>();
  SX_RETURN_IF_ERROR(uv_status(uv_signal_init(loop, &box->handle), "uv_signal_init"));
  box->handle.data = box.get();
  Signal signal;
  signal.box_ = std::move(box);
  return signal;
}

Signal& Signal::operator=(Signal&& other) noexcept {
  if (this != &other) {
    close();
    box_ = std::move(other.box_);
  }
  return *this;
}

Status Signal::start(int signum, Callback callback) {
  if (!box_) return failed_precondition_error("Signal::start on a closed signal handle");
  box_->callback = std::move(callback);
  return uv_status(uv_signal_start(&box_->handle,
                                   [](uv_signal_t* h, int sig) {
                                     auto* box = static_cast<Box*>(h->data);
                                     Callback cb = box->callback;
                                     if (cb) cb(sig);
                                   },
                                   signum),
                   "uv_signal_start");
}

void Signal::stop() {
  if (box_) uv_signal_stop(&box_->handle);
}

void Signal::unref() {
  if (box_) uv_unref(reinterpret_cast<uv_handle_t*>(&box_->handle));
}

void Signal::close() {
  if (!box_) return;
  uv_signal_stop(&box_->handle);
  close_and_free(std::move(box_), &Box::handle);
}

}  // namespace sx::daemon::loop
