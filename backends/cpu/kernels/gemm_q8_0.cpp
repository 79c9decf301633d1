// Int8 matmul for Q8_0 weights on the integer units, for kQ8_0R16 weights at every m and for
// plain Q8_0 at large m: x rows are quantised to int8 blocks (quantize_activations_q8), W comes in
// panels of 16 interleaved rows (BlockQ8_0x16) whose k-pairs are sign-extended to int16 in
// the microkernel, so one vpmaddwd does 16 multiply-adds and, with its vpaddd, uses other ports
// than the FMAs (AVX2 has no VNNI). Per block of 32 the exact int32 sums are converted and scaled
// by d_w * d_x into F32 accumulators in block order, so the result equals the GEMV int8 path and
// matmul_reference_q8_activations bit for bit.
//
// kQ8_0R16 weights are read in place (the CPU device keeps Q8_0 weights that way); plain Q8_0 is
// interleaved per task into scratch first. Blocking: see kStreamingXPanels. x is quantised and
// packed once per call into 6-token panels, shared by all threads.
#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstring>
#include <mutex>
#include <type_traits>
#include <vector>

#include "backends/cpu/kernels/matmul_internal.h"
#include "runtime/base/half.h"

#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#define SX_GEMM_Q8_AVX2 1
#include <immintrin.h>

#include "backends/cpu/kernels/r8_values.h"
#endif

namespace sx::cpu::SX_CPU_ISA_NS::detail {

#if SX_GEMM_Q8_AVX2
namespace {

using hal::BlockQ8_0;
constexpr int kB = hal::kQ8_0Block;
constexpr int kMR = 6;                 // tokens per microtile (12 int32 accumulators)
constexpr int kNR = 16;                // W rows per microtile (two ymm of int32 lanes)
constexpr int kKC = 512;               // max k per block at large m: 8.5 KiB of W per panel
constexpr int kMaxPanelsPerTask = 16;  // <= 136 KiB of W per task and k block (L2)
// Software prefetch distance along W (one line per two k-pairs). At small m W comes from DRAM as
// one stream per task, which the hardware prefetchers alone do not keep ahead of.
constexpr int kPrefetchBytes = 1024;

// With VNNI (AVX-512 VNNI on 256-bit registers, or AVX-VNNI) the microkernels run vpdpbusd, four
// multiply-adds per int32 lane: W's k-pairs of 16 rows are regrouped into k-quads (vpunpck[lh]wd of
// two pairs: rows 0-3 and 8-11 in one register, 4-7 and 12-15 in the other) and made unsigned
// (w + 128, an xor), x stays signed (four int8 per int32 of the panel), and 128 * sum(x) of each
// block, packed with x, is taken off the exact int32 sum. Without VNNI: k-pairs sign-extended to
// int16 and vpmaddwd. Both give the exact int32 dot of each block, so every level gives the same bits.
#if defined(__AVX512VNNI__) && defined(__AVX512VL__)
#define SX_Q8_VNNI(insn) "%{evex%} " insn  // %{ %}: braces, not asm dialect alternatives
#elif defined(__AVXVNNI__)
#define SX_Q8_VNNI(insn) "%{vex%} " insn
#endif
#if defined(SX_Q8_VNNI)
constexpr bool kVnni = true;
constexpr int kXK = 4;           // k values per int32 of a packed x panel
constexpr int kWStepBytes = 64;  // W bytes per k step of a panel (one k-quad of 16 rows)
alignas(32) constexpr std::uint8_t kSignBias[32] = {
    0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80,
    0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80};
#else
constexpr bool kVnni = false;
constexpr int kXK = 2;
constexpr int kWStepBytes = 32;  // one k-pair of 16 rows
#endif

// Interleaves rows [row0, row0 + 16) x blocks [b0, b0 + nb) of a W whose blocks hold Q8_0 values
// (plain Q8_0, Q4_0, Q5_0, kQ5_0R8, kQ4_0R8: layouts.h blocks_as_q8_0, 16 blocks of a row at a time) into
// nb BlockQ8_0x16 (the layout kQ8_0R16 weights already have); rows at or past n are zero.
#if SX_GEMM_Q8_AVX2
// The same for kQ5_0R8 / kQ4_0R8 (row0 a multiple of 16: two groups of 8 rows per panel) in
// registers: each 8-row block's values (r8_values, one row per dword: elements 4v .. 4v + 3) less
// the offset, the low and high int16 of every dword gathered (vpshufb, vpermq) and the two groups'
// halves joined into the panel's pairs 2v and 2v + 1. The same bytes as blocks_as_q8_0 gives
// (padding rows: zero blocks either way, as far as the kernels can tell: their scales are 0).
template <typename Block>
void interleave_panel_r8(const Block* w, std::int64_t k, std::int64_t row0, std::int64_t n, std::int64_t b0,
                         std::int64_t nb, BlockQ8_0x16* dst) {
  constexpr bool kFive = std::is_same_v<Block, BlockQ5_0x8>;
  const std::int64_t nb_row = k / kB;
  const Block* g[2] = {w + (row0 / 8) * nb_row, row0 + 8 < n ? w + (row0 / 8 + 1) * nb_row : nullptr};
  const __m256i offset = _mm256_set1_epi8(kFive ? 16 : 8);
  // Per 16-byte half: the low int16 of its 4 dwords, then the high ones.
  const __m256i split = _mm256_setr_epi8(0, 1, 4, 5, 8, 9, 12, 13, 2, 3, 6, 7, 10, 11, 14, 15, 0, 1, 4, 5, 8, 9, 12,
                                         13, 2, 3, 6, 7, 10, 11, 14, 15);
  for (std::int64_t b = 0; b < nb; ++b) {
    BlockQ8_0x16& out = dst[b];
    __m256i q[2][8];
    for (int h = 0; h < 2; ++h) {
      if (g[h] == nullptr) {
        for (__m256i& v : q[h]) v = offset;  // zero once the offset is taken off
        std::memset(out.d + 8 * h, 0, 8 * sizeof(std::uint16_t));
        continue;
      }
      const Block& in = g[h][b0 + b];
      if constexpr (kFive) {
        r8_values<true>(in.qs, in.qh, q[h]);
      } else {
        r8_values<false>(in.qs, nullptr, q[h]);
      }
      std::memcpy(out.d + 8 * h, in.d, 8 * sizeof(std::uint16_t));
    }
    for (int v = 0; v < 8; ++v) {
      // [row r's elements 4v, 4v + 1 for r < 4 | r < 8 | then 4v + 2, 4v + 3], per group.
      const __m256i a = _mm256_permute4x64_epi64(
          _mm256_shuffle_epi8(_mm256_sub_epi8(q[0][v], offset), split), 0xD8);
      const __m256i c = _mm256_permute4x64_epi64(
          _mm256_shuffle_epi8(_mm256_sub_epi8(q[1][v], offset), split), 0xD8);
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(out.qs + 32 * (2 * v)), _mm256_permute2x128_si256(a, c, 0x20));
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(out.qs + 32 * (2 * v + 1)), _mm256_permute2x128_si256(a, c, 0x31));
    }
  }
}
#endif

