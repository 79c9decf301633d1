// What generate and bench share: the options that pick a model, a backend and a cache size, and
// the steps that open the model (checked before any device memory), create the device and load it.
#pragma once

#include <atomic>

#include <functional>
#include <string>
#include <string_view>

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "daemon/commands/args.h"
#include "daemon/config/serve_config.h"
#include "runtime/engine/device_group.h"
#include "runtime/engine/memory_planner.h"
#include "runtime/engine/model_loader.h"
#include "runtime/engine/model.h"
#include "runtime/hal/device.h"

namespace sx::daemon {

// Options added to a command's spec list.
std::vector<Args::Spec> model_session_specs();

// Everything that shapes a session, from flags (session_options) or from `sextant serve`'s config.
struct SessionOptions {
  std::string backend = "cpu";
  int threads = 0;  // 0: all
  int tp = 1, pp = 1;
  bool requantize_unaligned = false;  // parallel::PlanOptions::requantize_unaligned
  // engine/smoke_test.h before the memory plan: "auto" (tp x pp > 1 on a backend other than the
  // CPU), "on", "off".
  std::string smoke_test = "auto";
  // Stop after the memory plan (`sextant doctor`): devices created, smoke test run, nothing loaded.
  bool plan_only = false;
  std::int64_t context_tokens = 0;  // KV capacity per request (0: the model's context length)
  bool cap_context = false;         // context_tokens is an estimate: cap it at the model's context
  std::int64_t max_seqs = 1;        // requests that can all reach context_tokens at once
  std::int64_t max_batch_tokens = 512;
  std::int64_t block_size = 16;
  std::int64_t state_snapshots = -1;  // a hybrid's prefix-cache snapshots (MemoryPlanOptions::state_snapshots)
  hal::DType kv_dtype = hal::DType::kF32;
  double memory_utilization = 0.9;
  std::uint64_t memory_budget = 0;  // bytes each device may use, as the backend option "memory_budget" (0: unset)
  std::vector<int> device_indices;  // the backend's devices for the ranks, rank order (empty: 0 .. tp*pp-1)
  hal::DeviceOptions device_options;  // further backend options, passed on by name (device_options.h)
  bool verbose = false;             // print the memory plan per device and layer
  // When set and true, open_session stops with CANCELLED at its next step (see ModelOptions).
  const std::atomic<bool>* cancel = nullptr;
  // Called as each step of open_session succeeds: ("devices", "cpu:0 (2 threads)"), ("plan", the
  // one-line summary), ("load", ...). Unset: the plan summary goes to stderr.
  std::function<void(std::string_view phase, const std::string& detail)> on_phase;
};

// A replica's session as `sextant serve`'s config describes it (model, engine and parallel
// settings; the caller adds the replica's devices, threads and hooks).
SessionOptions session_options(const config::ServeConfig& c);

struct ModelSession {
  engine::OpenedModel opened;
  engine::DeviceGroup devices;  // tp x pp devices, rank order
  std::unique_ptr<engine::Model> model;
  std::string plan_text;     // the memory plan as printed by `sextant plan --verbose`
  std::string plan_summary;  // its one-line summary
  std::optional<engine::MemoryPlan> memory_plan;
  std::string smoke_summary;  // the smoke test's result, "" when it did not run
  std::int64_t context_tokens = 0, max_seqs = 0;
  int tp = 1, pp = 1;
  // "cpu:0 (2 threads)" or "6 devices (tp 6 x pp 1): cpu:0 (1 threads), ..."
  std::string devices_summary() const;
};

// The session options given by the flags of model_session_specs().
Result<SessionOptions> session_options(const Args& args, std::int64_t context_tokens, std::int64_t max_seqs);

// Creates the devices, checks the memory plan (refusing what cannot fit, before any device
// memory is used) and loads the model.
Result<ModelSession> open_session(const SessionOptions& options, engine::OpenedModel opened);

// Opens the model named by --model (no device memory yet).
Result<engine::OpenedModel> open_model_arg(const Args& args);

// Creates the devices (--tp x --pp of --backend, threads split between them) and loads the model. context_tokens: KV capacity needed (rounded up to
// blocks; capped by the model's context; --ctx overrides).
Result<ModelSession> open_session(const Args& args, engine::OpenedModel opened, std::int64_t context_tokens);
// The same for `max_seqs` concurrent requests of up to context_tokens each (the KV pool holds all of
// them; the model returns logits for max_seqs rows per step).
Result<ModelSession> open_session(const Args& args, engine::OpenedModel opened, std::int64_t context_tokens,
                                  std::int64_t max_seqs);

// Prints "sextant <cmd>: <error>" to stderr and returns exit code 1 (or 2 for usage errors).
int report_error(std::string_view command, const Status& status);

}  // namespace sx::daemon
