// Paged KV write and causal grouped-query attention over paged KV blocks (mixed prefill/decode).
#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
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

#if defined(__AVX2__) && defined(__FMA__)
#if !defined(__AVX512F__)  // the AVX-512 levels score K rows transposed (dot16t_n)
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
#endif

#if defined(__AVX512F__)
// r[i] = row i of a 16 x 16 block -> r[j] = its column j (unpack, then 64- and 128-bit shuffles).
inline void transpose16(__m512 (&r)[16]) {
  __m512 t[16];
  for (int i = 0; i < 8; ++i) {
    t[2 * i] = _mm512_unpacklo_ps(r[2 * i], r[2 * i + 1]);
    t[2 * i + 1] = _mm512_unpackhi_ps(r[2 * i], r[2 * i + 1]);
  }
  for (int i = 0; i < 4; ++i) {
    r[4 * i + 0] = _mm512_shuffle_ps(t[4 * i + 0], t[4 * i + 2], 0x44);
    r[4 * i + 1] = _mm512_shuffle_ps(t[4 * i + 0], t[4 * i + 2], 0xEE);
    r[4 * i + 2] = _mm512_shuffle_ps(t[4 * i + 1], t[4 * i + 3], 0x44);
    r[4 * i + 3] = _mm512_shuffle_ps(t[4 * i + 1], t[4 * i + 3], 0xEE);
  }
  for (int i = 0; i < 4; ++i) {
    t[i] = _mm512_shuffle_f32x4(r[i], r[4 + i], 0x88);
    t[4 + i] = _mm512_shuffle_f32x4(r[i], r[4 + i], 0xDD);
    t[8 + i] = _mm512_shuffle_f32x4(r[8 + i], r[12 + i], 0x88);
    t[12 + i] = _mm512_shuffle_f32x4(r[8 + i], r[12 + i], 0xDD);
  }
  for (int i = 0; i < 4; ++i) {
    r[i] = _mm512_shuffle_f32x4(t[i], t[8 + i], 0x88);
    r[4 + i] = _mm512_shuffle_f32x4(t[4 + i], t[12 + i], 0x88);
    r[8 + i] = _mm512_shuffle_f32x4(t[i], t[8 + i], 0xDD);
    r[12 + i] = _mm512_shuffle_f32x4(t[4 + i], t[12 + i], 0xDD);
  }
}

// The K rows rows[0, 16) (those at or past n: zero) transposed: kt[16 d + i] = rows[i][d], d < hd
// (kt 64-byte aligned).
inline void transpose_rows16(const float* const* rows, std::int64_t n, std::int64_t hd, float* kt) {
  for (std::int64_t d0 = 0; d0 < hd; d0 += 16) {
    const auto nd = static_cast<int>(std::min<std::int64_t>(16, hd - d0));
    const auto mask = static_cast<__mmask16>((1u << nd) - 1u);
    __m512 r[16];
    for (int i = 0; i < 16; ++i) r[i] = i < n ? _mm512_maskz_loadu_ps(mask, rows[i] + d0) : _mm512_setzero_ps();
    transpose16(r);
    for (int i = 0; i < nd; ++i) _mm512_store_ps(kt + (d0 + i) * 16, r[i]);
  }
}

