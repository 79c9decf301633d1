// Paged KV write and causal grouped-query attention over paged KV blocks (mixed prefill/decode).
#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "backends/cpu/kernels/kernel_table.h"
#include "backends/cpu/ops/cpu_ops.h"
#include "runtime/base/half.h"

#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#endif

namespace sx::cpu::SX_CPU_ISA_NS {

void kv_write(ThreadPool& /*pool*/, const float* k, const float* v, void* k_cache, void* v_cache,
              hal::DType cache_type, const std::int32_t* slots, std::int64_t n_tokens,
              std::int64_t n_kv_heads, std::int64_t head_dim) {
  const std::int64_t row = n_kv_heads * head_dim;
  for (std::int64_t t = 0; t < n_tokens; ++t) {
    if (slots[t] < 0) continue;
    const std::int64_t dst = static_cast<std::int64_t>(slots[t]) * row;
    if (cache_type == hal::DType::kF32) {
      std::memcpy(static_cast<float*>(k_cache) + dst, k + t * row, static_cast<std::size_t>(row) * sizeof(float));
      std::memcpy(static_cast<float*>(v_cache) + dst, v + t * row, static_cast<std::size_t>(row) * sizeof(float));
    } else {
      hal::quantize_row(cache_type, k + t * row, static_cast<std::uint16_t*>(k_cache) + dst, row);
      hal::quantize_row(cache_type, v + t * row, static_cast<std::uint16_t*>(v_cache) + dst, row);
    }
  }
}

namespace {

struct SeqToken {
  std::int32_t seq;
  std::int32_t pos;  // absolute position of this token
};

#if defined(__AVX2__) && defined(__FMA__)
// scores[r] = scale * (the sum of a[r]'s lanes) for 8 accumulators: a transposing add tree, so the
// horizontal sums cost one vector op per dot product.
inline void store_sums8(const __m256 (&a)[8], float scale, float* scores) {
  const __m256 s01 = _mm256_hadd_ps(a[0], a[1]), s23 = _mm256_hadd_ps(a[2], a[3]);
  const __m256 s45 = _mm256_hadd_ps(a[4], a[5]), s67 = _mm256_hadd_ps(a[6], a[7]);
  const __m256 s0123 = _mm256_hadd_ps(s01, s23), s4567 = _mm256_hadd_ps(s45, s67);
  // Lanes: s0123 = [r0 r1 r2 r3 | r0 r1 r2 r3] halves; add the 128-bit halves pairwise.
  const __m256 lo = _mm256_permute2f128_ps(s0123, s4567, 0x20);
  const __m256 hi = _mm256_permute2f128_ps(s0123, s4567, 0x31);
  _mm256_storeu_ps(scores, _mm256_mul_ps(_mm256_add_ps(lo, hi), _mm256_set1_ps(scale)));
}

// scores[i] = scale * q . rows[i] for 8 rows at once: eight accumulators, then store_sums8.
inline void dot8(const float* q, const float* const* rows, std::int64_t hd, float scale, float* scores) {
  __m256 a[8];
  for (int r = 0; r < 8; ++r) a[r] = _mm256_setzero_ps();
  for (std::int64_t i = 0; i < hd; i += 8) {
    const __m256 qv = _mm256_loadu_ps(q + i);
    for (int r = 0; r < 8; ++r) a[r] = _mm256_fmadd_ps(qv, _mm256_loadu_ps(rows[r] + i), a[r]);
  }
  store_sums8(a, scale, scores);
}

#if defined(__AVX512F__)
// dot8 on 512-bit registers (hd % 16 == 0): sixteen-lane partial sums folded to eight lanes, then
// store_sums8 (its own summation order: the same on every AVX-512 level).
inline void dot8_512(const float* q, const float* const* rows, std::int64_t hd, float scale, float* scores) {
  __m512 a[8];
  for (int r = 0; r < 8; ++r) a[r] = _mm512_setzero_ps();
  for (std::int64_t i = 0; i < hd; i += 16) {
    const __m512 qv = _mm512_loadu_ps(q + i);
    for (int r = 0; r < 8; ++r) a[r] = _mm512_fmadd_ps(qv, _mm512_loadu_ps(rows[r] + i), a[r]);
  }
  __m256 b[8];
  for (int r = 0; r < 8; ++r) {
    b[r] = _mm256_add_ps(_mm512_castps512_ps256(a[r]),
                         _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(a[r]), 1)));
  }
  store_sums8(b, scale, scores);
}

