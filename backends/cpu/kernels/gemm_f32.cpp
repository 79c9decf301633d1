// Large-m matmul (prefill) for every weight format: x is packed into panels of kMR tokens, W into
// panels of 16 rows dequantised to F32 (k blocked to stay in L1/L2), and a kMR x 16 register-tiled
// FMA microkernel (BLIS-style outer products) computes each tile of y: 6 x 16 in 12 ymm
// accumulators with AVX2, 12 x 16 in 12 zmm with AVX-512 (twice the multiply-adds per FMA). Each
// element of y is the same chain of FMAs over k in order either way, so both give the same bits.
#include <algorithm>
#include <atomic>
#include <bit>
#include <cstdint>
#include <cstring>
#include <vector>

#include "backends/cpu/kernels/matmul_internal.h"
#include "runtime/base/half.h"
#include "runtime/hal/quant.h"

#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#define SX_GEMM_AVX2 1
#include <immintrin.h>
#endif

namespace sx::cpu::SX_CPU_ISA_NS::detail {

namespace {

#if SX_GEMM_AVX2 && defined(__AVX512F__)
#define SX_GEMM_AVX512 1
#if defined(__AVX512BF16__)
#define SX_GEMM_BF16_DOT 1  // BF16 weights: vdpbf16ps on BF16 pairs (gemm_bf16_dot below)
#endif
constexpr int kMR = 12;      // tokens per microtile (one zmm accumulator each)
#else
constexpr int kMR = 6;       // tokens per microtile
#endif
constexpr int kNR = 16;      // W rows per microtile (two ymm)
constexpr int kKC = 256;     // max k per packed block: a 16-row panel is 16 KiB
constexpr int kMaxPanelsPerTask = 16;  // W panels packed per task and k block: <= 256 KiB (L2)

using hal::BlockQ8_0;

// ---- W row loaders: 8 consecutive elements (i % 8 == 0) or one element of a row, as F32. ----
// Rows need not be aligned to their element size (a view may start anywhere), hence memcpy.
template <typename T>
T load_unaligned(const void* row, std::int64_t i) {
  T v;
  std::memcpy(&v, static_cast<const std::byte*>(row) + i * static_cast<std::int64_t>(sizeof(T)), sizeof(T));
  return v;
}
struct RowF32 {
  static float get(const void* row, std::int64_t i) { return load_unaligned<float>(row, i); }
#if SX_GEMM_AVX2
  static __m256 load8(const void* row, std::int64_t i) { return _mm256_loadu_ps(static_cast<const float*>(row) + i); }
#endif
};
struct RowF16 {
  static float get(const void* row, std::int64_t i) { return f16_to_f32(load_unaligned<std::uint16_t>(row, i)); }
#if SX_GEMM_AVX2
  static __m256 load8(const void* row, std::int64_t i) {
    return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(static_cast<const std::uint16_t*>(row) + i)));
  }
#endif
};
struct RowBF16 {
  static float get(const void* row, std::int64_t i) { return bf16_to_f32(load_unaligned<std::uint16_t>(row, i)); }
#if SX_GEMM_AVX2
  static __m256 load8(const void* row, std::int64_t i) {
    const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(static_cast<const std::uint16_t*>(row) + i));
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
  }
#endif
};
#if SX_GEMM_BF16_DOT
// An F16 row read as BF16 pairs for gemm_bf16_dot: word i holds elements 2i (low half) and 2i + 1
// (high half), each rounded from F16 to BF16 to nearest even (vcvtneps2bf16; f32_to_bf16 alike:
// an F16 value is never an F32 denormal, which the instruction would flush).
struct RowF16AsBF16Pairs {
  static float get(const void* row, std::int64_t i) {
    const std::uint32_t lo = f32_to_bf16(f16_to_f32(load_unaligned<std::uint16_t>(row, 2 * i)));
    const std::uint32_t hi = f32_to_bf16(f16_to_f32(load_unaligned<std::uint16_t>(row, 2 * i + 1)));
    return std::bit_cast<float>(lo | hi << 16);
  }
  static __m256 load8(const void* row, std::int64_t i) {
    const auto* h = reinterpret_cast<const __m256i*>(static_cast<const std::uint16_t*>(row) + 2 * i);
    return reinterpret_cast<__m256>(_mm512_cvtneps_pbh(_mm512_cvtph_ps(_mm256_loadu_si256(h))));
  }
};
#endif
struct RowQ8_0 {
  static float get(const void* row, std::int64_t i) {
    const BlockQ8_0& b = static_cast<const BlockQ8_0*>(row)[i / hal::kQ8_0Block];
    return f16_to_f32(b.d) * static_cast<float>(b.qs[i % hal::kQ8_0Block]);
  }
#if SX_GEMM_AVX2
  static __m256 load8(const void* row, std::int64_t i) {
    const BlockQ8_0& b = static_cast<const BlockQ8_0*>(row)[i / hal::kQ8_0Block];
    std::int64_t q8;
    std::memcpy(&q8, b.qs + i % hal::kQ8_0Block, sizeof(q8));
    const __m256 q = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_cvtsi64_si128(q8)));
    return _mm256_mul_ps(q, _mm256_set1_ps(_cvtsh_ss(b.d)));
  }
