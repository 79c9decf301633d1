// Small-m matmul for the GGML block formats other than Q8_0 (Q4_0 ... Q6_K): W is streamed once,
// each row against the m tokens while it is in L1.
//
// AVX2 kernels (int8 dot products, like llama.cpp's):
//   Q4_K, Q6_K  x quantised per 256 (ActQ8K: one F32 scale, int8 values, int16 sums per 16), so a
//               super-block's 8 (16) sub-block dot products are weighted by their integer scales
//               in int32 and scaled once: y += d_w * d_x * sum_s sc_s * dot_s - dmin_w * d_x *
//               sum_s m_s * xsum_s (Q4_K; Q6_K subtracts 32 * sum_s sc_s * xsum_s instead).
//   Q5_0        x quantised per 32 (quantize_activations_q8, as the Q8_0 path): per block the
//               exact int32 dot of (q - 16) and x, scaled by d_w * d_x; in the CPU device's layout
//               kQ5_0R8 (and Q4_0's kQ4_0R8) 8 rows at once, one per lane (dot_r8).
//   Q4_0, Q4_1, Q5_1  the same per 32; the mins of Q4_1 / Q5_1 (w = d q + m) join as m * d_x * sum(x).
//   Q5_K        as Q4_K (x per 256) with the fifth bits.
//   Q2_K, Q3_K  x per 256 too, their scales per 16 applied in int32 (dot_q23_k).
//   AWQ int4    x per 32, its blocks' even elements first (the nibble order), the zero of each
//               group of 128 as scale * zero * sum_b d_x * sum(x_b).
// With VNNI (AVX-512 VNNI, AVX-VNNI) the int8 dots are vpdpbusd, else vpmaddubsw + vpmaddwd: the
// same exact integers, so every vector level computes the same bits.
// Activation quantisation error per element is at most amax(block of x) / 254 (block = 256 for
// Q4_K / Q6_K, 32 for Q5_0); every other step is exact integer arithmetic or F32 rounding.
// Every other format (and every format without AVX2): the row is dequantised to F32 with
// hal::dequantize_row and dotted in F32 (exact products of the dequantised weights).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <vector>

#include "backends/cpu/kernels/matmul_internal.h"
#include "backends/cpu/simd.h"
#include "runtime/base/half.h"
#include "runtime/hal/quant.h"

#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#define SX_GEMV_QUANT_AVX2 1
#include <immintrin.h>

#include "backends/cpu/kernels/r8_values.h"
#endif

namespace sx::cpu::SX_CPU_ISA_NS::detail {

namespace {

using hal::BlockQ4_K;
using hal::BlockQ5_0;
using hal::BlockQ6_K;
using hal::kQK_K;

// One super-block (256) of quantised activations.
struct alignas(32) ActQ8K {
  std::int8_t qs[kQK_K];
  std::int16_t bsums[kQK_K / 16];  // sums of qs per 16
  float d;
};

void quantize_act_q8k(const float* x, std::int64_t k, ActQ8K* out) {
  for (std::int64_t b = 0; b < k / kQK_K; ++b) {
    const float* xb = x + b * kQK_K;
    float amax = 0.0f;
    for (int j = 0; j < kQK_K; ++j) amax = std::max(amax, std::fabs(xb[j]));
    const float d = amax / 127.0f;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    ActQ8K& a = out[b];
    a.d = d;
    for (int j = 0; j < kQK_K; ++j) a.qs[j] = static_cast<std::int8_t>(std::nearbyint(xb[j] * id));
    for (int s = 0; s < kQK_K / 16; ++s) {
      int sum = 0;
      for (int j = 0; j < 16; ++j) sum += a.qs[16 * s + j];
      a.bsums[s] = static_cast<std::int16_t>(sum);
    }
  }
}

#if SX_GEMV_QUANT_AVX2

inline float f16(std::uint16_t h) { return _cvtsh_ss(h); }

// How far ahead the K-quant row dots prefetch W. A row is one stream, read in order, and the
// kernels do enough arithmetic per line that the hardware prefetchers alone fall behind: with
// 2 KiB of lead, the K-quant GEMVs' share of a one-thread Q4_K_M decode profile fell by a fifth
// against the unchanged Q8_0 LM head (k/q8 0.77-0.82 -> 0.62-0.65 in 3 interleaved runs each;
// 512 bytes gave 0.69-0.73, 1.5-3 KiB all 0.60-0.67).
constexpr int kKQuantPrefetchBytes = 2048;

// Dot of one Q4_K row (nsb super-blocks) with one quantised token; Q5_K (Block = BlockQ5_K) is the
// same with the fifth bits ORed in: element 64c + l takes bit 2c of qh[l], element 64c + 32 + l
// bit 2c + 1 (q 0..31, so vpmaddubsw pairs stay below 2 * 31 * 127).
template <typename Block>
float dot_q4_k(const Block* w, const ActQ8K* a, std::int64_t nsb) {
  constexpr bool kFive = std::is_same_v<Block, hal::BlockQ5_K>;
  const __m256i m4 = _mm256_set1_epi8(0x0F);
  const __m256i one = _mm256_set1_epi8(0x01);
  __m256 acc = _mm256_setzero_ps();
  __m128 accm = _mm_setzero_ps();
  for (std::int64_t i = 0; i < nsb; ++i) {
    prefetch_block<sizeof(Block)>(reinterpret_cast<const char*>(w + i) + kKQuantPrefetchBytes);
    const float d = a[i].d * f16(w[i].d);
    const float dmin = a[i].d * f16(w[i].dmin);
    std::uint32_t s[3];
    std::memcpy(s, w[i].scales, 12);
    // The 6-bit scales and mins of the 8 sub-blocks (hal::q4k_scale_min, four at a time).
    const std::uint32_t sc_lo = s[0] & 0x3f3f3f3fu, m_lo = s[1] & 0x3f3f3f3fu;
    const std::uint32_t sc_hi = (s[2] & 0x0f0f0f0fu) | ((s[0] >> 2) & 0x30303030u);
    const std::uint32_t m_hi = ((s[2] >> 4) & 0x0f0f0f0fu) | ((s[1] >> 2) & 0x30303030u);
    const __m256i sm = _mm256_cvtepu8_epi16(_mm_setr_epi32(static_cast<int>(sc_lo), static_cast<int>(sc_hi),
                                                          static_cast<int>(m_lo), static_cast<int>(m_hi)));
    // Mins: sum_s m_s * (sum of x over sub-block s).
    const __m256i bs16 = _mm256_load_si256(reinterpret_cast<const __m256i*>(a[i].bsums));
    const __m128i bs32 = _mm_hadd_epi16(_mm256_castsi256_si128(bs16), _mm256_extracti128_si256(bs16, 1));
    const __m128i mprod = _mm_madd_epi16(_mm256_extracti128_si256(sm, 1), bs32);
    accm = _mm_fmadd_ps(_mm_set1_ps(dmin), _mm_cvtepi32_ps(mprod), accm);
    // Scales, broadcast per sub-block with byte shuffles (both lanes hold the 8 int16 scales).
    const __m128i sc128 = _mm256_castsi256_si128(sm);
    const __m256i scales = _mm256_set_m128i(sc128, sc128);
    __m256i sumi = _mm256_setzero_si256();
    [[maybe_unused]] __m256i qh;
    if constexpr (kFive) qh = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w[i].qh));
    for (int c = 0; c < 4; ++c) {
      const __m256i sel0 = _mm256_set1_epi16(static_cast<short>(0x0100 + 0x0202 * (2 * c)));
      const __m256i sel1 = _mm256_set1_epi16(static_cast<short>(0x0100 + 0x0202 * (2 * c + 1)));
      const __m256i q4 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w[i].qs + 32 * c));
      const __m256i x0 = _mm256_load_si256(reinterpret_cast<const __m256i*>(a[i].qs + 64 * c));
      const __m256i x1 = _mm256_load_si256(reinterpret_cast<const __m256i*>(a[i].qs + 64 * c + 32));
      __m256i lo = _mm256_and_si256(q4, m4), hi = _mm256_and_si256(_mm256_srli_epi16(q4, 4), m4);
      if constexpr (kFive) {
        const __m128i s0 = _mm_cvtsi32_si128(2 * c), s1 = _mm_cvtsi32_si128(2 * c + 1);
        lo = _mm256_or_si256(lo, _mm256_slli_epi16(_mm256_and_si256(_mm256_srl_epi16(qh, s0), one), 4));
        hi = _mm256_or_si256(hi, _mm256_slli_epi16(_mm256_and_si256(_mm256_srl_epi16(qh, s1), one), 4));
      }
      const __m256i p0 = _mm256_madd_epi16(_mm256_maddubs_epi16(lo, x0), _mm256_shuffle_epi8(scales, sel0));
      const __m256i p1 = _mm256_madd_epi16(_mm256_maddubs_epi16(hi, x1), _mm256_shuffle_epi8(scales, sel1));
      sumi = _mm256_add_epi32(sumi, _mm256_add_epi32(p0, p1));
    }
    acc = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(sumi), acc);
  }
  __m128 m = _mm_add_ps(accm, _mm_movehl_ps(accm, accm));
  m = _mm_add_ss(m, _mm_movehdup_ps(m));
  return hsum256(acc) - _mm_cvtss_f32(m);
}

