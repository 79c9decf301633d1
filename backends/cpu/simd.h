// Small AVX2 helpers shared by the CPU kernel units (only defined when AVX2 and FMA are on; in the
// namespace of the ISA level being compiled, kernel_table.h).
#pragma once

#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>

namespace sx::cpu::SX_CPU_ISA_NS {

// Sum of the eight lanes.
inline float hsum256(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

// Software prefetch distance along each weight-row stream of the GEMVs (measured best on Zen 3
// with 4 streams).
inline constexpr int kGemvPrefetchBytes = 512;

// Software prefetch (into L1) of the cache lines of [p, p + Bytes): one block of a weight stream,
// some distance ahead of the block being read.
template <int Bytes>
inline void prefetch_block(const void* p) {
  for (int o = 0; o < Bytes; o += 64) _mm_prefetch(static_cast<const char*>(p) + o, _MM_HINT_T0);
}

}  // namespace sx::cpu::SX_CPU_ISA_NS
#endif
