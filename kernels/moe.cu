// The mixture-of-experts ops (hal::MoeRouterArgs, hal::MoeFfnArgs), kept as simple as the
// Vulkan shaders they mirror (shaders/moe_*.comp, matmul.comp's MOE variant):
// - router: one block per token: softmax max and sum reduced in shared memory, then k passes that
//   each take the most probable expert after the previous pass's in top_k_before's order, and the
//   chosen probabilities as weights (renormalised when asked);
// - ffn: route (one thread per local expert lists the slots t * k + j choosing it, in token
//   order), then per stacked matrix one warp per expert row over tiles of up to kTile of its
//   routed slots (each weight row read once per tile, dequantised element by element through
//   dequant.cuh, F32 activations), silu(gate) * up, the down matrix the same way, and the
//   weighted sum of each token's choices held here (zero when none).
#include <algorithm>

#include "kernels/common.cuh"
#include "kernels/dequant.cuh"

namespace sx::kernels {
namespace {

constexpr int kThreads = 256;
constexpr int kWarps = 4;  // expert rows per block of the matmul
constexpr int kTile = 8;   // routed slots per block of the matmul

__global__ void moe_router_kernel(const float* logits, std::int32_t* ids, float* weights, int n_experts, int k,
                                  bool normalize) {
  __shared__ float sv[kThreads];
  __shared__ int si[kThreads];
  __shared__ float chosen[64];  // hal::kMaxTopK
  const float* row = logits + static_cast<std::int64_t>(blockIdx.x) * n_experts;
  const int t = threadIdx.x;
  float mx = -INFINITY;
  for (int c = t; c < n_experts; c += kThreads) mx = fmaxf(mx, row[c]);
  sv[t] = mx;
  __syncthreads();
  for (int s = kThreads / 2; s > 0; s >>= 1) {
    if (t < s) sv[t] = fmaxf(sv[t], sv[t + s]);
    __syncthreads();
  }
  mx = sv[0];
  __syncthreads();
  float sum = 0.0f;
  for (int c = t; c < n_experts; c += kThreads) sum += expf(row[c] - mx);
  sv[t] = sum;
  __syncthreads();
  for (int s = kThreads / 2; s > 0; s >>= 1) {
    if (t < s) sv[t] += sv[t + s];
    __syncthreads();
  }
  sum = sv[0];
  __syncthreads();
  float last_v = 0.0f;
  int last_i = -1;
  for (int pass = 0; pass < k; ++pass) {
    float bv = 0.0f;
    int bi = -1;
    for (int c = t; c < n_experts; c += kThreads) {
      const float v = expf(row[c] - mx) / sum;
      if (last_i >= 0 && !top_k_before(last_v, last_i, v, c)) continue;  // taken by an earlier pass
      if (bi < 0 || top_k_before(v, c, bv, bi)) {
        bv = v;
        bi = c;
      }
    }
    sv[t] = bv;
    si[t] = bi;
    __syncthreads();
    for (int s = kThreads / 2; s > 0; s >>= 1) {
      if (t < s && si[t + s] >= 0 && (si[t] < 0 || top_k_before(sv[t + s], si[t + s], sv[t], si[t]))) {
        sv[t] = sv[t + s];
        si[t] = si[t + s];
      }
      __syncthreads();
    }
    last_v = sv[0];
    last_i = si[0];
    if (t == 0) {
      chosen[pass] = last_v;
      ids[static_cast<std::int64_t>(blockIdx.x) * k + pass] = last_i;
    }
    __syncthreads();
  }
  if (t == 0) {
    float total = 0.0f;
    for (int r = 0; r < k; ++r) total += chosen[r];
    for (int r = 0; r < k; ++r) {
      weights[static_cast<std::int64_t>(blockIdx.x) * k + r] = normalize && total > 0.0f ? chosen[r] / total : chosen[r];
    }
  }
}

__global__ void moe_route_kernel(const std::int32_t* ids, std::int64_t n_slots, std::int64_t cap, int expert_begin,
                                 int n_local, std::int32_t* routes, std::int32_t* counts) {
  const int e = blockIdx.x * blockDim.x + threadIdx.x;
  if (e >= n_local) return;
  std::int64_t n = 0;
  for (std::int64_t s = 0; s < n_slots && n < cap; ++s) {
    if (ids[s] == expert_begin + e) routes[e * cap + n++] = static_cast<std::int32_t>(s);
  }
  counts[e] = static_cast<std::int32_t>(n);
}

// y[slot][row] = W_e[row] . x[slot / x_div] for the routed slots of expert e = blockIdx.z.
__global__ void __launch_bounds__(kWarps * 32)
    moe_matmul_kernel(const std::uint8_t* w, int type, std::size_t row_bytes, std::int64_t rows, std::int64_t cols,
                      const float* x, int x_div, float* y, const std::int32_t* routes, const std::int32_t* counts,
                      std::int64_t cap) {
  const std::int64_t row = blockIdx.x * static_cast<std::int64_t>(kWarps) + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  const std::int64_t e = blockIdx.z, m0 = static_cast<std::int64_t>(blockIdx.y) * kTile;
  const std::int64_t routed = counts[e];
  if (row >= rows || m0 >= routed) return;  // whole warps
  const int n = static_cast<int>(min(static_cast<std::int64_t>(kTile), routed - m0));
  std::int64_t slot[kTile];
#pragma unroll
  for (int i = 0; i < kTile; ++i) slot[i] = i < n ? routes[e * cap + m0 + i] : 0;
  const std::uint8_t* wr = w + (e * rows + row) * row_bytes;
  float acc[kTile];
#pragma unroll
  for (int i = 0; i < kTile; ++i) acc[i] = 0.0f;
  for (std::int64_t j = lane; j < cols; j += 32) {
    const float v = dequant_element(type, wr, j);
#pragma unroll
    for (int i = 0; i < kTile; ++i) {
      if (i < n) acc[i] = fmaf(v, x[(slot[i] / x_div) * cols + j], acc[i]);
    }
  }
#pragma unroll
  for (int i = 0; i < kTile; ++i) {
    if (i < n) {
      const float s = warp_sum(acc[i]);
      if (lane == 0) y[slot[i] * rows + row] = s;
    }
  }
}

__global__ void moe_combine_kernel(const float* y, const std::int32_t* ids, const float* weights, float* out,
                                   std::int64_t n_tokens, std::int64_t dim, int k, int expert_begin, int n_local) {
  const std::int64_t total = n_tokens * dim;
  for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    const std::int64_t t = i / dim, c = i % dim;
    float acc = 0.0f;
    for (int j = 0; j < k; ++j) {
      const std::int64_t s = t * k + j;
      const int e = ids[s] - expert_begin;
      if (e >= 0 && e < n_local) acc = fmaf(weights[s], y[s * dim + c], acc);
    }
    out[i] = acc;
  }
}

}  // namespace

