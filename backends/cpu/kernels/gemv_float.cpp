// Small-m matmul for F32/F16/BF16 weights: each W row is read once and converted to F32 in
// registers; tiles of rows x tokens share the loads (memory-bound decode GEMV, DESIGN.md §1.3).
#include <algorithm>
#include <cstdint>
#include <cstring>

#include "backends/cpu/kernels/matmul_internal.h"
#include "backends/cpu/simd.h"
#include "runtime/base/half.h"

#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#define SX_GEMV_AVX2 1
#include <immintrin.h>
#endif

namespace sx::cpu::SX_CPU_ISA_NS::detail {

namespace {

// Scalar element loaders (tails and the portable build). Rows need not be aligned to their
// element size, hence memcpy (compiled to a plain load).
template <typename T>
T load_elem(const T* p, std::int64_t i) {
  T v;
  std::memcpy(&v, p + i, sizeof(T));
  return v;
}
struct ElemF32 {
  using T = float;
  static float get(const T* p, std::int64_t i) { return load_elem(p, i); }
};
struct ElemF16 {
  using T = std::uint16_t;
  static float get(const T* p, std::int64_t i) { return f16_to_f32(load_elem(p, i)); }
};
struct ElemBF16 {
  using T = std::uint16_t;
  static float get(const T* p, std::int64_t i) { return bf16_to_f32(load_elem(p, i)); }
};

#if SX_GEMV_AVX2
struct VecF32 : ElemF32 {
  static __m256 load8(const T* p) { return _mm256_loadu_ps(p); }
};
struct VecF16 : ElemF16 {
  static __m256 load8(const T* p) {
    return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  }
};
struct VecBF16 : ElemBF16 {
  static __m256 load8(const T* p) {
    const __m256i w = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
    return _mm256_castsi256_ps(_mm256_slli_epi32(w, 16));
  }
};


// R rows of W (row j at w + j * row_stride elements, k each) against T tokens (x row stride k);
// y[t * ldy + j * y_stride] (+ bias[j * y_stride]).
template <class L, int R, int T>
void tile(const typename L::T* w, std::int64_t row_stride, const float* x, std::int64_t k, float* y,
          std::int64_t ldy, std::int64_t y_stride, const float* bias) {
  __m256 acc[R][T];
  for (int r = 0; r < R; ++r)
    for (int t = 0; t < T; ++t) acc[r][t] = _mm256_setzero_ps();
  std::int64_t i = 0;
  for (; i + 8 <= k; i += 8) {
    __m256 xv[T];
    for (int t = 0; t < T; ++t) xv[t] = _mm256_loadu_ps(x + t * k + i);
    for (int r = 0; r < R; ++r) {
      const typename L::T* wr = w + r * row_stride + i;
      // One prefetch per 64-byte line of the stream.
      if ((i * static_cast<std::int64_t>(sizeof(typename L::T))) % 64 == 0) {
        _mm_prefetch(reinterpret_cast<const char*>(wr) + kGemvPrefetchBytes, _MM_HINT_T0);
      }
      const __m256 wv = L::load8(wr);
      for (int t = 0; t < T; ++t) acc[r][t] = _mm256_fmadd_ps(wv, xv[t], acc[r][t]);
    }
  }
  for (int r = 0; r < R; ++r) {
    for (int t = 0; t < T; ++t) {
      float s = hsum256(acc[r][t]);
      for (std::int64_t j = i; j < k; ++j) s += L::get(w + r * row_stride, j) * x[t * k + j];
      y[t * ldy + r * y_stride] = s + (bias != nullptr ? bias[r * y_stride] : 0.0f);
    }
  }
}

// Rows [0, n_rows) of W against all m tokens, the rows read as R long streams (the R contiguous
// parts of the range, one row of each per tile): long streams keep the prefetchers ahead.
template <class L, int R, int T>
void rows_streams(const typename L::T* w, const float* x, std::int64_t m, std::int64_t k, float* y,
                  std::int64_t ldy, const float* bias, std::int64_t n_rows) {
  const std::int64_t q = n_rows / R;  // rows per stream
  for (std::int64_t i = 0; i < q; ++i) {
    const typename L::T* wi = w + i * k;
    const float* bi = bias != nullptr ? bias + i : nullptr;
    std::int64_t t = 0;
    for (; t + T <= m; t += T) tile<L, R, T>(wi, q * k, x + t * k, k, y + t * ldy + i, ldy, q, bi);
    if (m - t == 2) tile<L, R, 2>(wi, q * k, x + t * k, k, y + t * ldy + i, ldy, q, bi);
    if (m - t == 1) tile<L, R, 1>(wi, q * k, x + t * k, k, y + t * ldy + i, ldy, q, bi);
  }
  for (std::int64_t r = R * q; r < n_rows; ++r) {
    const float* br = bias != nullptr ? bias + r : nullptr;
    for (std::int64_t t = 0; t < m; ++t) tile<L, 1, 1>(w + r * k, k, x + t * k, k, y + t * ldy + r, ldy, 1, br);
  }
}

template <class L>
void rows(const typename L::T* w, const float* x, std::int64_t m, std::int64_t k, float* y,
          std::int64_t ldy, const float* bias, std::int64_t n_rows) {
  rows_streams<L, 4, 3>(w, x, m, k, y, ldy, bias, n_rows);
}
#else
template <class L>
void rows(const typename L::T* w, const float* x, std::int64_t m, std::int64_t k, float* y,
          std::int64_t ldy, const float* bias, std::int64_t n_rows) {
  for (std::int64_t r = 0; r < n_rows; ++r) {
    for (std::int64_t t = 0; t < m; ++t) {
      float a[8] = {0, 0, 0, 0, 0, 0, 0, 0};
      std::int64_t i = 0;
      for (; i + 8 <= k; i += 8)
        for (int j = 0; j < 8; ++j) a[j] += L::get(w + r * k, i + j) * x[t * k + i + j];
      float s = ((a[0] + a[1]) + (a[2] + a[3])) + ((a[4] + a[5]) + (a[6] + a[7]));
      for (; i < k; ++i) s += L::get(w + r * k, i) * x[t * k + i];
      y[t * ldy + r] = s + (bias != nullptr ? bias[r] : 0.0f);
    }
  }
}
#endif

template <class L>
void run(ThreadPool& pool, const MatmulProblem& p) {
  const auto* w = static_cast<const typename L::T*>(p.w);
  for_row_chunks(pool, p.n, [&](std::int64_t r0, std::int64_t r1) {
    rows<L>(w + r0 * p.k, p.x, p.m, p.k, p.y + r0, p.n, p.bias != nullptr ? p.bias + r0 : nullptr,
            r1 - r0);
  });
}

}  // namespace

void gemv_float(ThreadPool& pool, const MatmulProblem& p) {
#if SX_GEMV_AVX2
  using F32 = VecF32;
  using F16 = VecF16;
  using BF16 = VecBF16;
#else
  using F32 = ElemF32;
  using F16 = ElemF16;
  using BF16 = ElemBF16;
#endif
  switch (p.w_type) {
    case hal::DType::kF32:
      run<F32>(pool, p);
      return;
    case hal::DType::kF16:
      run<F16>(pool, p);
      return;
    case hal::DType::kBF16:
      run<BF16>(pool, p);
      return;
    default:
      return;  // callers dispatch Q8_0 elsewhere; other formats are rejected before matmul
  }
}

}  // namespace sx::cpu::SX_CPU_ISA_NS::detail
