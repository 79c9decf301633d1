// One replica: loading it (the start-up phases of one engine), its engine thread and its stats.
#include "daemon/replicas/replica.h"

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <optional>
#include <thread>

#include <fmt/format.h>

#include "backends/registry.h"
#include "daemon/config/replica_spec.h"
#include "daemon/commands/commands.h"
#include "runtime/base/fnv.h"
#include "runtime/base/log.h"
#include "runtime/engine/model_loader.h"
#include "runtime/hal/topology_text.h"
#include "runtime/parallel/placement.h"

namespace sx::daemon::replicas {

std::string_view replica_state_name(ReplicaState s) {
  switch (s) {
    case ReplicaState::kLoading: return "loading";
    case ReplicaState::kReady: return "ready";
    case ReplicaState::kDraining: return "draining";
    case ReplicaState::kStopped: return "stopped";
    case ReplicaState::kFailed: return "failed";
  }
  return "?";
}

std::string Replica::label() const { return fmt::format("{}.{}", generation_, index_); }

std::string Replica::name() const { return "replica " + label(); }

Replica::~Replica() { stop(); }

void Replica::start() {
  if (!service_) service_ = std::make_unique<serve::EngineService>(*engine_);
  state = ReplicaState::kReady;
}

void Replica::stop() {
  if (service_) service_->stop();
}

engine::EngineStats Replica::stats() const { return engine_->stats(); }

std::int64_t Replica::max_request_tokens() const {
  return std::min(session_->model->max_request_tokens(), session_->context_tokens);
}

namespace {

// The identity of a model's weights for the prefix cache's files (engine::EngineConfig::
// cache_salt): each file's name, size and first and last MiB (a directory: its files in name order).
// The same file gives the same value after a reload or an upgrade; another file another.
std::uint64_t weights_identity(const std::string& path) {
  namespace fs = std::filesystem;
  std::vector<fs::path> files;
  std::error_code ec;
  if (fs::is_directory(path, ec)) {
    for (const auto& e : fs::directory_iterator(path, ec)) {
      if (e.is_regular_file(ec)) files.push_back(e.path());
    }
    std::sort(files.begin(), files.end());
  } else {
    files.push_back(path);
  }
  Fnv1a h;
  std::vector<char> buf(std::size_t{1} << 20);
  for (const fs::path& f : files) {
    const std::string name = f.filename().string();
    const std::uint64_t size = fs::file_size(f, ec);
    h.add(name).add_value(size);
    std::ifstream in(f, std::ios::binary);
    for (const std::uint64_t at : {std::uint64_t{0}, size > buf.size() ? size - buf.size() : 0}) {
      in.clear();
      in.seekg(static_cast<std::streamoff>(at));
      in.read(buf.data(), static_cast<std::streamsize>(buf.size()));
      h.add(buf.data(), static_cast<std::size_t>(in.gcount()));
    }
  }
  return h.value;
}

}  // namespace

Result<std::unique_ptr<Replica>> Replica::load(const ReplicaOptions& o, std::string* failed_phase) {
  const config::ServeConfig& c = *o.config;
  std::unique_ptr<Replica> r(new Replica());
  r->index_ = o.index;
  r->generation_ = o.generation;
  r->prefixes = PrefixIndex(static_cast<std::size_t>(c.engine.block_size));
  const std::string who = r->name();
  std::string phase = "model check";
  auto failed = [&](Status s) -> Status {
    if (failed_phase != nullptr) *failed_phase = phase;
    return s;
  };
  auto cancelled = [&] { return o.cancel != nullptr && o.cancel->load(std::memory_order_relaxed); };
  // A model reference (ORG/NAME) loads its cached snapshot, pulled first when model.pull says so.
  auto path = resolve_model_path(c.model.path, c.model.pull == "missing");
  if (!path.ok()) return failed(path.status());
  if (*path != c.model.path) log_info("serve: {}: model {} is {}", who, c.model.path, *path);
  auto opened = engine::open_model(*path);
  if (!opened.ok()) return failed(opened.status());
  if (cancelled()) return failed(cancelled_error("shutdown requested after the model check"));
  log_info("serve: {}: phase model check: ok ({}, {} layers, context {})", who, c.model.path, opened->config.n_layers,
           opened->config.context_length);
  // What the load leaves out or works around (e.g. a Qwen3.5 checkpoint's vision tower).
  for (const std::string& w : opened->check.warnings) log_warn("serve: {}: {}", who, w);
  phase = "devices";
  SessionOptions so = session_options(c);  // backend "auto": open_session picks and logs why
  so.threads = o.threads;
  so.device_indices = o.devices;
  if (o.fail_at_op > 0) so.device_options.set("fail_at_op", o.fail_at_op);
  so.cancel = o.cancel;
  so.on_phase = [&](std::string_view done, const std::string& detail) {
    log_info("serve: {}: phase {}: ok ({})", who, done, detail);
    phase = done == "devices" ? "plan or load" : "load";
  };
  auto session = open_session(so, std::move(opened).value());
  if (!session.ok()) return failed(session.status());
  r->session_ = std::make_unique<ModelSession>(std::move(session).value());
  if (cancelled()) return failed(cancelled_error("shutdown requested after the weights were loaded"));
  log_info("serve: {}: phase load: ok ({} MB of weights; KV cache for {} requests of {} tokens)", who,
           r->session_->model->weight_bytes() / 1000000, r->session_->max_seqs, r->session_->context_tokens);
  phase = "engine";
  engine::EngineConfig ec;
  ec.scheduler.max_num_batched_tokens = r->session_->model->options().max_batch_tokens;
  ec.scheduler.max_num_seqs = c.engine.max_num_seqs;
  ec.scheduler.max_step_ms = c.engine.max_step_ms;
  ec.scheduler.max_step_ratio = c.engine.max_step_ratio;
  ec.scheduler.max_model_len = r->max_request_tokens();
  ec.prefix_caching = c.engine.enable_prefix_caching;
  ec.snapshot_interval = c.engine.prefix_snapshot_interval;
  ec.prefix_cache_dir = c.engine.prefix_cache_dir;
  ec.prefix_cache_bytes = c.engine.prefix_cache_bytes.value_or(ec.prefix_cache_bytes);
  ec.cache_salt = weights_identity(*path);
  ec.eos_ids = r->session_->opened.extra_eos_ids;
  auto eng = engine::Engine::create(*r->session_->model, *r->session_->opened.tokenizer, ec);
  if (!eng.ok()) return failed(eng.status());
  r->engine_ = std::move(eng).value();
  if (cancelled()) return failed(cancelled_error("shutdown requested before the warm-up"));
  phase = "warm-up";
  // A short prompt and two decodes through every layer: the first client does not pay for
  // first-touch costs, and the scheduler's cost model has seen a prefill step and decode steps
  // (paced scheduling starts with its measured costs, not a guess).
  engine::RequestOptions wo;
  wo.max_tokens = 3;
  wo.sampling.temperature = 0;
  wo.ignore_eos = true;
  const std::int64_t warm_prompt = std::clamp<std::int64_t>(r->max_request_tokens() - wo.max_tokens, 1, 32);
  Status warm_error;
  auto id = r->engine_->submit(std::vector<std::int32_t>(static_cast<std::size_t>(warm_prompt), 0), wo,
                               [&](const engine::RequestEvent& e) {
    if (e.finished && e.finish == engine::RequestFinish::kError) warm_error = e.error;
  });
  if (!id.ok()) return failed(id.status());
  if (Status s = r->engine_->run_until_idle(); !s.ok()) return failed(s);
  if (!warm_error.ok()) return failed(warm_error);
  log_info("serve: {}: phase warm-up: ok", who);
  return r;
}

namespace {

// $SEXTANT_FAULT_REPLICA="I:N" (tests): replica I of every generation gets the device option
// fail_at_op=N. 0 when unset or for other replicas.
std::int64_t fault_for(int index) {
  const char* env = std::getenv("SEXTANT_FAULT_REPLICA");
  if (env == nullptr) return 0;
  int at = -1;
  long long op = 0;
  if (std::sscanf(env, "%d:%lld", &at, &op) != 2 || at != index || op <= 0) return 0;
  return op;
}

}  // namespace

namespace {

// model.placement auto (issue 22 item 3): the replicas' device groups and rank order from the links
// between the GPUs (model.topology, else the backend's), where model.devices does not list them and
// the replicas are a count; nullopt where no links are known (the devices go in order).
Result<std::optional<std::vector<std::vector<int>>>> place_replicas(const config::ServeConfig& config,
                                                                    const config::ReplicaSpec& spec, int available) {
  using Groups = std::optional<std::vector<std::vector<int>>>;
  if (config.model.placement != "auto" || !config.model.devices.empty() ||
      spec.kind != config::ReplicaSpec::Kind::kCount || available < 2) {
    return Groups{};
  }
  std::optional<hal::Topology> topo;
  if (!config.model.topology.empty()) {
    SX_ASSIGN_OR_RETURN(hal::Topology t, hal::read_nvidia_smi_topo(config.model.topology));
    topo = std::move(t);
  } else if (config.model.backend != "auto") {
    SX_ASSIGN_OR_RETURN(hal::Backend * backend, backends::default_registry().find(config.model.backend));
    if (auto t = backend->topology(); t.ok()) topo = *std::move(t);
  }
  // The links are per GPU: placement needs one device per GPU (not SEXTANT_CUDA_DEVICES=0x6).
  if (!topo || topo->size() != available) {
    if (topo && !config.model.topology.empty()) {
      return invalid_argument_error("model.topology: {} describes {} GPUs but backend {} has {} devices",
                                    config.model.topology, topo->size(), config.model.backend, available);
    }
    return Groups{};
  }
  parallel::PlacementRequest req;
  req.devices = available;
  req.tp = static_cast<int>(config.model.tp);
  req.pp = static_cast<int>(config.model.pp);
  req.replicas = spec.count;
  auto p = parallel::place(*topo, req);
  if (!p.ok()) return invalid_argument_error("model.placement: {}", p.status().message());
  std::vector<std::vector<int>> groups;
  for (int r = 0; r < p->chosen.replicas; ++r) {
    std::vector<int> devices;
    for (int s = 0; s < p->chosen.pp; ++s) {
      const auto& g = p->chosen.groups[static_cast<std::size_t>(r * p->chosen.pp + s)];
      devices.insert(devices.end(), g.begin(), g.end());
    }
    groups.push_back(std::move(devices));
  }
  log_info("serve: placement from {}: {}; {}", topo->source, p->chosen.describe(), p->why);
  if (p->chosen.worst == parallel::LinkTier::kSocket) {
    // The configured shape cannot avoid a SYS link: say what the links would allow instead.
    parallel::PlacementRequest any;
    any.devices = available;
    any.fits = [need = req.tp * req.pp](int t, int pp) { return t * pp >= need; };
    if (auto better = parallel::place(*topo, any); better.ok() && better->chosen.worst < p->chosen.worst) {
      log_warn("serve: placement: every layout of this shape has a SYS link inside a TP group; {} would avoid it ({})",
               better->chosen.describe(), better->why);
    }
  }
  return Groups{std::move(groups)};
}

}  // namespace

Result<std::vector<std::unique_ptr<Replica>>> load_replicas(const config::ServeConfig& config, int generation,
                                                            const std::atomic<bool>* cancel,
                                                            std::string* failed_phase) {
  if (failed_phase != nullptr) *failed_phase = "devices";
  SX_ASSIGN_OR_RETURN(const config::ReplicaSpec spec, config::parse_replica_spec(config.model.replicas));
  // The backend only to count its devices and its host threads ("auto": open_session picks).
  int available = 0, host_threads = 0;
  if (config.model.backend != "auto") {
    SX_ASSIGN_OR_RETURN(hal::Backend * backend, backends::default_registry().find(config.model.backend));
    SX_ASSIGN_OR_RETURN(std::vector<hal::DeviceInfo> listed, hal::list_devices(*backend));
    available = static_cast<int>(listed.size());
    host_threads = backend->host_threads();
  } else if (spec != config::ReplicaSpec{}) {
    return invalid_argument_error("model.replicas needs a named backend, not auto (set model.backend)");
  }
  const int ranks = static_cast<int>(config.model.tp * config.model.pp);
  std::vector<std::vector<int>> groups;
  SX_ASSIGN_OR_RETURN(std::optional<std::vector<std::vector<int>>> placed, place_replicas(config, spec, available));
  if (placed) {
    groups = std::move(*placed);
  } else if (spec == config::ReplicaSpec{} && config.model.devices.empty()) {
    groups.push_back({});  // one replica on the first tp x pp devices, as open_session picks them
  } else {
    auto g = config::replica_device_groups(spec, ranks, available, config.model.devices);
    if (!g.ok()) return invalid_argument_error("model.replicas: {}", g.status().message());
    groups = std::move(g).value();
  }
  // Replicas on a backend that computes with the host's cores share them evenly.
  int threads = static_cast<int>(config.model.threads);
  if (host_threads > 0 && groups.size() > 1) {
    const int total = threads > 0 ? threads : host_threads;
    const int n = static_cast<int>(groups.size());
    threads = std::max(1, total / n);
    if (total < n) {
      // Said, not silent: each engine gets a thread of its own, more than the cores there are.
      log_warn("serve: {} replicas ({}) on the {} backend share {} host thread(s) ({}): one thread each, so the cores "
               "are oversubscribed {:.1f}x; for throughput use at most {} replicas, or raise model.threads",
               n, config.model.replicas, config.model.backend, total,
               config.model.threads > 0 ? "model.threads" : "this machine's hardware threads",
               static_cast<double>(n) / total, total);
    } else {
      log_info("serve: {} replicas on the {} backend share {} host threads: {} each{}", n, config.model.backend, total,
               threads, total % n != 0 ? fmt::format(" ({} left unused)", total % n) : std::string());
    }
  }
  std::vector<std::unique_ptr<Replica>> out;
  for (std::size_t i = 0; i < groups.size(); ++i) {
    ReplicaOptions o;
    o.config = &config;
    o.index = static_cast<int>(i);
    o.generation = generation;
    o.devices = groups[i];
    o.threads = threads;
    o.fail_at_op = fault_for(o.index);
    o.cancel = cancel;
    SX_ASSIGN_OR_RETURN(std::unique_ptr<Replica> r, Replica::load(o, failed_phase));
    out.push_back(std::move(r));
  }
  return out;
}

}  // namespace sx::daemon::replicas
