// Small-m matmul for Q8_0 weights: x quantised to int8 blocks once per call, then int8 dot
// products per block (AVX2 sign trick: |w| * sign(x, w) with maddubs, pairs summed with madd,
// 8 rows reduced together by a transposing add tree), scaled by d_w * d_x into F32 accumulators,
// one lane per row. W is streamed once (memory-bound decode GEMV).
#include <algorithm>
#include <cmath>
#include <cstdint>

#include "backends/cpu/kernels/matmul_internal.h"
#include "backends/cpu/simd.h"
#include "runtime/base/half.h"

#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#define SX_GEMV_Q8_AVX2 1
#include <immintrin.h>
#endif

namespace sx::cpu::SX_CPU_ISA_NS::detail {

namespace {

using hal::BlockQ8_0;
constexpr int kB = hal::kQ8_0Block;

// Every Q8_0 matmul path computes the same value for an output y[t][j] (so results do not depend
// on the batch a token is in): per block b the exact int32 dot product of the int8 weights and
// activations, then acc = fma(float(isum_b), d_w(b) * d_x(b), acc) in block order from acc = 0,
// then acc + bias. The GEMM (gemm_q8_0.cpp) computes exactly this too.

#if SX_GEMV_Q8_AVX2

// int32 dot products of one block of 8 rows (wq[r] = 32 int8 weights) with 32 int8 activations,
// as the 8 lanes of one vector (exact).
inline __m256i block_dots8(const BlockQ8_0* const* wrow, std::int64_t b, __m256i xv) {
  const __m256i ones = _mm256_set1_epi16(1);
  __m256i p[8];
  for (int r = 0; r < 8; ++r) {
    const __m256i w = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(wrow[r][b].qs));
    // |w| * sign(x, w): the unsigned x signed multiply of maddubs; pairs then quads summed.
    p[r] = _mm256_madd_epi16(_mm256_maddubs_epi16(_mm256_abs_epi8(w), _mm256_sign_epi8(xv, w)), ones);
  }
  // Transposing add tree: lane r of the result is the sum of the 8 lanes of p[r].
  const __m256i s01 = _mm256_hadd_epi32(p[0], p[1]), s23 = _mm256_hadd_epi32(p[2], p[3]);
  const __m256i s45 = _mm256_hadd_epi32(p[4], p[5]), s67 = _mm256_hadd_epi32(p[6], p[7]);
  const __m256i s0123 = _mm256_hadd_epi32(s01, s23), s4567 = _mm256_hadd_epi32(s45, s67);
  return _mm256_add_epi32(_mm256_permute2x128_si256(s0123, s4567, 0x20), _mm256_permute2x128_si256(s0123, s4567, 0x31));
}

// 8 rows of W (row r at wrow[r], nb blocks each) against T quantised tokens (xq row stride k, xd
// row stride nb); y[t * ldy + r * y_stride] (+ bias[r * y_stride]). Lane r of acc[t] is row r.
template <int T>
void tile8(const BlockQ8_0* const* wrow, std::int64_t nb, const std::int8_t* xq, const float* xd, std::int64_t k,
           float* y, std::int64_t ldy, std::int64_t y_stride, const float* bias) {
  __m256 acc[T];
  for (int t = 0; t < T; ++t) acc[t] = _mm256_setzero_ps();
  for (std::int64_t b = 0; b < nb; ++b) {
    for (int r = 0; r < 8; ++r) {
      _mm_prefetch(reinterpret_cast<const char*>(&wrow[r][b]) + kGemvPrefetchBytes, _MM_HINT_T0);
    }
    // Built from scalars, not loaded: narrow stores followed by a wide load would stall store
    // forwarding on every block.
    const __m256 dw = _mm256_cvtph_ps(_mm_setr_epi16(
        static_cast<short>(wrow[0][b].d), static_cast<short>(wrow[1][b].d), static_cast<short>(wrow[2][b].d),
        static_cast<short>(wrow[3][b].d), static_cast<short>(wrow[4][b].d), static_cast<short>(wrow[5][b].d),
        static_cast<short>(wrow[6][b].d), static_cast<short>(wrow[7][b].d)));
    for (int t = 0; t < T; ++t) {
      const __m256i xv = _mm256_load_si256(reinterpret_cast<const __m256i*>(xq + t * k + b * kB));
      const __m256i dots = block_dots8(wrow, b, xv);
      acc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dots), _mm256_mul_ps(dw, _mm256_set1_ps(xd[t * nb + b])), acc[t]);
    }
  }
  for (int t = 0; t < T; ++t) {
    alignas(32) float v[8];
    _mm256_store_ps(v, acc[t]);
    for (int r = 0; r < 8; ++r) y[t * ldy + r * y_stride] = v[r] + (bias != nullptr ? bias[r * y_stride] : 0.0f);
  }
}