// Dots of one Q2_K or Q3_K row with one quantised token. Both keep 2 bits per element in qs: for
// chunk c (128 elements) and j = 0..3, element 128c + 32j + l is (qs[32c + l] >> 2j) & 3, in
// sub-block 8c + 2j (l < 16) or 8c + 2j + 1. Per pair of sub-blocks one vpmaddubsw (the unsigned
// 2- or 3-bit q against x) and one vpmaddwd by their scales (int16 in the two halves) give exact
// int32 sums.
//   Q2_K  w = d * sc * q - dmin * m (4-bit sc and m): d * sum_s sc_s dot_s - dmin * sum_s m_s xsum_s.
//   Q3_K  w = d * sc * (q - 4 + 4 * hbit) (signed 6-bit sc): with v = q + 4 * hbit in 0..7,
//         d * (sum_s sc_s dot_s(v) - 4 * sum_s sc_s xsum_s).
// Then times the token's d (ActQ8K::d).
inline int hsum_epi32(__m256i v) {
  __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
  s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4E));
  s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0xB1));
  return _mm_cvtsi128_si32(s);
}

template <bool Q3>
float dot_q23_k(const void* row, const ActQ8K* a, std::int64_t nsb) {
  const __m256i m3 = _mm256_set1_epi8(0x03);
  const __m256i one = _mm256_set1_epi8(0x01);
  __m256 acc = _mm256_setzero_ps();
  float acc_min = 0.0f;
  for (std::int64_t i = 0; i < nsb; ++i) {
    const std::uint8_t* qs;
    __m256i hm = _mm256_setzero_si256();
    __m256i scales;  // the 16 sub-block scales as int16
    float d;
    if constexpr (Q3) {
      const auto& b = static_cast<const hal::BlockQ3_K*>(row)[i];
      prefetch_block<sizeof(hal::BlockQ3_K)>(reinterpret_cast<const char*>(&b) + kKQuantPrefetchBytes);
      // hal::q3k_scales without a loop: low 4 bits of scale s in byte s % 8 (the high nibble for
      // s >= 8), its high 2 bits at bits 2 (s / 4) of byte 8 + s % 4; minus 32.
      std::uint64_t lo;
      std::uint32_t hi;
      std::memcpy(&lo, b.scales, 8);
      std::memcpy(&hi, b.scales + 8, 4);
      constexpr std::uint64_t kNib = 0x0F0F0F0F0F0F0F0Full;
      constexpr std::uint32_t kTwo = 0x03030303u;
      const std::uint64_t hi01 = (hi & kTwo) | static_cast<std::uint64_t>((hi >> 2) & kTwo) << 32;
      const std::uint64_t hi23 = ((hi >> 4) & kTwo) | static_cast<std::uint64_t>((hi >> 6) & kTwo) << 32;
      const __m128i s8 = _mm_sub_epi8(
          _mm_set_epi64x(static_cast<long long>(((lo >> 4) & kNib) | (hi23 << 4)), static_cast<long long>((lo & kNib) | (hi01 << 4))),
          _mm_set1_epi8(32));
      scales = _mm256_cvtepi8_epi16(s8);
      qs = b.qs;
      hm = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b.hmask));
      d = a[i].d * f16(b.d);
    } else {
      const auto& b = static_cast<const hal::BlockQ2_K*>(row)[i];
      prefetch_block<sizeof(hal::BlockQ2_K)>(reinterpret_cast<const char*>(&b) + kKQuantPrefetchBytes);
      const __m128i sm = _mm_loadu_si128(reinterpret_cast<const __m128i*>(b.scales));
      const __m128i nib = _mm_set1_epi8(0x0F);
      scales = _mm256_cvtepu8_epi16(_mm_and_si128(sm, nib));
      const __m256i mins = _mm256_cvtepu8_epi16(_mm_and_si128(_mm_srli_epi16(sm, 4), nib));
      qs = b.qs;
      d = a[i].d * f16(b.d);
      const float dmin = a[i].d * f16(b.dmin);
      const __m256i mp = _mm256_madd_epi16(mins, _mm256_load_si256(reinterpret_cast<const __m256i*>(a[i].bsums)));
      acc_min = std::fma(dmin, static_cast<float>(hsum_epi32(mp)), acc_min);
    }
    __m256i sumi = _mm256_setzero_si256();
    const __m256i scales_of[2] = {_mm256_permute2x128_si256(scales, scales, 0x00),
                                  _mm256_permute2x128_si256(scales, scales, 0x11)};
    for (int c = 0; c < 2; ++c) {
      const __m256i scd = scales_of[c];
      const __m256i q = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(qs + 32 * c));
      for (int j = 0; j < 4; ++j) {
        __m256i v = _mm256_and_si256(_mm256_srl_epi16(q, _mm_cvtsi32_si128(2 * j)), m3);
        if constexpr (Q3) {
          const __m256i hb = _mm256_and_si256(_mm256_srl_epi16(hm, _mm_cvtsi32_si128(4 * c + j)), one);
          v = _mm256_or_si256(v, _mm256_slli_epi16(hb, 2));
        }
        const __m256i x = _mm256_load_si256(reinterpret_cast<const __m256i*>(a[i].qs + 128 * c + 32 * j));
        // Scales of sub-blocks s and s + 1 as int16 in the low and high halves (words 2j, 2j + 1 of
        // scd, which holds this chunk's eight scales in both halves).
        const char w0 = static_cast<char>(4 * j), w1 = static_cast<char>(4 * j + 1);
        const char w2 = static_cast<char>(4 * j + 2), w3 = static_cast<char>(4 * j + 3);
        const __m256i scv = _mm256_shuffle_epi8(
            scd, _mm256_setr_epi8(w0, w1, w0, w1, w0, w1, w0, w1, w0, w1, w0, w1, w0, w1, w0, w1, w2, w3, w2, w3, w2,
                                  w3, w2, w3, w2, w3, w2, w3, w2, w3, w2, w3));
        sumi = _mm256_add_epi32(sumi, _mm256_madd_epi16(_mm256_maddubs_epi16(v, x), scv));
      }
    }
    if constexpr (Q3) {
      // - 4 * sum_s sc_s * xsum_s
      const __m256i off = _mm256_madd_epi16(scales, _mm256_load_si256(reinterpret_cast<const __m256i*>(a[i].bsums)));
      sumi = _mm256_sub_epi32(sumi, _mm256_slli_epi32(off, 2));
    }
    acc = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(sumi), acc);
  }
  return hsum256(acc) - acc_min;
}

