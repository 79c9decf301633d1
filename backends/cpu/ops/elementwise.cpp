// Element-wise ops: silu(gate) * up, add, and row argmax.
#include <cmath>

#include "backends/cpu/ops/cpu_ops.h"

namespace sx::cpu {

void silu_mul(ThreadPool& pool, const float* gate, const float* up, float* out, std::int64_t n_rows,
              std::int64_t n_cols, std::int64_t gate_stride, std::int64_t up_stride,
              std::int64_t out_stride) {
  auto row_fn = [&](std::int64_t r) {
    const float* g = gate + r * gate_stride;
    const float* u = up + r * up_stride;
    float* o = out + r * out_stride;
    silu_mul_row(g, u, o, n_cols);
  };
  if (n_rows < 4) {
    for (std::int64_t r = 0; r < n_rows; ++r) row_fn(r);
  } else {
    pool.parallel_for(n_rows, row_fn);
  }
}

void add(ThreadPool& /*pool*/, const float* a, const float* b, float* out, std::int64_t n) {
  for (std::int64_t i = 0; i < n; ++i) out[i] = a[i] + b[i];
}

void argmax_rows(ThreadPool& pool, const float* x, std::int32_t* out, std::int64_t n_rows,
                 std::int64_t n_cols) {
  pool.parallel_for(n_rows, [&](std::int64_t r) {
    const float* row = x + r * n_cols;
    std::int64_t best = 0;
    for (std::int64_t j = 1; j < n_cols; ++j) {
      if (row[j] > row[best]) best = j;
    }
    out[r] = static_cast<std::int32_t>(best);
  });
}

}  // namespace sx::cpu