// weighted_sum_part for two heads over the same rows, on 512-bit registers (NZ per head): each
// element's sum is the same chain of FMAs in row order as weighted_sum_part's (the same bits), but
// the two heads' 2 x NZ chains keep both FMA units busy where one head's NZ would wait on latency.
template <int NZ>
void weighted_sum_pair(const float* wa, const float* wb, const float* const* rows, std::int64_t n, float* acc_a,
                       float* acc_b) {
  __m512 a[NZ], b[NZ];
  for (int v = 0; v < NZ; ++v) {
    a[v] = _mm512_loadu_ps(acc_a + 16 * v);
    b[v] = _mm512_loadu_ps(acc_b + 16 * v);
  }
  for (std::int64_t i = 0; i < n; ++i) {
    const __m512 xa = _mm512_set1_ps(wa[i]), xb = _mm512_set1_ps(wb[i]);
    const float* r = rows[i];
    for (int v = 0; v < NZ; ++v) {
      const __m512 x = _mm512_loadu_ps(r + 16 * v);
      a[v] = _mm512_fmadd_ps(xa, x, a[v]);
      b[v] = _mm512_fmadd_ps(xb, x, b[v]);
    }
  }
  for (int v = 0; v < NZ; ++v) {
    _mm512_storeu_ps(acc_a + 16 * v, a[v]);
    _mm512_storeu_ps(acc_b + 16 * v, b[v]);
  }
}
#endif

// acc += sum_i w[i] * rows[i], rows in order, with the hd-wide accumulator (in memory between
// calls, so the sum can be taken a run of rows at a time) held in NV registers.
template <int NV>
void weighted_sum_part(const float* w, const float* const* rows, std::int64_t n, std::int64_t /*hd*/, float* acc_io) {
  __m256 acc[NV];
  for (int v = 0; v < NV; ++v) acc[v] = _mm256_loadu_ps(acc_io + 8 * v);
  for (std::int64_t i = 0; i < n; ++i) {
    const __m256 wi = _mm256_set1_ps(w[i]);
    const float* r = rows[i];
    for (int v = 0; v < NV; ++v) acc[v] = _mm256_fmadd_ps(wi, _mm256_loadu_ps(r + 8 * v), acc[v]);
  }
  for (int v = 0; v < NV; ++v) _mm256_storeu_ps(acc_io + 8 * v, acc[v]);
}
#endif

// acc += sum_i w[i] * rows[i], rows in order, any hd.
void weighted_sum_part_any(const float* w, const float* const* rows, std::int64_t n, std::int64_t hd, float* acc) {
  for (std::int64_t i = 0; i < n; ++i) axpy_f32(w[i], rows[i], acc, hd);
}

using WeightedSumPart = void (*)(const float*, const float* const*, std::int64_t, std::int64_t, float*);
using WeightedSumPair = void (*)(const float*, const float*, const float* const*, std::int64_t, float*, float*);
// The two-head kernel for head size hd where there is one (else null).
WeightedSumPair weighted_sum_pair_for([[maybe_unused]] std::int64_t hd) {
#if defined(__AVX512F__)
  switch (hd) {
    case 64: return weighted_sum_pair<4>;
    case 128: return weighted_sum_pair<8>;
    default: break;
  }
#endif
  return nullptr;
}
WeightedSumPart weighted_sum_part_for([[maybe_unused]] std::int64_t hd) {
#if defined(__AVX2__) && defined(__FMA__)
  switch (hd) {
    case 16: return weighted_sum_part<2>;
    case 32: return weighted_sum_part<4>;
    case 64: return weighted_sum_part<8>;
    case 128: return weighted_sum_part<16>;
    default: break;
  }
#endif
  return weighted_sum_part_any;
}

