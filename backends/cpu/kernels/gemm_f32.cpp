// Large-m matmul (prefill) for every weight format, and every m for F32, F16 and BF16: x is packed
// into panels of kMR tokens, W into panels of 16 rows dequantised to F32 (k blocked to stay in
// L1/L2; the 16-row layouts of layouts.h hold such panels already), and a kMR x 16 register-tiled
// FMA microkernel (BLIS-style outer products) computes each tile of y: 6 x 16 in 12 ymm
// accumulators with AVX2, 12 x 16 in 12 zmm with AVX-512 (twice the multiply-adds per FMA). Each
// element of y is one chain of FMAs from zero per k block, in order, the blocks added to y one after
// another, whatever the ISA level's width, the tile or the number of tokens: fewer than 8 tokens
// (decode) run the same chains in kernels with only their tokens' accumulators, W read panel by
// panel (run_panels_few), so a token's result never depends on the batch it is in.
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
// past n are zero. Returns the packed panel (dst), as every PackFn does: the kernels read the
// panel it returns, dst or, for a layout whose panels are the kernels' already, W itself.
template <class L>
const float* pack_w_panel(const std::byte* w, std::size_t row_bytes, std::int64_t row0, std::int64_t n,
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
  return dst;
}

using PackFn = const float* (*)(const std::byte*, std::size_t, std::int64_t, std::int64_t, std::int64_t,
                                std::int64_t, float*);

// ---- the 16-row float layouts (layouts.h): W's whole panels are stored as the kernels read them;
// the last n % 16 rows are plain rows, which the file format's packer takes (the same values, so
// the same bits) ----

// A kF32R16 panel's columns [pc, pc + kc): the F32 kernels' panel as it is.
const float* panel_f32_r16(const std::byte* w, std::size_t row_bytes, std::int64_t row0, std::int64_t n,
                           std::int64_t pc, std::int64_t kc, float* dst) {
  if (row0 + kNR > n) return pack_w_panel<RowF32>(w, row_bytes, row0, n, pc, kc, dst);
  return reinterpret_cast<const float*>(w + row_bytes * static_cast<std::size_t>(row0)) + pc * kNR;
}

// A whole panel (row0 + 16 <= n) of kBF16R16 or kF16R16 from pair pc on, as the layout holds it:
// run_panels_few's full path (a last, partial panel takes its tail path).
const float* panel_pairs_r16_whole(const std::byte* w, std::size_t row_bytes, std::int64_t row0, std::int64_t,
                                   std::int64_t pc, std::int64_t, float*) {
  return reinterpret_cast<const float*>(w + row_bytes * static_cast<std::size_t>(row0)) + pc * kNR;
}

// A kBF16R16 panel's pairs [pc, pc + kc): the BF16 pair kernels' panel as it is (a plain BF16 row
// holds its pairs as the layout's words do).
const float* panel_pairs_r16(const std::byte* w, std::size_t row_bytes, std::int64_t row0, std::int64_t n,
                             std::int64_t pc, std::int64_t kc, float* dst) {
  if (row0 + kNR > n) return pack_w_panel<RowF32>(w, row_bytes, row0, n, pc, kc, dst);
  return reinterpret_cast<const float*>(w + row_bytes * static_cast<std::size_t>(row0)) + pc * kNR;
}

// A kF16R16 / kBF16R16 panel's columns [pc, pc + kc) as F32 for the F32 kernels (dst[kc][16]):
// each pair word split into its two elements. L: PairsF16 or PairsBF16 (below), Row: the plain
// format's loader for a tail panel.
template <class L, class Row>
const float* pack_pairs_r16_as_f32(const std::byte* w, std::size_t row_bytes, std::int64_t row0, std::int64_t n,
                                   std::int64_t pc, std::int64_t kc, float* dst) {
  if (row0 + kNR > n) return pack_w_panel<Row>(w, row_bytes, row0, n, pc, kc, dst);
  const auto* panel = reinterpret_cast<const std::uint16_t*>(w + row_bytes * static_cast<std::size_t>(row0));
  std::int64_t i = pc;
#if SX_GEMM_AVX2
  if (i % 2 == 1 && i < pc + kc) {  // a block that starts inside a pair (k not a multiple of 32)
    for (int r = 0; r < kNR; ++r) dst[(i - pc) * kNR + r] = L::get(panel, (i / 2) * 2 * kNR + 2 * r + 1);
    ++i;
  }
  for (; i + 2 <= pc + kc; i += 2) {
    const std::uint16_t* words = panel + i * kNR;  // 16 pair words: rows 0-15, elements i and i + 1
    float* e0 = dst + (i - pc) * kNR;
    float* e1 = e0 + kNR;
    for (int h = 0; h < 2; ++h) {  // rows 8h .. 8h + 7
      __m256 lo, hi;
      L::split8(words + 16 * h, &lo, &hi);
      _mm256_storeu_ps(e0 + 8 * h, lo);
      _mm256_storeu_ps(e1 + 8 * h, hi);
    }
  }
#endif
  for (; i < pc + kc; ++i) {
    for (int r = 0; r < kNR; ++r) dst[(i - pc) * kNR + r] = L::get(panel, (i / 2) * 2 * kNR + 2 * r + i % 2);
  }
  return dst;
}

