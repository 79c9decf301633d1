// What generate and bench share: the options that pick a model, a backend and a cache size, and
// the steps that open the model (checked before any device memory), create the device and load it.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "daemon/commands/args.h"
#include "runtime/engine/device_group.h"
#include "runtime/engine/model_loader.h"
#include "runtime/engine/qwen2_model.h"
#include "runtime/hal/device.h"

namespace sx::daemon {

// Options added to a command's spec list.
std::vector<Args::Spec> model_session_specs();

struct ModelSession {
  engine::OpenedModel opened;
  engine::DeviceGroup devices;  // tp x pp devices, rank order
  std::unique_ptr<engine::Qwen2Model> model;
  // "cpu:0 (2 threads)" or "6 devices (tp 6 x pp 1): cpu:0 (1 threads), ..."
  std::string devices_summary() const;
};

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
