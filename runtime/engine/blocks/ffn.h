// The feed-forward blocks: a dense SwiGLU FFN (this rank's rows of gate / up, columns of down),
// routed experts (the router whole on every rank, the rank's experts stacked: expert parallelism)
// and a shared expert scaled by its sigmoid gate (whole on the stage's tp rank 0). Each reads xn
// and writes or adds to delta, before the layer's all-reduce.
#pragma once

#include <cstdint>
#include <vector>

#include "runtime/engine/blocks/step.h"

namespace sx::engine {

class DenseFfn {
 public:
  static Result<DenseFfn> load(const BlockSite& site);
  Status run(const Step& step, const Workspace& ws) const;  // xn -> delta
  static void ops(const OpsSite& site, const parallel::LayerWeightTypes& held, std::vector<hal::Op>& ops);

 private:
  DeviceTensor gate_w, up_w, down_w;
};

class RoutedExperts {
 public:
  static Result<RoutedExperts> load(const BlockSite& site);
  // xn -> delta: every rank routes every token the same way (xn is the same on all); each
  // computes its own experts' share, and the all-reduce sums them.
  Status run(const Step& step, const Workspace& ws) const;
  static void ops(const OpsSite& site, const parallel::LayerWeightTypes& held, std::vector<hal::Op>& ops);

 private:
  DeviceTensor router, gate_exps, up_exps, down_exps;
};

class SharedExpert {
 public:
  static Result<SharedExpert> load(const BlockSite& site);
  // delta += sigmoid(xn . gate row) * FFN(xn).
  Status run(const Step& step, const Workspace& ws) const;
  static void ops(const OpsSite& site, const parallel::LayerWeightTypes& held, std::vector<hal::Op>& ops);

 private:
  DeviceTensor sh_gate, sh_up, sh_down, sh_router;
};

// The experts' FFN of a step of T tokens on rank `rp` (buffers unset).
hal::MoeFfnArgs moe_ffn_args(const model::ModelConfig& c, const parallel::RankPlan& rp,
                             const parallel::LayerWeightTypes& w, std::int64_t T);

}  // namespace sx::engine