// Element loaders of the pair layouts: get(panel, index) reads one 16-bit element as F32;
// split8(words, lo, hi) reads 8 rows' pair words (16 elements) as their first and second elements.
struct PairsF16 {
  static float get(const std::uint16_t* p, std::int64_t i) { return f16_to_f32(load_unaligned<std::uint16_t>(p, i)); }
#if SX_GEMM_AVX2
  static void split8(const std::uint16_t* words, __m256* first, __m256* second) {
    // Rows 0-3 and 4-7 as [r e0, r e1, ...] pairs, then evens and odds (in-lane), then lanes in order.
    const __m256 a = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(words)));
    const __m256 b = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(words + 8)));
    *first = _mm256_castpd_ps(_mm256_permute4x64_pd(_mm256_castps_pd(_mm256_shuffle_ps(a, b, 0x88)), 0xD8));
    *second = _mm256_castpd_ps(_mm256_permute4x64_pd(_mm256_castps_pd(_mm256_shuffle_ps(a, b, 0xDD)), 0xD8));
  }
#endif
#if SX_GEMM_AVX512
  // 16 rows' pair words: rows 0-7 and 8-15 as [r e0, r e1, ...], then their evens and odds.
  static void split16(const float* words, __m512* first, __m512* second) {
    const __m512i v = _mm512_loadu_si512(words);
    const __m512 lo = _mm512_cvtph_ps(_mm512_castsi512_si256(v)), hi = _mm512_cvtph_ps(_mm512_extracti64x4_epi64(v, 1));
    const __m512i even = _mm512_set_epi32(30, 28, 26, 24, 22, 20, 18, 16, 14, 12, 10, 8, 6, 4, 2, 0);
    *first = _mm512_permutex2var_ps(lo, even, hi);
    *second = _mm512_permutex2var_ps(lo, _mm512_add_epi32(even, _mm512_set1_epi32(1)), hi);
  }
#endif
#if SX_GEMM_BF16_DOT
  // 16 rows' pair words as BF16 pairs, each element rounded as RowF16AsBF16Pairs rounds it
  // (vcvtph2ps, then vcvtneps2bf16: round to nearest even).
  static __m512bh bf16_pairs(const float* words) {
    const __m512i v = _mm512_loadu_si512(words);
    const __m512 lo = _mm512_cvtph_ps(_mm512_castsi512_si256(v)), hi = _mm512_cvtph_ps(_mm512_extracti64x4_epi64(v, 1));
    return _mm512_cvtne2ps_pbh(hi, lo);
  }
#endif
};
struct PairsBF16 {
  static float get(const std::uint16_t* p, std::int64_t i) { return bf16_to_f32(load_unaligned<std::uint16_t>(p, i)); }
#if SX_GEMM_AVX2
  static void split8(const std::uint16_t* words, __m256* first, __m256* second) {
    const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(words));
    *first = _mm256_castsi256_ps(_mm256_slli_epi32(v, 16));
    *second = _mm256_castsi256_ps(_mm256_and_si256(v, _mm256_set1_epi32(static_cast<int>(0xFFFF0000u))));
  }
#endif
#if SX_GEMM_AVX512
  static void split16(const float* words, __m512* first, __m512* second) {
    const __m512i v = _mm512_loadu_si512(words);
    *first = _mm512_castsi512_ps(_mm512_slli_epi32(v, 16));
    *second = _mm512_castsi512_ps(_mm512_and_si512(v, _mm512_set1_epi32(static_cast<int>(0xFFFF0000u))));
  }
