// RMSNorm with an optional fused residual add (x += add; out = x / rms(x) * w).
#include <cmath>

#include "backends/cpu/ops/cpu_ops.h"

namespace sx::cpu {

void rmsnorm(ThreadPool& pool, float* x, const float* add, const float* weight, float* out,
             std::int64_t n_rows, std::int64_t dim, float eps) {
  auto row_fn = [&](std::int64_t r) {
    float* xr = x + r * dim;
    if (add != nullptr) {
      const float* ar = add + r * dim;
      for (std::int64_t i = 0; i < dim; ++i) xr[i] += ar[i];
    }
    double ss = 0.0;
    for (std::int64_t i = 0; i < dim; ++i) ss += static_cast<double>(xr[i]) * xr[i];
    const float scale = 1.0f / std::sqrt(static_cast<float>(ss / static_cast<double>(dim)) + eps);
    float* o = out + r * dim;
    for (std::int64_t i = 0; i < dim; ++i) o[i] = xr[i] * scale * weight[i];
  };
  if (n_rows < 4) {
    for (std::int64_t r = 0; r < n_rows; ++r) row_fn(r);
  } else {
    pool.parallel_for(n_rows, row_fn);
  }
}

}  // namespace sx::cpu