// The same for 4 rows and one token (decode): 4 long streams suit the prefetchers better than 8.
void tile4(const BlockQ8_0* const* wrow, std::int64_t nb, const std::int8_t* xq, const float* xd, float* y,
           std::int64_t y_stride, const float* bias) {
  const __m256i ones = _mm256_set1_epi16(1);
  __m128 acc = _mm_setzero_ps();
  for (std::int64_t b = 0; b < nb; ++b) {
    for (int r = 0; r < 4; ++r) {
      _mm_prefetch(reinterpret_cast<const char*>(&wrow[r][b]) + kGemvPrefetchBytes, _MM_HINT_T0);
    }
    const __m128 dw = _mm_cvtph_ps(_mm_setr_epi16(static_cast<short>(wrow[0][b].d), static_cast<short>(wrow[1][b].d),
                                                  static_cast<short>(wrow[2][b].d), static_cast<short>(wrow[3][b].d), 0, 0,
                                                  0, 0));
    const __m256i xv = _mm256_load_si256(reinterpret_cast<const __m256i*>(xq + b * kB));
    __m256i p[4];
    for (int r = 0; r < 4; ++r) {
      const __m256i w = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(wrow[r][b].qs));
      p[r] = _mm256_madd_epi16(_mm256_maddubs_epi16(_mm256_abs_epi8(w), _mm256_sign_epi8(xv, w)), ones);
    }
    // Lane r of the low half + lane r of the high half = the block dot of row r.
    const __m256i s = _mm256_hadd_epi32(_mm256_hadd_epi32(p[0], p[1]), _mm256_hadd_epi32(p[2], p[3]));
    const __m128i dots = _mm_add_epi32(_mm256_castsi256_si128(s), _mm256_extracti128_si256(s, 1));
    acc = _mm_fmadd_ps(_mm_cvtepi32_ps(dots), _mm_mul_ps(dw, _mm_set1_ps(xd[b])), acc);
  }
  alignas(16) float v[4];
  _mm_store_ps(v, acc);
  for (int r = 0; r < 4; ++r) y[r * y_stride] = v[r] + (bias != nullptr ? bias[r * y_stride] : 0.0f);
}

// One row against one token (the rows left over by tile8), the same arithmetic.
void row1(const BlockQ8_0* w, std::int64_t nb, const std::int8_t* xq, const float* xd, float* y, const float* bias) {
  const __m256i ones = _mm256_set1_epi16(1);
  float acc = 0.0f;
  for (std::int64_t b = 0; b < nb; ++b) {
    const __m256i wv = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w[b].qs));
    const __m256i xv = _mm256_load_si256(reinterpret_cast<const __m256i*>(xq + b * kB));
    const __m256i p = _mm256_madd_epi16(_mm256_maddubs_epi16(_mm256_abs_epi8(wv), _mm256_sign_epi8(xv, wv)), ones);
    __m128i s = _mm_add_epi32(_mm256_castsi256_si128(p), _mm256_extracti128_si256(p, 1));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4E));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0xB1));
    acc = std::fma(static_cast<float>(_mm_cvtsi128_si32(s)), f16_to_f32(w[b].d) * xd[b], acc);
  }
  *y = acc + (bias != nullptr ? *bias : 0.0f);
}