#endif
#if SX_GEMM_BF16_DOT
  static __m512bh bf16_pairs(const float* words) { return reinterpret_cast<__m512bh>(_mm512_loadu_ps(words)); }
#endif
};

// Any other block format (Q4_0 ... Q6_K, AWQ int4): each row's [pc, pc + kc) dequantised with the HAL
// reference, then transposed into the panel. pc and kc fall on block boundaries (kc_step below is a
// multiple of 32, and exactly 256 when k is a multiple of 256).
template <hal::DType T>
const float* pack_w_panel_dequant(const std::byte* w, std::size_t row_bytes, std::int64_t row0, std::int64_t n,
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
  return dst;
}

// The CPU device's 8-row layouts (kQ5_0R8, kQ4_0R8, kQ4_1R8, kQ5_1R8, kQ4_KR8, kQ5_KR8):
// each row's elements [pc, pc + kc) (whole blocks of kElems) dequantised straight from its group
// of 8 (the same values as the file format's dequantisation).
template <typename Block, void (*DequantizeLane)(const Block*, int, std::int64_t, float*), int kElems = hal::kQK>
const float* pack_w_panel_r8(const std::byte* w, std::size_t row_bytes, std::int64_t row0, std::int64_t n,
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
  return dst;
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
    case kF32R16: return &panel_f32_r16;
    case kF16R16: return &pack_pairs_r16_as_f32<PairsF16, RowF16>;
    case kBF16R16: return &pack_pairs_r16_as_f32<PairsBF16, RowBF16>;
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

// c[r][0, nr) = (accumulate ? c : bias or 0) + tile[r] for r < mr: how every kernel below adds its
// tile to y (one rounding, the same in vector and scalar code).
template <int R>
void add_tile(const float (&tile)[R][kNR], float* c, std::int64_t ldc, int mr, int nr, const float* bias,
              bool accumulate) {
  for (int r = 0; r < mr; ++r) {
    float* cr = c + r * ldc;
    for (int j = 0; j < nr; ++j) {
      const float base = accumulate ? cr[j] : (bias != nullptr ? bias[j] : 0.0f);
      cr[j] = base + tile[r][j];
    }
  }
}

// c[mr][nr] (row stride ldc) = (accumulate ? c : bias or 0) + a[kc][kMR]^T . b[kc][16].
#if SX_GEMM_AVX512
// c[r][0, nr) = (accumulate ? c : bias or 0) + tile[r], for r < mr.
inline void store_tile(const __m512* tile, float* c, std::int64_t ldc, int mr, int nr, const float* bias,
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

// The tiles of a few tokens (MR < kMR: decode, small batches) in NP panels side by side (b[q], the
// y columns and bias from c and bias + 16 q; nr is the last panel's): the same chain of FMAs per
// element as kernel_tile, with only MR tokens' accumulators (kernel_tile's other ones would
// multiply padding), and NP panels' chains in flight so that one token is not held to an FMA's
// latency.
template <int MR, int NP>
void kernel_tile_few(std::int64_t kc, const float* a, std::int64_t lda, const float* const* b, float* c,
                     std::int64_t ldc, int mr, int nr, const float* bias, bool accumulate) {
  __m512 acc[NP][MR];
  for (auto& q : acc)
    for (__m512& v : q) v = _mm512_setzero_ps();
#pragma GCC unroll 2
  for (std::int64_t p = 0; p < kc; ++p) {
#pragma GCC unroll 4
    for (int q = 0; q < NP; ++q) {
      const __m512 bv = _mm512_loadu_ps(b[q] + p * kNR);
#pragma GCC unroll 12
      for (int r = 0; r < MR; ++r) acc[q][r] = _mm512_fmadd_ps(_mm512_set1_ps(a[r * lda + p]), bv, acc[q][r]);
    }
  }
  for (int q = 0; q < NP; ++q) {
    store_tile(acc[q], c + q * kNR, ldc, mr, q + 1 < NP ? kNR : nr, bias != nullptr ? bias + q * kNR : nullptr,
               accumulate);
  }
}

// The few-token tiles of a kF16R16 / kBF16R16 panel read as it is (b[q] its pair words) by the F32
// chain: element 2p, then 2p + 1, as kernel_tile takes them from a panel of F32 (Pairs: PairsF16,
// PairsBF16, which split the words in registers). kc is even.
template <int MR, int NP, class Pairs>
void kernel_tile_pairs_few(std::int64_t kc, const float* a, std::int64_t lda, const float* const* b, float* c,
                           std::int64_t ldc, int mr, int nr, const float* bias, bool accumulate) {
  __m512 acc[NP][MR];
  for (auto& q : acc)
    for (__m512& v : q) v = _mm512_setzero_ps();
#pragma GCC unroll 2
  for (std::int64_t p = 0; p < kc / 2; ++p) {
#pragma GCC unroll 4
    for (int q = 0; q < NP; ++q) {
      __m512 e0, e1;
      Pairs::split16(b[q] + p * kNR, &e0, &e1);
#pragma GCC unroll 12
      for (int r = 0; r < MR; ++r) {
        acc[q][r] = _mm512_fmadd_ps(_mm512_set1_ps(a[r * lda + 2 * p]), e0, acc[q][r]);
        acc[q][r] = _mm512_fmadd_ps(_mm512_set1_ps(a[r * lda + 2 * p + 1]), e1, acc[q][r]);
      }
    }
  }
  for (int q = 0; q < NP; ++q) {
    store_tile(acc[q], c + q * kNR, ldc, mr, q + 1 < NP ? kNR : nr, bias != nullptr ? bias + q * kNR : nullptr,
               accumulate);
  }
}

#if SX_GEMM_BF16_DOT
// Panels of BF16 pairs as kernel_tile_bf16 reads them (b[q], as a pack wrote them or a kBF16R16
// layout holds them).
struct PanelBF16 {
  static __m512bh bf16_pairs(const float* words) { return reinterpret_cast<__m512bh>(_mm512_loadu_ps(words)); }
};

// kernel_tile_bf16's chain per element for a few tokens in NP panels; Load: PanelBF16, or PairsF16
// for a kF16R16 panel read as it is (converted in registers as its packer converts it).
template <int MR, int NP, class Load = PanelBF16>
void kernel_tile_bf16_few(std::int64_t kc2, const float* a, std::int64_t lda, const float* const* b, float* c,
                          std::int64_t ldc, int mr, int nr, const float* bias, bool accumulate) {
  __m512 acc[NP][MR];
  for (auto& q : acc)
    for (__m512& v : q) v = _mm512_setzero_ps();
  const auto* ai = reinterpret_cast<const std::int32_t*>(a);
#pragma GCC unroll 2
  for (std::int64_t p = 0; p < kc2; ++p) {
#pragma GCC unroll 4
    for (int q = 0; q < NP; ++q) {
      const __m512bh bv = Load::bf16_pairs(b[q] + p * kNR);
#pragma GCC unroll 12
      for (int r = 0; r < MR; ++r) {
        acc[q][r] = _mm512_dpbf16_ps(acc[q][r], reinterpret_cast<__m512bh>(_mm512_set1_epi32(ai[r * lda + p])), bv);
      }
    }
  }
  for (int q = 0; q < NP; ++q) {
    store_tile(acc[q], c + q * kNR, ldc, mr, q + 1 < NP ? kNR : nr, bias != nullptr ? bias + q * kNR : nullptr,
               accumulate);
  }
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
    const __m256 b0 = _mm256_loadu_ps(b + p * kNR);
    const __m256 b1 = _mm256_loadu_ps(b + p * kNR + 8);
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
  add_tile(tile, c, ldc, mr, nr, bias, accumulate);
}

// y of the few-token kernels' NP panels: as kernel_tile adds its tile to y (base + tile).
template <int MR, int NP>
void store_tiles_few(const __m256 (&acc)[NP][MR][2], float* c, std::int64_t ldc, int mr, int nr, const float* bias,
                     bool accumulate) {
  for (int q = 0; q < NP; ++q) {
    alignas(32) float tile[MR][kNR];
    for (int r = 0; r < MR; ++r) {
      _mm256_store_ps(tile[r], acc[q][r][0]);
      _mm256_store_ps(tile[r] + 8, acc[q][r][1]);
    }
    add_tile(tile, c + q * kNR, ldc, mr, q + 1 < NP ? kNR : nr, bias != nullptr ? bias + q * kNR : nullptr, accumulate);
  }
}

// The tiles of a few tokens in NP panels, as in the AVX-512 build: kernel_tile's chain per element
// with MR tokens' accumulators, x row-major (token r at a + r * lda).
template <int MR, int NP>
void kernel_tile_few(std::int64_t kc, const float* a, std::int64_t lda, const float* const* b, float* c,
                     std::int64_t ldc, int mr, int nr, const float* bias, bool accumulate) {
  __m256 acc[NP][MR][2];
  for (auto& q : acc)
    for (auto& v : q) v[0] = v[1] = _mm256_setzero_ps();
#pragma GCC unroll 2
  for (std::int64_t p = 0; p < kc; ++p) {
#pragma GCC unroll 4
    for (int q = 0; q < NP; ++q) {
      const __m256 b0 = _mm256_loadu_ps(b[q] + p * kNR);
      const __m256 b1 = _mm256_loadu_ps(b[q] + p * kNR + 8);
#pragma GCC unroll 7
      for (int r = 0; r < MR; ++r) {
        const __m256 av = _mm256_broadcast_ss(a + r * lda + p);
        acc[q][r][0] = _mm256_fmadd_ps(av, b0, acc[q][r][0]);
        acc[q][r][1] = _mm256_fmadd_ps(av, b1, acc[q][r][1]);
      }
    }
  }
  store_tiles_few<MR, NP>(acc, c, ldc, mr, nr, bias, accumulate);
}

// kernel_tile_pairs_few of the AVX-512 build: a pair layout's panel split in registers (split8).
template <int MR, int NP, class Pairs>
void kernel_tile_pairs_few(std::int64_t kc, const float* a, std::int64_t lda, const float* const* b, float* c,
                           std::int64_t ldc, int mr, int nr, const float* bias, bool accumulate) {
  __m256 acc[NP][MR][2];
  for (auto& q : acc)
    for (auto& v : q) v[0] = v[1] = _mm256_setzero_ps();
  for (std::int64_t p = 0; p < kc / 2; ++p) {
#pragma GCC unroll 4
    for (int q = 0; q < NP; ++q) {
      const auto* words = reinterpret_cast<const std::uint16_t*>(b[q] + p * kNR);
      __m256 e0[2], e1[2];
      Pairs::split8(words, &e0[0], &e1[0]);
      Pairs::split8(words + 16, &e0[1], &e1[1]);
#pragma GCC unroll 7
      for (int r = 0; r < MR; ++r) {
        const __m256 x0 = _mm256_broadcast_ss(a + r * lda + 2 * p), x1 = _mm256_broadcast_ss(a + r * lda + 2 * p + 1);
        for (int h = 0; h < 2; ++h) {
          acc[q][r][h] = _mm256_fmadd_ps(x0, e0[h], acc[q][r][h]);
          acc[q][r][h] = _mm256_fmadd_ps(x1, e1[h], acc[q][r][h]);
        }
      }
    }
  }
  store_tiles_few<MR, NP>(acc, c, ldc, mr, nr, bias, accumulate);
}
#else
void kernel_tile(std::int64_t kc, const float* a, const float* b, float* c, std::int64_t ldc,
                 int mr, int nr, const float* bias, bool accumulate) {
  float tile[kMR][kNR] = {};
  for (std::int64_t p = 0; p < kc; ++p)
    for (int r = 0; r < kMR; ++r)
      for (int j = 0; j < kNR; ++j) tile[r][j] += a[p * kMR + r] * b[p * kNR + j];
  add_tile(tile, c, ldc, mr, nr, bias, accumulate);
}
// The portable build's few-token tiles: kernel_tile's arithmetic (a product, then a sum: this level
// has no FMA) for MR tokens of row-major x, panel after panel.
template <int MR, int NP>
void kernel_tile_few(std::int64_t kc, const float* a, std::int64_t lda, const float* const* b, float* c,
                     std::int64_t ldc, int mr, int nr, const float* bias, bool accumulate) {
  for (int q = 0; q < NP; ++q) {
    float tile[MR][kNR] = {};
    for (std::int64_t p = 0; p < kc; ++p)
      for (int r = 0; r < MR; ++r)
        for (int j = 0; j < kNR; ++j) tile[r][j] += a[r * lda + p] * b[q][p * kNR + j];
    add_tile(tile, c + q * kNR, ldc, mr, q + 1 < NP ? kNR : nr, bias != nullptr ? bias + q * kNR : nullptr, accumulate);
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
      const float* panel[kMaxPanelsPerTask];
      for (std::int64_t pc = 0; pc < kw; pc += kc_step) {
        const std::int64_t kc = std::min(kc_step, kw - pc);
        for (std::int64_t j = j0; j < j1; ++j) panel[j - j0] = pack(w, rb, j * kNR, n, pc, kc, wp + (j - j0) * kc * kNR);
        for (std::int64_t i = 0; i < x_panels; ++i) {
          const float* a = xp + i * kw * kMR + pc * kMR;
          const int mr = static_cast<int>(std::min<std::int64_t>(kMR, m - i * kMR));
          for (std::int64_t j = j0; j < j1; ++j) {
            const int nr = static_cast<int>(std::min<std::int64_t>(kNR, n - j * kNR));
            kernel(kc, a, panel[j - j0], p.y + i * kMR * n + j * kNR, n, mr, nr,
                   p.bias != nullptr ? p.bias + j * kNR : nullptr, pc > 0);
          }
        }
      }
    }
  });
}

