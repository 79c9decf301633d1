// The attention block: q, k, v (optional biases); optional RMS norms of every query and key head;
// rope over the rotated dims; the KV write and paged attention; an optional sigmoid output gate;
// the row-parallel o (this rank's heads' share, summed by the layer's all-reduce).
#pragma once

#include <cstdint>
#include <vector>

#include "runtime/engine/blocks/step.h"

namespace sx::engine {

struct AttentionSpec {
  bool bias = false;     // attn_{q,k,v}.bias (qwen2)
  bool qk_norm = false;  // attn_{q,k}_norm: every query and key head RMS-normalised before rope (qwen3, qwen35)
  // attn_q holds [query | gate] per head; the output is scaled by the gate's sigmoid (qwen35).
  bool gated = false;
  bool operator==(const AttentionSpec&) const = default;
};

class Attention {
 public:
  // This rank's heads of layer site.layer; kv_index: the layer's KV cache among the rank's.
  static Result<Attention> load(const BlockSite& site, const AttentionSpec& spec, std::int64_t kv_index);
  // xn -> delta, writing the step's keys and values into the layer's cache.
  Status run(const Step& step, const Workspace& ws, hal::BufView k_cache, hal::BufView v_cache) const;
  // Every op run() can issue, at the site's largest step.
  static void ops(const OpsSite& site, const AttentionSpec& spec, const parallel::LayerWeightTypes& held,
                  std::vector<hal::Op>& ops);

  std::int64_t kv_index() const { return kv_index_; }

 private:
  std::int64_t kv_index_ = -1;
  DeviceTensor q_w, q_b, k_w, k_b, v_w, v_b, o_w;
  DeviceTensor q_norm, k_norm;  // head_dim wide
  DeviceTensor q_gate;          // the gate rows of attn_q
};

// The KV write and the attention of a step of T tokens in n_seqs sequences (buffers unset).
hal::KvWriteArgs kv_write_args(const ModelOptions& o, const parallel::RankPlan& rp, std::int64_t head_dim,
                               std::int64_t T);
hal::AttentionArgs attention_args(const model::ModelConfig& c, const ModelOptions& o, const parallel::RankPlan& rp,
                                  std::int64_t T, std::int64_t n_seqs, std::int64_t max_blocks_per_seq);
// The rotated dims of an attention head (Qwen3.5 rotates a quarter).
std::int64_t rot_dim_of(const model::ModelConfig& c);

}  // namespace sx::engine