// Dot of one Q6_K row with one quantised token.
float dot_q6_k(const BlockQ6_K* w, const ActQ8K* a, std::int64_t nsb) {
  const __m256i m4 = _mm256_set1_epi8(0x0F);
  const __m256i m2 = _mm256_set1_epi8(0x30);
  __m256 acc = _mm256_setzero_ps();
  for (std::int64_t i = 0; i < nsb; ++i) {
    prefetch_block<sizeof(BlockQ6_K)>(reinterpret_cast<const char*>(w + i) + kKQuantPrefetchBytes);
    const float d = a[i].d * f16(w[i].d);
    const __m128i sc8 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(w[i].scales));
    // The -32 offset: 32 * sum_s sc_s * (sum of x over sub-block s).
    const __m256i bs16 = _mm256_load_si256(reinterpret_cast<const __m256i*>(a[i].bsums));
    const __m256i off = _mm256_madd_epi16(_mm256_cvtepi8_epi16(sc8), bs16);
    __m256i sumi = _mm256_setzero_si256();
    for (int h = 0; h < 2; ++h) {
      // Scales 8h .. 8h+7 as int16 in both lanes; group g takes 8h+2g (low lane) and 8h+2g+1 (high).
      const __m128i s16 = _mm_cvtepi8_epi16(h == 0 ? sc8 : _mm_srli_si128(sc8, 8));
      const __m256i scales = _mm256_set_m128i(s16, s16);
      const std::uint8_t* ql = w[i].ql + 64 * h;
      const __m256i ql0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(ql));
      const __m256i ql1 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(ql + 32));
      const __m256i qh = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w[i].qh + 32 * h));
      const __m256i q[4] = {
          _mm256_or_si256(_mm256_and_si256(ql0, m4), _mm256_and_si256(_mm256_slli_epi16(qh, 4), m2)),
          _mm256_or_si256(_mm256_and_si256(ql1, m4), _mm256_and_si256(_mm256_slli_epi16(qh, 2), m2)),
          _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(ql0, 4), m4), _mm256_and_si256(qh, m2)),
          _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(ql1, 4), m4),
                          _mm256_and_si256(_mm256_srli_epi16(qh, 2), m2)),
      };
      for (int g = 0; g < 4; ++g) {
        const short lo = static_cast<short>(0x0100 + 0x0202 * (2 * g));
        const short hi = static_cast<short>(0x0100 + 0x0202 * (2 * g + 1));
        const __m256i sel = _mm256_setr_epi16(lo, lo, lo, lo, lo, lo, lo, lo, hi, hi, hi, hi, hi, hi, hi, hi);
        const __m256i x = _mm256_load_si256(reinterpret_cast<const __m256i*>(a[i].qs + 128 * h + 32 * g));
        const __m256i p = _mm256_madd_epi16(_mm256_maddubs_epi16(q[g], x), _mm256_shuffle_epi8(scales, sel));
        sumi = _mm256_add_epi32(sumi, p);
      }
    }
    sumi = _mm256_sub_epi32(sumi, _mm256_slli_epi32(off, 5));
    acc = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(sumi), acc);
  }
  return hsum256(acc);
}

// a + the exact int32 dot products of each 4-byte group of u (unsigned) and s (signed), one per
// lane: vpdpbusd where the level has VNNI, else vpmaddubsw + vpmaddwd (the same lanes; no
// saturation while u <= 31).
inline __m256i dot_u8s8_add(__m256i a, __m256i u, __m256i s) {
#if defined(__AVX512VNNI__) && defined(__AVX512VL__)
  return _mm256_dpbusd_epi32(a, u, s);
#elif defined(__AVXVNNI__)
  return _mm256_dpbusd_avx_epi32(a, u, s);
#else
  return _mm256_add_epi32(a, _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1)));
#endif
}

// The 32 nibbles of 16 bytes as 32 bytes: the low nibbles in bytes 0-15, the high ones in 16-31.
inline __m256i nibbles32(const void* p) {
  const __m256i m4 = _mm256_set1_epi8(0x0F);
  const __m256i qs = _mm256_broadcastsi128_si256(_mm_loadu_si128(static_cast<const __m128i*>(p)));
  return _mm256_and_si256(_mm256_srlv_epi64(qs, _mm256_setr_epi64x(0, 0, 4, 4)), m4);
}

// Four fp16 values times f, as floats.
inline __m128 halves_times(const std::uint16_t (&v)[4], float f) {
  std::uint64_t packed;
  std::memcpy(&packed, v, 8);
  return _mm_mul_ps(_mm_cvtph_ps(_mm_cvtsi64_si128(static_cast<long long>(packed))), _mm_set1_ps(f));
}