// Below this many tokens, run_panels_few; from it on, run_tiles (the same bits either way).
constexpr std::int64_t kFewTokens = 8;

// A few-token kernel: (kc, x of token 0 at the block's first column, x's row stride, the NP panels,
// y, ldy, mr, nr of the last panel, bias, accumulate).
using FewFn = void (*)(std::int64_t, const float*, std::int64_t, const float* const*, float*, std::int64_t, int, int,
                      const float*, bool);

// Panels a few-token kernel takes side by side for m tokens: enough chains in flight for one or two
// tokens (each panel is one chain per token and 16 rows).
int few_panels(std::int64_t m) { return m == 1 ? 4 : m == 2 ? 2 : 1; }

// The few-token kernel of family K (FewF32, FewBF16) for a panel of mr tokens in np panels side by
// side (np = few_panels(mr), or 1).
template <template <int, int> class K>
FewFn few_kernel(int mr, int np) {
  if (np == 4) return &K<1, 4>::run;
  if (np == 2) return &K<2, 2>::run;
  switch (mr) {
    case 1: return &K<1, 1>::run;
    case 2: return &K<2, 1>::run;
    case 3: return &K<3, 1>::run;
    case 4: return &K<4, 1>::run;
    case 5: return &K<5, 1>::run;
    case 6: return &K<6, 1>::run;
    default: return &K<7, 1>::run;
  }
}
template <int MR, int NP>
struct FewF32 {
  static void run(std::int64_t kc, const float* a, std::int64_t lda, const float* const* b, float* c, std::int64_t ldc,
                  int mr, int nr, const float* bias, bool accumulate) {
    kernel_tile_few<MR, NP>(kc, a, lda, b, c, ldc, mr, nr, bias, accumulate);
  }
};

