// What every block of a layer works with (runtime/engine/blocks/): the rank's step (its stream,
// sizes, integer inputs and the matmul every block issues), the activation workspace the blocks
// share, and what a block's load and op list are given. A block is one concept over the HAL op
// set (attention, Gated DeltaNet, dense FFN, routed experts, shared expert, embedding, logits):
// it loads its tensors through the Uploader (load), issues its ops on the step's stream (run),
// and lists the ops it can issue for Device::supports (ops). The shard (shard.h) holds the
// workspace, caches and states; an architecture (models/) says which blocks its layers use.
#pragma once

#include <algorithm>
#include <cstdint>
#include <initializer_list>
#include <memory>
#include <vector>

#include "runtime/base/status.h"
#include "runtime/engine/model.h"
#include "runtime/engine/weights.h"
#include "runtime/hal/ops.h"
#include "runtime/model/model_config.h"
#include "runtime/parallel/shard_plan.h"

namespace sx::engine {

inline std::size_t f32_bytes(std::int64_t n) { return static_cast<std::size_t>(n) * sizeof(float); }
inline std::size_t i32_bytes(std::int64_t n) { return static_cast<std::size_t>(n) * sizeof(std::int32_t); }
inline hal::BufView view_of(const std::unique_ptr<hal::Buffer>& b) { return {b.get(), 0}; }

// A step's integer inputs on the device (each an array of int32): token ids, absolute positions,
// KV slots, sequence starts (n_seqs + 1) and context lengths, the block table, and a hybrid's
// state slot of each sequence.
struct StepInputViews {
  hal::BufView ids, positions, slots, seq_start, seq_ctx, block_table, state_slot;
};

// One step of T tokens in n_seqs sequences on one rank.
struct Step {
  hal::Stream& stream;
  const model::ModelConfig& config;
  const parallel::RankPlan& rp;
  const ModelOptions& options;
  std::int64_t T = 0, n_seqs = 0, max_blocks_per_seq = 0;
  StepInputViews in;

  // y[m x n] = x[m x k] w^T (+ bias).
  Status matmul(const DeviceTensor& w, const DeviceTensor* bias, hal::BufView x, hal::BufView y, std::int64_t m,
                std::int64_t n, std::int64_t k) const {
    hal::MatmulArgs a;
    a.w = w.view();
    a.w_type = w.type;
    a.x = x;
    if (bias != nullptr && bias->buffer) a.bias = bias->view();
    a.y = y;
    a.m = m;
    a.n = n;
    a.k = k;
    return stream.run(a);
  }
};

// The activations of a step, max_batch_tokens rows each (float32): allocated once per shard for
// the blocks its model uses (Shard::load). Every layer reads xn (the normalised hidden state) and
// writes its mixer's and its FFN's outputs into delta (before their all-reduce).
struct Workspace {
  std::unique_ptr<hal::Buffer> h, xn, delta;
  // Attention: q, k, v, its output; with q/k norms q and k before them (q_raw, k_raw); a gated
  // attention's gate.
  std::unique_ptr<hal::Buffer> q, k, v, attn, q_raw, k_raw, attn_gate;
  // Gated DeltaNet: q|k|v before and after the conv, z, alpha, beta, the output.
  std::unique_ptr<hal::Buffer> qkv, conv_out, z, alpha, beta, ssm_o;
  // Dense FFN: gate and up (the SiLU product into gate).
  std::unique_ptr<hal::Buffer> gate, up;
  // Routed experts: the router's logits, each token's experts and their weights.
  std::unique_ptr<hal::Buffer> router_logits, expert_ids, expert_weights;
  // Shared expert: its FFN, output and gate.
  std::unique_ptr<hal::Buffer> sh_gate, sh_up, sh_out, sh_logit;
  // Logits head (max_logit_rows rows): the rows of h asked for, their last delta, normalised; this
  // rank's logits (max_logit_rows x the widest vocab shard, the padding zero).
  std::unique_ptr<hal::Buffer> sel, sel_delta, sel_norm, logits;
};

// What a block's load() reads: the file through the uploader, the model, this rank's share, the
// layer and the formats the rank holds its matrices in.
struct BlockSite {
  Uploader& up;
  const model::ModelConfig& config;
  const parallel::RankPlan& rp;
  std::int64_t layer = 0;
  const parallel::LayerWeightTypes& held;
};

// What a block's ops() list is for: a step of rank `rp` at its largest (max_batch_tokens tokens,
// max_logit_rows sequences).
struct OpsSite {
  const model::ModelConfig& config;
  const parallel::RankPlan& rp;
  const ModelOptions& options;
  int tp = 1;
  std::int64_t T() const { return options.max_batch_tokens; }
  std::int64_t R() const { return options.max_logit_rows; }
  std::int64_t max_seqs() const { return std::min(T(), R()); }
  void matmul(std::vector<hal::Op>& ops, hal::DType w, std::int64_t m, std::int64_t n, std::int64_t k) const {
    hal::MatmulArgs a;
    a.w_type = w;
    a.m = m;
    a.n = n;
    a.k = k;
    ops.emplace_back(a);
  }
};

// Fails with the file and the tensor's format unless every present one of `tensors` is F32.
Status require_f32(const model::TensorSource& file, std::initializer_list<const DeviceTensor*> tensors);

}  // namespace sx::engine