cudaError_t launch_moe_router(cudaStream_t s, const hal::MoeRouterArgs& a, const float* logits, std::int32_t* ids,
                              float* weights) {
  for (std::int64_t r = 0; r < a.n_tokens; r += 65535LL * 1024) {
    const std::int64_t rows = std::min<std::int64_t>(a.n_tokens - r, 65535LL * 1024);
    moe_router_kernel<<<static_cast<unsigned>(rows), kThreads, 0, s>>>(
        logits + r * a.n_experts, ids + r * a.k, weights + r * a.k, static_cast<int>(a.n_experts),
        static_cast<int>(a.k), a.normalize);
  }
  return cudaGetLastError();
}

cudaError_t launch_moe_ffn(cudaStream_t s, const hal::MoeFfnArgs& a, const MoePtrs& p, const MoeScratch& ws) {
  if (a.n_tokens <= 0) return cudaSuccess;
  if (a.n_local == 0) return cudaMemsetAsync(p.out, 0, static_cast<std::size_t>(a.n_tokens * a.dim) * 4, s);
  const std::int64_t slots = a.n_tokens * a.k, cap = a.n_tokens;
  if (a.n_local > 65535 || (cap + kTile - 1) / kTile > 65535) return cudaErrorInvalidValue;  // the stream checks
  moe_route_kernel<<<static_cast<unsigned>((a.n_local + 63) / 64), 64, 0, s>>>(
      p.ids, slots, cap, static_cast<int>(a.expert_begin), static_cast<int>(a.n_local), ws.routes, ws.counts);
  auto matmul = [&](const std::uint8_t* w, hal::DType type, std::int64_t rows, std::int64_t cols, const float* x,
                    int x_div, float* y) {
    const int t = static_cast<int>(type);
    const std::size_t rb = static_cast<std::size_t>(cols / block_elems(t)) * static_cast<std::size_t>(block_bytes(t));
    const dim3 grid(static_cast<unsigned>((rows + kWarps - 1) / kWarps), static_cast<unsigned>((cap + kTile - 1) / kTile),
                    static_cast<unsigned>(a.n_local));
    moe_matmul_kernel<<<grid, kWarps * 32, 0, s>>>(w, t, rb, rows, cols, x, x_div, y, ws.routes, ws.counts, cap);
  };
  const int k = static_cast<int>(a.k);
  matmul(p.gate, a.gate_type, a.ffn, a.dim, p.x, k, ws.gate);
  matmul(p.up, a.up_type, a.ffn, a.dim, p.x, k, ws.up);
  hal::SiluMulArgs act;
  act.n_rows = slots;
  act.n_cols = a.ffn;
  if (const cudaError_t e = launch_silu_mul(s, act, ws.gate, ws.up, ws.gate); e != cudaSuccess) return e;
  matmul(p.down, a.down_type, a.dim, a.ffn, ws.gate, 1, ws.down);
  moe_combine_kernel<<<grid_for(a.n_tokens * a.dim, 256), 256, 0, s>>>(ws.down, p.ids, p.weights, p.out, a.n_tokens,
                                                                       a.dim, k, static_cast<int>(a.expert_begin),
                                                                       static_cast<int>(a.n_local));
  return cudaGetLastError();
}

}  // namespace sx::kernels
