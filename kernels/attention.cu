// Paged causal attention over mixed prefill/decode batches (hal::AttentionArgs).
//
// One block per (token, local KV head, split of the context): the block serves every local query
// head of that KV head's group (heads_per_kv of them, in rounds of kGroup), so each K and V row is
// read once per round for the whole group, not once per query head. Positions go in tiles of 32:
// the four warps compute the group's scores (a lane per head-dimension slice, shuffled sums), then
// an online softmax per query head (running max and sum, rescaled per tile) accumulates V, each
// thread owning up to two head dimensions of each head.
//
// Decode-sized batches split each context over several blocks (backends/cuda/launch_plan.h
// plan_attention) that write partial states (accumulators, max, sum) per (token, query head,
// split), which a second kernel combines.
#include <cuda_fp16.h>

#include "kernels/common.cuh"

namespace sx::kernels {
namespace {

constexpr int kThreads = 128;  // launch_plan.h kAttentionThreads
constexpr int kWarps = kThreads / 32;
constexpr int kTile = 32;      // kAttentionTile
constexpr int kMaxHeadDim = 256;
constexpr int kGroup = 8;      // query heads a round

__device__ __forceinline__ float cache_at(const void* cache, bool f16, std::int64_t i) {
  return f16 ? __half2float(static_cast<const __half*>(cache)[i]) : static_cast<const float*>(cache)[i];
}

struct Shape {
  std::int64_t n_seqs, n_heads, n_kv_heads, head_dim, block_size, max_blocks, n_slots;
  std::int64_t q_head_offset, kv_head_offset, heads_per_kv;
  bool f16;
  float scale;
  std::int64_t splits, chunk;
};

// The partial state of (token t, local head h, split y): head_dim accumulators, max, sum.
__device__ __forceinline__ float* partial_at(float* partials, const Shape& a, std::int64_t t, std::int64_t h,
                                             std::int64_t y) {
  return partials + ((t * a.n_heads + h) * a.splits + y) * (a.head_dim + 2);
}

__global__ void __launch_bounds__(kThreads)
    attention_kernel(AttentionPtrs p, Shape a, int* err, float* partials) {
  __shared__ float q_s[kGroup][kMaxHeadDim];
  __shared__ float scores[kGroup][kTile];
  __shared__ std::int64_t slots[kTile];
  __shared__ int seq_s;
  const std::int64_t t = blockIdx.x / a.n_kv_heads, kvh = blockIdx.x % a.n_kv_heads;
  const std::int64_t y = blockIdx.y;
  // The local query heads whose KV head is kvh: global heads [g * hpk, (g + 1) * hpk) of the
  // global KV head g, shifted by this rank's first query head, within [0, n_heads).
  const std::int64_t g_kv = kvh + a.kv_head_offset;
  std::int64_t h_begin = g_kv * a.heads_per_kv - a.q_head_offset;
  std::int64_t h_end = h_begin + a.heads_per_kv;
  if (h_begin < 0) h_begin = 0;
  if (h_end > a.n_heads) h_end = a.n_heads;
  if (h_begin >= h_end) return;  // a KV head held here for another rank's query heads (same for the block)
  if (threadIdx.x == 0) {
    int s = 0;
    while (s + 1 < a.n_seqs && p.seq_token_start[s + 1] <= t) ++s;
    seq_s = s;
  }
  __syncthreads();
  const int s = seq_s;
  const std::int64_t c = p.seq_token_start[s + 1] - p.seq_token_start[s];
  const std::int64_t ctx = p.seq_context_len[s];
  if (c < 0 || ctx < c || ctx > a.max_blocks * a.block_size) {  // the same for every thread: all return
    if (threadIdx.x == 0) report_error(err, kErrAttentionContext, s, static_cast<int>(c), static_cast<int>(ctx));
    if (a.splits > 1) {  // empty partial states: the combine writes zeros, not stale memory
      for (std::int64_t h = h_begin + threadIdx.x; h < h_end; h += kThreads) {
        float* part = partial_at(partials, a, t, h, y);
        part[a.head_dim] = -INFINITY;
        part[a.head_dim + 1] = 0.0f;
      }
    }
    return;
  }
  const std::int64_t n_ctx = ctx - c + (t - p.seq_token_start[s]) + 1;  // positions [0, n_ctx)
  const std::int64_t begin = a.splits > 1 ? y * a.chunk : 0;
  const std::int64_t end = a.splits > 1 ? (begin + a.chunk < n_ctx ? begin + a.chunk : n_ctx) : n_ctx;
  const std::int32_t* table = p.block_table + s * a.max_blocks;
  const std::int64_t n_blocks = a.n_slots / a.block_size;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const std::int64_t d0 = threadIdx.x, d1 = threadIdx.x + kThreads;
  const std::int64_t hd = a.head_dim;

  for (std::int64_t h0 = h_begin; h0 < h_end; h0 += kGroup) {  // rounds of at most kGroup heads
    const int G = static_cast<int>(h_end - h0 < kGroup ? h_end - h0 : kGroup);
    __syncthreads();  // q_s of the previous round is no longer read
    for (std::int64_t i = threadIdx.x; i < G * hd; i += kThreads) {
      const std::int64_t g = i / hd, d = i % hd;
      q_s[g][d] = p.q[(t * a.n_heads + h0 + g) * hd + d];
    }
    float acc0[kGroup], acc1[kGroup], m[kGroup], l[kGroup];
#pragma unroll
    for (int g = 0; g < kGroup; ++g) acc0[g] = acc1[g] = l[g] = 0.0f, m[g] = -INFINITY;
    __syncthreads();
    for (std::int64_t tile = begin; tile < end; tile += kTile) {
      const int count = static_cast<int>(end - tile < kTile ? end - tile : kTile);
      for (int i = warp; i < count; i += kWarps) {
        const std::int64_t ps = tile + i;
        const std::int64_t bi = ps / a.block_size;
        const std::int64_t block = bi < a.max_blocks ? table[bi] : -1;
        float dot[kGroup];
#pragma unroll
        for (int g = 0; g < kGroup; ++g) dot[g] = 0.0f;
        std::int64_t slot = -1;
        if (block < 0 || block >= n_blocks) {
          if (lane == 0) report_error(err, kErrAttentionBlock, s, static_cast<int>(bi), static_cast<int>(block));
        } else {
          slot = block * a.block_size + ps % a.block_size;
          const std::int64_t base = (slot * a.n_kv_heads + kvh) * hd;
          for (std::int64_t d = lane; d < hd; d += 32) {
            const float k = cache_at(p.k_cache, a.f16, base + d);
#pragma unroll
            for (int g = 0; g < kGroup; ++g) {
              if (g < G) dot[g] = fmaf(q_s[g][d], k, dot[g]);
            }
          }
        }
#pragma unroll
        for (int g = 0; g < kGroup; ++g) {
          if (g < G) {
            const float sum = warp_sum(dot[g]);
            if (lane == 0) scores[g][i] = slot >= 0 ? sum * a.scale : -INFINITY;
          }
        }
        if (lane == 0) slots[i] = slot;
      }
      __syncthreads();
#pragma unroll
      for (int g = 0; g < kGroup; ++g) {
        if (g >= G) continue;
        float tile_max = -INFINITY;
        for (int i = 0; i < count; ++i) tile_max = fmaxf(tile_max, scores[g][i]);
        const float m_new = fmaxf(m[g], tile_max);
        if (m_new == -INFINITY) continue;  // every slot of the tile was bad (an error is latched)
        const float corr = m[g] == -INFINITY ? 0.0f : expf(m[g] - m_new);
        acc0[g] *= corr;
        acc1[g] *= corr;
        l[g] *= corr;
        m[g] = m_new;
      }
      for (int i = 0; i < count; ++i) {
        if (slots[i] < 0) continue;
        const std::int64_t base = (slots[i] * a.n_kv_heads + kvh) * hd;
        const float v0 = d0 < hd ? cache_at(p.v_cache, a.f16, base + d0) : 0.0f;
        const float v1 = d1 < hd ? cache_at(p.v_cache, a.f16, base + d1) : 0.0f;
#pragma unroll
        for (int g = 0; g < kGroup; ++g) {
          if (g < G) {
            const float w = expf(scores[g][i] - m[g]);
            l[g] += w;
            acc0[g] = fmaf(w, v0, acc0[g]);
            acc1[g] = fmaf(w, v1, acc1[g]);
          }
        }
      }
      __syncthreads();  // scores and slots are rewritten by the next tile
    }
#pragma unroll
    for (int g = 0; g < kGroup; ++g) {
      if (g >= G) continue;
      const std::int64_t h = h0 + g;
      if (a.splits > 1) {
        float* part = partial_at(partials, a, t, h, y);
        if (d0 < hd) part[d0] = acc0[g];
        if (d1 < hd) part[d1] = acc1[g];
        if (threadIdx.x == 0) {
          part[hd] = m[g];  // -inf for a split past the context: it weighs nothing in the combine
          part[hd + 1] = l[g];
        }
      } else {
        float* out = p.out + (t * a.n_heads + h) * hd;
        const float inv = l[g] > 0.0f ? 1.0f / l[g] : 0.0f;
        if (d0 < hd) out[d0] = acc0[g] * inv;
        if (d1 < hd) out[d1] = acc1[g] * inv;
      }
    }
  }
}

// out = sum_s e^(m_s - M) acc_s / sum_s e^(m_s - M) l_s over the splits of one (token, head), M the
// largest m_s (split 0 always holds position 0, so M is finite unless an error was latched).
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
  const std::int64_t blocks = a.n_tokens * a.n_kv_heads;
  if (blocks <= 0 || a.n_heads <= 0) return cudaSuccess;
  if (splits < 1 || splits > 65535 || (splits > 1 && (chunk < 1 || partials == nullptr)) ||
      a.head_dim > kMaxHeadDim) {
    return cudaErrorInvalidValue;
  }
  const Shape shape{a.n_seqs,        a.n_heads,        a.n_kv_heads,   a.head_dim, a.block_size,
                    a.max_blocks_per_seq, a.n_slots,   a.q_head_offset, a.kv_head_offset, a.heads_per_kv,
                    a.cache_type == hal::DType::kF16, a.scale, splits, chunk};
  const dim3 grid(static_cast<unsigned>(blocks), static_cast<unsigned>(splits));
  attention_kernel<<<grid, kThreads, 0, s>>>(p, shape, err, partials);
  if (splits > 1) {
    if (const cudaError_t e = cudaGetLastError(); e != cudaSuccess) return e;
    attention_combine_kernel<<<static_cast<unsigned>(a.n_tokens * a.n_heads), kThreads, 0, s>>>(partials, p.out,
                                                                                                 splits, a.head_dim);
  }
  return cudaGetLastError();
}

}  // namespace sx::kernels