void interleave_panel(hal::DType t, const void* w, std::int64_t k, std::int64_t row0, std::int64_t n,
                      std::int64_t b0, std::int64_t nb, BlockQ8_0x16* dst) {
#if SX_GEMM_Q8_AVX2
  static_assert(kNR == 16 && kQ5_0R8Rows == 8 && kQ4_0R8Rows == 8);
  if (t == kQ5_0R8 && row0 % 16 == 0) {
    interleave_panel_r8(static_cast<const BlockQ5_0x8*>(w), k, row0, n, b0, nb, dst);
    return;
  }
  if (t == kQ4_0R8 && row0 % 16 == 0) {
    interleave_panel_r8(static_cast<const BlockQ4_0x8*>(w), k, row0, n, b0, nb, dst);
    return;
  }
#endif
  for_panel_blocks_as_q8_0(t, w, k, n, row0, b0, nb, [&](int r, std::int64_t b, const BlockQ8_0& blk) {
    BlockQ8_0x16& out = dst[b];
    out.d[r] = blk.d;
    for (int q = 0; q < kB / 2; ++q) std::memcpy(out.qs + 32 * q + 2 * r, blk.qs + 2 * q, 2);
  });
}

// Packed x panel of kMR tokens: [k / kXK][kMR] int32 (a k-pair as two int16, or with VNNI a k-quad
// as four int8), then [block][kMR] F32 scales, then with VNNI [block][kMR] int32 128 * sum(x).
constexpr std::size_t x_values_bytes(std::int64_t k) { return static_cast<std::size_t>(k / kXK) * kMR * 4; }
constexpr std::size_t x_panel_bytes(std::int64_t k) {
  return (x_values_bytes(k) + static_cast<std::size_t>(k / kB) * kMR * 4 * (kVnni ? 2 : 1) + 63) / 64 * 64;
}
inline const float* x_scales(const std::byte* panel, std::int64_t k) {
  return reinterpret_cast<const float*>(panel + x_values_bytes(k));
}
inline const std::int32_t* x_sums(const std::byte* panel, std::int64_t k) {
  return reinterpret_cast<const std::int32_t*>(panel + x_values_bytes(k) + static_cast<std::size_t>(k / kB) * kMR * 4);
}

