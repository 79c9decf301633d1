// The feed-forward blocks (ffn.h).
#include "runtime/engine/blocks/ffn.h"

#include "runtime/model/tensor_names.h"

namespace sx::engine {

using model::LayerTensor;

hal::MoeFfnArgs moe_ffn_args(const model::ModelConfig& c, const parallel::RankPlan& rp,
                             const parallel::LayerWeightTypes& w, std::int64_t T) {
  hal::MoeFfnArgs m;
  m.gate_type = w.gate;
  m.up_type = w.up;
  m.down_type = w.down;
  m.n_tokens = T;
  m.dim = c.hidden;
  m.ffn = c.expert_ffn;
  m.k = c.n_experts_used;
  m.expert_begin = rp.experts.begin;
  m.n_local = rp.experts.size();
  return m;
}

Result<DenseFfn> DenseFfn::load(const BlockSite& site) {
  const std::int64_t f0 = site.rp.ffn.begin, fn = site.rp.ffn.size(), H = site.config.hidden;
  auto name = [&](LayerTensor t) { return model::layer_tensor_name(site.layer, t); };
  DenseFfn f;
  SX_ASSIGN_OR_RETURN(f.gate_w, site.up.tensor(name(LayerTensor::kFfnGate), true, f0, fn));
  SX_ASSIGN_OR_RETURN(f.up_w, site.up.tensor(name(LayerTensor::kFfnUp), true, f0, fn));
  SX_ASSIGN_OR_RETURN(f.down_w, site.up.tensor(name(LayerTensor::kFfnDown), true, 0, H, f0, fn, site.held.down));
  return f;
}

Status DenseFfn::run(const Step& step, const Workspace& ws) const {
  const std::int64_t T = step.T, H = step.config.hidden, nf = step.rp.ffn.size();
  const auto V = view_of;
  SX_RETURN_IF_ERROR(step.matmul(gate_w, nullptr, V(ws.xn), V(ws.gate), T, nf, H));
  SX_RETURN_IF_ERROR(step.matmul(up_w, nullptr, V(ws.xn), V(ws.up), T, nf, H));
  SX_RETURN_IF_ERROR(step.stream.run(hal::SiluMulArgs{V(ws.gate), V(ws.up), V(ws.gate), T, nf, 0, 0, 0}));
  return step.matmul(down_w, nullptr, V(ws.gate), V(ws.delta), T, H, nf);
}

void DenseFfn::ops(const OpsSite& site, const parallel::LayerWeightTypes& held, std::vector<hal::Op>& ops) {
  const std::int64_t T = site.T(), H = site.config.hidden, nf = site.rp.ffn.size();
  site.matmul(ops, held.gate, T, nf, H);
  site.matmul(ops, held.up, T, nf, H);
  site.matmul(ops, held.down, T, H, nf);
  ops.emplace_back(hal::SiluMulArgs{{}, {}, {}, T, nf, 0, 0, 0});
}

Result<RoutedExperts> RoutedExperts::load(const BlockSite& site) {
  const std::int64_t e0 = site.rp.experts.begin, ne = site.rp.experts.size(), fe = site.config.expert_ffn;
  const std::int64_t H = site.config.hidden;
  auto name = [&](LayerTensor t) { return model::layer_tensor_name(site.layer, t); };
  Uploader& up = site.up;
  RoutedExperts r;
  SX_ASSIGN_OR_RETURN(r.router, up.tensor(name(LayerTensor::kFfnGateInp), true));
  SX_ASSIGN_OR_RETURN(r.gate_exps, up.tensor(name(LayerTensor::kFfnGateExps), true, e0 * fe, ne * fe));
  SX_ASSIGN_OR_RETURN(r.up_exps, up.tensor(name(LayerTensor::kFfnUpExps), true, e0 * fe, ne * fe));
  SX_ASSIGN_OR_RETURN(r.down_exps, up.tensor(name(LayerTensor::kFfnDownExps), true, e0 * H, ne * H));
  return r;
}

Status RoutedExperts::run(const Step& step, const Workspace& ws) const {
  const model::ModelConfig& c = step.config;
  const std::int64_t T = step.T, H = c.hidden, E = c.n_experts, k = c.n_experts_used;
  const auto V = view_of;
  SX_RETURN_IF_ERROR(step.matmul(router, nullptr, V(ws.xn), V(ws.router_logits), T, E, H));
  SX_RETURN_IF_ERROR(step.stream.run(
      hal::MoeRouterArgs{V(ws.router_logits), V(ws.expert_ids), V(ws.expert_weights), T, E, k, c.norm_topk_prob}));
  parallel::LayerWeightTypes held;  // the formats the rank holds its experts in
  held.gate = gate_exps.type;
  held.up = up_exps.type;
  held.down = down_exps.type;
  hal::MoeFfnArgs m = moe_ffn_args(c, step.rp, held, T);
  m.x = V(ws.xn);
  m.ids = V(ws.expert_ids);
  m.weights = V(ws.expert_weights);
  m.gate = gate_exps.view();
  m.up = up_exps.view();
  m.down = down_exps.view();
  m.out = V(ws.delta);
  return step.stream.run(m);
}

void RoutedExperts::ops(const OpsSite& site, const parallel::LayerWeightTypes& held, std::vector<hal::Op>& ops) {
  const model::ModelConfig& c = site.config;
  const std::int64_t T = site.T();
  site.matmul(ops, held.router, T, c.n_experts, c.hidden);
  hal::MoeRouterArgs r;
  r.n_tokens = T;
  r.n_experts = c.n_experts;
  r.k = c.n_experts_used;
  r.normalize = c.norm_topk_prob;
  ops.emplace_back(r);
  ops.emplace_back(moe_ffn_args(c, site.rp, held, T));
}

Result<SharedExpert> SharedExpert::load(const BlockSite& site) {
  auto name = [&](LayerTensor t) { return model::layer_tensor_name(site.layer, t); };
  Uploader& up = site.up;
  SharedExpert e;
  SX_ASSIGN_OR_RETURN(e.sh_gate, up.tensor(name(LayerTensor::kFfnGateShexp), true));
  SX_ASSIGN_OR_RETURN(e.sh_up, up.tensor(name(LayerTensor::kFfnUpShexp), true));
  SX_ASSIGN_OR_RETURN(e.sh_down, up.tensor(name(LayerTensor::kFfnDownShexp), true));
  SX_ASSIGN_OR_RETURN(e.sh_router, up.f32(name(LayerTensor::kFfnGateInpShexp), /*as_row=*/true));
  return e;
}

Status SharedExpert::run(const Step& step, const Workspace& ws) const {
  hal::Stream& s = step.stream;
  const std::int64_t T = step.T, H = step.config.hidden, fs = step.config.shared_expert_ffn;
  const auto V = view_of;
  SX_RETURN_IF_ERROR(step.matmul(sh_gate, nullptr, V(ws.xn), V(ws.sh_gate), T, fs, H));
  SX_RETURN_IF_ERROR(step.matmul(sh_up, nullptr, V(ws.xn), V(ws.sh_up), T, fs, H));
  SX_RETURN_IF_ERROR(s.run(hal::SiluMulArgs{V(ws.sh_gate), V(ws.sh_up), V(ws.sh_gate), T, fs, 0, 0, 0}));
  SX_RETURN_IF_ERROR(step.matmul(sh_down, nullptr, V(ws.sh_gate), V(ws.sh_out), T, H, fs));
  SX_RETURN_IF_ERROR(step.matmul(sh_router, nullptr, V(ws.xn), V(ws.sh_logit), T, 1, H));
  SX_RETURN_IF_ERROR(s.run(hal::SigmoidMulArgs{V(ws.sh_out), V(ws.sh_logit), V(ws.sh_out), T, H, 0, 0, 0, true}));
  return s.run(hal::AddArgs{V(ws.delta), V(ws.sh_out), V(ws.delta), T * H});
}

void SharedExpert::ops(const OpsSite& site, const parallel::LayerWeightTypes& held, std::vector<hal::Op>& ops) {
  const std::int64_t T = site.T(), H = site.config.hidden, fs = site.config.shared_expert_ffn;
  site.matmul(ops, held.sh_gate, T, fs, H);
  site.matmul(ops, held.sh_up, T, fs, H);
  site.matmul(ops, held.sh_down, T, H, fs);
  site.matmul(ops, hal::DType::kF32, T, 1, H);  // its gate (read as f32)
  ops.emplace_back(hal::SiluMulArgs{{}, {}, {}, T, fs, 0, 0, 0});
  ops.emplace_back(hal::SigmoidMulArgs{{}, {}, {}, T, H, 0, 0, 0, true});
  ops.emplace_back(hal::AddArgs{{}, {}, {}, T * H});
}

}  // namespace sx::engine