// How run_panels_few reads a panel: the packer (or a layout's panel as it is) and the few-token
// kernels that read what it gives.
struct FewPath {
  PackFn pack;
  FewFn (*kernel)(int mr, int np);
};

// Few tokens (m < kFewTokens: decode, small batches), with the arithmetic of run_tiles element for
// element (each k block's chain of FMAs from zero, added to y block after block): a token's result
// does not depend on how many tokens share its step (DESIGN.md §1, issue 53). W is read panel by
// panel, each panel's 16 rows over all of k (16 long streams the prefetchers follow), np panels side
// by side, the rows handed out to the threads in guided chunks of whole panels (for_row_chunks'
// reasons: long first chunks, short last ones). `tail` reads a last panel of fewer than 16 rows
// (the layouts keep those rows plain), `full` every other one.
void run_panels_few(ThreadPool& pool, Scratch& scratch, const MatmulProblem& p, std::int64_t kw, std::int64_t kc_step,
                    const float* x, FewPath full, FewPath tail) {
  const std::int64_t m = p.m, n = p.n;
  const std::int64_t w_panels = ceil_div(n, kNR);
  const int np = few_panels(m);
  const int threads = pool.size();
  std::vector<float*> wbuf(static_cast<std::size_t>(threads));
  for (int t = 0; t < threads; ++t) {
    wbuf[static_cast<std::size_t>(t)] = static_cast<float*>(
        scratch.get(kSlotThread0 + t, static_cast<std::size_t>(np) * kKC * kNR * sizeof(float)));
  }
  const auto* w = static_cast<const std::byte*>(p.w);
  const std::size_t rb = cpu::row_bytes(p.w_type, p.k);
  auto panels = [&](int thread, std::int64_t j0, std::int64_t j1) {
    float* wp = wbuf[static_cast<std::size_t>(thread)];
    const float* panel[4];
    for (std::int64_t j = j0; j < j1;) {
      const bool last = (j + 1) * kNR > n;
      const FewPath& path = last ? tail : full;
      const int nq = !last && j + np <= j1 && (j + np) * kNR <= n ? np : 1;  // np whole panels, or one
      const int nr = static_cast<int>(std::min<std::int64_t>(kNR, n - (j + nq - 1) * kNR));
      for (std::int64_t pc = 0; pc < kw; pc += kc_step) {
        const std::int64_t kc = std::min(kc_step, kw - pc);
        for (int q = 0; q < nq; ++q) panel[q] = path.pack(w, rb, (j + q) * kNR, n, pc, kc, wp + q * kc * kNR);
        path.kernel(static_cast<int>(m), nq)(kc, x + pc, kw, panel, p.y + j * kNR, n, static_cast<int>(m), nr,
                                             p.bias != nullptr ? p.bias + j * kNR : nullptr, pc > 0);
      }
      j += nq;
    }
  };
  if (threads == 1 || w_panels == 1) {
    panels(0, 0, w_panels);
    return;
  }
  std::atomic<std::int64_t> next{0};
  pool.run_on_all([&](int thread, int) {
    std::int64_t j0 = 0, j1 = 0;
    while (claim_guided_chunk(next, w_panels, static_cast<std::int64_t>(threads) * kGemvTasksPerThread, np, np, j0, j1)) {
      panels(thread, j0, j1);
    }
  });
}

