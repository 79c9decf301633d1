// Small-m matmul for Q8_0 weights: x quantised to int8 blocks once per call, then int8 dot
// products per block (AVX2 sign trick: |w| * sign(x, w) with maddubs, pairs summed with madd),
// scaled by d_w * d_x into F32 accumulators. W is streamed once (memory-bound decode GEMV).
#include <algorithm>
#include <cstdint>

#include "backends/cpu/kernels/matmul_internal.h"
#include "backends/cpu/simd.h"
#include "runtime/base/half.h"

#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#define SX_GEMV_Q8_AVX2 1
#include <immintrin.h>
#endif

namespace sx::cpu::detail {

namespace {

using hal::BlockQ8_0;
constexpr int kB = hal::kQ8_0Block;

#if SX_GEMV_Q8_AVX2

// R rows of W (row j at w + j * row_stride blocks, nb blocks each) against T quantised tokens (xq
// row stride k, xd row stride nb); y[t * ldy + j * y_stride] (+ bias[j * y_stride]).
template <int R, int T>
void tile(const BlockQ8_0* w, std::int64_t row_stride, std::int64_t nb, const std::int8_t* xq,
          const float* xd, std::int64_t k, float* y, std::int64_t ldy, std::int64_t y_stride,
          const float* bias) {
  const __m256i ones = _mm256_set1_epi16(1);
  __m256 acc[R][T];
  for (int r = 0; r < R; ++r)
    for (int t = 0; t < T; ++t) acc[r][t] = _mm256_setzero_ps();
  for (std::int64_t b = 0; b < nb; ++b) {
    __m256i wv[R], aw[R];
    // The R fp16 scales of this block, converted together. (An array rather than
    // _mm_insert_epi16, whose lane must be a compile-time constant even when the loop is not
    // unrolled, as in -O2 sanitizer builds.)
    std::uint16_t dbits[8] = {};
    for (int r = 0; r < R; ++r) {
      const BlockQ8_0& blk = w[r * row_stride + b];
      _mm_prefetch(reinterpret_cast<const char*>(&blk) + kGemvPrefetchBytes, _MM_HINT_T0);
      wv[r] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk.qs));
      aw[r] = _mm256_abs_epi8(wv[r]);
      dbits[r] = blk.d;
    }
    // Built from scalars, not loaded: narrow stores followed by a wide load would stall store
    // forwarding on every block.
    const __m128 dw = _mm_cvtph_ps(_mm_setr_epi16(
        static_cast<short>(dbits[0]), static_cast<short>(dbits[1]), static_cast<short>(dbits[2]),
        static_cast<short>(dbits[3]), static_cast<short>(dbits[4]), static_cast<short>(dbits[5]),
        static_cast<short>(dbits[6]), static_cast<short>(dbits[7])));
    for (int t = 0; t < T; ++t) {
      const __m256i xv = _mm256_load_si256(reinterpret_cast<const __m256i*>(xq + t * k + b * kB));
      // Lane r of s: d_w(row r) * d_x; broadcast per row below.
      const __m256 s = _mm256_castps128_ps256(_mm_mul_ps(dw, _mm_set1_ps(xd[t * nb + b])));
      for (int r = 0; r < R; ++r) {
        const __m256i sx = _mm256_sign_epi8(xv, wv[r]);
        const __m256i prod = _mm256_madd_epi16(_mm256_maddubs_epi16(aw[r], sx), ones);
        const __m256 sr = r == 0 ? _mm256_broadcastss_ps(_mm256_castps256_ps128(s))
                                 : _mm256_permutevar8x32_ps(s, _mm256_set1_epi32(r));
        acc[r][t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(prod), sr, acc[r][t]);
      }
    }
  }
  for (int r = 0; r < R; ++r) {
    for (int t = 0; t < T; ++t) {
      y[t * ldy + r * y_stride] = hsum256(acc[r][t]) + (bias != nullptr ? bias[r * y_stride] : 0.0f);
    }
  }
}

// Rows [0, n_rows) of W against all m tokens. The rows are read as R long streams (the R
// contiguous parts of the range, one row of each per tile) rather than R adjacent short rows:
// long streams keep the prefetchers ahead (decode reads W from DRAM).
template <int R, int T>
void rows_streams(const BlockQ8_0* w, std::int64_t nb, const std::int8_t* xq, const float* xd,
                  std::int64_t m, std::int64_t k, float* y, std::int64_t ldy, const float* bias,
                  std::int64_t n_rows) {
  const std::int64_t q = n_rows / R;  // rows per stream
  for (std::int64_t i = 0; i < q; ++i) {
    const BlockQ8_0* wi = w + i * nb;
    const float* bi = bias != nullptr ? bias + i : nullptr;
    std::int64_t t = 0;
    for (; t + T <= m; t += T) {
      tile<R, T>(wi, q * nb, nb, xq + t * k, xd + t * nb, k, y + t * ldy + i, ldy, q, bi);
    }
    for (; t < m; ++t) tile<R, 1>(wi, q * nb, nb, xq + t * k, xd + t * nb, k, y + t * ldy + i, ldy, q, bi);
  }
  for (std::int64_t r = R * q; r < n_rows; ++r) {
    const float* br = bias != nullptr ? bias + r : nullptr;
    for (std::int64_t t = 0; t < m; ++t) {
      tile<1, 1>(w + r * nb, nb, nb, xq + t * k, xd + t * nb, k, y + t * ldy + r, ldy, 1, br);
    }
  }
}

void rows(const BlockQ8_0* w, std::int64_t nb, const std::int8_t* xq, const float* xd,
          std::int64_t m, std::int64_t k, float* y, std::int64_t ldy, const float* bias,
          std::int64_t n_rows) {
  if (m == 1) {
    rows_streams<4, 1>(w, nb, xq, xd, m, k, y, ldy, bias, n_rows);
  } else {
    rows_streams<2, 4>(w, nb, xq, xd, m, k, y, ldy, bias, n_rows);
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
        acc += static_cast<float>(s) * (f16_to_f32(blk.d) * xd[t * nb + b]);
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

}  // namespace sx::cpu::detail