// Rows [0, n_rows) of W against all m tokens. The rows are read as 8 long streams (the 8
// contiguous parts of the range, one row of each per tile) rather than 8 adjacent short rows:
// long streams keep the prefetchers ahead (decode reads W from DRAM).
void rows(const BlockQ8_0* w, std::int64_t nb, const std::int8_t* xq, const float* xd, std::int64_t m,
          std::int64_t k, float* y, std::int64_t ldy, const float* bias, std::int64_t n_rows) {
  if (m == 1) {
    const std::int64_t q = n_rows / 4;
    for (std::int64_t i = 0; i < q; ++i) {
      const BlockQ8_0* wrow[4];
      for (int r = 0; r < 4; ++r) wrow[r] = w + (r * q + i) * nb;
      tile4(wrow, nb, xq, xd, y + i, q, bias != nullptr ? bias + i : nullptr);
    }
    for (std::int64_t r = 4 * q; r < n_rows; ++r) row1(w + r * nb, nb, xq, xd, y + r, bias != nullptr ? bias + r : nullptr);
    return;
  }
  constexpr int kT = 4;
  const std::int64_t q = n_rows / 8;  // rows per stream
  for (std::int64_t i = 0; i < q; ++i) {
    const BlockQ8_0* wrow[8];
    for (int r = 0; r < 8; ++r) wrow[r] = w + (r * q + i) * nb;
    const float* bi = bias != nullptr ? bias + i : nullptr;
    std::int64_t t = 0;
    for (; t + kT <= m; t += kT) tile8<kT>(wrow, nb, xq + t * k, xd + t * nb, k, y + t * ldy + i, ldy, q, bi);
    for (; t < m; ++t) tile8<1>(wrow, nb, xq + t * k, xd + t * nb, k, y + t * ldy + i, ldy, q, bi);
  }
  for (std::int64_t r = 8 * q; r < n_rows; ++r) {
    for (std::int64_t t = 0; t < m; ++t) {
      row1(w + r * nb, nb, xq + t * k, xd + t * nb, y + t * ldy + r, bias != nullptr ? bias + r : nullptr);
    }
  }
}
#else
void rows(const BlockQ8_0* w, std::int64_t nb, const std::int8_t* xq, const float* xd,
          std::int64_t m, std::int64_t k, float* y, std::int64_t ldy, const float* bias,
          std::int64_t n_rows) {
  for (std::int64_t r = 0; r < n_rows; ++r) {
    for (std::int64_t t = 0; t < m; ++t) {
      float acc = 0.0f;
      for (std::int64_t b = 0; b < nb; ++b) {
        const BlockQ8_0& blk = w[r * nb + b];
        std::int32_t s = 0;
        for (int c = 0; c < kB; ++c) s += static_cast<std::int32_t>(blk.qs[c]) * xq[t * k + b * kB + c];
        acc = std::fma(static_cast<float>(s), f16_to_f32(blk.d) * xd[t * nb + b], acc);
      }
      y[t * ldy + r] = acc + (bias != nullptr ? bias[r] : 0.0f);
    }
  }
}
#endif

}  // namespace

void gemv_q8_0(ThreadPool& pool, Scratch& scratch, const MatmulProblem& p) {
  const std::int64_t nb = p.k / kB;
  auto* xq = static_cast<std::int8_t*>(scratch.get(kSlotActs, static_cast<std::size_t>(p.m * p.k) +
                                                                   static_cast<std::size_t>(p.m * nb) * sizeof(float)));
  auto* xd = reinterpret_cast<float*>(xq + p.m * p.k);  // k % 32 == 0: stays 4-byte aligned
  if (p.m * p.k <= 32768) {
    quantize_rows_q8(p.x, 0, p.m, p.k, xq, xd);
  } else {
    pool.parallel_for(p.m, [&](std::int64_t r) { quantize_rows_q8(p.x, r, r + 1, p.k, xq, xd); });
  }
  const auto* w = static_cast<const BlockQ8_0*>(p.w);
  for_row_chunks(pool, p.n, [&](std::int64_t r0, std::int64_t r1) {
    rows(w + r0 * nb, nb, xq, xd, p.m, p.k, p.y + r0, p.n, p.bias != nullptr ? p.bias + r0 : nullptr,
         r1 - r0);
  });
}

}  // namespace sx::cpu::SX_CPU_ISA_NS::detail
