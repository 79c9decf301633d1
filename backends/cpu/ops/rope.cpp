// Rotary position embedding, NeoX layout (pairs i and i + rot_dim/2), in place.
#include <cmath>
#include <vector>

#include "backends/cpu/ops/cpu_ops.h"

namespace sx::cpu {

void rope_neox(ThreadPool& pool, float* x, const std::int32_t* positions, std::int64_t n_tokens,
               std::int64_t n_heads, std::int64_t head_dim, std::int64_t rot_dim, float theta) {
  const std::int64_t half = rot_dim / 2;
  std::vector<double> inv_freq(static_cast<std::size_t>(half));
  for (std::int64_t i = 0; i < half; ++i) {
    inv_freq[i] = std::pow(static_cast<double>(theta), -2.0 * static_cast<double>(i) / static_cast<double>(rot_dim));
  }
  auto token_fn = [&](std::int64_t t) {
    const double pos = positions[t];
    float cs[256], sn[256];  // rot_dim <= 512 is checked by the stream
    for (std::int64_t i = 0; i < half; ++i) {
      const double a = pos * inv_freq[i];
      cs[i] = static_cast<float>(std::cos(a));
      sn[i] = static_cast<float>(std::sin(a));
    }
    for (std::int64_t h = 0; h < n_heads; ++h) {
      float* v = x + (t * n_heads + h) * head_dim;
      for (std::int64_t i = 0; i < half; ++i) {
        const float a = v[i], b = v[i + half];
        v[i] = a * cs[i] - b * sn[i];
        v[i + half] = a * sn[i] + b * cs[i];
      }
    }
  };
  if (n_tokens < 4) {
    for (std::int64_t t = 0; t < n_tokens; ++t) token_fn(t);
  } else {
    pool.parallel_for(n_tokens, token_fn);
  }
}

}  // namespace sx::cpu
