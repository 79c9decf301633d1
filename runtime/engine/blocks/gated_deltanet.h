// The Gated DeltaNet block (Qwen3.5's linear-attention layers): q|k|v, z, alpha, beta; the causal
// conv with each sequence's conv state; the delta rule on its recurrent state; the gated norm with
// z; the row-parallel ssm_out. A rank holds some K heads with the V heads that read them.
#pragma once

#include <cstdint>
#include <vector>

#include "runtime/engine/blocks/step.h"

namespace sx::engine {

// A rank's share of a hybrid's DeltaNet layers: K heads [k0, k0 + nk) of nk_all with the V heads
// that read them, all of d dims. Tiled files (GGUF; V head j reads K head j % nk_all): in each of
// the `groups` groups of nk_all V heads, the nk with them; locally they stay tiled (group-major),
// so local V head j reads local K head j % nk. Grouped files (Hugging Face; V head j reads K head
// j / groups): the one run of V heads [k0 * groups, (k0 + nk) * groups), still grouped locally.
struct SsmShare {
  std::int64_t k0 = 0, nk = 0, nk_all = 0, groups = 1, d = 0;
  bool grouped = false;
  std::int64_t nv() const { return nk * groups; }
  std::int64_t channels() const { return (2 * nk + nv()) * d; }
  std::int64_t inner() const { return nv() * d; }
  // The held V heads' ranges in units of `per_head` (d for rows of v / z / ssm_out's columns, 1 for
  // alpha / beta / a / dt), after `offset` units.
  Ranges v(std::int64_t per_head, std::int64_t offset = 0) const;
  // The q|k|v channels held (rows of attn_qkv and ssm_conv1d).
  Ranges channel_ranges() const;
};

// Rank rp's share (all zero for a model with no DeltaNet layers).
SsmShare ssm_share(const model::ModelConfig& c, const parallel::RankPlan& rp);

class GatedDeltaNet {
 public:
  // This rank's heads of layer site.layer; state_index: the layer's states among the rank's.
  static Result<GatedDeltaNet> load(const BlockSite& site, std::int64_t state_index);
  // xn -> delta, reading and advancing each sequence's conv and recurrent states.
  Status run(const Step& step, const Workspace& ws, hal::BufView conv_state, hal::BufView delta_state) const;
  static void ops(const OpsSite& site, const parallel::LayerWeightTypes& held, std::vector<hal::Op>& ops);

  std::int64_t state_index() const { return state_index_; }

 private:
  std::int64_t state_index_ = -1;
  DeviceTensor qkv_w, z_w, alpha_w, beta_w, ssm_out_w;
  DeviceTensor conv_w, ssm_a, dt_bias, ssm_norm;  // read as F32
};

}  // namespace sx::engine
