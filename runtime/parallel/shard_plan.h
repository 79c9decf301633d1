// The shard planner (DESIGN.md §5): which part of a model every rank of a TP x PP group holds.
//
// Ranks are numbered stage-major: rank = stage * tp + tp_rank. Within a stage (tensor parallelism):
// - query heads are split into contiguous ranges of whole head units whose counts differ by at
//   most one unit: a unit is the fewest heads whose columns in the o weights (split by input
//   columns, head * head_dim) make whole blocks of o's format (1 head for float formats, 2 for
//   head_dim 128 and 256-column K-quant blocks: 72B's 64 heads at TP 6 are 10, 10, 12, 10, 10, 12),
//   the last unit shorter where the heads do not divide (rank i of T gets units
//   [floor(i * U / T), floor((i + 1) * U / T)) of U = ceil(H / unit));
// - each rank holds exactly the KV heads its query heads use: [q.begin / g, (q.end - 1) / g + 1)
//   with g = heads / kv_heads. A KV head held by more than one rank of the stage is a replica
//   (a GQA group split across ranks, or TP above the KV-head count);
// - FFN rows (rows of gate/up, columns of down) are split in units of the down weights' block
//   (1 for float formats, 32 for Q8_0 / Q4_0 / Q5_0, 128 for AWQ int4, 256 for Q4_K / Q6_K; the
//   largest over the layers), contiguous, sizes differing by at most one unit;
// - Q/K/V and gate/up are column-parallel (each rank computes its own heads / FFN rows, with the
//   matching slices of the biases); o and down are row-parallel (each rank multiplies its slice of
//   the input columns and one all-reduce sums the partial outputs; a bias of a row-parallel matrix
//   is added by tp rank 0 only);
// - the token embedding and the LM head are vocab-split: rank i holds rows
//   [floor(i * V / T), floor((i + 1) * V / T)). The embedding of a step is the all-reduce of each
//   rank's rows (zero rows for ids another rank holds; the sum is exact), and the LM head's logits
//   are all-gathered. Why not replicate: the two tables are the largest tensors of the small Qwen
//   models (0.5B: 136 M of 494 M parameters) and the LM head is read for every decoded token, so
//   splitting them divides both memory and decode bytes by T at the price of one small collective.
// Across stages (pipeline parallelism): contiguous layer ranges whose sizes differ by at most one
// layer (stage s of P gets [floor(s * L / P), floor((s + 1) * L / P))); the embedding lives on the
// first stage and the final norm + LM head on the last (with tied embeddings and P > 1 both stages
// hold their shard of the one table).
//
// Errors (INVALID_ARGUMENT, naming the numbers): tp or pp below 1, tp above 64 or above the query
// head count, pp above the layer count, an FFN size that is not a whole number of units or has
// fewer units than tp ranks, a vocabulary smaller than tp, per-layer weight types missing, or
// fewer head units than tp ranks (the message names the largest tp that works, and
// --requantize-unaligned).
// Threading: pure functions over immutable inputs.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "runtime/base/status.h"
#include "runtime/hal/dtype.h"
#include "runtime/model/gguf.h"
#include "runtime/model/model_config.h"