// Dots of R Q5_0 rows (nb blocks each) with one token quantised per 32 (xq values, xd scales,
// xcorr = -16 * the sum of each block's xq). The 5-bit q (0..31) is the unsigned operand of
// vpmaddubsw as it is (pairs stay below 2 * 31 * 127, no saturation), and the -16 offset joins
// the exact int32 block sum as xcorr; R rows in lockstep are R streams through W (see for_row_streams).
template <int R>
void dot_q5_0(const BlockQ5_0* const (&w)[R], const std::int8_t* xq, const float* xd, const std::int32_t* xcorr,
              std::int64_t nb, float (&out)[R]) {
  static_assert(R <= 4);
  const __m256i ones = _mm256_set1_epi16(1);
  // Byte j of a vector gets byte j / 8 of qh; OR-ing every bit but j % 8 then comparing with
  // all-ones tests bit j.
  const __m256i spread = _mm256_setr_epi64x(0x0000000000000000, 0x0101010101010101, 0x0202020202020202,
                                            0x0303030303030303);
  const __m256i bit_mask = _mm256_set1_epi64x(0x7fbfdfeff7fbfdfe);
  const __m256i all = _mm256_set1_epi64x(-1);
  const __m256i bit4 = _mm256_set1_epi8(0x10);
  const __m256i m4 = _mm256_set1_epi8(0x0F);
  const __m256i nib_shift = _mm256_setr_epi64x(0, 0, 4, 4);  // low nibbles, then high nibbles
  __m256 acc[R];
  for (int r = 0; r < R; ++r) acc[r] = _mm256_setzero_ps();
  for (std::int64_t b = 0; b < nb; ++b) {
    const __m256i x = _mm256_load_si256(reinterpret_cast<const __m256i*>(xq + 32 * b));
    const __m256i corr = _mm256_zextsi128_si256(_mm_cvtsi32_si128(xcorr[b]));
    // d_w * d_x of the R rows (F16C converts four scales at once).
    alignas(16) float scale[4];
    {
      std::uint16_t dw[4] = {};
      for (int r = 0; r < R; ++r) dw[r] = w[r][b].d;
      std::uint64_t packed;
      std::memcpy(&packed, dw, 8);
      _mm_store_ps(scale, _mm_mul_ps(_mm_cvtph_ps(_mm_cvtsi64_si128(static_cast<long long>(packed))), _mm_set1_ps(xd[b])));
    }
    for (int r = 0; r < R; ++r) {
      const BlockQ5_0& wb = w[r][b];
      _mm_prefetch(reinterpret_cast<const char*>(&wb) + kGemvPrefetchBytes, _MM_HINT_T0);
      const __m256i qs = _mm256_broadcastsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(wb.qs)));
      const __m256i nib = _mm256_and_si256(_mm256_srlv_epi64(qs, nib_shift), m4);
      std::uint32_t qh;
      std::memcpy(&qh, wb.qh, 4);
      const __m256i bits = _mm256_cmpeq_epi8(
          _mm256_or_si256(_mm256_shuffle_epi8(_mm256_set1_epi32(static_cast<int>(qh)), spread), bit_mask), all);
      const __m256i q = _mm256_or_si256(nib, _mm256_and_si256(bits, bit4));  // 0 .. 31
      const __m256i p = _mm256_add_epi32(_mm256_madd_epi16(_mm256_maddubs_epi16(q, x), ones), corr);
      acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p), _mm256_set1_ps(scale[r]), acc[r]);
    }
  }
  for (int r = 0; r < R; ++r) out[r] = hsum256(acc[r]);
}

// corr + the exact int32 dot of each row's 32 values q (r8_values) with the token's 32 values x
// (xv(v): its elements 4v .. 4v + 3 in every lane), one row per lane: vpdpbusd in two chains where
// the level has VNNI, else vpmaddubsw pairs (below 2 * 31 * 127 each, so four add up in int16) and
// vpmaddwd. The same integers either way.
inline __m256i r8_dot(const __m256i (&q)[8], const std::int8_t* x, __m256i corr) {
  auto xv = [&](int v) {
    std::int32_t xi;
    std::memcpy(&xi, x + 4 * v, 4);
    return _mm256_set1_epi32(xi);
  };
#if (defined(__AVX512VNNI__) && defined(__AVX512VL__)) || defined(__AVXVNNI__)
  __m256i even = corr, odd = _mm256_setzero_si256();
  for (int v = 0; v < 8; v += 2) {
    even = dot_u8s8_add(even, q[v], xv(v));
    odd = dot_u8s8_add(odd, q[v + 1], xv(v + 1));
  }
  return _mm256_add_epi32(even, odd);
#else
  const __m256i ones = _mm256_set1_epi16(1);
  __m256i half[2];
  for (int h = 0; h < 2; ++h) {
    const int v = 4 * h;
    const __m256i s01 = _mm256_add_epi16(_mm256_maddubs_epi16(q[v], xv(v)), _mm256_maddubs_epi16(q[v + 1], xv(v + 1)));
    const __m256i s23 =
        _mm256_add_epi16(_mm256_maddubs_epi16(q[v + 2], xv(v + 2)), _mm256_maddubs_epi16(q[v + 3], xv(v + 3)));
    half[h] = _mm256_madd_epi16(_mm256_add_epi16(s01, s23), ones);
  }
  return _mm256_add_epi32(_mm256_add_epi32(half[0], half[1]), corr);
#endif
}

template <typename Block>
inline __m256i r8_block_dot(const Block& wb, const std::int8_t* x, __m256i corr) {
  __m256i q[8];
  if constexpr (requires { wb.qh; }) {  // BlockQ5_0x8, BlockQ5_1x8
    r8_values<true>(wb.qs, wb.qh, q);
  } else {
    r8_values<false>(wb.qs, nullptr, q);
  }
  return r8_dot(q, x, corr);
}

// One token against G groups of 8 interleaved rows (kQ5_0R8, kQ4_0R8, kQ5_1R8 or kQ4_1R8, nb
// blocks each) in lockstep, G streams through W: out[g][r] = dot of row r of group g. The same
// arithmetic as dot_q5_0 per row and block (exact int32 dot of q and x plus xcorr: -16 or -8 times
// the block's sum of x, then one FMA by d_w * d_x), with the 8 rows in the 8 lanes, so no
// horizontal sums. The formats with a min (w = d q + m: Q4_1, Q5_1) take xcorr as the plain sum of
// x and add m_w * d_x * xsum in a second FMA instead.
// Each stream prefetches kR8PrefetchBlocks blocks ahead: in the one-thread Q4_K_M decode profile
// this kernel's share against the unchanged Q8_0 LM head fell from 1.38-1.43 to 1.32-1.37 with 2-4
// blocks (6 interleaved runs each); 8 blocks was worse than none.
constexpr int kR8PrefetchBlocks = 4;

template <typename Block, int G>
void dot_r8(const Block* const (&w)[G], const std::int8_t* xq, const float* xd, const std::int32_t* xcorr,
            std::int64_t nb, float (&out)[G][8]) {
  constexpr bool kMins = requires(const Block& blk) { blk.m; };
  __m256 acc[G];
  for (int g = 0; g < G; ++g) acc[g] = _mm256_setzero_ps();
  for (std::int64_t b = 0; b < nb; ++b) {
    const std::int8_t* x = xq + 32 * b;
    const __m256i corr = kMins ? _mm256_setzero_si256() : _mm256_set1_epi32(xcorr[b]);
    const __m256 dx = _mm256_set1_ps(xd[b]);
    [[maybe_unused]] const __m256 mx = _mm256_set1_ps(xd[b] * static_cast<float>(xcorr[b]));
    for (int g = 0; g < G; ++g) {
      const Block& wb = w[g][b];
      prefetch_block<sizeof(Block)>(&wb + kR8PrefetchBlocks);
      const __m256i p = r8_block_dot(wb, x, corr);
      const __m256 scale =
          _mm256_mul_ps(_mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(wb.d))), dx);
      acc[g] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p), scale, acc[g]);
      if constexpr (kMins) {
        acc[g] = _mm256_fmadd_ps(_mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(wb.m))), mx, acc[g]);
      }
    }
  }
  for (int g = 0; g < G; ++g) _mm256_storeu_ps(out[g], acc[g]);
}