void pack_x_panel(const std::int8_t* xq, const float* xd, std::int64_t m, std::int64_t k, std::int64_t t0,
                  std::byte* dst) {
  auto* pairs = reinterpret_cast<std::int32_t*>(dst);
  auto* scales = const_cast<float*>(x_scales(dst, k));
  [[maybe_unused]] auto* sums = const_cast<std::int32_t*>(x_sums(dst, k));
  const std::int64_t nb = k / kB;
  for (int t = 0; t < kMR; ++t) {
    if (t0 + t >= m) {  // padding tokens: zero values, scales (and sums)
      if (m - t0 < 5) break;  // only kernel_6 (5 or 6 tokens) reads past the panel's tokens
      for (std::int64_t p = 0; p < k / kXK; ++p) pairs[p * kMR + t] = 0;
      for (std::int64_t b = 0; b < nb; ++b) scales[b * kMR + t] = 0.0f;
      if constexpr (kVnni) {
        for (std::int64_t b = 0; b < nb; ++b) sums[b * kMR + t] = 0;
      }
      continue;
    }
    const std::int8_t* q = xq + (t0 + t) * k;
    for (std::int64_t b = 0; b < nb; ++b) scales[b * kMR + t] = xd[(t0 + t) * nb + b];
    if constexpr (kVnni) {
      for (std::int64_t p = 0; p < k / 4; ++p) std::memcpy(&pairs[p * kMR + t], q + 4 * p, 4);
      for (std::int64_t b = 0; b < nb; ++b) {
        std::int32_t sum = 0;
        for (int i = 0; i < kB; ++i) sum += q[b * kB + i];
        sums[b * kMR + t] = 128 * sum;
      }
      continue;
    }
    // 16 k (8 pairs) at a time (k is a multiple of 32): int8 sign-extended to int16 are the
    // little-endian pairs (lo | hi << 16) as int32.
    for (std::int64_t p0 = 0; p0 < k / 2; p0 += 8) {
      alignas(32) std::int32_t v[8];
      _mm256_store_si256(reinterpret_cast<__m256i*>(v),
                         _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(q + 2 * p0))));
      for (int i = 0; i < 8; ++i) pairs[(p0 + i) * kMR + t] = v[i];
    }
  }
}

// Loads the F32 accumulators of a tile of c (or zeros) and stores them back (+ bias).
template <int MR>
inline void load_tile(const float* c, std::int64_t ldc, int nr, bool accumulate, __m256 (&f)[MR][2]) {
  for (int t = 0; t < MR; ++t) {
    if (!accumulate) {
      f[t][0] = f[t][1] = _mm256_setzero_ps();
    } else if (nr == kNR) {
      f[t][0] = _mm256_loadu_ps(c + t * ldc);
      f[t][1] = _mm256_loadu_ps(c + t * ldc + 8);
    } else {
      alignas(32) float v[kNR] = {};
      for (int j = 0; j < nr; ++j) v[j] = c[t * ldc + j];
      f[t][0] = _mm256_load_ps(v);
      f[t][1] = _mm256_load_ps(v + 8);
    }
  }
}

inline void store_row(float* cr, int nr, __m256 v0, __m256 v1, const float* bias) {
  if (nr == kNR) {
    if (bias != nullptr) {
      v0 = _mm256_add_ps(v0, _mm256_loadu_ps(bias));
      v1 = _mm256_add_ps(v1, _mm256_loadu_ps(bias + 8));
    }
    _mm256_storeu_ps(cr, v0);
    _mm256_storeu_ps(cr + 8, v1);
    return;
  }
  alignas(32) float v[kNR];
  _mm256_store_ps(v, v0);
  _mm256_store_ps(v + 8, v1);
  for (int j = 0; j < nr; ++j) cr[j] = v[j] + (bias != nullptr ? bias[j] : 0.0f);
}

// acc = fma(float(int32 dot of block b), d_w * d_x, acc) for the two halves (rows 0-7, 8-15).
inline void scale_block(const BlockQ8_0x16& wb, float dx, __m256i i0, __m256i i1, __m256& f0, __m256& f1) {
  const __m256 dw0 = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(wb.d)));
  const __m256 dw1 = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(wb.d + 8)));
  const __m256 d = _mm256_set1_ps(dx);
  f0 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(i0), _mm256_mul_ps(dw0, d), f0);
  f1 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(i1), _mm256_mul_ps(dw1, d), f1);
}

