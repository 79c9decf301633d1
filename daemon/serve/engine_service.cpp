// EngineService: the engine thread.
#include "daemon/serve/engine_service.h"

#include "runtime/base/log.h"

namespace sx::daemon::serve {

EngineService::EngineService(engine::Engine& engine) : engine_(engine), thread_([this] { run(); }) {}

EngineService::~EngineService() { stop(); }

void EngineService::stop() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

void EngineService::wake() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    pending_ = true;
  }
  cv_.notify_one();
}

Result<std::uint64_t> EngineService::submit(std::vector<std::int32_t> prompt, engine::RequestOptions options,
                                            engine::EventCallback on_event) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stopping_) return unavailable_error("the engine is shutting down");
  }
  SX_ASSIGN_OR_RETURN(std::uint64_t id, engine_.submit(std::move(prompt), std::move(options), std::move(on_event)));
  wake();
  return id;
}

void EngineService::cancel(std::uint64_t id) {
  engine_.cancel(id);
  wake();
}

std::uint64_t EngineService::failed_steps() const {
  std::lock_guard<std::mutex> lock(mu_);
  return failed_steps_;
}

void EngineService::run() {
  for (;;) {
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [&] { return stopping_ || pending_; });
      if (stopping_) return;
      pending_ = false;
    }
    while (engine_.has_work()) {
      {
        std::lock_guard<std::mutex> lock(mu_);
        if (stopping_) return;
      }
      if (Status s = engine_.step(); !s.ok()) {
        log_error("engine step failed (its requests end with an error): {}", s.to_string());
        std::lock_guard<std::mutex> lock(mu_);
        ++failed_steps_;
      }
    }
  }
}

}  // namespace sx::daemon::serve