// The activations' per-32 sums that the mins of Q4_K / Q5_K multiply, paired as vpmaddwd wants
// them: with B_s the sum of x over sub-block s of super-block i (bsums 2s and 2s + 1),
// out[4i + j] holds int16 B_s | B_s' << 16 for (s, s') = (0, 2), (1, 3), (4, 6), (5, 7).
void k_min_pairs(const ActQ8K* a, std::int64_t nsb, std::int32_t* out) {
  constexpr int kPairs[4][2] = {{0, 2}, {1, 3}, {4, 6}, {5, 7}};
  for (std::int64_t i = 0; i < nsb; ++i) {
    for (int j = 0; j < 4; ++j) {
      const int lo = a[i].bsums[2 * kPairs[j][0]] + a[i].bsums[2 * kPairs[j][0] + 1];
      const int hi = a[i].bsums[2 * kPairs[j][1]] + a[i].bsums[2 * kPairs[j][1] + 1];
      out[4 * i + j] = static_cast<std::int32_t>(static_cast<std::uint16_t>(lo) |
                                                 static_cast<std::uint32_t>(static_cast<std::uint16_t>(hi)) << 16);
    }
  }
}

// One token (a: nsb super-blocks, pairs: k_min_pairs) against G groups of 8 interleaved Q4_K or
// Q5_K rows (kQ4_KR8 / kQ5_KR8) in lockstep, one row per lane: per super-block, the 8 sub-blocks'
// exact int32 dots (r8_dot) times their 6-bit scales, summed in int32, and the mins' integer sum
// sum_s m_s * B_s (vpmaddwd: m < 64, |B_s| <= 32 * 127), then
//   acc += d_w * d_x * sum_s sc_s dot_s - dmin_w * d_x * sum_s m_s B_s
// in F32 per row: the same integers as dot_q4_k, a different F32 summation order. The scales are
// decoded for the 8 rows at once, the dword arithmetic of hal::q4k_scale_min on scales[j]. No
// software prefetch: a super-block group is 1152 / 1408 bytes, and prefetching the next one cost
// 4-10% from cache (Q4_K 74-75 -> 71-72 GB/s, Q5_K 72 -> 65) for no gain from DRAM measurable on
// the shared machine (bench_decode, 896 x 4864, 4 alternations each).
template <typename Block, int G>
void dot_k_r8(const Block* const (&w)[G], const ActQ8K* a, const std::int32_t* pairs, std::int64_t nsb,
              float (&out)[G][8]) {
  constexpr bool kFive = std::is_same_v<Block, BlockQ5_Kx8>;
  const __m256i low6 = _mm256_set1_epi32(0x3f3f3f3f), low4 = _mm256_set1_epi32(0x0f0f0f0f);
  const __m256i bits45 = _mm256_set1_epi32(0x30303030), even_bytes = _mm256_set1_epi32(0x00ff00ff);
  // Byte j of each dword, zero-extended to the dword (vpshufb indexes within 16-byte halves).
  __m256i pick[4];
  for (int j = 0; j < 4; ++j) {
    const int c = static_cast<int>(0x80808000u | static_cast<unsigned>(j));
    pick[j] = _mm256_setr_epi32(c, c + 4, c + 8, c + 12, c, c + 4, c + 8, c + 12);
  }
  __m256 acc[G];
  for (int g = 0; g < G; ++g) acc[g] = _mm256_setzero_ps();
  for (std::int64_t i = 0; i < nsb; ++i) {
    const std::int8_t* x = a[i].qs;
    const __m256 dx = _mm256_set1_ps(a[i].d);
    const std::int32_t* bp = pairs + 4 * i;
    for (int g = 0; g < G; ++g) {
      const Block& wb = w[g][i];
      const auto* sp = reinterpret_cast<const __m256i*>(wb.scales);
      const __m256i s0 = _mm256_loadu_si256(sp), s1 = _mm256_loadu_si256(sp + 1), s2 = _mm256_loadu_si256(sp + 2);
      const __m256i sc[2] = {
          _mm256_and_si256(s0, low6),
          _mm256_or_si256(_mm256_and_si256(s2, low4), _mm256_and_si256(_mm256_srli_epi32(s0, 2), bits45))};
      const __m256i m_lo = _mm256_and_si256(s1, low6);
      const __m256i m_hi = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi32(s2, 4), low4),
                                           _mm256_and_si256(_mm256_srli_epi32(s1, 2), bits45));
      // mins of sub-blocks (0, 2), (1, 3), (4, 6), (5, 7) as int16 pairs, against bp's pairs.
      auto min_pair = [&](__m256i m, int shift, int j) {
        return _mm256_madd_epi16(_mm256_and_si256(_mm256_srli_epi32(m, shift), even_bytes), _mm256_set1_epi32(bp[j]));
      };
      const __m256i mins = _mm256_add_epi32(_mm256_add_epi32(min_pair(m_lo, 0, 0), min_pair(m_lo, 8, 1)),
                                            _mm256_add_epi32(min_pair(m_hi, 0, 2), min_pair(m_hi, 8, 3)));
      __m256i sumi = _mm256_setzero_si256();
      for (int sb = 0; sb < 8; ++sb) {
        __m256i q[8];
        if constexpr (kFive) {
          r8_values<true>(wb.qs + 128 * sb, wb.qh + 32 * sb, q);
        } else {
          r8_values<false>(wb.qs + 128 * sb, nullptr, q);
        }
        const __m256i dot = r8_dot(q, x + 32 * sb, _mm256_setzero_si256());
        sumi = _mm256_add_epi32(sumi, _mm256_mullo_epi32(dot, _mm256_shuffle_epi8(sc[sb / 4], pick[sb % 4])));
      }
      const __m256 dw = _mm256_mul_ps(_mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(wb.d))), dx);
      const __m256 mw = _mm256_mul_ps(_mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(wb.dmin))), dx);
      acc[g] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sumi), dw, acc[g]);
      acc[g] = _mm256_fnmadd_ps(_mm256_cvtepi32_ps(mins), mw, acc[g]);
    }
  }
  for (int g = 0; g < G; ++g) _mm256_storeu_ps(out[g], acc[g]);
}