namespace sx::parallel {

// A hybrid's DeltaNet heads are split like query heads: contiguous ranges of K heads in units
// whose columns of ssm_out (each V head's head_dim, per K head in every tiled group) make whole
// blocks of its format, counts differing by at most one unit.
// Storage formats of the 2-D weights (norm weights and biases are always F32).
struct LayerWeightTypes {
  hal::DType q = hal::DType::kF32, k = hal::DType::kF32, v = hal::DType::kF32, o = hal::DType::kF32;
  // Dense: the FFN's matrices. Mixture of experts: the stacked experts' (ffn_{gate,up,down}_exps).
  hal::DType gate = hal::DType::kF32, up = hal::DType::kF32, down = hal::DType::kF32;
  hal::DType router = hal::DType::kF32;  // ffn_gate_inp (mixture of experts only)
  // A hybrid's Gated DeltaNet layer (where q, k, v, o are unused): attn_qkv, attn_gate (z),
  // ssm_alpha, ssm_beta, ssm_out. Its attention layers' q is attn_q, [query | gate] per head.
  hal::DType qkv = hal::DType::kF32, z = hal::DType::kF32, alpha = hal::DType::kF32, beta = hal::DType::kF32;
  hal::DType ssm_out = hal::DType::kF32;
  // A shared expert (qwen35moe): ffn_{gate,up,down}_shexp and its gate's row ffn_gate_inp_shexp.
  hal::DType sh_gate = hal::DType::kF32, sh_up = hal::DType::kF32, sh_down = hal::DType::kF32;
  hal::DType sh_router = hal::DType::kF32;
  bool operator==(const LayerWeightTypes&) const = default;
};

struct WeightTypes {
  hal::DType token_embd = hal::DType::kF32;
  hal::DType output = hal::DType::kF32;  // the LM head; ignored when the config has tied embeddings
  std::vector<LayerWeightTypes> layers;  // one entry per layer
};

// Every matrix (embeddings included) in `type`.
WeightTypes uniform_weight_types(const model::ModelConfig& config, hal::DType type);

// Which tensor formats weight_types_from_source accepts.
enum class WeightTypeCheck {
  kLoadable,  // only formats the loader has kernels for (model::require_supported)
  kSized,     // any format the HAL knows the size of (Q4_K, Q6_K, ... too): for planning
};
// The types of a model's weight tensors (its config must already be checked).
Result<WeightTypes> weight_types_from_source(const model::TensorSource& file, const model::ModelConfig& config,
                                             WeightTypeCheck check = WeightTypeCheck::kLoadable);

// A half-open range [begin, end).
struct Range {
  std::int64_t begin = 0, end = 0;
  std::int64_t size() const { return end - begin; }
  bool contains(std::int64_t i) const { return i >= begin && i < end; }
  bool operator==(const Range&) const = default;
};

struct PlanOptions {
  int tp = 1;
  int pp = 1;
  hal::DType kv_dtype = hal::DType::kF32;  // for kv_bytes_per_token
  // Where the o (or down) weights' blocks leave fewer head (FFN) units than ranks, re-quantise those
  // matrices to Q8_0 (32-column blocks) at load instead of refusing: each rank's slice is
  // dequantised from the file and quantised again (ShardPlan::types, ::requantized say which, and
  // the rank weight bytes count the larger format). `--requantize-unaligned`,
  // model.requantize_unaligned.
  bool requantize_unaligned = false;
};

struct RankPlan {
  int rank = 0;     // stage * tp + tp_rank
  int stage = 0;
  int tp_rank = 0;
  Range q_heads;    // global query heads
  Range kv_heads;   // global KV heads held (exactly those q_heads use)
  std::vector<std::int64_t> replicated_kv_heads;  // the held KV heads another rank of the stage also holds
  Range ffn;        // FFN rows: rows of gate/up, columns of down (a mixture of experts: every expert's)
  Range experts;    // a mixture of experts: the experts held (expert parallelism; every rank the router)
  Range vocab;      // rows of token_embd / the LM head held (used on the first / last stage)
  // A hybrid's Gated DeltaNet heads: the K (query/key) heads held, and with each K head g every V
  // head that reads it (llama.cpp's tiled order: g, g + K, g + 2K, ...). The shared expert of a
  // hybrid MoE is held whole by each stage's tp rank 0.
  Range ssm_k_heads;
  bool has_shared_expert = false;
  Range layers;     // the stage's layers
  bool has_embedding = false;  // first stage
  bool has_lm_head = false;    // last stage: final norm + LM head shard
  std::uint64_t weight_bytes = 0;        // every byte of weights this rank holds
  std::uint64_t kv_bytes_per_token = 0;  // KV cache bytes per token of context, all its layers
};

struct ShardPlan {
  int tp = 1;
  int pp = 1;
  std::int64_t ffn_unit = 1;   // FFN rows per split unit
  hal::DType kv_dtype = hal::DType::kF32;  // the KV-cache format kv_bytes_per_token counts
  std::vector<RankPlan> ranks;  // ranks[r].rank == r
  std::uint64_t model_weight_bytes = 0;  // the whole model held once (what tp = pp = 1 holds)
  // The formats the ranks hold: the file's, except matrices re-quantised (requantize_unaligned).
  WeightTypes types;
  // "the o weights of 80 layers, Q4_K -> Q8_0 at load (+1.23 GiB over the file's)"; empty if none.
  std::string requantized;
  const RankPlan& at(int stage, int tp_rank) const { return ranks[static_cast<std::size_t>(stage * tp + tp_rank)]; }
  std::uint64_t total_weight_bytes() const;  // sum over ranks (replicas counted on each rank)
};

Result<ShardPlan> plan_shards(const model::ModelConfig& config, const WeightTypes& types, const PlanOptions& options);

// A mixture of experts: the bytes of the experts one token does not use, over every layer
// ((n_experts - n_experts_used) / n_experts of each layer's expert matrices); 0 for a dense model.
std::uint64_t idle_expert_bytes(const model::ModelConfig& config, const WeightTypes& types);
// The weight bytes one decode token reads of the model held once (`model_weight_bytes`): every
// matrix but the idle experts, and one row of the token embedding rather than the table.
std::uint64_t active_weight_bytes_per_token(const model::ModelConfig& config, const WeightTypes& types,
                                            std::uint64_t model_weight_bytes);

// The table `sextant plan` prints: one line per rank (stage, tp rank, query heads, KV heads with
// replicas marked '*', FFN rows, vocab rows, layers, weight bytes, KV bytes per token), then totals
// and a legend.
std::string format_plan(const ShardPlan& plan, const model::ModelConfig& config);

}  // namespace sx::parallel