#endif
};

// Packs rows [row0, row0 + 16) x columns [pc, pc + kc) of W into dst[kc][16] (F32); rows at or
// past n are zero.
template <class L>
void pack_w_panel(const std::byte* w, std::size_t row_bytes, std::int64_t row0, std::int64_t n,
                  std::int64_t pc, std::int64_t kc, float* dst) {
  const std::int64_t valid = std::min<std::int64_t>(kNR, n - row0);
  std::int64_t i = 0;
#if SX_GEMM_AVX2
  if (valid == kNR) {
    for (; i + 8 <= kc; i += 8) {
      for (int h = 0; h < 2; ++h) {  // two halves of 8 rows: an 8x8 transpose each
        const std::byte* r = w + static_cast<std::size_t>(row0 + h * 8) * row_bytes;
        __m256 v0 = L::load8(r + 0 * row_bytes, pc + i), v1 = L::load8(r + 1 * row_bytes, pc + i);
        __m256 v2 = L::load8(r + 2 * row_bytes, pc + i), v3 = L::load8(r + 3 * row_bytes, pc + i);
        __m256 v4 = L::load8(r + 4 * row_bytes, pc + i), v5 = L::load8(r + 5 * row_bytes, pc + i);
        __m256 v6 = L::load8(r + 6 * row_bytes, pc + i), v7 = L::load8(r + 7 * row_bytes, pc + i);
        const __m256 t0 = _mm256_unpacklo_ps(v0, v1), t1 = _mm256_unpackhi_ps(v0, v1);
        const __m256 t2 = _mm256_unpacklo_ps(v2, v3), t3 = _mm256_unpackhi_ps(v2, v3);
        const __m256 t4 = _mm256_unpacklo_ps(v4, v5), t5 = _mm256_unpackhi_ps(v4, v5);
        const __m256 t6 = _mm256_unpacklo_ps(v6, v7), t7 = _mm256_unpackhi_ps(v6, v7);
        const __m256 s0 = _mm256_shuffle_ps(t0, t2, 0x44), s1 = _mm256_shuffle_ps(t0, t2, 0xEE);
        const __m256 s2 = _mm256_shuffle_ps(t1, t3, 0x44), s3 = _mm256_shuffle_ps(t1, t3, 0xEE);
        const __m256 s4 = _mm256_shuffle_ps(t4, t6, 0x44), s5 = _mm256_shuffle_ps(t4, t6, 0xEE);
        const __m256 s6 = _mm256_shuffle_ps(t5, t7, 0x44), s7 = _mm256_shuffle_ps(t5, t7, 0xEE);
        float* d = dst + i * kNR + h * 8;
        _mm256_store_ps(d + 0 * kNR, _mm256_permute2f128_ps(s0, s4, 0x20));
        _mm256_store_ps(d + 1 * kNR, _mm256_permute2f128_ps(s1, s5, 0x20));
        _mm256_store_ps(d + 2 * kNR, _mm256_permute2f128_ps(s2, s6, 0x20));
        _mm256_store_ps(d + 3 * kNR, _mm256_permute2f128_ps(s3, s7, 0x20));
        _mm256_store_ps(d + 4 * kNR, _mm256_permute2f128_ps(s0, s4, 0x31));
        _mm256_store_ps(d + 5 * kNR, _mm256_permute2f128_ps(s1, s5, 0x31));
        _mm256_store_ps(d + 6 * kNR, _mm256_permute2f128_ps(s2, s6, 0x31));
        _mm256_store_ps(d + 7 * kNR, _mm256_permute2f128_ps(s3, s7, 0x31));
      }
    }
  }
#endif
  for (; i < kc; ++i) {
    for (int r = 0; r < kNR; ++r) {
      dst[i * kNR + r] = r < valid ? L::get(w + static_cast<std::size_t>(row0 + r) * row_bytes, pc + i) : 0.0f;
    }
  }
}