#if SX_GEMM_AVX2
// A whole kF16R16 / kBF16R16 panel's pair words from element pc (even) on, as they are: for
// kernel_tile_pairs_few (run_panels_few's full path).
const float* panel_pairs_r16_at(const std::byte* w, std::size_t row_bytes, std::int64_t row0, std::int64_t,
                                std::int64_t pc, std::int64_t, float*) {
  return reinterpret_cast<const float*>(w + row_bytes * static_cast<std::size_t>(row0)) + pc / 2 * kNR;
}

template <class Pairs>
struct FewPairs {
  template <int MR, int NP>
  struct K {
    static void run(std::int64_t kc, const float* a, std::int64_t lda, const float* const* b, float* c,
                    std::int64_t ldc, int mr, int nr, const float* bias, bool accumulate) {
      kernel_tile_pairs_few<MR, NP, Pairs>(kc, a, lda, b, c, ldc, mr, nr, bias, accumulate);
    }
  };
};
#endif

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

// A kF16R16 panel's pairs [pc, pc + kc) as BF16 pairs (dst[kc][16] words), each element rounded as
// RowF16AsBF16Pairs rounds it (vcvtph2ps, then vcvtneps2bf16: round to nearest even).
const float* pack_f16_r16_as_bf16_pairs(const std::byte* w, std::size_t row_bytes, std::int64_t row0, std::int64_t n,
                                        std::int64_t pc, std::int64_t kc, float* dst) {
  if (row0 + kNR > n) return pack_w_panel<RowF16AsBF16Pairs>(w, row_bytes, row0, n, pc, kc, dst);
  const std::byte* words = w + row_bytes * static_cast<std::size_t>(row0) + 64 * static_cast<std::size_t>(pc);
  for (std::int64_t q = 0; q < kc; ++q) {
    const __m512i v = _mm512_loadu_si512(words + 64 * q);  // 16 rows' pairs of F16
    const __m512 lo = _mm512_cvtph_ps(_mm512_castsi512_si256(v)), hi = _mm512_cvtph_ps(_mm512_extracti64x4_epi64(v, 1));
    _mm512_storeu_ps(dst + q * kNR, reinterpret_cast<__m512>(_mm512_cvtne2ps_pbh(hi, lo)));
  }
  return dst;
}