// Q4_0, Q4_1 and Q5_1: dots of R rows (nb blocks each) with one token quantised per 32 (xq, xd;
// xsum = the sum of each block's xq), as dot_q5_0 does Q5_0: the unsigned 4- or 5-bit q against x
// (the exact int32 dot per lane, dot_u8s8_add), then per block
// acc += (dot - 8 * xsum) * d_w * d_x for Q4_0 (w = d (q - 8)), and for Q4_1 / Q5_1 (w = d q + m)
// acc += dot * d_w * d_x and macc += m_w * d_x * xsum. The R rows' d_w * d_x (and m_w * d_x) come
// from one F16C conversion per block; the fifth bits of Q5_1 from an AVX-512 byte mask where there
// is one. (Per lane and block the same operations as the one-row-at-a-time kernel before issue 44,
// so the same bits, at ~1.5x its speed from cache.)
template <hal::DType T, int R>
void dot_q4_q5(const std::byte* const (&w)[R], const std::int8_t* xq, const float* xd, const std::int32_t* xsum,
               std::int64_t nb, float (&out)[R]) {
  static_assert(R <= 4);
  using Block = std::conditional_t<T == hal::DType::kQ4_0, hal::BlockQ4_0,
                                   std::conditional_t<T == hal::DType::kQ4_1, hal::BlockQ4_1, hal::BlockQ5_1>>;
  constexpr bool kMin = T != hal::DType::kQ4_0;
  constexpr bool kFive = T == hal::DType::kQ5_1;
  const __m256i bit4 = _mm256_set1_epi8(0x10);
#if !(defined(__AVX512BW__) && defined(__AVX512VL__))
  // The fifth bits (Q5_1), as dot_q5_0 spreads them.
  const __m256i spread = _mm256_setr_epi64x(0x0000000000000000, 0x0101010101010101, 0x0202020202020202,
                                            0x0303030303030303);
  const __m256i bit_mask = _mm256_set1_epi64x(0x7fbfdfeff7fbfdfe);
  const __m256i all = _mm256_set1_epi64x(-1);
#endif
  __m256 acc[R];
  __m128 macc = _mm_setzero_ps();  // lane r: row r's sum of m_w * d_x * xsum
  for (int r = 0; r < R; ++r) acc[r] = _mm256_setzero_ps();
  for (std::int64_t b = 0; b < nb; ++b) {
    const __m256i x = _mm256_load_si256(reinterpret_cast<const __m256i*>(xq + 32 * b));
    const __m256i corr = _mm256_zextsi128_si256(_mm_cvtsi32_si128(kMin ? 0 : -8 * xsum[b]));
    const float dx = xd[b];
    std::uint16_t dw[4] = {}, mw[4] = {};
    for (int r = 0; r < R; ++r) {
      const Block& wb = reinterpret_cast<const Block*>(w[r])[b];
      dw[r] = wb.d;
      if constexpr (kMin) mw[r] = wb.m;
    }
    alignas(16) float scale[4];
    _mm_store_ps(scale, halves_times(dw, dx));
    for (int r = 0; r < R; ++r) {
      const Block& wb = reinterpret_cast<const Block*>(w[r])[b];
      if (b % 2 == 0) _mm_prefetch(reinterpret_cast<const char*>(&wb) + kGemvPrefetchBytes, _MM_HINT_T0);
      __m256i q = nibbles32(wb.qs);
      if constexpr (kFive) {
        std::uint32_t qh;
        std::memcpy(&qh, wb.qh, 4);
#if defined(__AVX512BW__) && defined(__AVX512VL__)
        q = _mm256_mask_add_epi8(q, static_cast<__mmask32>(qh), q, bit4);  // q < 16: + 16 sets bit 4
#else
        const __m256i bits = _mm256_cmpeq_epi8(
            _mm256_or_si256(_mm256_shuffle_epi8(_mm256_set1_epi32(static_cast<int>(qh)), spread), bit_mask), all);
        q = _mm256_or_si256(q, _mm256_and_si256(bits, bit4));
#endif
      }
      const __m256i p = dot_u8s8_add(corr, q, x);
      acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p), _mm256_set1_ps(scale[r]), acc[r]);
    }
    if constexpr (kMin) macc = _mm_fmadd_ps(halves_times(mw, dx), _mm_set1_ps(static_cast<float>(xsum[b])), macc);
  }
  alignas(16) float m[4];
  _mm_store_ps(m, macc);
  for (int r = 0; r < R; ++r) out[r] = hsum256(acc[r]) + m[r];
}

// AWQ / GPTQ int4 (kAwqInt4: groups of 128, byte j holding elements 2j (low nibble) and 2j + 1,
// then the fp16 scale and zero; w = scale * (q - zero)): R rows against one token quantised per 32
// whose blocks are stored with their even elements first, then their odd ones (permute_awq_x), so
// that a block's 16 bytes of nibbles meet x as they lie (nibbles32, as Q4_0). Per block of 32 the
// exact int32 dot of q and x, then per group
// y += scale * sum_b d_x,b * dot_b - scale * zero * zx_g, zx_g = sum_b d_x,b * xsum_b (the same
// for every row: permute_awq_x computes it).
template <int R>
void dot_awq(const std::byte* const (&w)[R], const std::int8_t* xq, const float* xd, const float* zx,
             std::int64_t ngroups, float (&out)[R]) {
  constexpr int kBlocks = hal::kAwqInt4Group / hal::kQK;
  __m256 acc[R];
  float zacc[R] = {};
  for (int r = 0; r < R; ++r) acc[r] = _mm256_setzero_ps();
  for (std::int64_t g = 0; g < ngroups; ++g) {
    const std::uint8_t* blk[R];
    float scale[R];
    for (int r = 0; r < R; ++r) {
      blk[r] = reinterpret_cast<const std::uint8_t*>(w[r]) + g * hal::kAwqInt4BlockBytes;
      std::uint16_t sh, zh;
      std::memcpy(&sh, blk[r] + hal::kAwqInt4Group / 2, 2);
      std::memcpy(&zh, blk[r] + hal::kAwqInt4Group / 2 + 2, 2);
      scale[r] = f16(sh);
      zacc[r] = std::fma(scale[r] * f16(zh), zx[g], zacc[r]);
    }
    for (int b = 0; b < kBlocks; ++b) {
      const std::int64_t xb = g * kBlocks + b;
      const __m256i x = _mm256_load_si256(reinterpret_cast<const __m256i*>(xq + 32 * xb));
      const __m256 dx = _mm256_set1_ps(xd[xb]);
      for (int r = 0; r < R; ++r) {
        if (b % 2 == 0) _mm_prefetch(reinterpret_cast<const char*>(blk[r] + 16 * b) + kGemvPrefetchBytes, _MM_HINT_T0);
        const __m256i p = dot_u8s8_add(_mm256_setzero_si256(), nibbles32(blk[r] + 16 * b), x);
        acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p), _mm256_mul_ps(_mm256_set1_ps(scale[r]), dx), acc[r]);
      }
    }
  }
  for (int r = 0; r < R; ++r) out[r] = hsum256(acc[r]) - zacc[r];
}