using PackFn = void (*)(const std::byte*, std::size_t, std::int64_t, std::int64_t, std::int64_t,
                        std::int64_t, float*);

// Any other block format (Q4_0 ... Q6_K, AWQ int4): each row's [pc, pc + kc) dequantised with the HAL
// reference, then transposed into the panel. pc and kc fall on block boundaries (kc_step below is a
// multiple of 32, and exactly 256 when k is a multiple of 256).
template <hal::DType T>
void pack_w_panel_dequant(const std::byte* w, std::size_t row_bytes, std::int64_t row0, std::int64_t n,
                          std::int64_t pc, std::int64_t kc, float* dst) {
  thread_local std::vector<float> tmp;
  tmp.resize(static_cast<std::size_t>(kc));
  const std::size_t off = cpu::row_bytes(T, pc);
  for (int r = 0; r < kNR; ++r) {
    if (row0 + r < n) {
      hal::dequantize_row(T, w + static_cast<std::size_t>(row0 + r) * row_bytes + off, tmp.data(), kc);
      for (std::int64_t i = 0; i < kc; ++i) dst[i * kNR + r] = tmp[static_cast<std::size_t>(i)];
    } else {
      for (std::int64_t i = 0; i < kc; ++i) dst[i * kNR + r] = 0.0f;
    }
  }
}

// The CPU device's 8-row layouts (kQ5_0R8, kQ4_0R8, kQ4_1R8, kQ5_1R8, kQ4_KR8, kQ5_KR8):
// each row's elements [pc, pc + kc) (whole blocks of kElems) dequantised straight from its group
// of 8 (the same values as the file format's dequantisation).
template <typename Block, void (*DequantizeLane)(const Block*, int, std::int64_t, float*), int kElems = hal::kQK>
void pack_w_panel_r8(const std::byte* w, std::size_t row_bytes, std::int64_t row0, std::int64_t n,
                     std::int64_t pc, std::int64_t kc, float* dst) {
  static_assert(kQ5_0R8Rows == 8 && kQ4_0R8Rows == 8 && kQ4_KR8Rows == 8);
  thread_local std::vector<float> tmp;
  tmp.resize(static_cast<std::size_t>(kc));
  for (int r = 0; r < kNR; ++r) {
    const std::int64_t row = row0 + r;
    if (row < n) {
      const auto* group = reinterpret_cast<const Block*>(w + static_cast<std::size_t>(row / 8 * 8) * row_bytes);
      DequantizeLane(group + pc / kElems, static_cast<int>(row % 8), kc / kElems, tmp.data());
      for (std::int64_t i = 0; i < kc; ++i) dst[i * kNR + r] = tmp[static_cast<std::size_t>(i)];
    } else {
      for (std::int64_t i = 0; i < kc; ++i) dst[i * kNR + r] = 0.0f;
    }
  }
}

