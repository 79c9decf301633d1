// The Gated DeltaNet block (gated_deltanet.h).
#include "runtime/engine/blocks/gated_deltanet.h"

#include <cmath>

#include "runtime/model/tensor_names.h"

namespace sx::engine {

using model::LayerTensor;

namespace {

// Every step runs the delta rule in its recurrent form, a token at a time: a sequence's state after
// position p is then the same bits however its tokens were split into steps (prefill chunks of any
// size, decodes batched beside a prefill or alone, a preempted sequence computed again), which the
// chunked form cannot give when a step boundary falls inside one of its chunks (issue 53: greedy
// answers of a hybrid changed under load). The work is the same in both forms (3 d_k d_v
// multiply-adds per token and V head); the chunked one only reads the state once per chunk.
constexpr std::int64_t kDeltaChunk = 0;

// A DeltaNet layer's conv and delta rule over a step of T tokens in n_seqs sequences (buffers
// unset; the whole layer on one rank): the same for the step and for ops().
hal::ConvStateArgs conv_state_args(const model::ModelConfig& c, const SsmShare& share, const ModelOptions& o,
                                   std::int64_t T, std::int64_t n_seqs) {
  hal::ConvStateArgs a;
  a.n_seqs = n_seqs;
  a.n_tokens = T;
  a.channels = share.channels();
  a.kernel = c.ssm_conv_kernel;
  a.n_slots = o.total_state_slots();
  return a;
}

hal::DeltaRuleArgs delta_rule_args(const model::ModelConfig& c, const SsmShare& share, const ModelOptions& o,
                                   std::int64_t T, std::int64_t n_seqs) {
  hal::DeltaRuleArgs a;
  a.n_seqs = n_seqs;
  a.n_tokens = T;
  a.n_k_heads = share.nk;
  a.n_v_heads = share.nv();
  a.d_k = a.d_v = c.ssm_head_dim;
  a.n_slots = o.total_state_slots();
  a.chunk = kDeltaChunk;
  a.tiled = !c.ssm_v_grouped;  // llama.cpp's GGUF order of V heads, or Hugging Face's
  a.eps = static_cast<float>(c.rms_eps);
  a.scale = 1.0f / std::sqrt(static_cast<float>(c.ssm_head_dim));
  return a;
}

}  // namespace

Ranges SsmShare::v(std::int64_t per_head, std::int64_t offset) const {
  if (grouped) return {{offset + k0 * groups * per_head, nk * groups * per_head}};
  Ranges r;
  for (std::int64_t m = 0; m < groups; ++m) r.emplace_back(offset + (m * nk_all + k0) * per_head, nk * per_head);
  return r;
}

Ranges SsmShare::channel_ranges() const {
  Ranges r = {{k0 * d, nk * d}, {(nk_all + k0) * d, nk * d}};
  for (const auto& range : v(d, 2 * nk_all * d)) r.push_back(range);
  return r;
}

SsmShare ssm_share(const model::ModelConfig& c, const parallel::RankPlan& rp) {
  SsmShare s;
  if (!c.is_hybrid()) return s;
  s.k0 = rp.ssm_k_heads.begin;
  s.nk = rp.ssm_k_heads.size();
  s.nk_all = c.ssm_k_heads;
  s.groups = c.ssm_v_heads / c.ssm_k_heads;
  s.d = c.ssm_head_dim;
  s.grouped = c.ssm_v_grouped;
  return s;
}

Result<GatedDeltaNet> GatedDeltaNet::load(const BlockSite& site, std::int64_t state_index) {
  // This rank's K heads with their V heads (column-parallel projections and conv channels,
  // row-parallel ssm_out), the norm whole.
  const SsmShare share = ssm_share(site.config, site.rp);
  auto name = [&](LayerTensor t) { return model::layer_tensor_name(site.layer, t); };
  Uploader& up = site.up;
  GatedDeltaNet g;
  g.state_index_ = state_index;
  SX_ASSIGN_OR_RETURN(g.qkv_w, up.rows_of(name(LayerTensor::kAttnQkv), share.channel_ranges()));
  SX_ASSIGN_OR_RETURN(g.z_w, up.rows_of(name(LayerTensor::kAttnGate), share.v(share.d)));
  SX_ASSIGN_OR_RETURN(g.alpha_w, up.rows_of(name(LayerTensor::kSsmAlpha), share.v(1)));
  SX_ASSIGN_OR_RETURN(g.beta_w, up.rows_of(name(LayerTensor::kSsmBeta), share.v(1)));
  SX_ASSIGN_OR_RETURN(g.ssm_out_w, up.cols_of(name(LayerTensor::kSsmOut), share.v(share.d)));
  SX_ASSIGN_OR_RETURN(g.conv_w, up.f32(name(LayerTensor::kSsmConv1d), false, share.channel_ranges()));
  SX_ASSIGN_OR_RETURN(g.ssm_a, up.f32(name(LayerTensor::kSsmA), false, share.v(1)));
  SX_ASSIGN_OR_RETURN(g.dt_bias, up.f32(name(LayerTensor::kSsmDt), false, share.v(1)));
  SX_ASSIGN_OR_RETURN(g.ssm_norm, up.f32(name(LayerTensor::kSsmNorm)));
  return g;
}

Status GatedDeltaNet::run(const Step& step, const Workspace& ws, hal::BufView conv_state,
                          hal::BufView delta_state) const {
  hal::Stream& s = step.stream;
  const model::ModelConfig& c = step.config;
  const SsmShare share = ssm_share(c, step.rp);
  const std::int64_t T = step.T, H = c.hidden;
  const std::int64_t C = share.channels(), inner = share.inner(), nv = share.nv(), d = share.d;
  const auto V = view_of;
  SX_RETURN_IF_ERROR(step.matmul(qkv_w, nullptr, V(ws.xn), V(ws.qkv), T, C, H));
  SX_RETURN_IF_ERROR(step.matmul(z_w, nullptr, V(ws.xn), V(ws.z), T, inner, H));
  SX_RETURN_IF_ERROR(step.matmul(alpha_w, nullptr, V(ws.xn), V(ws.alpha), T, nv, H));
  SX_RETURN_IF_ERROR(step.matmul(beta_w, nullptr, V(ws.xn), V(ws.beta), T, nv, H));
  hal::ConvStateArgs cs = conv_state_args(c, share, step.options, T, step.n_seqs);
  cs.x = V(ws.qkv);
  cs.weight = conv_w.view();
  cs.state = conv_state;
  cs.out = V(ws.conv_out);
  cs.seq_token_start = step.in.seq_start;
  cs.seq_context_len = step.in.seq_ctx;
  cs.seq_slot = step.in.state_slot;
  SX_RETURN_IF_ERROR(s.run(cs));
  hal::DeltaRuleArgs dr = delta_rule_args(c, share, step.options, T, step.n_seqs);
  dr.q = V(ws.conv_out);
  dr.k = dr.q.at(f32_bytes(share.nk * d));
  dr.v = dr.q.at(f32_bytes(2 * share.nk * d));
  dr.alpha = V(ws.alpha);
  dr.beta = V(ws.beta);
  dr.a = ssm_a.view();
  dr.dt_bias = dt_bias.view();
  dr.state = delta_state;
  dr.out = V(ws.ssm_o);
  dr.seq_token_start = cs.seq_token_start;
  dr.seq_context_len = cs.seq_context_len;
  dr.seq_slot = cs.seq_slot;
  SX_RETURN_IF_ERROR(s.run(dr));
  const auto eps = static_cast<float>(c.rms_eps);
  SX_RETURN_IF_ERROR(s.run(hal::GatedNormArgs{V(ws.ssm_o), V(ws.z), ssm_norm.view(), V(ws.ssm_o), T * nv, d, eps}));
  return step.matmul(ssm_out_w, nullptr, V(ws.ssm_o), V(ws.delta), T, H, inner);
}

void GatedDeltaNet::ops(const OpsSite& site, const parallel::LayerWeightTypes& held, std::vector<hal::Op>& ops) {
  const model::ModelConfig& c = site.config;
  const SsmShare share = ssm_share(c, site.rp);
  const std::int64_t T = site.T(), H = c.hidden;
  site.matmul(ops, held.qkv, T, share.channels(), H);
  site.matmul(ops, held.z, T, share.inner(), H);
  site.matmul(ops, held.alpha, T, share.nv(), H);
  site.matmul(ops, held.beta, T, share.nv(), H);
  site.matmul(ops, held.ssm_out, T, H, share.inner());
  ops.emplace_back(conv_state_args(c, share, site.options, T, site.max_seqs()));
  ops.emplace_back(delta_rule_args(c, share, site.options, T, site.max_seqs()));
  ops.emplace_back(hal::GatedNormArgs{{}, {}, {}, {}, T * share.nv(), share.d, static_cast<float>(c.rms_eps)});
}

}  // namespace sx::engine
