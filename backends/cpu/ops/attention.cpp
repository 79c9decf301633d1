// Paged KV write and causal grouped-query attention over paged KV blocks (mixed prefill/decode).
#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "backends/cpu/ops/cpu_ops.h"
#include "runtime/base/half.h"

namespace sx::cpu {

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
  const int n_threads = pool.size();
  // Per-thread scratch: scores for the longest context, and one converted K/V row.
  std::int64_t max_ctx = 0;
  for (std::int64_t q = 0; q < s.n_seqs; ++q) max_ctx = std::max<std::int64_t>(max_ctx, p.seq_context_len[q]);
  std::vector<std::vector<float>> scratch(static_cast<std::size_t>(n_threads));

  // One task per (token, local kv head): all query heads of the group share the K/V rows.
  const std::int64_t n_local_kv = s.n_kv_heads;
  // Query heads of this rank that map to local kv head g.
  std::vector<std::vector<std::int64_t>> group(static_cast<std::size_t>(n_local_kv));
  for (std::int64_t h = 0; h < s.n_heads; ++h) {
    const std::int64_t g = (s.q_head_offset + h) / s.heads_per_kv - s.kv_head_offset;
    group[static_cast<std::size_t>(g)].push_back(h);
  }
  pool.run_on_all([&](int thread, int n_thr) {
    std::vector<float>& buf = scratch[static_cast<std::size_t>(thread)];
    const std::int64_t max_group = s.heads_per_kv;
    buf.resize(static_cast<std::size_t>(max_ctx * max_group + 2 * hd + max_group * hd));
    float* scores = buf.data();
    float* krow = scores + max_ctx * max_group;
    float* vrow = krow + hd;
    float* acc = vrow + hd;
    const std::int64_t n_tasks = s.n_tokens * n_local_kv;
    for (std::int64_t task = thread; task < n_tasks; task += n_thr) {
      const std::int64_t t = task / n_local_kv;
      const std::int64_t g = task % n_local_kv;
      const auto& heads = group[static_cast<std::size_t>(g)];
      if (heads.empty()) continue;
      const std::int64_t ng = static_cast<std::int64_t>(heads.size());
      const SeqToken st = tokens[static_cast<std::size_t>(t)];
      const std::int32_t* bt = p.block_table + st.seq * s.max_blocks_per_seq;
      const std::int64_t n_ctx = st.pos + 1;
      float maxv[64];
      for (std::int64_t j = 0; j < ng; ++j) maxv[j] = -INFINITY;
      for (std::int64_t c = 0; c < n_ctx; ++c) {
        const std::int64_t slot = static_cast<std::int64_t>(bt[c / s.block_size]) * s.block_size + c % s.block_size;
        const std::byte* kp = static_cast<const std::byte*>(p.k_cache) + (slot * kv_row + g * hd) * static_cast<std::int64_t>(elem);
        const float* kr;
        if (s.cache_type == hal::DType::kF32) {
          kr = reinterpret_cast<const float*>(kp);
        } else {
          load_row_f32(s.cache_type, kp, krow, hd);
          kr = krow;
        }
        for (std::int64_t j = 0; j < ng; ++j) {
          const float* qv = p.q + (t * s.n_heads + heads[static_cast<std::size_t>(j)]) * hd;
          const float sc = dot_f32(qv, kr, hd) * s.scale;
          scores[j * n_ctx + c] = sc;
          maxv[j] = std::max(maxv[j], sc);
        }
      }
      float inv_sum[64];
      for (std::int64_t j = 0; j < ng; ++j) {
        float sum = 0.0f;
        float* sc = scores + j * n_ctx;
        for (std::int64_t c = 0; c < n_ctx; ++c) {
          sc[c] = std::exp(sc[c] - maxv[j]);
          sum += sc[c];
        }
        inv_sum[j] = 1.0f / sum;
      }
      std::fill(acc, acc + ng * hd, 0.0f);
      for (std::int64_t c = 0; c < n_ctx; ++c) {
        const std::int64_t slot = static_cast<std::int64_t>(bt[c / s.block_size]) * s.block_size + c % s.block_size;
        const std::byte* vp = static_cast<const std::byte*>(p.v_cache) + (slot * kv_row + g * hd) * static_cast<std::int64_t>(elem);
        const float* vr;
        if (s.cache_type == hal::DType::kF32) {
          vr = reinterpret_cast<const float*>(vp);
        } else {
          load_row_f32(s.cache_type, vp, vrow, hd);
          vr = vrow;
        }
        for (std::int64_t j = 0; j < ng; ++j) axpy_f32(scores[j * n_ctx + c], vr, acc + j * hd, hd);
      }
      for (std::int64_t j = 0; j < ng; ++j) {
        float* o = p.out + (t * s.n_heads + heads[static_cast<std::size_t>(j)]) * hd;
        for (std::int64_t i = 0; i < hd; ++i) o[i] = acc[j * hd + i] * inv_sum[j];
      }
    }
  });
}

}  // namespace sx::cpu