PackFn pack_fn(hal::DType t) {
  switch (t) {
    case hal::DType::kF16:
      return &pack_w_panel<RowF16>;
    case hal::DType::kBF16:
      return &pack_w_panel<RowBF16>;
    case hal::DType::kQ8_0:
      return &pack_w_panel<RowQ8_0>;
    case hal::DType::kQ4_0: return &pack_w_panel_dequant<hal::DType::kQ4_0>;
    case hal::DType::kQ4_1: return &pack_w_panel_dequant<hal::DType::kQ4_1>;
    case hal::DType::kQ5_0: return &pack_w_panel_dequant<hal::DType::kQ5_0>;
    case kQ5_0R8: return &pack_w_panel_r8<BlockQ5_0x8, &dequantize_lane_q5_0_r8>;
    case kQ4_0R8: return &pack_w_panel_r8<BlockQ4_0x8, &dequantize_lane_q4_0_r8>;
    case kQ4_1R8: return &pack_w_panel_r8<BlockQ4_1x8, &dequantize_lane_q4_1_r8>;
    case kQ5_1R8: return &pack_w_panel_r8<BlockQ5_1x8, &dequantize_lane_q5_1_r8>;
    case kQ4_KR8: return &pack_w_panel_r8<BlockQ4_Kx8, &dequantize_lane_q4_k_r8, hal::kQK_K>;
    case kQ5_KR8: return &pack_w_panel_r8<BlockQ5_Kx8, &dequantize_lane_q5_k_r8, hal::kQK_K>;
    case hal::DType::kQ5_1: return &pack_w_panel_dequant<hal::DType::kQ5_1>;
    case hal::DType::kQ2_K: return &pack_w_panel_dequant<hal::DType::kQ2_K>;
    case hal::DType::kQ3_K: return &pack_w_panel_dequant<hal::DType::kQ3_K>;
    case hal::DType::kQ4_K: return &pack_w_panel_dequant<hal::DType::kQ4_K>;
    case hal::DType::kQ5_K: return &pack_w_panel_dequant<hal::DType::kQ5_K>;
    case hal::DType::kQ6_K: return &pack_w_panel_dequant<hal::DType::kQ6_K>;
    case hal::DType::kAwqInt4: return &pack_w_panel_dequant<hal::DType::kAwqInt4>;
    default:
      return &pack_w_panel<RowF32>;
  }
}

// Packs tokens [t0, t0 + kMR) of x (rows of k) into dst[k][kMR]; tokens at or past m are zero.
void pack_x_panel(const float* x, std::int64_t m, std::int64_t k, std::int64_t t0, float* dst) {
  const std::int64_t valid = std::min<std::int64_t>(kMR, m - t0);
#if SX_GEMM_AVX2
  if (valid == kMR) {
    // Four k at a time: 4 x 4 transposes of each group of 4 tokens (a scalar scatter of x took ~10%
    // of the 896 x 4864 projection at m = 512, whose x is 5.4x its W).
    constexpr int kGroups = kMR / 4;  // the tokens past them (2 of AVX2's 6) one at a time
    std::int64_t i = 0;
    for (; i + 4 <= k; i += 4) {
      for (int t = 4 * kGroups; t < kMR; ++t) {
        for (int e = 0; e < 4; ++e) dst[(i + e) * kMR + t] = x[(t0 + t) * k + i + e];
      }
      for (int g = 0; g < kGroups; ++g) {
        const float* src = x + (t0 + 4 * g) * k + i;
        __m128 r0 = _mm_loadu_ps(src), r1 = _mm_loadu_ps(src + k), r2 = _mm_loadu_ps(src + 2 * k);
        __m128 r3 = _mm_loadu_ps(src + 3 * k);
        _MM_TRANSPOSE4_PS(r0, r1, r2, r3);
        float* d = dst + i * kMR + 4 * g;
        _mm_storeu_ps(d, r0);
        _mm_storeu_ps(d + kMR, r1);
        _mm_storeu_ps(d + 2 * kMR, r2);
        _mm_storeu_ps(d + 3 * kMR, r3);
      }
    }
    for (; i < k; ++i) {
      for (std::int64_t t = 0; t < kMR; ++t) dst[i * kMR + t] = x[(t0 + t) * k + i];
    }
    return;
  }
#endif
  for (std::int64_t t = 0; t < kMR; ++t) {
    if (t < valid) {
      const float* src = x + (t0 + t) * k;
      for (std::int64_t i = 0; i < k; ++i) dst[i * kMR + t] = src[i];
    } else {
      for (std::int64_t i = 0; i < k; ++i) dst[i * kMR + t] = 0.0f;
    }
  }
}

// c[mr][nr] (row stride ldc) = (accumulate ? c : bias or 0) + a[kc][kMR]^T . b[kc][16].
#if SX_GEMM_AVX512
// c[r][0, nr) = (accumulate ? c : bias or 0) + tile[r], for r < mr.
inline void store_tile(const __m512 (&tile)[kMR], float* c, std::int64_t ldc, int mr, int nr, const float* bias,
                       bool accumulate) {
  const __mmask16 mask = static_cast<__mmask16>((1u << nr) - 1u);
  const __m512 bias_v = !accumulate && bias != nullptr ? _mm512_maskz_loadu_ps(mask, bias) : _mm512_setzero_ps();
  for (int r = 0; r < mr; ++r) {
    float* cr = c + r * ldc;
    const __m512 base = accumulate ? _mm512_maskz_loadu_ps(mask, cr) : bias_v;
    _mm512_mask_storeu_ps(cr, mask, _mm512_add_ps(base, tile[r]));
  }
}

