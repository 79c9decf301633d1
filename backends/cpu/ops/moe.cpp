// The mixture-of-experts ops on the CPU (hal::MoeRouterArgs, hal::MoeFfnArgs; cpu_ops.h): the
// router's softmax and top-k per token, and the routed experts' SwiGLU FFNs grouped by expert, each
// expert's stacked matrices run through the ordinary matmul kernels once per call over the rows of
// the tokens routed to it: experts shared out whole among the threads when there are enough of
// them (a decode step's 8 on 2 threads), else one after the other on all threads.
#include <algorithm>
#include <atomic>
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

namespace {

// One expert's FFN over its routed rows: xs [m][H] gathered from x, then down(silu(gate xs) * up xs)
// into d [m][H], on `tp` (the whole pool, or a pool of one inside a thread of it).
struct ExpertBuffers {
  std::vector<float> xs, g, u;
};

void run_expert(ThreadPool& tp, Scratch& scratch, const MoeFfnPtrs& p, const hal::MoeFfnArgs& a, std::int64_t e,
                const std::vector<std::pair<std::int32_t, float>>& rows, float* d, ExpertBuffers& b) {
  const std::int64_t H = a.dim, F = a.ffn, m = static_cast<std::int64_t>(rows.size());
  b.xs.resize(static_cast<std::size_t>(m * H));
  b.g.resize(static_cast<std::size_t>(m * F));
  b.u.resize(static_cast<std::size_t>(m * F));
  for (std::int64_t r = 0; r < m; ++r) std::copy_n(p.x + rows[static_cast<std::size_t>(r)].first * H, H, b.xs.data() + r * H);
  const void* ge = static_cast<const std::byte*>(p.gate) + cpu::tensor_bytes(p.gate_type, e * F, H);
  const void* ue = static_cast<const std::byte*>(p.up) + cpu::tensor_bytes(p.up_type, e * F, H);
  const void* de = static_cast<const std::byte*>(p.down) + cpu::tensor_bytes(p.down_type, e * H, F);
  matmul(tp, scratch, MatmulProblem{ge, p.gate_type, b.xs.data(), nullptr, b.g.data(), m, F, H});
  matmul(tp, scratch, MatmulProblem{ue, p.up_type, b.xs.data(), nullptr, b.u.data(), m, F, H});
  silu_mul(tp, b.g.data(), b.u.data(), b.g.data(), m, F, F, F, F);
  matmul(tp, scratch, MatmulProblem{de, p.down_type, b.g.data(), nullptr, d, m, H, F});
}

}  // namespace

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
  // The experts with tokens, and where each one's down outputs start in d.
  std::vector<std::int64_t> active, at(static_cast<std::size_t>(a.n_local), 0);
  std::int64_t rows = 0;
  for (std::int64_t e = 0; e < a.n_local; ++e) {
    if (routed[static_cast<std::size_t>(e)].empty()) continue;
    active.push_back(e);
    at[static_cast<std::size_t>(e)] = rows;
    rows += static_cast<std::int64_t>(routed[static_cast<std::size_t>(e)].size());
  }
  std::vector<float> d(static_cast<std::size_t>(rows * H));
  const auto n_active = static_cast<std::int64_t>(active.size());
  if (pool.size() > 1 && n_active >= 2 * pool.size()) {
    // Enough experts to share out whole: each thread runs whole experts on a pool of its own (no
    // synchronisation inside an expert), the largest first. A row's result does not depend on the
    // threads its matmul runs on, so this gives the same bits as the other branch.
    std::vector<std::int64_t> order = active;
    std::stable_sort(order.begin(), order.end(), [&](std::int64_t x, std::int64_t y) {
      return routed[static_cast<std::size_t>(x)].size() > routed[static_cast<std::size_t>(y)].size();
    });
    std::atomic<std::int64_t> next{0};
    pool.run_on_all([&](int, int) {
      thread_local ThreadPool alone(1);
      thread_local Scratch own;
      thread_local ExpertBuffers buffers;
      for (std::int64_t i = next++; i < n_active; i = next++) {
        const std::int64_t e = order[static_cast<std::size_t>(i)];
        run_expert(alone, own, p, a, e, routed[static_cast<std::size_t>(e)], d.data() + at[static_cast<std::size_t>(e)] * H,
                   buffers);
      }
    });
  } else {
    ExpertBuffers buffers;
    for (std::int64_t e : active) {
      run_expert(pool, scratch, p, a, e, routed[static_cast<std::size_t>(e)], d.data() + at[static_cast<std::size_t>(e)] * H,
                 buffers);
    }
  }
  // The weighted sum, expert by expert in order (the same order whichever branch ran).
  for (std::int64_t e : active) {
    const auto& rs = routed[static_cast<std::size_t>(e)];
    const float* de = d.data() + at[static_cast<std::size_t>(e)] * H;
    for (std::size_t r = 0; r < rs.size(); ++r) {
      axpy_f32(rs[r].second, de + static_cast<std::int64_t>(r) * H, p.out + static_cast<std::int64_t>(rs[r].first) * H, H);
    }
  }
  return ok_status();
}

}  // namespace sx::cpu
