// ModelSession: open model -> device -> load.
#include "daemon/commands/model_session.h"

#include <cstdio>

#include "backends/registry.h"
#include "daemon/diagnose/known_failures.h"
#include "runtime/engine/smoke_test.h"
#include "runtime/engine/memory_planner.h"
#include "runtime/kv/kv_cache_manager.h"
#include "runtime/parallel/shard_plan.h"
#include "daemon/commands/commands.h"
#include "runtime/base/log.h"

namespace sx::daemon {

namespace {

std::uint64_t total_capacity(std::span<const engine::DeviceBudget> budgets) {
  std::uint64_t sum = 0;
  for (const engine::DeviceBudget& b : budgets) sum += b.capacity_bytes;
  return sum;
}

}  // namespace

std::vector<Args::Spec> model_session_specs() {
  return {
      {{"-m", "--model"}, true, false, "model: a GGUF file or a Hugging Face safetensors directory", "PATH"},
      {{"--backend"}, true, false, "backend to run on (default: cpu)", "NAME"},
      {{"-t", "--threads"}, true, false, "CPU threads (default: all; split between the ranks)", "N"},
      {{"--tp"}, true, false, "tensor-parallel ranks, any count that the heads allow (default 1)", "N"},
      {{"--pp"}, true, false, "pipeline stages (default 1)", "M"},
      {{"--requantize-unaligned"}, false, false,
       "where the o / down weights' blocks allow no split for --tp, re-quantise them to Q8_0 at load", ""},
      {{"--smoke-test"}, false, false,
       "first run the bundled model through the same TP x PP layout and check its text (default: for tp x pp > 1 "
       "on GPU backends)",
       ""},
      {{"--device-option"}, true, true, "a backend device option, e.g. threads=2 (repeatable; see the README)",
       "NAME=VALUE"},
      {{"--ctx"}, true, false, "KV cache capacity in tokens (default: what the request needs)", "N"},
      {{"--kv-dtype"}, true, false, "KV cache format: f32 (default), f16, bf16", "TYPE"},
      {{"--max-batch-tokens"}, true, false, "tokens per forward step / prefill chunk (default 512)", "N"},
      {{"--verbose"}, false, false, "print the memory plan (per device and per layer) before loading", ""},
  };
}

Result<engine::OpenedModel> open_model_arg(const Args& args) {
  auto path = args.get("--model");
  if (!path) return invalid_argument_error("--model FILE is required");
  SX_ASSIGN_OR_RETURN(const std::string resolved, resolve_model_path(*path, false));
  SX_ASSIGN_OR_RETURN(engine::OpenedModel m, engine::open_model(resolved));
  for (const std::string& w : m.check.warnings) log_warn("{}", w);
  return m;
}

Result<ModelSession> open_session(const Args& args, engine::OpenedModel opened, std::int64_t context_tokens) {
  return open_session(args, std::move(opened), context_tokens, 1);
}

Result<ModelSession> open_session(const Args& args, engine::OpenedModel opened, std::int64_t context_tokens,
                                  std::int64_t max_seqs) {
  SX_ASSIGN_OR_RETURN(SessionOptions o, session_options(args, context_tokens, max_seqs));
  return open_session(o, std::move(opened));
}

Result<SessionOptions> session_options(const Args& args, std::int64_t context_tokens, std::int64_t max_seqs) {
  SessionOptions o;
  SX_ASSIGN_OR_RETURN(o.backend, args.get_string("--backend", "cpu"));
  SX_ASSIGN_OR_RETURN(std::int64_t threads, args.get_int("--threads", 0, 0, 1024));
  SX_ASSIGN_OR_RETURN(std::int64_t tp, args.get_int("--tp", 1, 1, 64));
  SX_ASSIGN_OR_RETURN(std::int64_t pp, args.get_int("--pp", 1, 1, 1024));
  o.threads = static_cast<int>(threads);
  o.tp = static_cast<int>(tp);
  o.pp = static_cast<int>(pp);
  o.requantize_unaligned = args.has("--requantize-unaligned");
  if (args.has("--smoke-test")) o.smoke_test = "on";
  for (const std::string& kv : args.get_all("--device-option")) {
    const std::size_t eq = kv.find('=');
    if (eq == std::string::npos || eq == 0) {
      return invalid_argument_error("--device-option {}: expected NAME=VALUE", kv);
    }
    const std::string name = kv.substr(0, eq), value = kv.substr(eq + 1);
    char* end = nullptr;
    const long long n = std::strtoll(value.c_str(), &end, 10);
    if (value == "true" || value == "false") {
      o.device_options.set(name, value == "true");
    } else if (!value.empty() && end != nullptr && *end == '\0') {
      o.device_options.set(name, static_cast<std::int64_t>(n));
    } else {
      o.device_options.set(name, value);
    }
  }
  SX_ASSIGN_OR_RETURN(o.max_batch_tokens, args.get_int("--max-batch-tokens", 512, 1, 1 << 20));
  SX_ASSIGN_OR_RETURN(std::string kv_name, args.get_string("--kv-dtype", "f32"));
  auto kv_type = hal::dtype_from_name(kv_name);
  if (!kv_type || (*kv_type != hal::DType::kF32 && *kv_type != hal::DType::kF16 && *kv_type != hal::DType::kBF16)) {
    return invalid_argument_error("--kv-dtype must be f32, f16 or bf16, got '{}'", kv_name);
  }
  o.kv_dtype = *kv_type;
  SX_ASSIGN_OR_RETURN(o.context_tokens, args.get_int("--ctx", context_tokens, 1, INT64_MAX));
  o.cap_context = !args.has("--ctx");
  o.max_seqs = max_seqs;
  o.verbose = args.has("--verbose");
  return o;
}

SessionOptions session_options(const config::ServeConfig& c) {
  SessionOptions so;
  so.backend = c.model.backend;
  so.tp = static_cast<int>(c.model.tp);
  so.pp = static_cast<int>(c.model.pp);
  so.requantize_unaligned = c.model.requantize_unaligned;
  so.context_tokens = c.engine.max_model_len;
  so.max_seqs = c.engine.max_num_seqs;
  so.max_batch_tokens = c.engine.max_num_batched_tokens;
  so.block_size = c.engine.block_size;
  so.memory_utilization = c.engine.memory_utilization;
  so.memory_budget = c.engine.memory_budget.value_or(0);
  so.smoke_test = c.engine.smoke_test;
  so.state_snapshots = c.engine.enable_prefix_caching ? c.engine.prefix_snapshots : 0;
  return so;
}

Result<ModelSession> open_session(const SessionOptions& o, engine::OpenedModel opened) {
  ModelSession s;
  s.opened = std::move(opened);
  const model::ModelConfig& c = s.opened.config;
  std::string why;
  SX_ASSIGN_OR_RETURN(hal::Backend * backend, backends::default_registry().pick(o.backend, &why));
  if (o.backend == "auto") log_info("backend {}", why);
  // Passed on by name for the backend to take or refuse (its own options: device_options.h).
  hal::DeviceOptions dopts = o.device_options;
  if (o.threads > 0) dopts.set("threads", o.threads);
  if (o.memory_budget > 0) dopts.set("memory_budget", o.memory_budget);
  if (!o.device_indices.empty() && o.device_indices.size() != static_cast<std::size_t>(o.tp * o.pp)) {
    return invalid_argument_error("{} device indexes for tp {} x pp {} ranks", o.device_indices.size(), o.tp, o.pp);
  }
  SX_ASSIGN_OR_RETURN(s.devices, o.device_indices.empty()
                                     ? engine::create_device_group(*backend, o.tp * o.pp, dopts)
                                     : engine::create_device_group(*backend, o.device_indices, dopts));
  auto phase = [&](std::string_view name, const std::string& detail) {
    if (o.on_phase) o.on_phase(name, detail);
  };
  s.tp = o.tp;
  s.pp = o.pp;
  phase("devices", s.devices_summary());
  // Small model first (engine/smoke_test.h), on the same devices and channels as the real one.
  const bool smoke = o.smoke_test == "on" || (o.smoke_test == "auto" && o.tp * o.pp > 1 && backend->name() != "cpu");
  if (smoke) {
    const std::string bundled = engine::find_smoke_model();
    if (bundled.empty()) {
      if (o.smoke_test == "on") {
        return not_found_error("smoke test: the bundled model (memorise-f16.gguf) is not installed; set "
                               "SEXTANT_SMOKE_MODEL to its path or engine.smoke_test: off");
      }
      log_warn("smoke test skipped: the bundled model (memorise-f16.gguf) is not installed");
    } else {
      SX_ASSIGN_OR_RETURN(const engine::SmokeResult r,
                          engine::run_smoke_test(bundled, *backend, s.devices.devices, o.tp, o.pp));
      const std::string detail = r.steps > 0 ? fmt::format("the bundled model's text through tp {} x pp {}: {} tokens "
                                                           "as memorised ({:.2f} s)",
                                                           o.tp, o.pp, r.steps, r.seconds)
                                             : "skipped: " + r.skipped;
      if (!o.on_phase) std::fprintf(stderr, "smoke test: %s\n", detail.c_str());
      phase("smoke test", detail);
      s.smoke_summary = detail;
    }
  }

  engine::ModelOptions mo;
  mo.cancel = o.cancel;
  mo.max_batch_tokens = o.max_batch_tokens;
  mo.kv.dtype = o.kv_dtype;
  mo.kv.block_size = o.block_size;
  if (o.context_tokens > c.context_length && !o.cap_context) {
    return invalid_argument_error("a context of {} tokens (--ctx / engine.max_model_len) exceeds the model's context "
                                  "length of {}", o.context_tokens, c.context_length);
  }
  const std::int64_t ctx =
      o.context_tokens > 0 ? std::min<std::int64_t>(o.context_tokens, c.context_length) : c.context_length;
  // Every sequence at full length at once, + the null block.
  mo.kv.num_blocks = o.max_seqs * ((ctx + mo.kv.block_size - 1) / mo.kv.block_size) + 1;
  mo.max_batch_tokens = std::min<std::int64_t>(mo.max_batch_tokens, mo.kv.usable_tokens());
  mo.max_logit_rows = o.max_seqs;
  mo.max_blocks_per_seq = (ctx + mo.kv.block_size - 1) / mo.kv.block_size;
  s.context_tokens = ctx;
  s.max_seqs = o.max_seqs;
  engine::ParallelOptions po;
  po.tp = o.tp;
  po.pp = o.pp;
  po.requantize_unaligned = o.requantize_unaligned;

  // The memory plan for exactly this session, before any weight is loaded: refuse what cannot fit.
  SX_ASSIGN_OR_RETURN(parallel::WeightTypes types, parallel::weight_types_from_source(*s.opened.weights, c));
  SX_ASSIGN_OR_RETURN(parallel::ShardPlan shards, parallel::plan_shards(c, types, {po.tp, po.pp, mo.kv.dtype, po.requantize_unaligned}));
  engine::MemoryPlanOptions mpo;
  mpo.memory_utilization = o.memory_utilization;
  mpo.max_model_len = ctx;
  mpo.max_num_seqs = o.max_seqs;
  mpo.max_num_batched_tokens = mo.max_batch_tokens;
  mpo.block_size = mo.kv.block_size;
  mpo.state_snapshots = o.state_snapshots;
  // Whatever the backend: its devices say whether they share one memory or each have their own.
  std::vector<hal::DeviceInfo> infos;
  for (const hal::Device* d : s.devices.devices) infos.push_back(d->info());
  // What the channels take beyond the model on each device (NCCL's buffers): the rank's TP group
  // and, with PP, the pipeline group of every rank.
  const std::uint64_t channels = backend->channel_reserve_bytes(o.tp) + (o.pp > 1 ? backend->channel_reserve_bytes(o.tp * o.pp) : 0);
  SX_ASSIGN_OR_RETURN(const std::vector<engine::DeviceBudget> budgets,
                      engine::group_budgets(infos, o.tp * o.pp, channels));
  SX_ASSIGN_OR_RETURN(engine::MemoryPlan plan, engine::plan_memory(c, types, shards, budgets, mpo));
  s.plan_text = engine::format_memory_plan(plan, true);
  if (o.verbose) std::fputs(s.plan_text.c_str(), stderr);
  SX_RETURN_IF_ERROR(engine::memory_plan_status(plan));
  s.memory_plan = plan;
  mo.state_snapshots = plan.state_snapshots;
  std::uint64_t weights = 0, workspace = 0;
  for (const engine::DeviceMemory& d : plan.devices) {
    weights += d.weights;
    workspace += d.workspace;
  }
  s.plan_summary = fmt::format(
      "{:.1f} MB of weights and {:.1f} MB of workspace on {} device(s), KV cache for {} tokens ({} request(s) of {}); "
      "fits in {} of memory x {:.2g}",
      static_cast<double>(weights) / 1e6, static_cast<double>(workspace) / 1e6, plan.devices.size(),
      mo.kv.usable_tokens(), o.max_seqs, ctx,
      engine::gib(infos.front().shared_memory ? infos.front().memory_bytes : total_capacity(budgets)),
      o.memory_utilization);
  if (!o.on_phase) std::fprintf(stderr, "memory plan: %s\n", s.plan_summary.c_str());
  phase("plan", s.plan_summary);
  if (o.plan_only) return s;
  SX_ASSIGN_OR_RETURN(s.model, engine::Model::load(*s.opened.weights, c, *backend, s.devices.devices, po, mo));
  return s;
}

std::string ModelSession::devices_summary() const {
  if (devices.devices.size() == 1) return devices.devices[0]->info().name;
  std::string out = fmt::format("{} devices (tp {} x pp {}):", devices.devices.size(), tp, pp);
  for (const hal::Device* d : devices.devices) out += (d == devices.devices[0] ? " " : ", ") + d->info().name;
  return out;
}

int report_error(std::string_view command, const Status& status) {
  // Messages quote paths and variables the user gave: no control character reaches the terminal.
  std::fprintf(stderr, "sextant %.*s: %s\n", static_cast<int>(command.size()), command.data(),
               printable_text(status.to_string()).c_str());
  // A known failure (daemon/diagnose): its root cause and fix on one more line.
  if (const std::string why = diagnose::cause_and_fix(status); !why.empty()) {
    std::fprintf(stderr, "sextant %.*s: %s\n", static_cast<int>(command.size()), command.data(), why.c_str());
  }
  return status.code() == StatusCode::kInvalidArgument ? 2 : 1;
}

}  // namespace sx::daemon