void kernel_tile(std::int64_t kc, const float* a, const float* b, float* c, std::int64_t ldc, int mr, int nr,
                 const float* bias, bool accumulate) {
  for (int r = 0; r < mr; ++r) _mm_prefetch(reinterpret_cast<const char*>(c + r * ldc), _MM_HINT_T0);
  __m512 c0 = _mm512_setzero_ps(), c1 = c0, c2 = c0, c3 = c0, c4 = c0, c5 = c0;
  __m512 c6 = c0, c7 = c0, c8 = c0, c9 = c0, c10 = c0, c11 = c0;
#pragma GCC unroll 2
  for (std::int64_t p = 0; p < kc; ++p) {
    const __m512 bv = _mm512_loadu_ps(b + p * kNR);
    const float* ap = a + p * kMR;
    c0 = _mm512_fmadd_ps(_mm512_set1_ps(ap[0]), bv, c0);
    c1 = _mm512_fmadd_ps(_mm512_set1_ps(ap[1]), bv, c1);
    c2 = _mm512_fmadd_ps(_mm512_set1_ps(ap[2]), bv, c2);
    c3 = _mm512_fmadd_ps(_mm512_set1_ps(ap[3]), bv, c3);
    c4 = _mm512_fmadd_ps(_mm512_set1_ps(ap[4]), bv, c4);
    c5 = _mm512_fmadd_ps(_mm512_set1_ps(ap[5]), bv, c5);
    c6 = _mm512_fmadd_ps(_mm512_set1_ps(ap[6]), bv, c6);
    c7 = _mm512_fmadd_ps(_mm512_set1_ps(ap[7]), bv, c7);
    c8 = _mm512_fmadd_ps(_mm512_set1_ps(ap[8]), bv, c8);
    c9 = _mm512_fmadd_ps(_mm512_set1_ps(ap[9]), bv, c9);
    c10 = _mm512_fmadd_ps(_mm512_set1_ps(ap[10]), bv, c10);
    c11 = _mm512_fmadd_ps(_mm512_set1_ps(ap[11]), bv, c11);
  }
  const __m512 tile[kMR] = {c0, c1, c2, c3, c4, c5, c6, c7, c8, c9, c10, c11};
  store_tile(tile, c, ldc, mr, nr, bias, accumulate);
}

