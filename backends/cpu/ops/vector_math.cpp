// Small vectorised helpers used by the CPU ops: dot, axpy, row loading with conversion.
#include <cmath>
#include <cstring>

#include "backends/cpu/kernels/kernel_table.h"
#include "backends/cpu/ops/cpu_ops.h"
#include "backends/cpu/simd.h"

#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#define SX_CPU_AVX2 1
#endif

namespace sx::cpu::SX_CPU_ISA_NS {

#ifdef SX_CPU_AVX2
namespace {
// exp(x) for x in [-87.3, 88] (clamped outside): 2^n * p(r), r = x - n ln2 in [-ln2/2, ln2/2],
// p a degree-6 polynomial (Cephes expf coefficients); about 1 ulp.
inline __m256 exp256(__m256 x) {
  x = _mm256_min_ps(_mm256_max_ps(x, _mm256_set1_ps(-87.3f)), _mm256_set1_ps(88.0f));
  const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                                   _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);
  r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
  __m256 p = _mm256_set1_ps(1.9875691500e-4f);
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.3981999507e-3f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(8.3334519073e-3f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.1665795894e-2f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.6666665459e-1f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(5.0000001201e-1f));
  const __m256 r2 = _mm256_mul_ps(r, r);
  p = _mm256_fmadd_ps(p, r2, _mm256_add_ps(r, _mm256_set1_ps(1.0f)));
  const __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
  return _mm256_mul_ps(p, _mm256_castsi256_ps(e));
}
}  // namespace
#endif

float exp_shifted_sum(float* x, std::int64_t n, float shift) {
  std::int64_t i = 0;
  float sum = 0.0f;
#ifdef SX_CPU_AVX2
  const __m256 vs = _mm256_set1_ps(shift);
  __m256 acc = _mm256_setzero_ps();
  for (; i + 8 <= n; i += 8) {
    const __m256 e = exp256(_mm256_sub_ps(_mm256_loadu_ps(x + i), vs));
    _mm256_storeu_ps(x + i, e);
    acc = _mm256_add_ps(acc, e);
  }
  sum = hsum256(acc);
#endif
  for (; i < n; ++i) {
    x[i] = std::exp(x[i] - shift);
    sum += x[i];
  }
  return sum;
}

void silu_mul_row(const float* gate, const float* up, float* out, std::int64_t n) {
  std::int64_t i = 0;
#ifdef SX_CPU_AVX2
  const __m256 one = _mm256_set1_ps(1.0f);
  for (; i + 8 <= n; i += 8) {
    const __m256 g = _mm256_loadu_ps(gate + i);
    const __m256 e = exp256(_mm256_sub_ps(_mm256_setzero_ps(), g));
    _mm256_storeu_ps(out + i, _mm256_mul_ps(_mm256_div_ps(g, _mm256_add_ps(one, e)), _mm256_loadu_ps(up + i)));
  }
#endif
  for (; i < n; ++i) out[i] = gate[i] / (1.0f + std::exp(-gate[i])) * up[i];
}

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

}  // namespace sx::cpu::SX_CPU_ISA_NS