// x quantised per 32 for dot_awq: each block's values reordered to its even elements, then its
// odd ones (in place); zx[g] = sum over the group's 4 blocks of d_x * sum(x values), in block order.
void permute_awq_x(std::int8_t* q, const float* d, const std::int32_t* sum, std::int64_t blocks, float* zx) {
  constexpr int kBlocks = hal::kAwqInt4Group / hal::kQK;
  for (std::int64_t b = 0; b < blocks; ++b) {
    std::int8_t tmp[hal::kQK];
    for (int j = 0; j < hal::kQK / 2; ++j) {
      tmp[j] = q[b * hal::kQK + 2 * j];
      tmp[hal::kQK / 2 + j] = q[b * hal::kQK + 2 * j + 1];
    }
    std::memcpy(q + b * hal::kQK, tmp, hal::kQK);
  }
  for (std::int64_t g = 0; g < blocks / kBlocks; ++g) {
    float z = 0.0f;
    for (int b = 0; b < kBlocks; ++b) z = std::fma(d[g * kBlocks + b], static_cast<float>(sum[g * kBlocks + b]), z);
    zx[g] = z;
  }
}

float dot_f32(const float* w, const float* x, std::int64_t k) {
  __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps();
  std::int64_t i = 0;
  for (; i + 16 <= k; i += 16) {
    a0 = _mm256_fmadd_ps(_mm256_loadu_ps(w + i), _mm256_loadu_ps(x + i), a0);
    a1 = _mm256_fmadd_ps(_mm256_loadu_ps(w + i + 8), _mm256_loadu_ps(x + i + 8), a1);
  }
  float s = hsum256(_mm256_add_ps(a0, a1));
  for (; i < k; ++i) s += w[i] * x[i];
  return s;
}
#else
float dot_f32(const float* w, const float* x, std::int64_t k) {
  float s = 0.0f;
  for (std::int64_t i = 0; i < k; ++i) s += w[i] * x[i];
  return s;
}
#endif

// Any dequantisable format: each row to F32, then F32 dots.
void gemv_dequant(ThreadPool& pool, const MatmulProblem& p) {
  for_row_chunks(pool, p.n, [&](std::int64_t r0, std::int64_t r1) {
    thread_local std::vector<float> row;
    row.resize(static_cast<std::size_t>(p.k));
    for (std::int64_t r = r0; r < r1; ++r) {
      dequantize_tensor_row(p.w_type, p.w, p.k, r, p.n, row.data());
      for (std::int64_t t = 0; t < p.m; ++t) {
        p.y[t * p.n + r] = dot_f32(row.data(), p.x + t * p.k, p.k) + (p.bias != nullptr ? p.bias[r] : 0.0f);
      }
    }
  });
}

#if SX_GEMV_QUANT_AVX2
// x quantised per 32 for the int8 GEMVs (quantize_activations_q8: values q, scales d) with
// `factor` times the sum of each block's values (sum).
struct XBlocks32 {
  std::int8_t* q;
  float* d;
  std::int32_t* sum;
};
XBlocks32 quantize_x_blocks32(Scratch& scratch, const MatmulProblem& p, std::int32_t factor) {
  const std::int64_t nb = p.k / hal::kQK;
  auto* q = static_cast<std::int8_t*>(scratch.get(
      kSlotActs, static_cast<std::size_t>(p.m * p.k) + static_cast<std::size_t>(p.m * nb) * 2 * sizeof(float)));
  auto* d = reinterpret_cast<float*>(q + p.m * p.k);
  auto* sum = reinterpret_cast<std::int32_t*>(d + p.m * nb);
  quantize_rows_q8(p.x, 0, p.m, p.k, q, d);
  for (std::int64_t i = 0; i < p.m * nb; ++i) {
    std::int32_t s = 0;
    for (int j = 0; j < hal::kQK; ++j) s += q[i * hal::kQK + j];
    sum[i] = factor * s;
  }
  return {q, d, sum};
}

// y[t][row] = dot(the rows of R lockstep streams, token t) + bias, for every row of W (plain rows):
// dot(const std::byte* const (&rows)[R], t, float (&out)[R]).
template <typename Dot>
void gemv_row_streams(ThreadPool& pool, const MatmulProblem& p, Dot&& dot) {
  const auto* w = static_cast<const std::byte*>(p.w);
  const std::size_t rb = cpu::row_bytes(p.w_type, p.k);
  for_row_chunks(pool, p.n, [&](std::int64_t r0, std::int64_t r1) {
    for_row_streams(r0, r1, [&]<int R>(const std::int64_t (&rows)[R]) {
      const std::byte* wr[R];
      for (int i = 0; i < R; ++i) wr[i] = w + rb * static_cast<std::size_t>(rows[i]);
      for (std::int64_t tk = 0; tk < p.m; ++tk) {
        float v[R];
        dot(wr, tk, v);
        for (int i = 0; i < R; ++i) p.y[tk * p.n + rows[i]] = v[i] + (p.bias != nullptr ? p.bias[rows[i]] : 0.0f);
      }
    });
  });
}

// The same for a layout of 8-row groups (Block: one group's block; nb blocks per row):
// dot(const Block* const (&groups)[G], t, float (&out)[G][8]) gives the 8 rows of each of G
// lockstep group streams; the padding rows of the last group are dropped.
template <typename Block, typename Dot>
void gemv_group_streams(ThreadPool& pool, const MatmulProblem& p, std::int64_t nb, Dot&& dot) {
  constexpr int kRows = 8;
  const auto* w = static_cast<const Block*>(p.w);
  for_row_chunks(pool, ceil_div(p.n, kRows), [&](std::int64_t g0, std::int64_t g1) {
    for_row_streams(g0, g1, [&]<int G>(const std::int64_t (&groups)[G]) {
      const Block* wg[G];
      for (int i = 0; i < G; ++i) wg[i] = w + groups[i] * nb;
      for (std::int64_t tk = 0; tk < p.m; ++tk) {
        float v[G][kRows];
        dot(wg, tk, v);
        for (int i = 0; i < G; ++i) {
          for (int r = 0; r < kRows && groups[i] * kRows + r < p.n; ++r) {
            const std::int64_t row = groups[i] * kRows + r;
            p.y[tk * p.n + row] = v[i][r] + (p.bias != nullptr ? p.bias[row] : 0.0f);
          }
        }
      }
    });
  });
}
#endif

}  // namespace

bool has_quant_gemv_kernel(hal::DType t) {
#if SX_GEMV_QUANT_AVX2
  return t == hal::DType::kQ2_K || t == hal::DType::kQ3_K || t == hal::DType::kQ4_K || t == hal::DType::kQ6_K ||
         t == hal::DType::kQ5_0 || t == kQ5_0R8 || t == kQ4_0R8 || t == kQ4_KR8 || t == kQ5_KR8 ||
         t == kQ4_1R8 || t == kQ5_1R8 ||
         t == hal::DType::kQ4_0 || t == hal::DType::kQ4_1 || t == hal::DType::kQ5_1 || t == hal::DType::kQ5_K ||
         t == hal::DType::kAwqInt4;
#else
  (void)t;
  return false;
#endif
}

