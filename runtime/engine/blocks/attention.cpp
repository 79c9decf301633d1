// The attention block (attention.h).
#include "runtime/engine/blocks/attention.h"

#include <cmath>

#include "runtime/model/tensor_names.h"

namespace sx::engine {

using model::LayerTensor;

hal::KvWriteArgs kv_write_args(const ModelOptions& o, const parallel::RankPlan& rp, std::int64_t head_dim,
                               std::int64_t T) {
  hal::KvWriteArgs kw;
  kw.cache_type = o.kv.dtype;
  kw.n_tokens = T;
  kw.n_kv_heads = rp.kv_heads.size();
  kw.head_dim = head_dim;
  kw.n_slots = o.kv.num_blocks * o.kv.block_size;
  return kw;
}

hal::AttentionArgs attention_args(const model::ModelConfig& c, const ModelOptions& o, const parallel::RankPlan& rp,
                                  std::int64_t T, std::int64_t n_seqs, std::int64_t max_blocks_per_seq) {
  hal::AttentionArgs at;
  at.cache_type = o.kv.dtype;
  at.n_seqs = n_seqs;
  at.n_tokens = T;
  at.n_heads = rp.q_heads.size();
  at.n_kv_heads = rp.kv_heads.size();
  at.head_dim = c.head_dim;
  at.block_size = o.kv.block_size;
  at.max_blocks_per_seq = max_blocks_per_seq;
  at.n_slots = o.kv.num_blocks * o.kv.block_size;
  at.q_head_offset = rp.q_heads.begin;
  at.kv_head_offset = rp.kv_heads.begin;
  at.heads_per_kv = c.n_heads / c.n_kv_heads;
  at.scale = 1.0f / std::sqrt(static_cast<float>(c.head_dim));
  return at;
}

std::int64_t rot_dim_of(const model::ModelConfig& c) { return c.rot_dim > 0 ? c.rot_dim : c.head_dim; }

Result<Attention> Attention::load(const BlockSite& site, const AttentionSpec& spec, std::int64_t kv_index) {
  const parallel::RankPlan& rp = site.rp;
  const std::int64_t hd = site.config.head_dim, H = site.config.hidden;
  const std::int64_t q0 = rp.q_heads.begin * hd, qn = rp.q_heads.size() * hd;
  const std::int64_t kv0 = rp.kv_heads.begin * hd, kvn = rp.kv_heads.size() * hd;
  auto name = [&](LayerTensor t) { return model::layer_tensor_name(site.layer, t); };
  Uploader& up = site.up;
  Attention a;
  a.kv_index_ = kv_index;
  if (spec.gated) {
    // attn_q holds [query | gate] per head: this rank's heads' query rows, then their gate rows.
    Ranges query, gate;
    for (std::int64_t h = rp.q_heads.begin; h < rp.q_heads.end; ++h) {
      query.emplace_back(2 * h * hd, hd);
      gate.emplace_back(2 * h * hd + hd, hd);
    }
    SX_ASSIGN_OR_RETURN(a.q_w, up.rows_of(name(LayerTensor::kAttnQ), query));
    SX_ASSIGN_OR_RETURN(a.q_gate, up.rows_of(name(LayerTensor::kAttnQ), gate));
  } else {
    SX_ASSIGN_OR_RETURN(a.q_w, up.tensor(name(LayerTensor::kAttnQ), true, q0, qn));
  }
  SX_ASSIGN_OR_RETURN(a.k_w, up.tensor(name(LayerTensor::kAttnK), true, kv0, kvn));
  SX_ASSIGN_OR_RETURN(a.v_w, up.tensor(name(LayerTensor::kAttnV), true, kv0, kvn));
  const bool bias = spec.bias;
  SX_ASSIGN_OR_RETURN(a.q_b, up.tensor(name(LayerTensor::kAttnQBias), bias, q0, bias ? qn : -1));
  SX_ASSIGN_OR_RETURN(a.k_b, up.tensor(name(LayerTensor::kAttnKBias), bias, kv0, bias ? kvn : -1));
  SX_ASSIGN_OR_RETURN(a.v_b, up.tensor(name(LayerTensor::kAttnVBias), bias, kv0, bias ? kvn : -1));
  SX_ASSIGN_OR_RETURN(a.o_w, up.tensor(name(LayerTensor::kAttnOutput), true, 0, H, q0, qn, site.held.o));
  if (spec.qk_norm) {  // head_dim wide, the same for every head: whole on every rank
    SX_ASSIGN_OR_RETURN(a.q_norm, up.tensor(name(LayerTensor::kAttnQNorm), true));
    SX_ASSIGN_OR_RETURN(a.k_norm, up.tensor(name(LayerTensor::kAttnKNorm), true));
  }
  SX_RETURN_IF_ERROR(require_f32(up.file(), {&a.q_b, &a.k_b, &a.v_b, &a.q_norm, &a.k_norm}));
  return a;
}

Status Attention::run(const Step& step, const Workspace& ws, hal::BufView k_cache, hal::BufView v_cache) const {
  hal::Stream& s = step.stream;
  const model::ModelConfig& c = step.config;
  const parallel::RankPlan& rp = step.rp;
  const std::int64_t T = step.T, H = c.hidden, hd = c.head_dim;
  const std::int64_t nq = rp.q_heads.size(), nkv = rp.kv_heads.size();
  const float eps = static_cast<float>(c.rms_eps);
  const auto V = view_of;
  SX_RETURN_IF_ERROR(step.matmul(q_w, &q_b, V(ws.xn), q_norm ? V(ws.q_raw) : V(ws.q), T, nq * hd, H));
  SX_RETURN_IF_ERROR(step.matmul(k_w, &k_b, V(ws.xn), k_norm ? V(ws.k_raw) : V(ws.k), T, nkv * hd, H));
  if (q_norm) {
    SX_RETURN_IF_ERROR(s.run(hal::RmsNormArgs{V(ws.q_raw), {}, q_norm.view(), V(ws.q), T * nq, hd, eps}));
    SX_RETURN_IF_ERROR(s.run(hal::RmsNormArgs{V(ws.k_raw), {}, k_norm.view(), V(ws.k), T * nkv, hd, eps}));
  }
  SX_RETURN_IF_ERROR(step.matmul(v_w, &v_b, V(ws.xn), V(ws.v), T, nkv * hd, H));
  const auto theta = static_cast<float>(c.rope_theta);
  const std::int64_t rot = rot_dim_of(c);
  SX_RETURN_IF_ERROR(s.run(hal::RopeArgs{V(ws.q), step.in.positions, T, nq, hd, rot, theta}));
  SX_RETURN_IF_ERROR(s.run(hal::RopeArgs{V(ws.k), step.in.positions, T, nkv, hd, rot, theta}));
  hal::KvWriteArgs kw = kv_write_args(step.options, rp, hd, T);
  kw.k = V(ws.k);
  kw.v = V(ws.v);
  kw.k_cache = k_cache;
  kw.v_cache = v_cache;
  kw.slot_mapping = step.in.slots;
  SX_RETURN_IF_ERROR(s.run(kw));
  hal::AttentionArgs at = attention_args(c, step.options, rp, T, step.n_seqs, step.max_blocks_per_seq);
  at.q = V(ws.q);
  at.k_cache = k_cache;
  at.v_cache = v_cache;
  at.out = V(ws.attn);
  at.seq_token_start = step.in.seq_start;
  at.seq_context_len = step.in.seq_ctx;
  at.block_table = step.in.block_table;
  SX_RETURN_IF_ERROR(s.run(at));
  if (q_gate) {
    SX_RETURN_IF_ERROR(step.matmul(q_gate, nullptr, V(ws.xn), V(ws.attn_gate), T, nq * hd, H));
    SX_RETURN_IF_ERROR(s.run(hal::SigmoidMulArgs{V(ws.attn), V(ws.attn_gate), V(ws.attn), T * nq, hd, 0, 0, 0, false}));
  }
  return step.matmul(o_w, nullptr, V(ws.attn), V(ws.delta), T, H, nq * hd);
}

void Attention::ops(const OpsSite& site, const AttentionSpec& spec, const parallel::LayerWeightTypes& held,
                    std::vector<hal::Op>& ops) {
  const model::ModelConfig& c = site.config;
  const std::int64_t T = site.T(), H = c.hidden, hd = c.head_dim;
  const std::int64_t nq = site.rp.q_heads.size(), nkv = site.rp.kv_heads.size();
  const auto eps = static_cast<float>(c.rms_eps);
  site.matmul(ops, held.q, T, nq * hd, H);  // a gated attention's gate rows are a second matmul of the same shape
  site.matmul(ops, held.k, T, nkv * hd, H);
  site.matmul(ops, held.v, T, nkv * hd, H);
  site.matmul(ops, held.o, T, H, nq * hd);
  if (spec.qk_norm) {  // one row per head
    ops.emplace_back(hal::RmsNormArgs{{}, {}, {}, {}, T * nq, hd, eps});
    ops.emplace_back(hal::RmsNormArgs{{}, {}, {}, {}, T * nkv, hd, eps});
  }
  const std::int64_t rot = rot_dim_of(c);
  ops.emplace_back(hal::RopeArgs{{}, {}, T, nq, hd, rot, static_cast<float>(c.rope_theta)});
  ops.emplace_back(hal::RopeArgs{{}, {}, T, nkv, hd, rot, static_cast<float>(c.rope_theta)});
  ops.emplace_back(kv_write_args(site.options, site.rp, hd, T));
  ops.emplace_back(attention_args(c, site.options, site.rp, T, site.max_seqs(), site.options.blocks_per_seq()));
  if (spec.gated) ops.emplace_back(hal::SigmoidMulArgs{{}, {}, {}, T * nq, hd, 0, 0, 0, false});
}

}  // namespace sx::engine