#if SX_GEMM_BF16_DOT
// The same tile with BF16 weights and x rounded to BF16: a[kc2][kMR] and b[kc2][16] hold pairs of
// BF16 values (elements 2p and 2p + 1 of the token / row, 32 bits each), and one vdpbf16ps adds
// both of a pair's products per lane: twice the multiply-adds of an FMA per instruction.
void kernel_tile_bf16(std::int64_t kc2, const float* a, const float* b, float* c, std::int64_t ldc, int mr, int nr,
                      const float* bias, bool accumulate) {
  for (int r = 0; r < mr; ++r) _mm_prefetch(reinterpret_cast<const char*>(c + r * ldc), _MM_HINT_T0);
  __m512 acc[kMR];
  for (__m512& v : acc) v = _mm512_setzero_ps();
  const auto* ai = reinterpret_cast<const std::int32_t*>(a);
#pragma GCC unroll 2
  for (std::int64_t p = 0; p < kc2; ++p) {
    const __m512bh bv = reinterpret_cast<__m512bh>(_mm512_loadu_ps(b + p * kNR));
    const std::int32_t* ap = ai + p * kMR;
#pragma GCC unroll 12
    for (int r = 0; r < kMR; ++r) {
      acc[r] = _mm512_dpbf16_ps(acc[r], reinterpret_cast<__m512bh>(_mm512_set1_epi32(ap[r])), bv);
    }
  }
  store_tile(acc, c, ldc, mr, nr, bias, accumulate);
}
#endif
#elif SX_GEMM_AVX2
void kernel_tile(std::int64_t kc, const float* a, const float* b, float* c, std::int64_t ldc,
                 int mr, int nr, const float* bias, bool accumulate) {
  // The tile of y is needed only at the end: start fetching it now (it is usually in L3).
  for (int r = 0; r < mr; ++r) {
    _mm_prefetch(reinterpret_cast<const char*>(c + r * ldc), _MM_HINT_T0);
    _mm_prefetch(reinterpret_cast<const char*>(c + r * ldc + kNR - 1), _MM_HINT_T0);
  }
  __m256 c00 = _mm256_setzero_ps(), c01 = c00, c10 = c00, c11 = c00, c20 = c00, c21 = c00;
  __m256 c30 = c00, c31 = c00, c40 = c00, c41 = c00, c50 = c00, c51 = c00;
#pragma GCC unroll 4
  for (std::int64_t p = 0; p < kc; ++p) {
    const __m256 b0 = _mm256_load_ps(b + p * kNR);
    const __m256 b1 = _mm256_load_ps(b + p * kNR + 8);
    const float* ap = a + p * kMR;
    __m256 av = _mm256_broadcast_ss(ap + 0);
    c00 = _mm256_fmadd_ps(av, b0, c00);
    c01 = _mm256_fmadd_ps(av, b1, c01);
    av = _mm256_broadcast_ss(ap + 1);
    c10 = _mm256_fmadd_ps(av, b0, c10);
    c11 = _mm256_fmadd_ps(av, b1, c11);
    av = _mm256_broadcast_ss(ap + 2);
    c20 = _mm256_fmadd_ps(av, b0, c20);
    c21 = _mm256_fmadd_ps(av, b1, c21);
    av = _mm256_broadcast_ss(ap + 3);
    c30 = _mm256_fmadd_ps(av, b0, c30);
    c31 = _mm256_fmadd_ps(av, b1, c31);
    av = _mm256_broadcast_ss(ap + 4);
    c40 = _mm256_fmadd_ps(av, b0, c40);
    c41 = _mm256_fmadd_ps(av, b1, c41);
    av = _mm256_broadcast_ss(ap + 5);
    c50 = _mm256_fmadd_ps(av, b0, c50);
    c51 = _mm256_fmadd_ps(av, b1, c51);
  }
  alignas(32) float tile[kMR][kNR];
  _mm256_store_ps(tile[0], c00);
  _mm256_store_ps(tile[0] + 8, c01);
  _mm256_store_ps(tile[1], c10);
  _mm256_store_ps(tile[1] + 8, c11);
  _mm256_store_ps(tile[2], c20);
  _mm256_store_ps(tile[2] + 8, c21);
  _mm256_store_ps(tile[3], c30);
  _mm256_store_ps(tile[3] + 8, c31);
  _mm256_store_ps(tile[4], c40);
  _mm256_store_ps(tile[4] + 8, c41);
  _mm256_store_ps(tile[5], c50);
  _mm256_store_ps(tile[5] + 8, c51);
  if (nr == kNR) {
    __m256 base0 = _mm256_setzero_ps(), base1 = base0;
    if (!accumulate && bias != nullptr) {
      base0 = _mm256_loadu_ps(bias);
      base1 = _mm256_loadu_ps(bias + 8);
    }
    for (int r = 0; r < mr; ++r) {
      float* cr = c + r * ldc;
      if (accumulate) {
        base0 = _mm256_loadu_ps(cr);
        base1 = _mm256_loadu_ps(cr + 8);
      }
      _mm256_storeu_ps(cr, _mm256_add_ps(base0, _mm256_load_ps(tile[r])));
      _mm256_storeu_ps(cr + 8, _mm256_add_ps(base1, _mm256_load_ps(tile[r] + 8)));
    }
    return;
  }
  for (int r = 0; r < mr; ++r) {
    float* cr = c + r * ldc;
    for (int j = 0; j < nr; ++j) {
      const float base = accumulate ? cr[j] : (bias != nullptr ? bias[j] : 0.0f);
      cr[j] = base + tile[r][j];
    }
  }
}
#else
void kernel_tile(std::int64_t kc, const float* a, const float* b, float* c, std::int64_t ldc,
                 int mr, int nr, const float* bias, bool accumulate) {
  float tile[kMR][kNR] = {};
  for (std::int64_t p = 0; p < kc; ++p)
    for (int r = 0; r < kMR; ++r)
      for (int j = 0; j < kNR; ++j) tile[r][j] += a[p * kMR + r] * b[p * kNR + j];
  for (int r = 0; r < mr; ++r) {
    float* cr = c + r * ldc;
    for (int j = 0; j < nr; ++j) {
      const float base = accumulate ? cr[j] : (bias != nullptr ? bias[j] : 0.0f);
      cr[j] = base + tile[r][j];
    }
  }
}
#endif

}  // namespace