// The microkernels: c[mr][nr] (row stride ldc) = (accumulate ? c : 0) + for each of nb blocks in
// order fma(float(exact int32 dot), d_w * d_x, .), then + bias (the caller passes it with the last k
// block only). W is 16 interleaved rows (one BlockQ8_0x16 per block: each k-pair of the 16 rows is
// 32 bytes, sign-extended to int16 in two halves), x a packed panel (a = k-pairs as int32, one per
// token, kMR per pair; adx = scales). One vpmaddwd multiplies a token's k-pair with 8 rows' pairs
// and adds them: 16 multiply-adds. This is exactly the arithmetic of the GEMV
// (gemv_q8_0.cpp), so a token's result does not depend on the batch it is computed in.
//
// One k step of 16 rows of W in registers (load_w), one token's x of that step multiplied and added
// into its two accumulators (madd_x), and a block's two accumulators made the exact int32 dots of
// rows 0-7 and 8-15 (block_dots). Inline asm: written with intrinsics, GCC unrolls the step loop,
// reassociates the integer sums into a tree and spills every product to the stack.
#if defined(SX_Q8_VNNI)
// A k-quad (two k-pairs, 64 bytes) of 16 rows as unsigned w + 128: rows 0-3 and 8-11 in w0, rows
// 4-7 and 12-15 in w1.
inline void load_w(const std::int8_t* q, __m256i& w0, __m256i& w1) {
  __m256i t;
  __asm__("vmovdqu %[bias], %[t]\n\t"
          "vpxor (%[q]), %[t], %[w0]\n\t"
          "vpxor 32(%[q]), %[t], %[w1]\n\t"
          "vpunpckhwd %[w1], %[w0], %[t]\n\t"
          "vpunpcklwd %[w1], %[w0], %[w0]\n\t"
          "vmovdqa %[t], %[w1]\n\t"
          : [w0] "=&x"(w0), [w1] "=&x"(w1), [t] "=&x"(t)
          : [q] "r"(q), [bias] "m"(*reinterpret_cast<const __m256i*>(kSignBias))
          : "memory");
}
// One token's k-quad (an int32 of four int8 at offset OFF of x) into accumulators A0 / A1.
#define SX_TOKEN_STEP(OFF, A0, A1)                      \
  "vpbroadcastd " OFF "(%[x]), %[xv]\n\t"               \
  SX_Q8_VNNI("vpdpbusd") " %[xv], %[w0], %[" A0 "]\n\t" \
  SX_Q8_VNNI("vpdpbusd") " %[xv], %[w1], %[" A1 "]\n\t"
// acc - 128 * sum(x), the lanes back in row order.
inline void block_dots(__m256i& i0, __m256i& i1, std::int32_t x_sum) {
  const __m256i s = _mm256_set1_epi32(x_sum);
  const __m256i e0 = _mm256_sub_epi32(i0, s), e1 = _mm256_sub_epi32(i1, s);
  i0 = _mm256_permute2x128_si256(e0, e1, 0x20);
  i1 = _mm256_permute2x128_si256(e0, e1, 0x31);
}
#else
// A k-pair of 16 rows sign-extended to int16 (rows 0-7 in w0, 8-15 in w1).
inline void load_w(const std::int8_t* q, __m256i& w0, __m256i& w1) {
  __asm__("vpmovsxbw (%[q]), %[w0]\n\t"
          "vpmovsxbw 16(%[q]), %[w1]\n\t"
          : [w0] "=x"(w0), [w1] "=x"(w1)
          : [q] "r"(q)
          : "memory");
}
// One token's k-pair (an int32 of two int16 at offset OFF of x) into accumulators A0 / A1.
#define SX_TOKEN_STEP(OFF, A0, A1)            \
  "vpbroadcastd " OFF "(%[x]), %[xv]\n\t"     \
  "vpmaddwd %[xv], %[w0], %[t]\n\t"           \
  "vpmaddwd %[xv], %[w1], %[xv]\n\t"          \
  "vpaddd %[t], %[" A0 "], %[" A0 "]\n\t"     \
  "vpaddd %[xv], %[" A1 "], %[" A1 "]\n\t"
inline void block_dots(__m256i&, __m256i&, std::int32_t) {}
#endif
inline void madd_x(__m256i& a0, __m256i& a1, __m256i w0, __m256i w1, const std::int32_t* x) {
  __m256i xv, t;
  __asm__(SX_TOKEN_STEP("", "a0", "a1")
          : [a0] "+x"(a0), [a1] "+x"(a1), [xv] "=&x"(xv), [t] "=&x"(t)
          : [w0] "x"(w0), [w1] "x"(w1), [x] "r"(x)
          : "memory");
}
// The k steps of a block and the x sum of token t of block b (0 without VNNI).
constexpr int kSteps = kB / kXK;
inline std::int32_t x_sum(const std::int32_t* acx, std::int64_t b, int t) { return kVnni ? acx[b * kMR + t] : 0; }

// Up to 4 tokens (<= 8 int32 accumulators, in registers).
template <int MR>
void kernel_small(std::int64_t nb, const std::int32_t* a, const float* adx, const std::int32_t* acx,
                  const BlockQ8_0x16* w, float* c, std::int64_t ldc, int nr, const float* bias, bool accumulate) {
  __m256 f[MR][2];
  load_tile<MR>(c, ldc, nr, accumulate, f);
  for (std::int64_t b = 0; b < nb; ++b) {
    __m256i acc[MR][2];
    for (int t = 0; t < MR; ++t) acc[t][0] = acc[t][1] = _mm256_setzero_si256();
    const std::int8_t* q = w[b].qs;
    const std::int32_t* xa = a + b * kSteps * kMR;
    for (int p = 0; p < kSteps; ++p) {
      if (kWStepBytes == 64 || p % 2 == 0) {
        _mm_prefetch(reinterpret_cast<const char*>(q + kWStepBytes * p) + kPrefetchBytes, _MM_HINT_T0);
      }
      __m256i w0, w1;
      load_w(q + kWStepBytes * p, w0, w1);
      for (int t = 0; t < MR; ++t) madd_x(acc[t][0], acc[t][1], w0, w1, xa + p * kMR + t);
    }
    for (int t = 0; t < MR; ++t) {
      block_dots(acc[t][0], acc[t][1], x_sum(acx, b, t));
      scale_block(w[b], adx[b * kMR + t], acc[t][0], acc[t][1], f[t][0], f[t][1]);
    }
  }
  for (int t = 0; t < MR; ++t) store_row(c + t * ldc, nr, f[t][0], f[t][1], bias);
}

