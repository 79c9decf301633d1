// One replica of the served model (DESIGN.md §5 "Replicas"): its devices, model session, engine,
// engine thread and state machine, and the loop thread's bookkeeping of the work routed to it.
//
// States: loading -> ready -> draining -> stopped, or failed (a device error in a step: taken out
// of rotation; what it had not started streaming is retried elsewhere by the daemon). A replica of
// an older generation drains after a reload and is destroyed once its last request ends.
//
// Threading: load() runs on a loader thread and touches nothing shared; everything else is the
// loop thread's, except the EngineService, which is thread-safe (engine_service.h).
// Errors: load() returns the first failing phase's status and names the phase in `failed_phase`.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "daemon/commands/model_session.h"
#include "daemon/config/serve_config.h"
#include "daemon/replicas/router.h"
#include "daemon/serve/engine_service.h"
#include "runtime/engine/engine.h"

namespace sx::daemon::replicas {

enum class ReplicaState { kLoading, kReady, kDraining, kStopped, kFailed };
std::string_view replica_state_name(ReplicaState s);

struct ReplicaOptions {
  const config::ServeConfig* config = nullptr;
  int index = 0, generation = 1;
  std::vector<int> devices;  // the backend's device indexes, rank order
  int threads = 0;           // host threads of this replica (backends that compute on the host); 0: unset
  // Test hook: the device option "fail_at_op" for this replica (a backend that has it fails that
  // op, as a device error would), from $SEXTANT_FAULT_REPLICA (replicas.cpp).
  std::int64_t fail_at_op = 0;
  const std::atomic<bool>* cancel = nullptr;  // a shutdown: the load stops at its next step
};

class Replica {
 public:
  // Model check -> devices -> plan -> load -> engine -> warm-up, each logged as
  // "serve: replica G.I: phase P: ok (...)".
  static Result<std::unique_ptr<Replica>> load(const ReplicaOptions& options, std::string* failed_phase);
  ~Replica();
  Replica(const Replica&) = delete;
  Replica& operator=(const Replica&) = delete;

  // Starts the engine thread (loop thread, once the replica's generation goes into service).
  void start();
  // Stops the engine thread (after its current step); later submits fail with UNAVAILABLE.
  void stop();

  int index() const { return index_; }
  int generation() const { return generation_; }
  // "1.0" (generation 1, index 0): the replica label of status and /metrics
  std::string label() const;
  // "replica 1.0", for the log
  std::string name() const;
  ModelSession& session() { return *session_; }
  const tokenizer::Tokenizer& tokenizer() const { return *session_->opened.tokenizer; }
  serve::EngineService& service() { return *service_; }
  engine::EngineStats stats() const;
  std::int64_t max_request_tokens() const;

  // Loop thread's bookkeeping.
  ReplicaState state = ReplicaState::kLoading;
  std::int64_t running = 0;                // engine requests routed here and not finished
  std::int64_t pending_prompt_tokens = 0;  // their prompt tokens not prefilled yet (expected)
  PrefixIndex prefixes;

 private:
  Replica() = default;
  int index_ = 0, generation_ = 1;
  std::unique_ptr<ModelSession> session_;
  std::unique_ptr<engine::Engine> engine_;
  std::unique_ptr<serve::EngineService> service_;
};

// The replicas of one configuration, loaded one after another on the caller's (loader) thread:
// model.replicas resolved against the backend's devices, CPU threads divided between replicas.
// `generation` numbers them; `on_replica` is called as each finishes loading (for the log).
Result<std::vector<std::unique_ptr<Replica>>> load_replicas(const config::ServeConfig& config, int generation,
                                                            const std::atomic<bool>* cancel,
                                                            std::string* failed_phase);

}  // namespace sx::daemon::replicas