namespace {

// The tiles of y: x packed into panels (xp: x_panels of kw words x kMR tokens), W panels packed by
// `pack` per task and k block (kw words per row, k blocks of at most kc_step <= kKC words),
// kernel(kc, a, b, c, ldc, mr, nr, bias, accumulate) per tile.
template <typename Kernel>
void run_tiles(ThreadPool& pool, Scratch& scratch, const MatmulProblem& p, std::int64_t kw, std::int64_t kc_step,
               const float* xp, PackFn pack, Kernel kernel) {
  const std::int64_t m = p.m, n = p.n;
  const std::int64_t x_panels = ceil_div(m, kMR);
  const std::int64_t w_panels = ceil_div(n, kNR);
  const int threads = pool.size();
  std::vector<float*> wbuf(static_cast<std::size_t>(threads));
  for (int t = 0; t < threads; ++t) {
    wbuf[static_cast<std::size_t>(t)] = static_cast<float*>(
        scratch.get(kSlotThread0 + t, static_cast<std::size_t>(kMaxPanelsPerTask) * kKC * kNR * sizeof(float)));
  }
  // Tasks: contiguous ranges of W panels, a multiple of the thread count for balance.
  const std::int64_t n_tasks = std::min<std::int64_t>(
      w_panels, threads * ceil_div(w_panels, static_cast<std::int64_t>(threads) * kMaxPanelsPerTask));
  const auto* w = static_cast<const std::byte*>(p.w);
  const std::size_t rb = cpu::row_bytes(p.w_type, p.k);
  std::atomic<std::int64_t> next{0};

  pool.run_on_all([&](int thread, int) {
    float* wp = wbuf[static_cast<std::size_t>(thread)];
    for (std::int64_t task = next.fetch_add(1); task < n_tasks; task = next.fetch_add(1)) {
      const std::int64_t j0 = task * w_panels / n_tasks, j1 = (task + 1) * w_panels / n_tasks;
      for (std::int64_t pc = 0; pc < kw; pc += kc_step) {
        const std::int64_t kc = std::min(kc_step, kw - pc);
        for (std::int64_t j = j0; j < j1; ++j) pack(w, rb, j * kNR, n, pc, kc, wp + (j - j0) * kc * kNR);
        for (std::int64_t i = 0; i < x_panels; ++i) {
          const float* a = xp + i * kw * kMR + pc * kMR;
          const int mr = static_cast<int>(std::min<std::int64_t>(kMR, m - i * kMR));
          for (std::int64_t j = j0; j < j1; ++j) {
            const int nr = static_cast<int>(std::min<std::int64_t>(kNR, n - j * kNR));
            kernel(kc, a, wp + (j - j0) * kc * kNR, p.y + i * kMR * n + j * kNR, n, mr, nr,
                   p.bias != nullptr ? p.bias + j * kNR : nullptr, pc > 0);
          }
        }
      }
    }
  });
}

#if SX_GEMM_BF16_DOT
// Row x[0, k) (k even) rounded to BF16 (round to nearest even, vcvtneps2bf16) as k / 2 words: word
// i holds element 2i in its low half and 2i + 1 in its high half, as a BF16 row of W holds them.
void x_to_bf16_pairs(const float* x, std::int64_t k, std::uint32_t* dst) {
  auto* d16 = reinterpret_cast<__m256i*>(dst);
  std::int64_t i = 0;
  for (; i + 16 <= k; i += 16) {
    _mm256_storeu_si256(d16 + i / 16, reinterpret_cast<__m256i>(_mm512_cvtneps_pbh(_mm512_loadu_ps(x + i))));
  }
  if (i < k) {
    const auto mask = static_cast<__mmask16>((1u << (k - i)) - 1u);
    _mm256_mask_storeu_epi16(d16 + i / 16, mask,
                             reinterpret_cast<__m256i>(_mm512_cvtneps_pbh(_mm512_maskz_loadu_ps(mask, x + i))));
  }
}

// BF16 and F16 weights (k even) on the avx512-bf16 level: x rounded to BF16 once, x and W packed
// as BF16 pairs (the F32 panels' layout with a pair in each 32-bit word, moved by the same
// transposes; `pack` reads W's row as such pairs), kernel_tile_bf16: one vdpbf16ps does 32
// multiply-adds where an F32 FMA does 16. Each product is exact in F32 (8-bit by 8-bit
// significands), so the differences from the F32 path are the roundings to BF16, half a unit of an
// 8-bit significand (2^-8 of the element) each: x's, and for F16 weights W's too (an F16 has 11
// significant bits). |error| <= 2^-8 * sum_i |x_i w_i| for BF16 weights, (2^-7 + 2^-16) * sum_i
// |x_i w_i| for F16 ones (+ F32 sums): F16 weights meet BF16 arithmetic as in vLLM's CPU executor,
// which cast whole F16 models to BF16, but here only in the prefill GEMM (decode's GEMV reads F16
// exactly). SEXTANT_CPU_ISA=avx512-vnni keeps the exact F32 products (F16C conversion + FMA).
void gemm_bf16_dot(ThreadPool& pool, Scratch& scratch, const MatmulProblem& p, PackFn pack) {
  const std::int64_t m = p.m, k2 = p.k / 2;
  const std::int64_t x_panels = ceil_div(m, kMR);
  const std::int64_t kc_step = ceil_div(k2, ceil_div(k2, kKC));
  auto* xb = static_cast<std::uint32_t*>(scratch.get(kSlotActs, static_cast<std::size_t>(m * k2) * sizeof(std::uint32_t)));
  auto* xp = static_cast<float*>(scratch.get(kSlotPackedX, static_cast<std::size_t>(x_panels * k2 * kMR) * sizeof(float)));
  pool.parallel_for(x_panels, [&](std::int64_t i) {
    for (std::int64_t t = i * kMR; t < std::min(m, (i + 1) * kMR); ++t) x_to_bf16_pairs(p.x + t * p.k, p.k, xb + t * k2);
    pack_x_panel(reinterpret_cast<const float*>(xb), m, k2, i * kMR, xp + i * k2 * kMR);
  });
  run_tiles(pool, scratch, p, k2, kc_step, xp, pack, &kernel_tile_bf16);
}
#endif

}  // namespace

