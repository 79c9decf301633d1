// Paged causal attention over mixed prefill/decode batches (hal::AttentionArgs): one block per
// (token, query head) and split of its context; positions in tiles of 32 whose scores the four
// warps compute (a lane per head dimension slice, shuffled sums), then an online softmax (running
// max and sum, rescaled per tile) accumulates V, each thread owning up to two head dimensions.
// Decode-sized batches split each context over several blocks (backends/cuda/launch_plan.h
// plan_attention) that write partial states (max, sum, accumulator), combined by a second kernel.
// Simple before fast: K/V are read once per query head (the group's heads read them again from L2).
#include <cuda_fp16.h>

#include "kernels/common.cuh"

namespace sx::kernels {
namespace {

constexpr int kThreads = 128;  // launch_plan.h kAttentionThreads
constexpr int kTile = 32;      // kAttentionTile
constexpr int kMaxHeadDim = 256;

__device__ __forceinline__ float cache_at(const void* cache, bool f16, std::int64_t i) {
  return f16 ? __half2float(static_cast<const __half*>(cache)[i]) : static_cast<const float*>(cache)[i];
}

// Split blockIdx.y of `splits` covers positions [y * chunk, (y + 1) * chunk) of the context (all of
// it when splits == 1, written to out; else the partial state goes to partials[block][y]: head_dim
// accumulators, then the max and the sum).
__global__ void attention_kernel(AttentionPtrs p, std::int64_t n_seqs, std::int64_t n_heads, std::int64_t n_kv_heads,
                                 std::int64_t head_dim, std::int64_t block_size, std::int64_t max_blocks,
                                 std::int64_t n_slots, std::int64_t q_head_offset, std::int64_t kv_head_offset,
                                 std::int64_t heads_per_kv, bool f16, float scale, int* err, std::int64_t splits,
                                 std::int64_t chunk, float* partials) {
  __shared__ float q_s[kMaxHeadDim];
  __shared__ float scores[kTile];
  __shared__ std::int64_t slots[kTile];
  __shared__ int seq_s;
  const std::int64_t t = blockIdx.x / n_heads, h = blockIdx.x % n_heads;
  if (threadIdx.x == 0) {
    int s = 0;
    while (s + 1 < n_seqs && p.seq_token_start[s + 1] <= t) ++s;
    seq_s = s;
  }
  const float* q = p.q + (t * n_heads + h) * head_dim;
  for (std::int64_t d = threadIdx.x; d < head_dim; d += kThreads) q_s[d] = q[d];
  __syncthreads();
  const int s = seq_s;
  const std::int64_t c = p.seq_token_start[s + 1] - p.seq_token_start[s];
  const std::int64_t ctx = p.seq_context_len[s];
  if (c < 0 || ctx < c || ctx > max_blocks * block_size) {  // the same for every thread: all return
    if (threadIdx.x == 0) {
      report_error(err, kErrAttentionContext, s, static_cast<int>(c), static_cast<int>(ctx));
      if (splits > 1) {  // an empty partial state: the combine writes zeros, not stale memory
        float* part = partials + (static_cast<std::int64_t>(blockIdx.x) * splits + blockIdx.y) * (head_dim + 2);
        part[head_dim] = -INFINITY;
        part[head_dim + 1] = 0.0f;
      }
    }
    return;
  }
  const std::int64_t pos = ctx - c + (t - p.seq_token_start[s]);
  const std::int64_t n_ctx = pos + 1;
  const std::int64_t kvh = (q_head_offset + h) / heads_per_kv - kv_head_offset;
  const std::int32_t* table = p.block_table + s * max_blocks;
  const std::int64_t n_blocks = n_slots / block_size;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const std::int64_t d0 = threadIdx.x, d1 = threadIdx.x + kThreads;
  float acc0 = 0.0f, acc1 = 0.0f, m = -INFINITY, l = 0.0f;
  const std::int64_t begin = splits > 1 ? blockIdx.y * chunk : 0;
  const std::int64_t end = splits > 1 ? (begin + chunk < n_ctx ? begin + chunk : n_ctx) : n_ctx;
  for (std::int64_t tile = begin; tile < end; tile += kTile) {
    const int count = static_cast<int>(end - tile < kTile ? end - tile : kTile);
    for (int i = warp; i < count; i += kThreads / 32) {
      const std::int64_t ps = tile + i;
      const std::int64_t bi = ps / block_size;
      const std::int64_t block = bi < max_blocks ? table[bi] : -1;
      float dot = 0.0f;
      std::int64_t slot = -1;
      if (block < 0 || block >= n_blocks) {
        if (lane == 0) report_error(err, kErrAttentionBlock, s, static_cast<int>(bi), static_cast<int>(block));
      } else {
        slot = block * block_size + ps % block_size;
        const std::int64_t base = (slot * n_kv_heads + kvh) * head_dim;
        for (std::int64_t d = lane; d < head_dim; d += 32) dot = fmaf(q_s[d], cache_at(p.k_cache, f16, base + d), dot);
      }
      dot = warp_sum(dot);
      if (lane == 0) {
        scores[i] = slot >= 0 ? dot * scale : -INFINITY;
        slots[i] = slot;
      }
    }
    __syncthreads();
    float tile_max = -INFINITY;
    for (int i = 0; i < count; ++i) tile_max = fmaxf(tile_max, scores[i]);
    const float m_new = fmaxf(m, tile_max);
    if (m_new != -INFINITY) {
      const float corr = m == -INFINITY ? 0.0f : expf(m - m_new);
      acc0 *= corr;
      acc1 *= corr;
      l *= corr;
      for (int i = 0; i < count; ++i) {
        if (slots[i] < 0) continue;
        const float w = expf(scores[i] - m_new);
        l += w;
        const std::int64_t base = (slots[i] * n_kv_heads + kvh) * head_dim;
        if (d0 < head_dim) acc0 = fmaf(w, cache_at(p.v_cache, f16, base + d0), acc0);
        if (d1 < head_dim) acc1 = fmaf(w, cache_at(p.v_cache, f16, base + d1), acc1);
      }
      m = m_new;
    }
    __syncthreads();  // scores and slots are rewritten by the next tile
  }
  if (splits > 1) {
    float* part = partials + (static_cast<std::int64_t>(blockIdx.x) * splits + blockIdx.y) * (head_dim + 2);
    if (d0 < head_dim) part[d0] = acc0;
    if (d1 < head_dim) part[d1] = acc1;
    if (threadIdx.x == 0) {
      part[head_dim] = m;  // -inf for a split past the context: it weighs nothing below
      part[head_dim + 1] = l;
    }
    return;
  }
  float* out = p.out + (t * n_heads + h) * head_dim;
  const float inv = l > 0.0f ? 1.0f / l : 0.0f;
  if (d0 < head_dim) out[d0] = acc0 * inv;
  if (d1 < head_dim) out[d1] = acc1 * inv;
}

// out = sum_s e^(m_s - M) acc_s / sum_s e^(m_s - M) l_s over the splits of one (token, head), M the
// largest m_s (split 0 always holds position 0, so M is finite).
__global__ void attention_combine_kernel(const float* partials, float* out, std::int64_t splits, std::int64_t head_dim) {
  const float* part = partials + static_cast<std::int64_t>(blockIdx.x) * splits * (head_dim + 2);
  float mx = -INFINITY;
  for (std::int64_t s = 0; s < splits; ++s) mx = fmaxf(mx, part[s * (head_dim + 2) + head_dim]);
  float sum = 0.0f;
  for (std::int64_t s = 0; s < splits; ++s) {
    const float ms = part[s * (head_dim + 2) + head_dim];
    if (ms != -INFINITY) sum += expf(ms - mx) * part[s * (head_dim + 2) + head_dim + 1];
  }
  const float inv = sum > 0.0f ? 1.0f / sum : 0.0f;
  for (std::int64_t d = threadIdx.x; d < head_dim; d += blockDim.x) {
    float acc = 0.0f;
    for (std::int64_t s = 0; s < splits; ++s) {
      const float ms = part[s * (head_dim + 2) + head_dim];
      if (ms != -INFINITY) acc = fmaf(expf(ms - mx), part[s * (head_dim + 2) + d], acc);
    }
    out[static_cast<std::int64_t>(blockIdx.x) * head_dim + d] = acc * inv;
  }
}

}  // namespace

cudaError_t launch_attention(cudaStream_t s, const hal::AttentionArgs& a, const AttentionPtrs& p, int* err,
                             std::int64_t splits, std::int64_t chunk, float* partials) {
  const std::int64_t blocks = a.n_tokens * a.n_heads;
  if (blocks <= 0) return cudaSuccess;
  if (splits < 1 || (splits > 1 && (chunk < 1 || partials == nullptr))) return cudaErrorInvalidValue;
  const dim3 grid(static_cast<unsigned>(blocks), static_cast<unsigned>(splits));
  attention_kernel<<<grid, kThreads, 0, s>>>(p, a.n_seqs, a.n_heads, a.n_kv_heads, a.head_dim, a.block_size,
                                             a.max_blocks_per_seq, a.n_slots, a.q_head_offset, a.kv_head_offset,
                                             a.heads_per_kv, a.cache_type == hal::DType::kF16, a.scale, err, splits,
                                             chunk, partials);
  if (splits > 1) {
    if (const cudaError_t e = cudaGetLastError(); e != cudaSuccess) return e;
    attention_combine_kernel<<<static_cast<unsigned>(blocks), kThreads, 0, s>>>(partials, p.out, splits, a.head_dim);
  }
  return cudaGetLastError();
}

}  // namespace sx::kernels