// Decode (one token, W streamed once): S panels in lockstep, block by block, S streams through W
// (for_row_streams). The arithmetic per panel is kernel_small<1>'s, so the result does not depend
// on S.
template <int S>
void kernel_1xS(std::int64_t nb, const std::int32_t* a, const float* adx, const std::int32_t* acx,
                const BlockQ8_0x16* const (&w)[S], float* const (&c)[S], const int (&nr)[S],
                const float* const (&bias)[S]) {
  __m256 f[S][2];
  for (int s = 0; s < S; ++s) f[s][0] = f[s][1] = _mm256_setzero_ps();
  for (std::int64_t b = 0; b < nb; ++b) {
    __m256i acc[S][2];
    for (int s = 0; s < S; ++s) acc[s][0] = acc[s][1] = _mm256_setzero_si256();
    const std::int32_t* xa = a + b * kSteps * kMR;
    for (int p = 0; p < kSteps; ++p) {
      for (int s = 0; s < S; ++s) {
        const std::int8_t* q = w[s][b].qs + kWStepBytes * p;
        if (kWStepBytes == 64 || p % 2 == 0) _mm_prefetch(reinterpret_cast<const char*>(q) + kPrefetchBytes, _MM_HINT_T0);
        __m256i w0, w1;
        load_w(q, w0, w1);
        madd_x(acc[s][0], acc[s][1], w0, w1, xa + p * kMR);
      }
    }
    for (int s = 0; s < S; ++s) {
      block_dots(acc[s][0], acc[s][1], x_sum(acx, b, 0));
      scale_block(w[s][b], adx[b * kMR], acc[s][0], acc[s][1], f[s][0], f[s][1]);
    }
  }
  for (int s = 0; s < S; ++s) store_row(c[s], nr[s], f[s][0], f[s][1], bias[s]);
}

// 5 or 6 tokens (padding tokens of the x panel are zero; only mr rows of c are touched): the
// k-step loop is inline asm, since with intrinsics GCC 12 keeps a copy of the 12 accumulators on
// the stack (12 stores per k step, which then bound the loop). F32 accumulators live in L1.
#if defined(SX_Q8_VNNI)
// 0x80 in every byte from nothing (all ones, |-1| = 1, << 7): no operand left for a constant.
#define SX_LOAD_W_ASM                      \
  "vpcmpeqd %[xv], %[xv], %[xv]\n\t"       \
  "vpabsb %[xv], %[xv]\n\t"                \
  "vpsllw $7, %[xv], %[xv]\n\t"            \
  "vpxor (%[w]), %[xv], %[w0]\n\t"         \
  "vpxor 32(%[w]), %[xv], %[w1]\n\t"       \
  "vpunpckhwd %[w1], %[w0], %[xv]\n\t"     \
  "vpunpcklwd %[w1], %[w0], %[w0]\n\t"     \
  "vmovdqa %[xv], %[w1]\n\t"
#else
#define SX_LOAD_W_ASM                      \
  "vpmovsxbw (%[w]), %[w0]\n\t"            \
  "vpmovsxbw 16(%[w]), %[w1]\n\t"
