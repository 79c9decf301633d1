// Element-wise ops: silu(gate) * up, add, and the top k of each row.
#include <cmath>

#include "backends/cpu/ops/cpu_ops.h"
#include "runtime/hal/ops.h"

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

void top_k_rows(ThreadPool& pool, const float* x, float* values, std::int32_t* ids, std::int64_t n_rows,
                std::int64_t n_cols, std::int64_t k, std::int64_t id_offset) {
  auto row_fn = [&](std::int64_t r) {
    const float* row = x + r * n_cols;
    float* v = values + r * k;
    std::int32_t* id = ids + r * k;
    // v / id: the best `n` so far in order; a column enters when it beats the last kept one.
    std::int64_t n = 0;
    for (std::int64_t j = 0; j < n_cols; ++j) {
      if (n == k && !hal::top_k_before(row[j], j, v[k - 1], id[k - 1] - id_offset)) continue;
      std::int64_t pos = n < k ? n++ : k - 1;
      while (pos > 0 && hal::top_k_before(row[j], j, v[pos - 1], id[pos - 1] - id_offset)) {
        v[pos] = v[pos - 1];
        id[pos] = id[pos - 1];
        --pos;
      }
      v[pos] = row[j];
      id[pos] = static_cast<std::int32_t>(j + id_offset);
    }
  };
  if (n_rows < 2) {
    for (std::int64_t r = 0; r < n_rows; ++r) row_fn(r);
  } else {
    pool.parallel_for(n_rows, row_fn);
  }
}

}  // namespace sx::cpu
