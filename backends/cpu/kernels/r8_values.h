// The values of the CPU device's 8-row interleaved layouts of 4- and 5-bit blocks (layouts.h) in
// vector registers, shared by the GEMVs (gemv_quant.cpp) and the int8 GEMM's panel interleave
// (gemm_q8_0.cpp). Kernel units only (compiled once per ISA level, AVX2 and up).
#pragma once

#include <cstdint>

#include <immintrin.h>

#if !defined(SX_CPU_ISA_NS)
#error "r8_values.h belongs to the kernel units, compiled once per ISA level (kernel_table.h)"
#endif

namespace sx::cpu::SX_CPU_ISA_NS::detail {

// q with the fifth bits of elements 4v .. 4v + 3 of each row of a BlockQ5_0x8 (or of a sub-block
// of the other 5-bit layouts) ORed in at bit 4 of their bytes (layouts.h): qh shifted by 4 - v. Bits
// that cross into a neighbouring byte land below bit 4 (left shifts of at most 4) or above it (right
// shifts of at most 3), so the mask keeps only the wanted ones. With AVX-512VL the mask and the OR
// are one vpternlogd (q | (shifted & bit4)).
template <int V>
inline __m256i add_q5_high(__m256i q, __m256i qh, __m256i bit4) {
  __m256i shifted;
  if constexpr (V < 4) {
    shifted = _mm256_slli_epi16(qh, 4 - V);
  } else if constexpr (V == 4) {
    shifted = qh;
  } else {
    shifted = _mm256_srli_epi16(qh, V - 4);
  }
#if defined(__AVX512VL__)
  return _mm256_ternarylogic_epi32(q, shifted, bit4, 0xF8);
#else
  return _mm256_or_si256(q, _mm256_and_si256(shifted, bit4));
#endif
}

// The values q_v of one 8-row interleaved block of 32 (kQ5_0R8, kQ4_0R8, and each sub-block of
// kQ4_KR8 / kQ5_KR8: layouts.h), v = 0..7: elements 4v .. 4v + 3 of each of the 8 rows, one row per
// 4-byte lane (vector i of qs holds v = 2i in its low nibbles and v = 2i + 1 in its high ones), with
// the fifth bits of qh where kFive.
template <bool kFive>
inline void r8_values(const std::uint8_t* qs, [[maybe_unused]] const std::uint8_t* qh, __m256i (&q)[8]) {
  const __m256i m4 = _mm256_set1_epi8(0x0F);
  for (int i = 0; i < 4; ++i) {
    const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(qs + 32 * i));
    q[2 * i] = _mm256_and_si256(v, m4);
    q[2 * i + 1] = _mm256_and_si256(_mm256_srli_epi16(v, 4), m4);
  }
  if constexpr (kFive) {
    const __m256i bit4 = _mm256_set1_epi8(0x10);
    const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(qh));
    q[0] = add_q5_high<0>(q[0], h, bit4);
    q[1] = add_q5_high<1>(q[1], h, bit4);
    q[2] = add_q5_high<2>(q[2], h, bit4);
    q[3] = add_q5_high<3>(q[3], h, bit4);
    q[4] = add_q5_high<4>(q[4], h, bit4);
    q[5] = add_q5_high<5>(q[5], h, bit4);
    q[6] = add_q5_high<6>(q[6], h, bit4);
    q[7] = add_q5_high<7>(q[7], h, bit4);
  }
}

}  // namespace sx::cpu::SX_CPU_ISA_NS::detail