#endif
void kernel_6(std::int64_t nb, const std::int32_t* a, const float* adx, const std::int32_t* acx,
              const BlockQ8_0x16* w, float* c, std::int64_t ldc, int mr, int nr, const float* bias, bool accumulate) {
  alignas(32) float facc[kMR][kNR] = {};
  if (accumulate) {
    for (int r = 0; r < mr; ++r) {
      for (int j = 0; j < nr; ++j) facc[r][j] = c[r * ldc + j];
    }
  }
  for (std::int64_t b = 0; b < nb; ++b) {
    __m256i i00 = _mm256_setzero_si256(), i01 = i00, i10 = i00, i11 = i00, i20 = i00, i21 = i00;
    __m256i i30 = i00, i31 = i00, i40 = i00, i41 = i00, i50 = i00, i51 = i00;
    const std::int32_t* xa = a + b * kSteps * kMR;
    for (int p = 0; p < kSteps; ++p) {
      __m256i w0, w1, xv, t;
      const std::int8_t* wp = w[b].qs + kWStepBytes * p;
      const std::int32_t* xp = xa + p * kMR;
      if (kWStepBytes == 64 || p % 2 == 0) _mm_prefetch(reinterpret_cast<const char*>(wp) + kPrefetchBytes, _MM_HINT_T0);
      __asm__(
          SX_LOAD_W_ASM
          SX_TOKEN_STEP("", "a00", "a01")
          SX_TOKEN_STEP("4", "a10", "a11")
          SX_TOKEN_STEP("8", "a20", "a21")
          SX_TOKEN_STEP("12", "a30", "a31")
          SX_TOKEN_STEP("16", "a40", "a41")
          SX_TOKEN_STEP("20", "a50", "a51")
          : [a00] "+x"(i00), [a01] "+x"(i01), [a10] "+x"(i10), [a11] "+x"(i11), [a20] "+x"(i20),
            [a21] "+x"(i21), [a30] "+x"(i30), [a31] "+x"(i31), [a40] "+x"(i40), [a41] "+x"(i41),
            [a50] "+x"(i50), [a51] "+x"(i51), [w0] "=&x"(w0), [w1] "=&x"(w1), [xv] "=&x"(xv), [t] "=&x"(t)
          : [w] "r"(wp), [x] "r"(xp)
          : "memory");  // reads wp[0..kWStepBytes) and xp[0..5] (30 operands is the limit: no "m" inputs)
    }
    const float* dx = adx + b * kMR;
    __m256i acc[kMR][2] = {{i00, i01}, {i10, i11}, {i20, i21}, {i30, i31}, {i40, i41}, {i50, i51}};
    for (int t = 0; t < kMR; ++t) {
      block_dots(acc[t][0], acc[t][1], x_sum(acx, b, t));
      __m256 f0 = _mm256_load_ps(facc[t]), f1 = _mm256_load_ps(facc[t] + 8);
      scale_block(w[b], dx[t], acc[t][0], acc[t][1], f0, f1);
      _mm256_store_ps(facc[t], f0);
      _mm256_store_ps(facc[t] + 8, f1);
    }
  }
  for (int r = 0; r < mr; ++r) store_row(c + r * ldc, nr, _mm256_load_ps(facc[r]), _mm256_load_ps(facc[r] + 8), bias);
}

void kernel(std::int64_t nb, const std::int32_t* a, const float* adx, const std::int32_t* acx, const BlockQ8_0x16* w,
            float* c, std::int64_t ldc, int mr, int nr, const float* bias, bool accumulate) {
  switch (mr) {
    case 1: return kernel_small<1>(nb, a, adx, acx, w, c, ldc, nr, bias, accumulate);
    case 2: return kernel_small<2>(nb, a, adx, acx, w, c, ldc, nr, bias, accumulate);
    case 3: return kernel_small<3>(nb, a, adx, acx, w, c, ldc, nr, bias, accumulate);
    case 4: return kernel_small<4>(nb, a, adx, acx, w, c, ldc, nr, bias, accumulate);
    default: return kernel_6(nb, a, adx, acx, w, c, ldc, mr, nr, bias, accumulate);
  }
}

// Up to this many x panels (18 tokens: batched decode) a task takes each W panel whole and runs
// every x panel over it while it is in L1/L2, so W streams from memory once, in address order.
// Beyond it (prefill) k is cut into blocks of <= kKC and a task's panels of one k block stay in L2
// while every x panel passes over them.
constexpr std::int64_t kStreamingXPanels = 3;

