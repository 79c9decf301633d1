// Activation quantiser of the int8 (Q8_0) paths: F32 rows -> int8 blocks of 32 with an F32 scale.
#include <algorithm>
#include <cmath>
#include <cstdint>

#include "backends/cpu/kernels/kernel_table.h"
#include "backends/cpu/kernels/matmul_internal.h"

#if defined(__AVX2__)
#include <immintrin.h>
#endif

namespace sx::cpu::SX_CPU_ISA_NS {

void quantize_activations_q8(const float* x, std::int64_t k, std::int8_t* qs, float* d) {
  constexpr int kB = hal::kQ8_0Block;
  for (std::int64_t b = 0; b < k / kB; ++b) {
    const float* xb = x + b * kB;
    std::int8_t* qb = qs + b * kB;
#if defined(__AVX2__)
    const __m256 sign = _mm256_set1_ps(-0.0f);
    __m256 v0 = _mm256_loadu_ps(xb), v1 = _mm256_loadu_ps(xb + 8);
    __m256 v2 = _mm256_loadu_ps(xb + 16), v3 = _mm256_loadu_ps(xb + 24);
    __m256 m = _mm256_max_ps(_mm256_max_ps(_mm256_andnot_ps(sign, v0), _mm256_andnot_ps(sign, v1)),
                             _mm256_max_ps(_mm256_andnot_ps(sign, v2), _mm256_andnot_ps(sign, v3)));
    __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
    m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
    m4 = _mm_max_ss(m4, _mm_movehdup_ps(m4));
    const float amax = _mm_cvtss_f32(m4);
    const float dd = amax / 127.0f;
    const float id = dd != 0.0f ? 1.0f / dd : 0.0f;
    d[b] = dd;
    const __m256 idv = _mm256_set1_ps(id);
    constexpr int kRound = _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC;
    const __m256i i0 = _mm256_cvtps_epi32(_mm256_round_ps(_mm256_mul_ps(v0, idv), kRound));
    const __m256i i1 = _mm256_cvtps_epi32(_mm256_round_ps(_mm256_mul_ps(v1, idv), kRound));
    const __m256i i2 = _mm256_cvtps_epi32(_mm256_round_ps(_mm256_mul_ps(v2, idv), kRound));
    const __m256i i3 = _mm256_cvtps_epi32(_mm256_round_ps(_mm256_mul_ps(v3, idv), kRound));
    // packs interleave the 128-bit lanes; the permute restores element order.
    const __m256i p = _mm256_packs_epi16(_mm256_packs_epi32(i0, i1), _mm256_packs_epi32(i2, i3));
    const __m256i q = _mm256_permutevar8x32_epi32(p, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(qb), q);
#else
    float amax = 0.0f;
    for (int j = 0; j < kB; ++j) amax = std::max(amax, std::fabs(xb[j]));
    const float dd = amax / 127.0f;
    const float id = dd != 0.0f ? 1.0f / dd : 0.0f;
    d[b] = dd;
    for (int j = 0; j < kB; ++j) qb[j] = static_cast<std::int8_t>(std::nearbyint(xb[j] * id));
#endif
  }
}

namespace detail {

void quantize_rows_q8(const float* x, std::int64_t r0, std::int64_t r1, std::int64_t k,
                      std::int8_t* qs, float* d) {
  for (std::int64_t r = r0; r < r1; ++r) {
    quantize_activations_q8(x + r * k, k, qs + r * k, d + r * (k / hal::kQ8_0Block));
  }
}

}  // namespace detail
}  // namespace sx::cpu::SX_CPU_ISA_NS