// scores[j][i] = scale * (q[j] . row i) for the 16 rows of kt (transpose_rows16) and NQ queries: a
// lane per row, each dot one chain of FMAs in d order from 0, so a row's score has the same bits
// whatever rows, queries or tile it is computed with, and no horizontal sums are needed.
template <int NQ>
void dot16t_n(const float* const* q, const float* kt, std::int64_t hd, float scale, float* const* scores) {
  __m512 a[NQ];
  for (int j = 0; j < NQ; ++j) a[j] = _mm512_setzero_ps();
  for (std::int64_t d = 0; d < hd; ++d) {
    const __m512 k = _mm512_load_ps(kt + d * 16);
    for (int j = 0; j < NQ; ++j) a[j] = _mm512_fmadd_ps(_mm512_set1_ps(q[j][d]), k, a[j]);
  }
  const __m512 sv = _mm512_set1_ps(scale);
  for (int j = 0; j < NQ; ++j) _mm512_storeu_ps(scores[j], _mm512_mul_ps(a[j], sv));
}
using Dot16T = void (*)(const float* const*, const float*, std::int64_t, float, float* const*);
constexpr int kDotQueries = 12;  // queries per dot16t_n call at most (12 chains hide the FMA latency)
constexpr Dot16T kDot16T[kDotQueries + 1] = {nullptr,         dot16t_n<1>, dot16t_n<2>,  dot16t_n<3>, dot16t_n<4>,
                                             dot16t_n<5>,     dot16t_n<6>, dot16t_n<7>,  dot16t_n<8>, dot16t_n<9>,
                                             dot16t_n<10>,    dot16t_n<11>, dot16t_n<12>};