// The driver shared by both weight layouts. `panels(thread, j0, j1, b0, nb)` returns the W panels
// j0..j1-1 restricted to blocks [b0, b0 + nb): a pointer to panel j0 and the stride in blocks from
// one panel to the next; in_place says that it points into W itself (any number of panels).
template <typename Panels>
void run_gemm(ThreadPool& pool, Scratch& scratch, const MatmulProblem& p, bool in_place, Panels&& panels) {
  const std::int64_t m = p.m, n = p.n, k = p.k;
  const std::int64_t x_panels = ceil_div(m, kMR);
  const std::int64_t w_panels = ceil_div(n, kNR);
  const bool streaming = x_panels <= kStreamingXPanels;
  const std::int64_t k_blocks = streaming ? 1 : ceil_div(k, kKC);
  const std::int64_t kc_step = ceil_div(ceil_div(k, k_blocks), kB) * kB;

  const std::int64_t nb_row = k / kB;
  const std::size_t acts_bytes = static_cast<std::size_t>(m * k) + static_cast<std::size_t>(m * nb_row) * sizeof(float);
  auto* xq = static_cast<std::int8_t*>(scratch.get(kSlotActs, acts_bytes));
  auto* xd = reinterpret_cast<float*>(xq + m * k);
  const std::size_t xpb = x_panel_bytes(k);
  auto* xp = static_cast<std::byte*>(scratch.get(kSlotPackedX, xpb * static_cast<std::size_t>(x_panels)));
  if (x_panels == 1) {  // decode: not worth a dispatch
    quantize_rows_q8(p.x, 0, m, k, xq, xd);
    pack_x_panel(xq, xd, m, k, 0, xp);
  } else {
    pool.parallel_for(x_panels, [&](std::int64_t i) {
      const std::int64_t t0 = i * kMR, t1 = std::min(m, t0 + kMR);
      quantize_rows_q8(p.x, t0, t1, k, xq, xd);
      pack_x_panel(xq, xd, m, k, t0, xp + xpb * static_cast<std::size_t>(i));
    });
  }

  const int threads = pool.size();
  // One token against W read in place (kQ8_0R16) streams W once: guided chunks of panels, as the
  // GEMVs (for_row_chunks). Otherwise equal tasks whose panels stay within L2 (and within the
  // per-thread scratch they are interleaved into).
  const bool guided = in_place && streaming && m == 1;
  const std::int64_t n_tasks = std::min<std::int64_t>(
      w_panels, threads * ceil_div(w_panels, static_cast<std::int64_t>(threads) * kMaxPanelsPerTask));
  std::atomic<std::int64_t> next{0};
  pool.run_on_all([&](int thread, int) {
    std::int64_t j0 = 0, j1 = 0;
    for (;;) {
      if (guided) {
        if (!claim_guided_chunk(next, w_panels, threads * kGemvTasksPerThread, 4, 1, j0, j1)) break;
      } else {
        const std::int64_t task = next.fetch_add(1);
        if (task >= n_tasks) break;
        j0 = task * w_panels / n_tasks;
        j1 = (task + 1) * w_panels / n_tasks;
      }
      for (std::int64_t pc = 0; pc < k; pc += kc_step) {
        const std::int64_t kc = std::min(kc_step, k - pc);
        const std::int64_t nb = kc / kB;
        const auto [w0, stride] = panels(thread, j0, j1, pc / kB, nb);
        const bool last = pc + kc == k;  // the bias joins the finished sum
        auto tile = [&](std::int64_t i, std::int64_t j) {
          const std::byte* xpi = xp + xpb * static_cast<std::size_t>(i);
          const auto* a = reinterpret_cast<const std::int32_t*>(xpi) + (pc / kXK) * kMR;
          const float* adx = x_scales(xpi, k) + (pc / kB) * kMR;
          const std::int32_t* acx = x_sums(xpi, k) + (pc / kB) * kMR;
          const int mr = static_cast<int>(std::min<std::int64_t>(kMR, m - i * kMR));
          const int nr = static_cast<int>(std::min<std::int64_t>(kNR, n - j * kNR));
          kernel(nb, a, adx, acx, w0 + (j - j0) * stride, p.y + i * kMR * n + j * kNR, n, mr, nr,
                 last && p.bias != nullptr ? p.bias + j * kNR : nullptr, pc > 0);
        };
        if (streaming && m == 1) {  // decode: W panels in lockstep streams (kernel_1xS)
          for_row_streams(j0, j1, [&]<int S>(const std::int64_t (&js)[S]) {
            if constexpr (S == 1) {
              tile(0, js[0]);
            } else {
              const BlockQ8_0x16* ws[S];
              float* cs[S];
              int nrs[S];
              const float* bs[S];
              for (int s = 0; s < S; ++s) {
                ws[s] = w0 + (js[s] - j0) * stride;
                cs[s] = p.y + js[s] * kNR;
                nrs[s] = static_cast<int>(std::min<std::int64_t>(kNR, n - js[s] * kNR));
                bs[s] = p.bias != nullptr ? p.bias + js[s] * kNR : nullptr;
              }
              const auto* a = reinterpret_cast<const std::int32_t*>(xp);
              kernel_1xS<S>(nb, a, x_scales(xp, k), x_sums(xp, k), ws, cs, nrs, bs);
            }
          });
        } else if (streaming) {
          for (std::int64_t j = j0; j < j1; ++j)
            for (std::int64_t i = 0; i < x_panels; ++i) tile(i, j);
        } else {
          for (std::int64_t i = 0; i < x_panels; ++i)
            for (std::int64_t j = j0; j < j1; ++j) tile(i, j);
        }
      }
    }
  });
}

}  // namespace

namespace {

// Per-thread scratch for the W panels of one task and k block (contiguous, so they stay together
// in L2 while every x panel passes over them).
std::vector<BlockQ8_0x16*> thread_panels(ThreadPool& pool, Scratch& scratch, const MatmulProblem& p) {
  const std::int64_t kc_max = std::min<std::int64_t>(p.k, ceil_div(kKC, kB) * kB);
  const std::int64_t panel_blocks = ceil_div(ceil_div(p.m, kMR) <= kStreamingXPanels ? p.k : kc_max, kB);
  std::vector<BlockQ8_0x16*> wbuf(static_cast<std::size_t>(pool.size()));
  for (int t = 0; t < pool.size(); ++t) {
    wbuf[static_cast<std::size_t>(t)] = static_cast<BlockQ8_0x16*>(scratch.get(
        kSlotThread0 + t, sizeof(BlockQ8_0x16) * static_cast<std::size_t>(panel_blocks * kMaxPanelsPerTask)));
  }
  return wbuf;
}

}  // namespace

