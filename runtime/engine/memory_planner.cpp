// The memory planner: per-device budgets, the KV pool, full-length request counts, refusals and the
// alternatives suggested with them. The model is in memory_planner.h.
#include "runtime/engine/memory_planner.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <optional>
#include <string_view>
#include <utility>

#include <fmt/format.h>

#include "runtime/engine/shard.h"
#include "runtime/parallel/weight_recipes.h"

namespace sx::engine {

namespace {

constexpr std::uint64_t kF32 = 4;
constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;
constexpr int kMaxTp = 64;
constexpr std::int64_t kMaxAutoSnapshots = 256;  // a hybrid's state snapshots when the plan chooses
constexpr std::int64_t kMaxCount = std::int64_t{1} << 24;  // max_num_seqs, max_num_batched_tokens, block_size
constexpr std::uint64_t kMaxBytes = std::uint64_t{1} << 56;  // a device's capacity or overhead (64 PiB)

std::uint64_t u64(std::int64_t v) { return static_cast<std::uint64_t>(std::max<std::int64_t>(v, 0)); }

std::string kib(std::uint64_t bytes) { return fmt::format("{:.2f} KiB", static_cast<double>(bytes) / 1024.0); }

// "-2.94" for a negative amount (over budget).
std::string signed_gib_number(std::uint64_t have, std::uint64_t need) {
  if (have >= need) return fmt::format("{:.2f}", static_cast<double>(have - need) / kGiB);
  return fmt::format("-{:.2f}", static_cast<double>(need - have) / kGiB);
}

std::string gib_number(std::uint64_t bytes) { return fmt::format("{:.2f}", static_cast<double>(bytes) / kGiB); }

// One state slot of rank r (a hybrid): every DeltaNet layer of the rank's conv state (kernel - 1)
// x its channels and recurrent state of its V heads x d x d, F32; 0 for a model without them.
std::uint64_t state_slot_bytes(const model::ModelConfig& c, const parallel::RankPlan& r) {
  if (!c.is_hybrid()) return 0;
  const std::uint64_t d = u64(c.ssm_head_dim), nk = u64(r.ssm_k_heads.size());
  const std::uint64_t nv = nk * u64(c.ssm_v_heads / c.ssm_k_heads), C = (2 * nk + nv) * d;
  std::uint64_t recurrent = 0;
  for (std::int64_t l = r.layers.begin; l < r.layers.end; ++l) recurrent += c.is_recurrent(l) ? 1 : 0;
  return kF32 * recurrent * ((u64(c.ssm_conv_kernel) - 1) * C + nv * d * d);
}

Status check_options(const model::ModelConfig& config, const parallel::ShardPlan& shards,
                     std::span<const DeviceBudget> devices, const MemoryPlanOptions& o) {
  if (!(o.memory_utilization > 0.0 && o.memory_utilization <= 1.0)) {
    return invalid_argument_error("memory plan: memory_utilization {} is outside (0, 1]; it is the fraction of each "
                                  "device's memory Sextant may use",
                                  o.memory_utilization);
  }
  if (o.max_model_len < 0) {
    return invalid_argument_error("memory plan: max_model_len {} is negative (0 means the model's context length)",
                                  o.max_model_len);
  }
  if (o.max_model_len > config.context_length) {
    return invalid_argument_error("memory plan: max_model_len {} exceeds the model's context length {}; use "
                                  "max_model_len <= {}",
                                  o.max_model_len, config.context_length, config.context_length);
  }
  if (o.max_num_seqs < 1) {
    return invalid_argument_error("memory plan: max_num_seqs {} must be at least 1", o.max_num_seqs);
  }
  if (o.max_num_batched_tokens < 1) {
    return invalid_argument_error("memory plan: max_num_batched_tokens {} must be at least 1", o.max_num_batched_tokens);
  }
  if (o.block_size < 1) {
    return invalid_argument_error("memory plan: block_size {} must be at least 1 token", o.block_size);
  }
  // Bounds that keep every product in 64 bits.
  const std::pair<std::string_view, std::int64_t> counts[] = {
      {"max_num_seqs", o.max_num_seqs}, {"max_num_batched_tokens", o.max_num_batched_tokens},
      {"block_size", o.block_size}};
  for (const auto& [what, v] : counts) {
    if (v > kMaxCount) return invalid_argument_error("memory plan: {} {} is above {}", what, v, kMaxCount);
  }
  for (const DeviceBudget& d : devices) {
    if (d.capacity_bytes > kMaxBytes || d.overhead_bytes > kMaxBytes) {
      return invalid_argument_error("memory plan: device {}: {} bytes of capacity and {} of overhead; at most {} each",
                                    d.name, d.capacity_bytes, d.overhead_bytes, kMaxBytes);
    }
  }
  if (config.context_length < 1) {
    return invalid_argument_error("memory plan: the model's context length is {}", config.context_length);
  }
  if (shards.ranks.empty()) return invalid_argument_error("memory plan: the shard plan has no ranks");
  if (devices.size() != shards.ranks.size()) {
    return invalid_argument_error("memory plan: {} device{} for {} ranks (tp {} x pp {}); give one device per rank",
                                  devices.size(), devices.size() == 1 ? "" : "s", shards.ranks.size(), shards.tp,
                                  shards.pp);
  }
  return ok_status();
}

// Weights, workspace, KV pool and counts; no suggestions.
Result<MemoryPlan> core_plan(const model::ModelConfig& config, const parallel::ShardPlan& shards,
                             std::span<const DeviceBudget> devices, const MemoryPlanOptions& options) {
  SX_RETURN_IF_ERROR(check_options(config, shards, devices, options));
  MemoryPlan plan;
  plan.options = options;
  if (plan.options.max_model_len == 0) plan.options.max_model_len = config.context_length;
  const MemoryPlanOptions& o = plan.options;
  plan.kv_dtype = shards.kv_dtype;
  plan.tp = shards.tp;
  plan.pp = shards.pp;
  plan.model_weight_bytes = shards.model_weight_bytes;
  plan.context_length = config.context_length;
  const std::uint64_t block = u64(o.block_size);
  const std::uint64_t kv_elem = static_cast<std::uint64_t>(hal::dtype_info(shards.kv_dtype).block_bytes);

  // The worst over-budget device (largest excess), if any.
  std::uint64_t worst_excess = 0;
  int over = 0;
  for (const parallel::RankPlan& r : shards.ranks) {
    const DeviceBudget& d = devices[static_cast<std::size_t>(r.rank)];
    DeviceMemory m;
    m.name = d.name;
    m.rank = r.rank;
    m.stage = r.stage;
    m.tp_rank = r.tp_rank;
    m.layers = r.layers;
    m.kv_heads = r.kv_heads.size();
    m.capacity = d.capacity_bytes;
    m.usable = static_cast<std::uint64_t>(std::floor(static_cast<long double>(d.capacity_bytes) *
                                                     static_cast<long double>(o.memory_utilization)));
    m.weights = r.weight_bytes;
    m.workspace_parts = rank_workspace(config, shards, r.rank, o);
    m.workspace = m.workspace_parts.total();
    m.overhead = d.overhead_bytes;
    m.kv_bytes_per_token = r.kv_bytes_per_token;
    m.snapshot_bytes = state_slot_bytes(config, r);
    m.kv_bytes_per_token_layer = 2 * u64(m.kv_heads) * u64(config.head_dim) * kv_elem;
    const std::uint64_t need = m.weights + m.workspace + m.overhead;
    m.weights_fit = need <= m.usable;
    if (m.weights_fit) {
      m.kv_budget = m.usable - need;
      // Every rank holds at least one layer and one KV head (the shard planner's rules).
      m.max_blocks = static_cast<std::int64_t>(m.kv_budget / (block * std::max<std::uint64_t>(m.kv_bytes_per_token, 1)));
      if (m.kv_bytes_per_token == 0) {
        // No KV on this rank (a hybrid's stage of DeltaNet layers only): it allows what every
        // sequence at full length needs (plus the null block), so that a model without any
        // attention layer gets a finite block pool.
        const std::int64_t per_request = (o.max_model_len + o.block_size - 1) / o.block_size;
        m.max_blocks = std::min(m.max_blocks, o.max_num_seqs * per_request + 1);
      }
    } else {
      ++over;
      if (need - m.usable > worst_excess || plan.limiting_rank < 0) {
        worst_excess = need - m.usable;
        plan.limiting_rank = r.rank;
      }
    }
    plan.devices.push_back(std::move(m));
  }
  plan.blocks_per_request = (o.max_model_len + o.block_size - 1) / o.block_size;

  // A hybrid's snapshot pool comes out of what the KV pool would take.
  if (over == 0 && config.is_hybrid() && o.state_snapshots != 0) {
    std::int64_t n = o.state_snapshots;
    if (n < 0) {
      n = kMaxAutoSnapshots;
      // A quarter of what the KV pool would take, and never the room of one full-length request.
      const std::uint64_t one_request = u64(plan.blocks_per_request + 1) * block;
      for (const DeviceMemory& m : plan.devices) {
        if (m.snapshot_bytes == 0) continue;
        const std::uint64_t keep = one_request * m.kv_bytes_per_token;
        const std::uint64_t spare = m.kv_budget > keep ? m.kv_budget - keep : 0;
        n = std::min({n, static_cast<std::int64_t>(m.kv_budget / 4 / m.snapshot_bytes),
                      static_cast<std::int64_t>(spare / m.snapshot_bytes)});
      }
    }
    plan.state_snapshots = n;
    for (DeviceMemory& m : plan.devices) {
      m.snapshots = u64(n) * m.snapshot_bytes;
      if (m.snapshots > m.kv_budget) {
        ++over;
        plan.limiting_rank = m.rank;
        plan.refusal = fmt::format("{} state snapshots (engine.prefix_snapshots) of {} each do not fit on rank {} ({}), "
                                   "which has {} left after its weights and workspace",
                                   n, gib(m.snapshot_bytes), m.rank, m.name, gib(m.kv_budget));
        m.kv_budget = 0;
        m.max_blocks = 0;
        continue;
      }
      m.kv_budget -= m.snapshots;
      m.max_blocks = static_cast<std::int64_t>(m.kv_budget / (block * std::max<std::uint64_t>(m.kv_bytes_per_token, 1)));
      if (m.kv_bytes_per_token == 0) {
        m.max_blocks = std::min(m.max_blocks, o.max_num_seqs * plan.blocks_per_request + 1);
      }
    }
    if (over > 0) {
      for (DeviceMemory& m : plan.devices) m.free = m.kv_budget;
      return plan;
    }
  }

  if (over > 0) {
    const DeviceMemory& w = plan.devices[static_cast<std::size_t>(plan.limiting_rank)];
    const std::uint64_t need = w.weights + w.workspace + w.overhead;
    plan.refusal = fmt::format(
        "the weights do not fit: rank {} on {} needs {} of weights + {} of workspace + {} of overhead = {}, more than "
        "its usable {} ({} x {}){}{}",
        w.rank, w.name, gib(w.weights), gib(w.workspace), gib(w.overhead), gib(need), gib(w.usable), gib(w.capacity),
        o.memory_utilization, w.weights > w.usable ? "; the weights alone exceed it" : "",
        over > 1 ? fmt::format(" ({} of {} devices are over)", over, plan.devices.size()) : "");
    for (DeviceMemory& m : plan.devices) m.free = m.kv_budget;
    return plan;
  }

  plan.num_blocks = std::numeric_limits<std::int64_t>::max();
  for (const DeviceMemory& m : plan.devices) {
    if (m.max_blocks < plan.num_blocks) {
      plan.num_blocks = m.max_blocks;
      plan.limiting_rank = m.rank;
    }
  }
  for (DeviceMemory& m : plan.devices) {
    m.kv_pool = u64(plan.num_blocks) * block * m.kv_bytes_per_token;
    m.free = m.kv_budget - m.kv_pool;
  }
  plan.kv_tokens = plan.num_blocks * o.block_size;
  plan.full_length_requests = plan.num_blocks / plan.blocks_per_request;
  plan.all_seqs_reach_full_length = plan.full_length_requests >= o.max_num_seqs;
  plan.longest_request = std::min(plan.num_blocks * o.block_size, config.context_length);
  plan.longest_for_all_seqs = std::min(plan.num_blocks / o.max_num_seqs * o.block_size, config.context_length);
  plan.fits = plan.full_length_requests >= 1;
  if (!plan.fits) {
    const DeviceMemory& l = plan.devices[static_cast<std::size_t>(plan.limiting_rank)];
    plan.refusal = fmt::format(
        "one request of max_model_len {} does not fit: it needs {} blocks of {} tokens, but the KV pool holds only {} "
        "blocks = {} tokens (rank {} on {} has {} left for the KV cache at {} per token)",
        o.max_model_len, plan.blocks_per_request, o.block_size, plan.num_blocks, plan.kv_tokens, l.rank, l.name,
        gib(l.kv_budget), kib(l.kv_bytes_per_token));
  }
  return plan;
}

// The device with the least memory after its overhead.
const DeviceBudget& smallest(std::span<const DeviceBudget> devices) {
  return *std::min_element(devices.begin(), devices.end(), [](const auto& a, const auto& b) {
    return a.capacity_bytes - std::min(a.capacity_bytes, a.overhead_bytes) <
           b.capacity_bytes - std::min(b.capacity_bytes, b.overhead_bytes);
  });
}

// `n` devices like `d`.
std::vector<DeviceBudget> copies(const DeviceBudget& d, int n) {
  std::vector<DeviceBudget> out(static_cast<std::size_t>(n), d);
  for (int i = 0; i < n; ++i) out[static_cast<std::size_t>(i)].name = fmt::format("{}#{}", d.name, i);
  return out;
}

// "fits: 5 requests of 32768 tokens at once (all 64: no)"
std::string outcome(const MemoryPlan& p) {
  if (!p.fits) return "does not fit";
  return fmt::format("fits: {} request{} of {} tokens at once ({} {}{})", p.full_length_requests,
                     p.full_length_requests == 1 ? "" : "s", p.options.max_model_len,
                     p.all_seqs_reach_full_length ? "all" : "not all", p.options.max_num_seqs,
                     p.all_seqs_reach_full_length ? "" : " at once");
}

std::uint64_t largest_rank_weights(const parallel::ShardPlan& s) {
  std::uint64_t m = 0;
  for (const parallel::RankPlan& r : s.ranks) m = std::max(m, r.weight_bytes);
  return m;
}

void add_suggestions(const model::ModelConfig& config, const parallel::WeightTypes& types,
                     const parallel::ShardPlan& shards, std::span<const DeviceBudget> devices, MemoryPlan& plan) {
  const MemoryPlanOptions& o = plan.options;
  auto& out = plan.suggestions;
  const bool weights_fit =
      std::all_of(plan.devices.begin(), plan.devices.end(), [](const DeviceMemory& m) { return m.weights_fit; });

  // Lengths and concurrency, from this pool.
  if (weights_fit && plan.num_blocks > 0) {
    if (!plan.fits) {
      out.push_back(fmt::format("--max-model-len {}: the longest one request can reach with this KV pool",
                                plan.longest_request));
    }
    if (plan.fits && !plan.all_seqs_reach_full_length) {
      out.push_back(fmt::format("--max-num-seqs {}: that many sequences can all reach max_model_len {} at once",
                                plan.full_length_requests, o.max_model_len));
    }
    if (!plan.all_seqs_reach_full_length && plan.longest_for_all_seqs > 0) {
      out.push_back(fmt::format("--max-model-len {}: the longest all {} sequences (max_num_seqs) can reach at once",
                                plan.longest_for_all_seqs, o.max_num_seqs));
    }
  }
  if (plan.fits) return;

  // A 4-bit file of the same model.
  const parallel::PlanOptions here{plan.tp, plan.pp, plan.kv_dtype};
  for (parallel::WeightRecipe recipe : {parallel::WeightRecipe::kAwqInt4, parallel::WeightRecipe::kQ4_K_M}) {
    const parallel::WeightTypes t4 = parallel::recipe_weight_types(config, recipe);
    auto once = parallel::plan_shards(config, t4, {1, 1, plan.kv_dtype});
    if (!once.ok() || once->model_weight_bytes >= shards.model_weight_bytes) continue;
    std::string line = fmt::format("--weights {}: the model in {} is {} of weights", parallel::recipe_name(recipe),
                                   parallel::recipe_description(recipe), gib(once->model_weight_bytes));
    auto s4 = parallel::plan_shards(config, t4, here);
    if (!s4.ok()) {
      // The reason up to its advice, and the tps that work instead.
      std::string why = s4.status().message();
      why = why.substr(0, std::min(why.find(';'), why.size()));
      std::string good;
      const std::int64_t max_tp = std::min<std::int64_t>(config.n_heads, kMaxTp);
      for (int t = 1; t <= max_tp; ++t) {
        if (parallel::plan_shards(config, t4, {t, plan.pp, plan.kv_dtype}).ok()) {
          good += fmt::format("{}{}", good.empty() ? "" : ", ", t);
        }
      }
      line += fmt::format(", but it cannot be split at tp {} x pp {} ({}){}", plan.tp, plan.pp, why,
                          good.empty() ? "" : fmt::format("; it can at tp {}", good));
    } else {
      auto p4 = core_plan(config, *s4, devices, o);
      if (p4.ok()) {
        if (s4->ranks.size() > 1) line += fmt::format(" ({} on the largest rank)", gib(largest_rank_weights(*s4)));
        line += fmt::format("; here it {}", outcome(*p4));
      }
    }
    out.push_back(line);
  }

  // More devices like the smallest one given: the smallest TP (then PP) that fits.
  const std::int64_t max_tp = std::min<std::int64_t>(config.n_heads, kMaxTp);
  const DeviceBudget& like = smallest(devices);
  std::optional<std::string> more;
  auto try_layout = [&](int tp, int pp) {
    auto s = parallel::plan_shards(config, types, {tp, pp, plan.kv_dtype});
    if (!s.ok()) return;
    auto p = core_plan(config, *s, copies(like, tp * pp), o);
    if (p.ok() && p->fits) {
      more = fmt::format("{} devices like {} ({} each) at tp {} x pp {}: {}", tp * pp, like.name,
                         gib(like.capacity_bytes), tp, pp, outcome(*p));
    }
  };
  for (int tp = plan.tp + 1; tp <= max_tp && !more; ++tp) try_layout(tp, plan.pp);
  for (int pp = plan.pp + 1; pp <= config.n_layers && plan.tp * pp <= kMaxTp && !more; ++pp) try_layout(plan.tp, pp);
  out.push_back(more ? *more
                     : fmt::format("more devices like these do not help: no tp up to {} (or pp at tp {}) fits", max_tp,
                                   plan.tp));

  // A higher memory_utilization: the smallest that holds the weights and one full-length request.
  double needed = 0;
  for (const DeviceMemory& m : plan.devices) {
    if (m.capacity == 0) {
      needed = 2;
      break;
    }
    const std::uint64_t kv = u64(plan.blocks_per_request) * u64(o.block_size) * m.kv_bytes_per_token;
    needed = std::max(needed, static_cast<double>(m.weights + m.workspace + m.overhead + kv) / static_cast<double>(m.capacity));
  }
  const double rounded = std::ceil(needed * 100.0 - 1e-9) / 100.0;
  if (rounded <= 1.0 && rounded > o.memory_utilization) {
    out.push_back(fmt::format("--memory-utilization {:.2f}: the least that holds the weights and one request of {} "
                              "tokens on every device",
                              rounded, o.max_model_len));
  }
}

}  // namespace

std::string gib(std::uint64_t bytes) { return fmt::format("{:.2f} GiB", static_cast<double>(bytes) / kGiB); }

Workspace rank_workspace(const model::ModelConfig& c, const parallel::ShardPlan& shards, int rank,
                         const MemoryPlanOptions& o) {
  const parallel::RankPlan& r = shards.ranks[static_cast<std::size_t>(rank)];
  const std::uint64_t T = u64(o.max_num_batched_tokens), S = u64(o.max_num_seqs), H = u64(c.hidden);
  const std::uint64_t q = u64(r.q_heads.size() * c.head_dim), kv = u64(r.kv_heads.size() * c.head_dim);
  const std::uint64_t f = u64(r.ffn.size());
  Workspace w;
  w.activations = kF32 * T * (3 * H + 2 * q + 2 * kv + 2 * f);
  if (model::has_qk_norm(c)) w.activations += kF32 * T * (q + kv);  // q and k before their head norms
  if (c.is_moe()) {
    // Router logits, the chosen experts and their weights; the experts' rows gathered per expert
    // (each token's k copies of x, gate, up, down) by a backend that computes them grouped.
    const std::uint64_t k = u64(c.n_experts_used);
    w.activations += kF32 * T * (u64(c.n_experts) + 2 * k) + kF32 * T * k * (2 * H + 2 * u64(c.expert_ffn));
  }
  ModelOptions mo;
  mo.max_batch_tokens = o.max_num_batched_tokens;
  mo.max_logit_rows = o.max_num_seqs;
  const std::int64_t len = o.max_model_len > 0 ? o.max_model_len : c.context_length;
  mo.max_blocks_per_seq = (len + o.block_size - 1) / o.block_size;
  std::int64_t vocab_shard = 0;
  for (const parallel::RankPlan& x : shards.ranks) {
    if (x.has_lm_head) vocab_shard = std::max(vocab_shard, x.vocab.size());
  }
  w.io = Shard::step_io_bytes(mo, r, shards.tp, vocab_shard);
  if (r.has_lm_head) {
    const std::uint64_t tp = u64(shards.tp);
    const std::uint64_t v = (u64(c.vocab) + tp - 1) / tp;
    w.logits = kF32 * S * 3 * H + kF32 * S * v * (1 + (tp > 1 ? tp : 0));
  }
  const std::uint64_t K = std::max({H, q, f});
  w.scratch = T * K + T * (K / 32) * 4 + 4 * T * K + kMatmulThreadScratchBytes;
  if (c.is_hybrid()) {
    const std::uint64_t d = u64(c.ssm_head_dim), nk = u64(r.ssm_k_heads.size());
    const std::uint64_t nv = nk * u64(c.ssm_v_heads / c.ssm_k_heads), C = (2 * nk + nv) * d;
    w.states = S * state_slot_bytes(c, r);
    w.states += kF32 * T * (2 * C + 2 * nv * d + 2 * nv + q);
    if (r.has_shared_expert) w.states += kF32 * T * (2 * u64(c.shared_expert_ffn) + H + 1);
  }
  return w;
}

Result<MemoryPlan> plan_memory(const model::ModelConfig& config, const parallel::WeightTypes& types,
                               const parallel::ShardPlan& shards, std::span<const DeviceBudget> devices,
                               const MemoryPlanOptions& options) {
  SX_ASSIGN_OR_RETURN(MemoryPlan plan, core_plan(config, shards, devices, options));
  add_suggestions(config, types, shards, devices, plan);
  return plan;
}

std::vector<DeviceBudget> shared_memory_budgets(std::uint64_t total_bytes, int ranks, std::string_view prefix,
                                                std::uint64_t overhead_bytes) {
  std::vector<DeviceBudget> out;
  if (ranks < 1) return out;
  for (int i = 0; i < ranks; ++i) {
    out.push_back({fmt::format("{}:{}", prefix, i), total_bytes / static_cast<std::uint64_t>(ranks), overhead_bytes});
  }
  return out;
}

Result<std::vector<DeviceBudget>> group_budgets(std::span<const hal::DeviceInfo> devices, int ranks,
                                                std::uint64_t overhead_bytes) {
  if (devices.empty()) return invalid_argument_error("memory plan: the backend reports no device");
  if (devices.front().shared_memory) {
    return shared_memory_budgets(devices.front().memory_bytes, ranks, devices.front().backend, overhead_bytes);
  }
  return device_budgets(devices, ranks, overhead_bytes);
}

Result<std::vector<DeviceBudget>> device_budgets(std::span<const hal::DeviceInfo> devices, int ranks,
                                                 std::uint64_t overhead_bytes) {
  if (ranks < 1 || devices.size() < static_cast<std::size_t>(ranks)) {
    return invalid_argument_error("memory plan: {} ranks need {} devices but {} {} available", ranks, ranks,
                                  devices.size(), devices.size() == 1 ? "is" : "are");
  }
  std::vector<DeviceBudget> out;
  for (int i = 0; i < ranks; ++i) {
    const hal::DeviceInfo& d = devices[static_cast<std::size_t>(i)];
    // Free memory, not total (other processes, a CUDA context of another program): a device that
    // reports what is free when enumerated is planned against that.
    const std::uint64_t capacity = d.free_bytes > 0 ? std::min(d.free_bytes, d.memory_bytes) : d.memory_bytes;
    out.push_back({d.name.empty() ? fmt::format("{}:{}", d.backend, d.index) : d.name, capacity, overhead_bytes});
  }
  return out;
}

std::string format_memory_plan(const MemoryPlan& plan, bool verbose) {
  const MemoryPlanOptions& o = plan.options;
  std::string out = fmt::format(
      "Memory per device, GiB: usable = capacity x {}; KV cache {} in blocks of {} tokens;\n"
      "workspace for steps of up to {} tokens (max_num_batched_tokens) and {} sequences (max_num_seqs)\n",
      o.memory_utilization, hal::dtype_name(plan.kv_dtype), o.block_size, o.max_num_batched_tokens, o.max_num_seqs);
  const std::vector<std::string> header = {"rank", "device", "capacity", "usable", "weights", "workspace",
                                           "overhead", "KV pool", "free", "KV/token"};
  std::vector<std::vector<std::string>> rows;
  std::uint64_t tot[7] = {};
  for (const DeviceMemory& m : plan.devices) {
    const bool kv = m.weights_fit && plan.num_blocks > 0;
    const std::uint64_t need = m.weights + m.workspace + m.overhead + m.kv_pool;
    rows.push_back({std::to_string(m.rank), m.name, gib_number(m.capacity), gib_number(m.usable), gib_number(m.weights),
                    gib_number(m.workspace), gib_number(m.overhead), kv ? gib_number(m.kv_pool) : "-",
                    signed_gib_number(m.usable, need), kib(m.kv_bytes_per_token)});
    const std::uint64_t v[7] = {m.capacity, m.usable, m.weights, m.workspace, m.overhead, m.kv_pool, m.free};
    for (int i = 0; i < 7; ++i) tot[i] += v[i];
  }
  if (plan.devices.size() > 1) {
    rows.push_back({"total", "", gib_number(tot[0]), gib_number(tot[1]), gib_number(tot[2]), gib_number(tot[3]),
                    gib_number(tot[4]), plan.num_blocks > 0 ? gib_number(tot[5]) : "-", "", ""});
  }
  std::vector<std::size_t> width(header.size());
  for (std::size_t i = 0; i < header.size(); ++i) {
    width[i] = header[i].size();
    for (const auto& r : rows) width[i] = std::max(width[i], r[i].size());
  }
  auto line = [&](const std::vector<std::string>& cells) {
    std::string s;
    for (std::size_t i = 0; i < cells.size(); ++i) {
      if (i > 0) s += "  ";
      const std::size_t pad = width[i] - cells[i].size();
      if (i == 1) {
        s += cells[i] + std::string(pad, ' ');
      } else {
        s += std::string(pad, ' ') + cells[i];
      }
    }
    while (!s.empty() && s.back() == ' ') s.pop_back();
    return s + "\n";
  };
  out += line(header);
  for (const auto& r : rows) out += line(r);
  out += "free: usable memory left after all of it (negative: over). KV/token: the rank's KV-cache bytes per token.\n";

  if (verbose) {
    out += "\nWorkspace per device (GiB): activations + logits + step I/O + matmul scratch (an estimate; see "
           "memory_planner.h)\n";
    for (const DeviceMemory& m : plan.devices) {
      const std::string states =
          m.workspace_parts.states > 0 ? fmt::format(" + {} (DeltaNet states)", gib_number(m.workspace_parts.states)) : "";
      out += fmt::format("  rank {} {}: {} + {} + {} + {}{} = {}\n", m.rank, m.name,
                         gib_number(m.workspace_parts.activations), gib_number(m.workspace_parts.logits),
                         gib_number(m.workspace_parts.io), gib_number(m.workspace_parts.scratch), states,
                         gib_number(m.workspace));
    }
    out += fmt::format("\nKV cache per layer ({}; KV/token summed over the stage's ranks; pool = {} blocks x {} tokens):\n",
                       hal::dtype_name(plan.kv_dtype), plan.num_blocks, o.block_size);
    out += fmt::format("{:>5}  {:>5}  {:<24}  {:>12}  {:>10}\n", "layer", "stage", "KV heads per rank", "KV/token",
                       "pool GiB");
    for (int stage = 0; stage < plan.pp; ++stage) {
      std::vector<const DeviceMemory*> ranks;
      for (const DeviceMemory& m : plan.devices) {
        if (m.stage == stage) ranks.push_back(&m);
      }
      if (ranks.empty()) continue;
      std::string heads;
      bool uniform = true;
      std::uint64_t per_token = 0;
      for (const DeviceMemory* m : ranks) {
        uniform = uniform && m->kv_heads == ranks.front()->kv_heads;
        per_token += m->kv_bytes_per_token_layer;
      }
      if (uniform) {
        heads = fmt::format("{} x {} ranks", ranks.front()->kv_heads, ranks.size());
      } else {
        for (const DeviceMemory* m : ranks) heads += fmt::format("{}{}", heads.empty() ? "" : ",", m->kv_heads);
      }
      const std::uint64_t pool = u64(plan.num_blocks) * u64(o.block_size) * per_token;
      for (std::int64_t l = ranks.front()->layers.begin; l < ranks.front()->layers.end; ++l) {
        out += fmt::format("{:>5}  {:>5}  {:<24}  {:>12}  {:>10}\n", l, stage, heads, kib(per_token), gib_number(pool));
      }
    }
  }

  out += "\n";
  if (plan.num_blocks > 0) {
    const DeviceMemory& l = plan.devices[static_cast<std::size_t>(plan.limiting_rank)];
    out += fmt::format("KV pool: {} blocks of {} tokens = {} tokens (set by rank {} on {})\n", plan.num_blocks,
                       o.block_size, plan.kv_tokens, l.rank, l.name);
    out += fmt::format("max_model_len {} ({} blocks): {} full-length request{} fit at once; ", o.max_model_len,
                       plan.blocks_per_request, plan.full_length_requests,
                       plan.full_length_requests == 1 ? "" : "s");
    out += plan.all_seqs_reach_full_length
               ? fmt::format("all {} sequences (max_num_seqs) can reach full length\n", o.max_num_seqs)
               : fmt::format("max_num_seqs {} cannot all reach full length at once (the scheduler preempts as they "
                             "grow)\n",
                             o.max_num_seqs);
  }
  if (plan.state_snapshots > 0) {
    const DeviceMemory& m = *std::max_element(plan.devices.begin(), plan.devices.end(),
                                              [](const DeviceMemory& a, const DeviceMemory& b) { return a.snapshots < b.snapshots; });
    out += fmt::format("State snapshots (prefix cache): {} of {} each on rank {} ({} per rank at most)\n",
                       plan.state_snapshots, gib(m.snapshot_bytes), m.rank, gib(m.snapshots));
  }
  if (plan.fits) {
    out += "Fits.\n";
  } else {
    out += "Refused: " + plan.refusal + ".\n";
  }
  if (!plan.suggestions.empty()) {
    out += plan.fits ? "To let every sequence reach its full length:\n" : "Alternatives:\n";
    for (const std::string& s : plan.suggestions) out += "  - " + s + "\n";
  }
  return out;
}

Status memory_plan_status(const MemoryPlan& plan) {
  if (plan.fits) return ok_status();
  return resource_exhausted_error("memory plan: {}", plan.refusal);
}

}  // namespace sx::engine