// weighted_sum_part for NQ queries over the same rows, on 512-bit registers (NZ per query): each
// element's sum is the same chain of FMAs in row order as weighted_sum_part's (the same bits), but
// each row is loaded once for all NQ, and their NQ x NZ chains keep both FMA units busy where one
// query's NZ would wait on latency. acc[j] += sum_i w[j][i] * rows[i].
template <int NZ, int NQ>
void weighted_sum_n(const float* const* w, const float* const* rows, std::int64_t n, float* const* acc) {
  __m512 a[NQ][NZ];
  for (int j = 0; j < NQ; ++j) {
    for (int v = 0; v < NZ; ++v) a[j][v] = _mm512_loadu_ps(acc[j] + 16 * v);
  }
  for (std::int64_t i = 0; i < n; ++i) {
    __m512 xw[NQ];
    for (int j = 0; j < NQ; ++j) xw[j] = _mm512_set1_ps(w[j][i]);
    const float* r = rows[i];
    for (int v = 0; v < NZ; ++v) {
      const __m512 x = _mm512_loadu_ps(r + 16 * v);
      for (int j = 0; j < NQ; ++j) a[j][v] = _mm512_fmadd_ps(xw[j], x, a[j][v]);
    }
  }
  for (int j = 0; j < NQ; ++j) {
    for (int v = 0; v < NZ; ++v) _mm512_storeu_ps(acc[j] + 16 * v, a[j][v]);
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
// Kernels that take several queries over the same rows at once (null where there is none).
using WeightedSumN = void (*)(const float* const*, const float* const*, std::int64_t, float* const*);
struct MultiQueryKernels {
  WeightedSumN sum4 = nullptr, sum2 = nullptr;  // 4 and 2 queries
};
MultiQueryKernels multi_query_kernels_for([[maybe_unused]] std::int64_t hd) {
  MultiQueryKernels m;
#if defined(__AVX512F__)
  switch (hd) {
    case 64:
      m.sum4 = weighted_sum_n<4, 4>;
      m.sum2 = weighted_sum_n<4, 2>;
      break;
    case 128: m.sum2 = weighted_sum_n<8, 2>; break;
    default: break;
  }
#endif
  return m;
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

#if !defined(__AVX512F__)
void scores_any(const float* q, const float* const* rows, std::int64_t n, std::int64_t hd, float scale, float* out) {
  std::int64_t c = 0;
#if defined(__AVX2__) && defined(__FMA__)
  if (hd % 8 == 0) {
    for (; c + 8 <= n; c += 8) dot8(q, rows + c, hd, scale, out + c);
  }
#endif
  for (; c < n; ++c) out[c] = dot_f32(q, rows[c], hd) * scale;
}
#endif

// The largest of x[0..n) (n > 0). Exact in any order, so vectorised.
float max_f32(const float* x, std::int64_t n) {
  std::int64_t i = 0;
  float m = x[0];
#if defined(__AVX2__) && defined(__FMA__)
  if (n >= 32) {
    __m256 a = _mm256_loadu_ps(x), b = _mm256_loadu_ps(x + 8), c = _mm256_loadu_ps(x + 16), d = _mm256_loadu_ps(x + 24);
    for (i = 32; i + 32 <= n; i += 32) {
      a = _mm256_max_ps(a, _mm256_loadu_ps(x + i));
      b = _mm256_max_ps(b, _mm256_loadu_ps(x + i + 8));
      c = _mm256_max_ps(c, _mm256_loadu_ps(x + i + 16));
      d = _mm256_max_ps(d, _mm256_loadu_ps(x + i + 24));
    }
    a = _mm256_max_ps(_mm256_max_ps(a, b), _mm256_max_ps(c, d));
    alignas(32) float lanes[8];
    _mm256_store_ps(lanes, a);
    m = *std::max_element(lanes, lanes + 8);
  }
#endif
  for (; i < n; ++i) m = std::max(m, x[i]);
  return m;
}

// Asks for rows[from, from + count), those of them below n (each `bytes` long), in L2 ahead of use
// (prefetcht1). A decode token's K and V rows of one KV head are short (256 bytes at head_dim 64)
// and a KV slot apart, a pattern the hardware prefetchers do not follow: without this, attention
// read its rows from DRAM at 0.31-0.37 of the bandwidth, with it 0.43-0.59 (bench_decode's attention
// cases, 2 threads, AMD EPYC; into L1 instead, prefetcht0, the misses filled the L1's miss queue: 0.27).
inline void prefetch_rows(const float* const* rows, std::int64_t from, std::int64_t count, std::int64_t n,
                          std::int64_t bytes) {
  for (std::int64_t i = from; i < std::min(from + count, n); ++i) {
    const auto* row = reinterpret_cast<const char*>(rows[i]);
    const char* end = row + bytes;
    for (const char* line = reinterpret_cast<const char*>(reinterpret_cast<std::uintptr_t>(row) & ~std::uintptr_t{63});
         line < end; line += 64) {
      __builtin_prefetch(line, 0, 2);
    }
  }
}
// How far ahead (rows) the score and V passes ask for their rows.
constexpr std::int64_t kPrefetchRows = 32;

inline std::int64_t round16(std::int64_t n) { return (n + 15) / 16 * 16; }
inline float* align64(float* p) {
  return reinterpret_cast<float*>((reinterpret_cast<std::uintptr_t>(p) + 63) & ~static_cast<std::uintptr_t>(63));
}

}  // namespace

void paged_attention(ThreadPool& pool, const AttentionPtrs& p, const AttentionShape& s) {
  const std::int64_t hd = s.head_dim;
  const std::int64_t kv_row = s.n_kv_heads * hd;
  const std::size_t elem = s.cache_type == hal::DType::kF32 ? 4 : 2;
  // Work comes in tiles: up to kTileTokens consecutive tokens of one sequence, which attend to the
  // same first rows (a prompt chunk's tokens see the same prefix), taken together so each K/V row
  // is read from memory once per tile and reused from L1 by all its queries. A token's arithmetic
  // is the same whatever tile it is in (its scores: on AVX-512 one FMA chain per row, in d order,
  // elsewhere 8 rows at a time from row 0; its V sums 32 rows at a time from row 0), so prefill and
  // decode, chunked or not, give the same bits.
  constexpr std::int64_t kTileTokens = 8;
  struct Tile {
    std::int32_t seq, first_token, n_tokens, first_pos;
  };
  std::vector<Tile> tiles;
  std::int64_t max_ctx = 0;
  for (std::int64_t q = 0; q < s.n_seqs; ++q) {
    const std::int32_t begin = p.seq_token_start[q], end = p.seq_token_start[q + 1];
    const std::int32_t first_pos = p.seq_context_len[q] - (end - begin);
    max_ctx = std::max<std::int64_t>(max_ctx, p.seq_context_len[q]);
    for (std::int32_t t = begin; t < end; t += static_cast<std::int32_t>(kTileTokens)) {
      const auto n = static_cast<std::int32_t>(std::min<std::int64_t>(kTileTokens, end - t));
      tiles.push_back({static_cast<std::int32_t>(q), t, n, first_pos + (t - begin)});
    }
  }
  // The longest tiles first, so the threads' shares even out at the end.
  std::stable_sort(tiles.begin(), tiles.end(),
                   [](const Tile& a, const Tile& b) { return a.first_pos + a.n_tokens > b.first_pos + b.n_tokens; });

  // Query heads of this rank that map to each local kv head.
  const std::int64_t n_local_kv = s.n_kv_heads;
  std::vector<std::vector<std::int64_t>> group(static_cast<std::size_t>(n_local_kv));
  for (std::int64_t h = 0; h < s.n_heads; ++h) {
    const std::int64_t g = (s.q_head_offset + h) / s.heads_per_kv - s.kv_head_offset;
    group[static_cast<std::size_t>(g)].push_back(h);
  }
  std::int64_t max_group = 0;
  for (const auto& heads : group) max_group = std::max<std::int64_t>(max_group, static_cast<std::int64_t>(heads.size()));
  const std::int64_t max_queries = kTileTokens * max_group;
  const WeightedSumPart sum_part = weighted_sum_part_for(hd);
  const MultiQueryKernels mq = multi_query_kernels_for(hd);
  const auto n_tasks = static_cast<std::int64_t>(tiles.size()) * n_local_kv;
  std::atomic<std::int64_t> next_task{0};
  pool.run_on_all([&](int /*thread*/, int /*n_thr*/) {
    // Per-thread scratch: scores and an accumulator per query of a tile, rows converted from a
    // 16-bit cache, row pointers. Kept by each pool thread from call to call (they only grow):
    // allocated per call, the worker threads' malloc arenas gave the memory back to the OS after
    // each layer and the next one faulted it in again, zeroed (a few % of a paced serving run).
    thread_local std::vector<float> buf;
    thread_local std::vector<const float*> krows, vrows;
    thread_local std::vector<float> inv_sum;
    thread_local std::vector<const float*> qptr;
    thread_local std::vector<float*> sptr;
    const bool convert = s.cache_type != hal::DType::kF32;
    // A query's scores take its tile's rows rounded up to 16 (the transposed K pass writes 16 at a
    // time), plus 16 K rows transposed (kt) and the slack to align them to 64 bytes.
    const std::int64_t floats =
        (convert ? 2 * max_ctx * hd : 0) + max_queries * (round16(max_ctx) + hd) + 16 * hd + 16;
    buf.resize(std::max(buf.size(), static_cast<std::size_t>(floats)));
    krows.resize(std::max(krows.size(), static_cast<std::size_t>(max_ctx)));
    vrows.resize(std::max(vrows.size(), static_cast<std::size_t>(max_ctx)));
    inv_sum.resize(std::max(inv_sum.size(), static_cast<std::size_t>(max_queries)));
    qptr.resize(std::max(qptr.size(), static_cast<std::size_t>(max_queries)));
    sptr.resize(std::max(sptr.size(), static_cast<std::size_t>(max_queries)));
    for (std::int64_t task = next_task++; task < n_tasks; task = next_task++) {
      const Tile& tile = tiles[static_cast<std::size_t>(task / n_local_kv)];
      const std::int64_t g = task % n_local_kv;
      const auto& heads = group[static_cast<std::size_t>(g)];
      if (heads.empty()) continue;
      const auto nh = static_cast<std::int64_t>(heads.size());
      const std::int64_t n_rows = tile.first_pos + tile.n_tokens;  // the last token's context
      const std::int64_t stride = round16(n_rows);                 // a query's scores
      float* kt = align64(buf.data());                              // [hd][16]
      float* scores = kt + 16 * hd;                                 // [query][stride]
      float* acc = scores + kTileTokens * nh * stride;              // [query][hd]
      float* kconv = acc + kTileTokens * nh * hd;
      float* vconv = kconv + n_rows * hd;
      const std::int32_t* bt = p.block_table + tile.seq * s.max_blocks_per_seq;
      for (std::int64_t c0 = 0; c0 < n_rows; c0 += s.block_size) {  // a block's rows are consecutive slots
        const std::int64_t base = static_cast<std::int64_t>(bt[c0 / s.block_size]) * s.block_size;
        const std::int64_t n_in = std::min(s.block_size, n_rows - c0);
        for (std::int64_t j = 0; j < n_in; ++j) {
          const std::int64_t c = c0 + j;
          const std::int64_t off = ((base + j) * kv_row + g * hd) * static_cast<std::int64_t>(elem);
          // The rows in the cache (for a 16-bit cache: their address only, until converted below).
          const auto sc = static_cast<std::size_t>(c);
          krows[sc] = reinterpret_cast<const float*>(static_cast<const std::byte*>(p.k_cache) + off);
          vrows[sc] = reinterpret_cast<const float*>(static_cast<const std::byte*>(p.v_cache) + off);
        }
      }
      const std::int64_t row_bytes = hd * static_cast<std::int64_t>(sizeof(float));
      if (convert) {  // to F32 rows in kconv / vconv, asking for the cache's rows ahead
        const std::int64_t src_bytes = hd * static_cast<std::int64_t>(elem);
        prefetch_rows(krows.data(), 0, kPrefetchRows, n_rows, src_bytes);
        prefetch_rows(vrows.data(), 0, kPrefetchRows, n_rows, src_bytes);
        for (std::int64_t c = 0; c < n_rows; ++c) {
          prefetch_rows(krows.data(), c + kPrefetchRows, 1, n_rows, src_bytes);
          prefetch_rows(vrows.data(), c + kPrefetchRows, 1, n_rows, src_bytes);
          const auto sc = static_cast<std::size_t>(c);
          load_row_f32(s.cache_type, krows[sc], kconv + c * hd, hd);
          load_row_f32(s.cache_type, vrows[sc], vconv + c * hd, hd);
          krows[sc] = kconv + c * hd;
          vrows[sc] = vconv + c * hd;
        }
      }
      // The F32 cache's rows are read in place, asked for ahead in each pass below (converted
      // rows are in the cache already).
      const std::int64_t ahead = convert ? 0 : kPrefetchRows;
      // Query qi = k * nh + i: token k of the tile, head i of the group, its context the token's
      // position + 1, so a token's queries see at least as many rows as the earlier ones'.
      const std::int64_t n_queries = tile.n_tokens * nh;
      auto q_at = [&](std::int64_t qi) {
        return (tile.first_token + qi / nh) * s.n_heads + heads[static_cast<std::size_t>(qi % nh)];
      };
      auto ctx_of = [&](std::int64_t qi) { return tile.first_pos + qi / nh + 1; };
      for (std::int64_t qi = 0; qi < n_queries; ++qi) {
        qptr[static_cast<std::size_t>(qi)] = p.q + q_at(qi) * hd;
        sptr[static_cast<std::size_t>(qi)] = scores + qi * stride;
      }
      // The first query that sees row r (rows before the tile's first position are seen by all).
      auto first_seeing = [&](std::int64_t r) { return std::max<std::int64_t>(0, r - tile.first_pos) * nh; };
      const float* const* kr = krows.data();
#if defined(__AVX512F__)
      // Scores: 16 K rows at a time, transposed once for all the queries of the tile that see any
      // of them (those past a query's context are computed and not used).
      prefetch_rows(kr, 0, ahead, n_rows, row_bytes);
      for (std::int64_t c = 0; c < n_rows; c += 16) {
        if (ahead > 0) prefetch_rows(kr, c + ahead, 16, n_rows, row_bytes);
        transpose_rows16(kr + c, n_rows - c, hd, kt);
        float* out[kDotQueries];
        for (std::int64_t j = first_seeing(c); j < n_queries; j += kDotQueries) {
          const auto nq = static_cast<int>(std::min<std::int64_t>(kDotQueries, n_queries - j));
          for (int x = 0; x < nq; ++x) out[x] = sptr[static_cast<std::size_t>(j + x)] + c;
          kDot16T[nq](qptr.data() + j, kt, hd, s.scale, out);
        }
      }
#else
      // Scores: every query of the tile over the same 8 K rows while they are in L1.
      prefetch_rows(kr, 0, ahead, n_rows, row_bytes);
      for (std::int64_t c = 0; c + 8 <= n_rows; c += 8) {
        if (ahead > 0) prefetch_rows(kr, c + ahead, 8, n_rows, row_bytes);
        for (std::int64_t j = first_seeing(c + 7); j < n_queries; ++j) {
          scores_any(qptr[static_cast<std::size_t>(j)], kr + c, 8, hd, s.scale, sptr[static_cast<std::size_t>(j)] + c);
        }
      }
      for (std::int64_t qi = 0; qi < n_queries; ++qi) {  // each query's last < 8 rows
        const std::int64_t c = ctx_of(qi) / 8 * 8;
        scores_any(qptr[static_cast<std::size_t>(qi)], kr + c, ctx_of(qi) - c, hd, s.scale,
                   sptr[static_cast<std::size_t>(qi)] + c);
      }
#endif
      for (std::int64_t qi = 0; qi < n_queries; ++qi) {
        const std::int64_t n_ctx = ctx_of(qi);
        float* sc = sptr[static_cast<std::size_t>(qi)];
        inv_sum[static_cast<std::size_t>(qi)] = 1.0f / exp_shifted_sum(sc, n_ctx, max_f32(sc, n_ctx));
      }
      // V: every query of the tile over the same kRowsPerPass rows, in row order, four or two
      // queries at a time where they have as many of those rows (each query's sums are the same
      // chain of FMAs whatever it is computed with).
      constexpr std::int64_t kRowsPerPass = 32;
      std::fill(acc, acc + n_queries * hd, 0.0f);
      // (The next pass's rows asked for at the start of each: kRowsPerPass ahead.)
      if (ahead > 0) prefetch_rows(vrows.data(), 0, kRowsPerPass, n_rows, row_bytes);
      for (std::int64_t r0 = 0; r0 < n_rows; r0 += kRowsPerPass) {
        if (ahead > 0) prefetch_rows(vrows.data(), r0 + kRowsPerPass, kRowsPerPass, n_rows, row_bytes);
        auto rows_of = [&](std::int64_t qi) { return std::min(kRowsPerPass, ctx_of(qi) - r0); };
        for (std::int64_t qi = first_seeing(r0); qi < n_queries;) {
          const std::int64_t n = rows_of(qi);
          std::int64_t end = qi + 1;
          while (end < n_queries && rows_of(end) == n) ++end;
          const float* w[4];
          float* ac[4];
          auto take = [&](std::int64_t j, int cnt) {
            for (int x = 0; x < cnt; ++x) {
              w[x] = sptr[static_cast<std::size_t>(j + x)] + r0;
              ac[x] = acc + (j + x) * hd;
            }
          };
          std::int64_t j = qi;
          if (mq.sum4 != nullptr) {
            for (; j + 4 <= end; j += 4) take(j, 4), mq.sum4(w, vrows.data() + r0, n, ac);
          }
          if (mq.sum2 != nullptr) {
            for (; j + 2 <= end; j += 2) take(j, 2), mq.sum2(w, vrows.data() + r0, n, ac);
          }
          for (; j < end; ++j) sum_part(sptr[static_cast<std::size_t>(j)] + r0, vrows.data() + r0, n, hd, acc + j * hd);
          qi = end;
        }
      }
      for (std::int64_t qi = 0; qi < n_queries; ++qi) {
        float* out = p.out + q_at(qi) * hd;
        const float inv = inv_sum[static_cast<std::size_t>(qi)];
        for (std::int64_t j = 0; j < hd; ++j) out[j] = acc[qi * hd + j] * inv;
      }
    }
  });
}

}  // namespace sx::cpu::SX_CPU_ISA_NS