void gemm_q8_0(ThreadPool& pool, Scratch& scratch, const MatmulProblem& p) {
  // Rows of Q8_0 values (plain Q8_0, or Q4_0 / Q5_0 as q - 8 / q - 16): each task interleaves its
  // panels of one k block into its own scratch.
  const std::vector<BlockQ8_0x16*> wbuf = thread_panels(pool, scratch, p);
  run_gemm(pool, scratch, p, false, [&](int thread, std::int64_t j0, std::int64_t j1, std::int64_t b0, std::int64_t nb) {
    BlockQ8_0x16* dst = wbuf[static_cast<std::size_t>(thread)];
    for (std::int64_t j = j0; j < j1; ++j) interleave_panel(p.w_type, p.w, p.k, j * kNR, p.n, b0, nb, dst + (j - j0) * nb);
    return std::pair<const BlockQ8_0x16*, std::int64_t>(dst, nb);
  });
}

void matmul_q8_0_r16(ThreadPool& pool, Scratch& scratch, const MatmulProblem& p) {
  const auto* w = static_cast<const BlockQ8_0x16*>(p.w);
  const std::int64_t nb_row = p.k / kB;
  if (ceil_div(p.m, kMR) <= kStreamingXPanels) {  // W streams once, in place
    run_gemm(pool, scratch, p, true, [&](int, std::int64_t j0, std::int64_t, std::int64_t b0, std::int64_t) {
      return std::pair<const BlockQ8_0x16*, std::int64_t>(w + j0 * nb_row + b0, nb_row);
    });
    return;
  }
  // Large m: the task's panels of one k block are copied together first (measured ~10% faster
  // than reading them in place at their stride of a whole row of blocks).
  const std::vector<BlockQ8_0x16*> wbuf = thread_panels(pool, scratch, p);
  run_gemm(pool, scratch, p, false, [&](int thread, std::int64_t j0, std::int64_t j1, std::int64_t b0, std::int64_t nb) {
    BlockQ8_0x16* dst = wbuf[static_cast<std::size_t>(thread)];
    for (std::int64_t j = j0; j < j1; ++j) {
      std::memcpy(dst + (j - j0) * nb, w + j * nb_row + b0, sizeof(BlockQ8_0x16) * static_cast<std::size_t>(nb));
    }
    return std::pair<const BlockQ8_0x16*, std::int64_t>(dst, nb);
  });
}

std::int64_t microkernel_in_l1(std::int64_t calls) {
  constexpr std::int64_t k = 256, nb = k / kB;
  alignas(64) static BlockQ8_0x16 w[nb];
  alignas(64) static std::byte xp[x_panel_bytes(k)];
  alignas(64) static float c[kMR * kNR];
  static std::once_flag once;
  std::call_once(once, [] {
    for (std::int64_t b = 0; b < nb; ++b) {
      for (int r = 0; r < kNR; ++r) w[b].d[r] = f32_to_f16(0.01f * static_cast<float>(r + 1));
      for (int i = 0; i < kB * kNR; ++i) w[b].qs[i] = static_cast<std::int8_t>((i * 37 + b * 11) % 255 - 127);
    }
    std::vector<float> x(kMR * k);
    for (std::size_t i = 0; i < x.size(); ++i) x[i] = static_cast<float>(static_cast<int>(i * 53 % 201) - 100) / 50.0f;
    std::vector<std::int8_t> xq(kMR * k);
    std::vector<float> xd(kMR * nb);
    quantize_rows_q8(x.data(), 0, kMR, k, xq.data(), xd.data());
    pack_x_panel(xq.data(), xd.data(), kMR, k, 0, xp);
  });
  const auto* a = reinterpret_cast<const std::int32_t*>(xp);
  for (std::int64_t i = 0; i < calls; ++i) kernel_6(nb, a, x_scales(xp, k), x_sums(xp, k), w, c, kNR, kMR, kNR, nullptr, i > 0);
  return calls * kMR * kNR * k;
}

#else  // portable build: the GEMV int8 kernels compute the same thing (tokens tiled in registers)

std::int64_t microkernel_in_l1(std::int64_t) { return 0; }

void gemm_q8_0(ThreadPool& pool, Scratch& scratch, const MatmulProblem& p) { gemv_q8_0(pool, scratch, p); }

void matmul_q8_0_r16(ThreadPool&, Scratch&, const MatmulProblem& p) { matmul_reference_q8_activations(p); }

#endif

}  // namespace sx::cpu::SX_CPU_ISA_NS::detail

namespace sx::cpu::SX_CPU_ISA_NS {

std::int64_t run_q8_microkernel_in_l1(std::int64_t calls) { return detail::microkernel_in_l1(calls); }

}  // namespace sx::cpu::SX_CPU_ISA_NS