// BF16 and F16 weights (k even) on the avx512-bf16 level: x rounded to BF16 once, x and W packed
// as BF16 pairs (the F32 panels' layout with a pair in each 32-bit word, moved by the same
// transposes; `pack` reads W's row as such pairs), kernel_tile_bf16: one vdpbf16ps does 32
// multiply-adds where an F32 FMA does 16. Each product is exact in F32 (8-bit by 8-bit
// significands), so the differences from the F32 path are the roundings to BF16, half a unit of an
// 8-bit significand (2^-8 of the element) each: x's, and for F16 weights W's too (an F16 has 11
// significant bits). |error| <= 2^-8 * sum_i |x_i w_i| for BF16 weights, (2^-7 + 2^-16) * sum_i
// |x_i w_i| for F16 ones (+ F32 sums): F16 weights meet BF16 arithmetic as in vLLM's CPU executor,
// which cast whole F16 models to BF16, here in every step, decode included, so that a token's result
// does not depend on its batch. SEXTANT_CPU_ISA=avx512-vnni keeps the exact F32 products (F16C
// conversion + FMA).
template <class Load>
struct FewBF16 {
  template <int MR, int NP>
  struct K {
    static void run(std::int64_t kc, const float* a, std::int64_t lda, const float* const* b, float* c,
                    std::int64_t ldc, int mr, int nr, const float* bias, bool accumulate) {
      kernel_tile_bf16_few<MR, NP, Load>(kc, a, lda, b, c, ldc, mr, nr, bias, accumulate);
    }
  };
};

