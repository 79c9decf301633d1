// The mixture-of-experts ops on the CPU (hal::MoeRouterArgs, hal::MoeFfnArgs; cpu_ops.h): the
// router's softmax and top-k per token, and the routed experts' SwiGLU FFNs grouped by expert, each
// expert's stacked matrices run through the ordinary matmul kernels once per call over the rows of
// the tokens routed to it.
#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

#include <fmt/format.h>

#include "backends/cpu/kernels/layouts.h"
#include "backends/cpu/kernels/matmul.h"
#include "backends/cpu/ops/cpu_ops.h"
#include "runtime/hal/ops.h"

namespace sx::cpu {

void moe_router(ThreadPool& pool, const float* logits, std::int32_t* ids, float* weights, std::int64_t n_tokens,
                std::int64_t n_experts, std::int64_t k, bool normalize) {
  pool.parallel_for(n_tokens, [&](std::int64_t t) {
    std::vector<float> p(static_cast<std::size_t>(n_experts));
    std::vector<std::int32_t> order(static_cast<std::size_t>(n_experts));
    {
      const float* row = logits + t * n_experts;
      float mx = row[0];
      for (std::int64_t e = 1; e < n_experts; ++e) mx = std::max(mx, row[e]);
      double sum = 0;
      for (std::int64_t e = 0; e < n_experts; ++e) {
        p[static_cast<std::size_t>(e)] = std::exp(row[e] - mx);
        sum += p[static_cast<std::size_t>(e)];
      }
      for (float& v : p) v = static_cast<float>(v / sum);
      std::iota(order.begin(), order.end(), 0);
      std::partial_sort(order.begin(), order.begin() + k, order.end(), [&](std::int32_t a, std::int32_t b) {
        return hal::top_k_before(p[static_cast<std::size_t>(a)], a, p[static_cast<std::size_t>(b)], b);
      });
      double chosen = 0;
      for (std::int64_t j = 0; j < k; ++j) chosen += p[static_cast<std::size_t>(order[static_cast<std::size_t>(j)])];
      for (std::int64_t j = 0; j < k; ++j) {
        const std::int32_t e = order[static_cast<std::size_t>(j)];
        ids[t * k + j] = e;
        const float w = p[static_cast<std::size_t>(e)];
        weights[t * k + j] = normalize && chosen > 0 ? static_cast<float>(w / chosen) : w;
      }
    }
  });
}

Status moe_ffn(ThreadPool& pool, Scratch& scratch, const MoeFfnPtrs& p, const hal::MoeFfnArgs& a) {
  const std::int64_t T = a.n_tokens, H = a.dim, F = a.ffn;
  // Expert i's matrices begin after i experts' rows: whole interleaved groups only.
  for (const auto& [type, rows, what] : {std::tuple{p.gate_type, F, "gate"}, std::tuple{p.up_type, F, "up"},
                                         std::tuple{p.down_type, H, "down"}}) {
    if (rows % interleaved_rows(type) != 0) {
      return invalid_argument_error("moe_ffn: {} experts of {} rows do not fall on the {} layout's groups of {}",
                                    what, rows, type_name(type), interleaved_rows(type));
    }
  }
  std::fill_n(p.out, T * H, 0.0f);
  // The tokens (and their weights) routed to each local expert, in token order.
  std::vector<std::vector<std::pair<std::int32_t, float>>> routed(static_cast<std::size_t>(a.n_local));
  for (std::int64_t t = 0; t < T; ++t) {
    for (std::int64_t j = 0; j < a.k; ++j) {
      const std::int64_t e = p.ids[t * a.k + j] - a.expert_begin;
      if (e >= 0 && e < a.n_local) routed[static_cast<std::size_t>(e)].emplace_back(static_cast<std::int32_t>(t), p.weights[t * a.k + j]);
    }
  }
  std::vector<float> xs, g, u, d;
  const auto* gate = static_cast<const std::byte*>(p.gate);
  const auto* up = static_cast<const std::byte*>(p.up);
  const auto* down = static_cast<const std::byte*>(p.down);
  for (std::int64_t e = 0; e < a.n_local; ++e) {
    const auto& rows = routed[static_cast<std::size_t>(e)];
    const auto m = static_cast<std::int64_t>(rows.size());
    if (m == 0) continue;
    xs.resize(static_cast<std::size_t>(m * H));
    g.resize(static_cast<std::size_t>(m * F));
    u.resize(static_cast<std::size_t>(m * F));
    d.resize(static_cast<std::size_t>(m * H));
    for (std::int64_t r = 0; r < m; ++r) {
      std::copy_n(p.x + rows[static_cast<std::size_t>(r)].first * H, H, xs.data() + r * H);
    }
    const void* ge = gate + cpu::tensor_bytes(p.gate_type, e * F, H);
    const void* ue = up + cpu::tensor_bytes(p.up_type, e * F, H);
    const void* de = down + cpu::tensor_bytes(p.down_type, e * H, F);
    matmul(pool, scratch, MatmulProblem{ge, p.gate_type, xs.data(), nullptr, g.data(), m, F, H});
    matmul(pool, scratch, MatmulProblem{ue, p.up_type, xs.data(), nullptr, u.data(), m, F, H});
    silu_mul(pool, g.data(), u.data(), g.data(), m, F, F, F, F);
    matmul(pool, scratch, MatmulProblem{de, p.down_type, g.data(), nullptr, d.data(), m, H, F});
    for (std::int64_t r = 0; r < m; ++r) {
      const auto& [t, w] = rows[static_cast<std::size_t>(r)];
      axpy_f32(w, d.data() + r * H, p.out + static_cast<std::int64_t>(t) * H, H);
    }
  }
  return ok_status();
}

}  // namespace sx::cpu