void gemv_quant(ThreadPool& pool, Scratch& scratch, const MatmulProblem& p) {
#if SX_GEMV_QUANT_AVX2
  const hal::DType t = p.w_type;
  if (t == hal::DType::kQ2_K || t == hal::DType::kQ3_K || t == hal::DType::kQ4_K || t == hal::DType::kQ5_K ||
      t == hal::DType::kQ6_K) {
    const std::int64_t nsb = p.k / kQK_K;
    auto* act = static_cast<ActQ8K*>(scratch.get(kSlotActs, static_cast<std::size_t>(p.m * nsb) * sizeof(ActQ8K)));
    if (p.m == 1) {
      quantize_act_q8k(p.x, p.k, act);
    } else {
      pool.parallel_for(p.m, [&](std::int64_t r) { quantize_act_q8k(p.x + r * p.k, p.k, act + r * nsb); });
    }
    const std::size_t rb = cpu::row_bytes(t, p.k);
    const auto* w = static_cast<const std::byte*>(p.w);
    for_row_chunks(pool, p.n, [&](std::int64_t r0, std::int64_t r1) {
      for (std::int64_t r = r0; r < r1; ++r) {
        const std::byte* row = w + rb * static_cast<std::size_t>(r);
        const float bias = p.bias != nullptr ? p.bias[r] : 0.0f;
        for (std::int64_t tk = 0; tk < p.m; ++tk) {
          const float v = t == hal::DType::kQ2_K   ? dot_q23_k<false>(row, act + tk * nsb, nsb)
                          : t == hal::DType::kQ3_K ? dot_q23_k<true>(row, act + tk * nsb, nsb)
                          : t == hal::DType::kQ4_K
                              ? dot_q4_k(reinterpret_cast<const BlockQ4_K*>(row), act + tk * nsb, nsb)
                          : t == hal::DType::kQ5_K
                              ? dot_q4_k(reinterpret_cast<const hal::BlockQ5_K*>(row), act + tk * nsb, nsb)
                              : dot_q6_k(reinterpret_cast<const BlockQ6_K*>(row), act + tk * nsb, nsb);
          p.y[tk * p.n + r] = v + bias;
        }
      }
    });
    return;
  }
  if (t == hal::DType::kQ4_0 || t == hal::DType::kQ4_1 || t == hal::DType::kQ5_1 || t == hal::DType::kAwqInt4) {
    const std::int64_t nb = p.k / hal::kQK;
    const XBlocks32 x = quantize_x_blocks32(scratch, p, 1);
    const std::int64_t ngroups = p.k / hal::kAwqInt4Group;
    float* zx = nullptr;  // AWQ: per token and group, sum_b d_x * xsum_b
    if (t == hal::DType::kAwqInt4) {
      zx = static_cast<float*>(scratch.get(kSlotPackedX, static_cast<std::size_t>(p.m * ngroups) * sizeof(float)));
      for (std::int64_t tk = 0; tk < p.m; ++tk) {
        permute_awq_x(x.q + tk * p.k, x.d + tk * nb, x.sum + tk * nb, nb, zx + tk * ngroups);
      }
    }
    auto rows_of = [&]<hal::DType T>() {
      gemv_row_streams(pool, p, [&]<int R>(const std::byte* const (&wr)[R], std::int64_t tk, float (&v)[R]) {
        if constexpr (T == hal::DType::kAwqInt4) {
          dot_awq<R>(wr, x.q + tk * p.k, x.d + tk * nb, zx + tk * ngroups, ngroups, v);
        } else {
          dot_q4_q5<T, R>(wr, x.q + tk * p.k, x.d + tk * nb, x.sum + tk * nb, nb, v);
        }
      });
    };
    if (t == hal::DType::kAwqInt4) {
      rows_of.template operator()<hal::DType::kAwqInt4>();
    } else if (t == hal::DType::kQ4_0) {
      rows_of.template operator()<hal::DType::kQ4_0>();
    } else if (t == hal::DType::kQ4_1) {
      rows_of.template operator()<hal::DType::kQ4_1>();
    } else {
      rows_of.template operator()<hal::DType::kQ5_1>();
    }
    return;
  }
  if (t == kQ4_KR8 || t == kQ5_KR8) {
    const std::int64_t nsb = p.k / kQK_K;
    auto* act = static_cast<ActQ8K*>(scratch.get(
        kSlotActs, static_cast<std::size_t>(p.m * nsb) * sizeof(ActQ8K)));
    auto* pairs = static_cast<std::int32_t*>(
        scratch.get(kSlotPackedX, static_cast<std::size_t>(p.m * nsb) * 4 * sizeof(std::int32_t)));
    for (std::int64_t tk = 0; tk < p.m; ++tk) {
      quantize_act_q8k(p.x + tk * p.k, p.k, act + tk * nsb);
      k_min_pairs(act + tk * nsb, nsb, pairs + tk * nsb * 4);
    }
    auto groups_of = [&]<typename Block>() {
      gemv_group_streams<Block>(pool, p, nsb, [&]<int G>(const Block* const (&wg)[G], std::int64_t tk, float (&v)[G][8]) {
        dot_k_r8<Block, G>(wg, act + tk * nsb, pairs + tk * nsb * 4, nsb, v);
      });
    };
    if (t == kQ4_KR8) {
      groups_of.template operator()<BlockQ4_Kx8>();
    } else {
      groups_of.template operator()<BlockQ5_Kx8>();
    }
    return;
  }
  if (t == kQ5_0R8 || t == kQ4_0R8 || t == kQ5_1R8 || t == kQ4_1R8) {
    const std::int64_t nb = p.k / hal::kQK;
    // The -16 of (q - 16) or the -8 of (q - 8), per block; the plain sum for the mins of Q4_1 / Q5_1.
    const XBlocks32 x = quantize_x_blocks32(scratch, p, t == kQ5_0R8 ? -16 : t == kQ4_0R8 ? -8 : 1);
    auto groups_of = [&]<typename Block>() {
      gemv_group_streams<Block>(pool, p, nb, [&]<int G>(const Block* const (&wg)[G], std::int64_t tk, float (&v)[G][8]) {
        dot_r8<Block, G>(wg, x.q + tk * p.k, x.d + tk * nb, x.sum + tk * nb, nb, v);
      });
    };
    if (t == kQ5_0R8) {
      groups_of.template operator()<BlockQ5_0x8>();
    } else if (t == kQ4_0R8) {
      groups_of.template operator()<BlockQ4_0x8>();
    } else if (t == kQ5_1R8) {
      groups_of.template operator()<BlockQ5_1x8>();
    } else {
      groups_of.template operator()<BlockQ4_1x8>();
    }
    return;
  }
  if (t == hal::DType::kQ5_0) {
    const std::int64_t nb = p.k / hal::kQK;
    const XBlocks32 x = quantize_x_blocks32(scratch, p, -16);  // the -16 of (q - 16), per block
    gemv_row_streams(pool, p, [&]<int R>(const std::byte* const (&wr)[R], std::int64_t tk, float (&v)[R]) {
      const BlockQ5_0* rows[R];
      for (int i = 0; i < R; ++i) rows[i] = reinterpret_cast<const BlockQ5_0*>(wr[i]);
      dot_q5_0<R>(rows, x.q + tk * p.k, x.d + tk * nb, x.sum + tk * nb, nb, v);
    });
    return;
  }
#else
  (void)scratch;
#endif
  gemv_dequant(pool, p);
}

}  // namespace sx::cpu::SX_CPU_ISA_NS::detail