void gemm_f32(ThreadPool& pool, Scratch& scratch, const MatmulProblem& p) {
#if SX_GEMM_BF16_DOT
  if (p.w_type == hal::DType::kBF16 && p.k % 2 == 0) {
    gemm_bf16_dot(pool, scratch, p, &pack_w_panel<RowF32>);  // a BF16 row is BF16 pairs already
    return;
  }
  if (p.w_type == hal::DType::kF16 && p.k % 2 == 0) {
    gemm_bf16_dot(pool, scratch, p, &pack_w_panel<RowF16AsBF16Pairs>);
    return;
  }
#endif
  const std::int64_t m = p.m, k = p.k;
  const std::int64_t x_panels = ceil_div(m, kMR);
  // k blocks of equal size (a multiple of 32 where possible, so Q8_0 blocks are not split).
  const std::int64_t k_blocks = ceil_div(k, kKC);
  std::int64_t kc_step = ceil_div(k, k_blocks);
  if (k % 32 == 0) kc_step = std::min<std::int64_t>(kKC, ceil_div(kc_step, 32) * 32);
  // Block formats need whole blocks per k block (256-element blocks get kc_step = 256; AWQ's
  // 128-element groups a multiple of 128).
  const std::int64_t block = hal::dtype_info(layout_source(p.w_type)).block_elems;
  if (block > 32 && k % block == 0) kc_step = std::min<std::int64_t>(kKC, ceil_div(kc_step, block) * block);

  auto* xp = static_cast<float*>(scratch.get(kSlotPackedX, static_cast<std::size_t>(x_panels * k * kMR) * sizeof(float)));
  pool.parallel_for(x_panels, [&](std::int64_t i) { pack_x_panel(p.x, m, k, i * kMR, xp + i * k * kMR); });
  run_tiles(pool, scratch, p, k, kc_step, xp, pack_fn(p.w_type), &kernel_tile);
}

}  // namespace sx::cpu::SX_CPU_ISA_NS::detail