void scores_any(const float* q, const float* const* rows, std::int64_t n, std::int64_t hd, float scale, float* out) {
  std::int64_t c = 0;
#if defined(__AVX2__) && defined(__FMA__)
#if defined(__AVX512F__)
  if (hd % 16 == 0) {
    for (; c + 8 <= n; c += 8) dot8_512(q, rows + c, hd, scale, out + c);
  }
#endif
  if (hd % 8 == 0) {
    for (; c + 8 <= n; c += 8) dot8(q, rows + c, hd, scale, out + c);
  }
#endif
  for (; c < n; ++c) out[c] = dot_f32(q, rows[c], hd) * scale;
}

}  // namespace

void paged_attention(ThreadPool& pool, const AttentionPtrs& p, const AttentionShape& s) {
  // Map each batch token to its sequence and position.
  std::vector<SeqToken> tokens(static_cast<std::size_t>(s.n_tokens));
  for (std::int64_t q = 0; q < s.n_seqs; ++q) {
    const std::int32_t begin = p.seq_token_start[q], end = p.seq_token_start[q + 1];
    const std::int32_t first_pos = p.seq_context_len[q] - (end - begin);
    for (std::int32_t t = begin; t < end; ++t) tokens[t] = {static_cast<std::int32_t>(q), first_pos + (t - begin)};
  }
  const std::int64_t hd = s.head_dim;
  const std::int64_t kv_row = s.n_kv_heads * hd;
  const std::size_t elem = s.cache_type == hal::DType::kF32 ? 4 : 2;
  std::int64_t max_ctx = 0;
  for (std::int64_t q = 0; q < s.n_seqs; ++q) max_ctx = std::max<std::int64_t>(max_ctx, p.seq_context_len[q]);

  // One task per (token, local kv head): all query heads of the group share the K/V rows.
  const std::int64_t n_local_kv = s.n_kv_heads;
  // Query heads of this rank that map to local kv head g.
  std::vector<std::vector<std::int64_t>> group(static_cast<std::size_t>(n_local_kv));
  for (std::int64_t h = 0; h < s.n_heads; ++h) {
    const std::int64_t g = (s.q_head_offset + h) / s.heads_per_kv - s.kv_head_offset;
    group[static_cast<std::size_t>(g)].push_back(h);
  }
  std::int64_t max_group = 0;
  for (const auto& heads : group) max_group = std::max<std::int64_t>(max_group, static_cast<std::int64_t>(heads.size()));
  const WeightedSumPart sum_part = weighted_sum_part_for(hd);
  const WeightedSumPair sum_pair = weighted_sum_pair_for(hd);
  pool.run_on_all([&](int thread, int n_thr) {
    // Per-thread scratch: scores and an accumulator per head of a group, rows converted from a
    // 16-bit cache, row pointers. Kept by each pool thread from call to call (they only grow):
    // allocated per call, the worker threads' malloc arenas gave the memory back to the OS after
    // each layer and the next one faulted it in again, zeroed (a few % of a paced serving run).
    thread_local std::vector<float> buf;
    thread_local std::vector<const float*> krows, vrows;
    thread_local std::vector<float> inv_sum;
    const bool convert = s.cache_type != hal::DType::kF32;
    buf.resize(std::max(buf.size(), static_cast<std::size_t>((convert ? 2 * max_ctx * hd : 0) + max_group * (max_ctx + hd))));
    float* scores = buf.data();
    float* acc = scores + max_group * max_ctx;
    float* kconv = acc + max_group * hd;
    float* vconv = kconv + max_ctx * hd;
    krows.resize(std::max(krows.size(), static_cast<std::size_t>(max_ctx)));
    vrows.resize(std::max(vrows.size(), static_cast<std::size_t>(max_ctx)));
    inv_sum.resize(std::max(inv_sum.size(), static_cast<std::size_t>(max_group)));
    const std::int64_t n_tasks = s.n_tokens * n_local_kv;
    for (std::int64_t task = thread; task < n_tasks; task += n_thr) {
      const std::int64_t t = task / n_local_kv;
      const std::int64_t g = task % n_local_kv;
      const auto& heads = group[static_cast<std::size_t>(g)];
      if (heads.empty()) continue;
      const SeqToken st = tokens[static_cast<std::size_t>(t)];
      const std::int32_t* bt = p.block_table + st.seq * s.max_blocks_per_seq;
      const std::int64_t n_ctx = st.pos + 1;
      std::int64_t slot_prev = 0;
      for (std::int64_t c = 0; c < n_ctx; ++c) {
        const std::int64_t in_block = c % s.block_size;  // a block's rows are consecutive slots
        const std::int64_t slot = in_block == 0 ? static_cast<std::int64_t>(bt[c / s.block_size]) * s.block_size
                                                : slot_prev + 1;
        slot_prev = slot;
        const std::int64_t off = (slot * kv_row + g * hd) * static_cast<std::int64_t>(elem);
        const std::byte* kp = static_cast<const std::byte*>(p.k_cache) + off;
        const std::byte* vp = static_cast<const std::byte*>(p.v_cache) + off;
        if (convert) {
          load_row_f32(s.cache_type, kp, kconv + c * hd, hd);
          load_row_f32(s.cache_type, vp, vconv + c * hd, hd);
          krows[static_cast<std::size_t>(c)] = kconv + c * hd;
          vrows[static_cast<std::size_t>(c)] = vconv + c * hd;
        } else {
          krows[static_cast<std::size_t>(c)] = reinterpret_cast<const float*>(kp);
          vrows[static_cast<std::size_t>(c)] = reinterpret_cast<const float*>(vp);
        }
      }
      // Every head of the group over the same rows while they are in L1: K 8 rows at a time, V
      // kRowsPerPass rows at a time. A head's arithmetic is the same whatever the passes (its
      // scores by scores_any, 8 rows per call, then the V rows accumulated in order), so its
      // result does not depend on the heads it shares them with.
      constexpr std::int64_t kRowsPerPass = 32;
      const auto nh = static_cast<std::int64_t>(heads.size());
      // Offset of head i of the group in q and out ([token][head][hd]).
      auto at = [&](std::int64_t i) { return (t * s.n_heads + heads[static_cast<std::size_t>(i)]) * hd; };
      std::int64_t c = 0;
      for (; c + 8 <= n_ctx; c += 8) {
        for (std::int64_t i = 0; i < nh; ++i) scores_any(p.q + at(i), krows.data() + c, 8, hd, s.scale, scores + i * max_ctx + c);
      }
      for (std::int64_t i = 0; i < nh; ++i) {
        float* sc = scores + i * max_ctx;
        scores_any(p.q + at(i), krows.data() + c, n_ctx - c, hd, s.scale, sc + c);  // the last < 8 rows
        const float mx = *std::max_element(sc, sc + n_ctx);
        inv_sum[static_cast<std::size_t>(i)] = 1.0f / exp_shifted_sum(sc, n_ctx, mx);
      }
      std::fill(acc, acc + nh * hd, 0.0f);
      for (std::int64_t r0 = 0; r0 < n_ctx; r0 += kRowsPerPass) {
        const std::int64_t n = std::min(kRowsPerPass, n_ctx - r0);
        std::int64_t i = 0;
        if (sum_pair != nullptr) {
          for (; i + 1 < nh; i += 2) {
            sum_pair(scores + i * max_ctx + r0, scores + (i + 1) * max_ctx + r0, vrows.data() + r0, n, acc + i * hd,
                     acc + (i + 1) * hd);
          }
        }
        for (; i < nh; ++i) sum_part(scores + i * max_ctx + r0, vrows.data() + r0, n, hd, acc + i * hd);
      }
      for (std::int64_t i = 0; i < nh; ++i) {
        float* out = p.out + at(i);
        for (std::int64_t j = 0; j < hd; ++j) out[j] = acc[i * hd + j] * inv_sum[static_cast<std::size_t>(i)];
      }
    }
  });
}

}  // namespace sx::cpu::SX_CPU_ISA_NS