// `pack`: W's panels as BF16 pairs for run_tiles; `few`, `few_tail`: run_panels_few's paths.
void gemm_bf16_dot(ThreadPool& pool, Scratch& scratch, const MatmulProblem& p, PackFn pack, FewPath few,
                   FewPath few_tail) {
  const std::int64_t m = p.m, k2 = p.k / 2;
  const std::int64_t x_panels = ceil_div(m, kMR);
  const std::int64_t kc_step = ceil_div(k2, ceil_div(k2, kKC));
  auto* xb = static_cast<std::uint32_t*>(scratch.get(kSlotActs, static_cast<std::size_t>(m * k2) * sizeof(std::uint32_t)));
  if (m < kFewTokens) {  // the few-token kernels read x's rows as they are
    for (std::int64_t t = 0; t < m; ++t) x_to_bf16_pairs(p.x + t * p.k, p.k, xb + t * k2);
    run_panels_few(pool, scratch, p, k2, kc_step, reinterpret_cast<const float*>(xb), few, few_tail);
    return;
  }
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
  if (p.k % 2 == 0) {
    constexpr auto bf16 = &few_kernel<FewBF16<PanelBF16>::K>;
    const FewPath packed_f16{&pack_w_panel<RowF16AsBF16Pairs>, bf16};
    switch (p.w_type) {
      case hal::DType::kBF16: {  // a BF16 row is BF16 pairs already
        const FewPath few{&pack_w_panel<RowF32>, bf16};
        return gemm_bf16_dot(pool, scratch, p, few.pack, few, few);
      }
      case hal::DType::kF16: return gemm_bf16_dot(pool, scratch, p, packed_f16.pack, packed_f16, packed_f16);
      case kBF16R16: {
        const FewPath few{&panel_pairs_r16, bf16};
        return gemm_bf16_dot(pool, scratch, p, few.pack, few, few);
      }
      case kF16R16:  // decode converts the panel in registers as its packer does
        return gemm_bf16_dot(pool, scratch, p, &pack_f16_r16_as_bf16_pairs,
                             FewPath{&panel_pairs_r16_whole, &few_kernel<FewBF16<PairsF16>::K>}, packed_f16);
      default: break;
    }
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

  if (m < kFewTokens) {  // the few-token kernels read x's rows as they are
    const FewPath packed{pack_fn(p.w_type), &few_kernel<FewF32>};
#if SX_GEMM_AVX2
    // The pair layouts' whole panels split in registers, their plain tail packed.
    if (kc_step % 2 == 0 && (p.w_type == kF16R16 || p.w_type == kBF16R16)) {
      const bool f16 = p.w_type == kF16R16;
      const FewPath split{&panel_pairs_r16_at,
                          f16 ? &few_kernel<FewPairs<PairsF16>::K> : &few_kernel<FewPairs<PairsBF16>::K>};
      const FewPath tail{f16 ? &pack_w_panel<RowF16> : &pack_w_panel<RowBF16>, &few_kernel<FewF32>};
      run_panels_few(pool, scratch, p, k, kc_step, p.x, split, tail);
      return;
    }
#endif
    run_panels_few(pool, scratch, p, k, kc_step, p.x, packed, packed);
    return;
  }
  auto* xp = static_cast<float*>(scratch.get(kSlotPackedX, static_cast<std::size_t>(x_panels * k * kMR) * sizeof(float)));
  pool.parallel_for(x_panels, [&](std::int64_t i) { pack_x_panel(p.x, m, k, i * kMR, xp + i * k * kMR); });
  run_tiles(pool, scratch, p, k, kc_step, xp, pack_fn(p.w_type), &kernel_tile);
}

}  // namespace sx::cpu::SX_CPU_ISA_NS::detail
