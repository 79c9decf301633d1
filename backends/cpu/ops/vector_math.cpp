// Small vectorised helpers used by the CPU ops: dot, axpy, row loading with conversion.
#include <cstring>

#include "backends/cpu/ops/cpu_ops.h"

#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#define SX_CPU_AVX2 1
#endif

namespace sx::cpu {

#ifdef SX_CPU_AVX2
namespace {
inline float hsum256(__m256 v) {
  __m128 lo = _mm256_castps256_ps128(v);
  __m128 hi = _mm256_extractf128_ps(v, 1);
  lo = _mm_add_ps(lo, hi);
  lo = _mm_add_ps(lo, _mm_movehl_ps(lo, lo));
  lo = _mm_add_ss(lo, _mm_shuffle_ps(lo, lo, 0x55));
  return _mm_cvtss_f32(lo);
}
}  // namespace
#endif

float dot_f32(const float* a, const float* b, std::int64_t n) {
  std::int64_t i = 0;
  float sum = 0.0f;
#ifdef SX_CPU_AVX2
  __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
  for (; i + 16 <= n; i += 16) {
    acc0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), acc0);
    acc1 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 8), _mm256_loadu_ps(b + i + 8), acc1);
  }
  for (; i + 8 <= n; i += 8) acc0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), acc0);
  sum = hsum256(_mm256_add_ps(acc0, acc1));
#endif
  for (; i < n; ++i) sum += a[i] * b[i];
  return sum;
}

void axpy_f32(float a, const float* x, float* y, std::int64_t n) {
  std::int64_t i = 0;
#ifdef SX_CPU_AVX2
  const __m256 va = _mm256_set1_ps(a);
  for (; i + 8 <= n; i += 8) {
    _mm256_storeu_ps(y + i, _mm256_fmadd_ps(va, _mm256_loadu_ps(x + i), _mm256_loadu_ps(y + i)));
  }
#endif
  for (; i < n; ++i) y[i] += a * x[i];
}

void load_row_f32(hal::DType type, const void* row, float* dst, std::int64_t n) {
#ifdef SX_CPU_AVX2
  if (type == hal::DType::kF16) {
    const auto* s = static_cast<const std::uint16_t*>(row);
    std::int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
      _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(s + i))));
    }
    if (i < n) hal::dequantize_row(type, s + i, dst + i, n - i);
    return;
  }
#endif
  hal::dequantize_row(type, row, dst, n);
}

}  // namespace sx::cpu
