// Gated DeltaNet and gated attention (hal::SigmoidMulArgs, GatedNormArgs, ConvStateArgs,
// DeltaRuleArgs): the same algorithms as the Vulkan shaders (shaders/{sigmoid_mul, gated_norm,
// conv_state, delta_rule}.comp), kept as simple. The delta rule runs in its recurrent form, which
// the op's chunked form equals within F32 rounding: one block per (sequence, V head), thread j < d_v
// owning column j of the head's state.
#include "kernels/common.cuh"

namespace sx::kernels {
namespace {

constexpr int kThreads = 256;
constexpr int kMaxConvHistory = 7;  // hal::kMaxConvKernel - 1 (op_checks.h, which nvcc does not compile)

__global__ void sigmoid_mul_kernel(const float* x, const float* gate, float* out, std::int64_t rows, std::int64_t cols,
                                   std::int64_t xs, std::int64_t gs, std::int64_t os, bool per_row) {
  const std::int64_t n = rows * cols;
  for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    const std::int64_t r = i / cols, c = i % cols;
    const float g = gate[r * gs + (per_row ? 0 : c)];
    out[r * os + c] = x[r * xs + c] / (1.0f + expf(-g));
  }
}

// One block per row.
__global__ void gated_norm_kernel(const float* x, const float* z, const float* w, float* out, std::int64_t dim,
                                  float eps) {
  __shared__ float partial[kThreads];
  const std::int64_t base = blockIdx.x * dim;
  float ss = 0.0f;
  for (std::int64_t i = threadIdx.x; i < dim; i += kThreads) ss += x[base + i] * x[base + i];
  partial[threadIdx.x] = ss;
  __syncthreads();
  for (int s = kThreads / 2; s > 0; s >>= 1) {
    if (threadIdx.x < s) partial[threadIdx.x] += partial[threadIdx.x + s];
    __syncthreads();
  }
  const float scale = rsqrtf(partial[0] / static_cast<float>(dim) + eps);
  for (std::int64_t i = threadIdx.x; i < dim; i += kThreads) {
    const float g = z[base + i];
    out[base + i] = x[base + i] * scale * w[i] * (g / (1.0f + expf(-g)));
  }
}

// One thread per (sequence, channel), walking the sequence's tokens in order.
__global__ void conv_state_kernel(const float* x, const float* w, float* state, float* out, const std::int32_t* start,
                                  const std::int32_t* ctx, const std::int32_t* slot, std::int64_t n_seqs,
                                  std::int64_t channels, std::int64_t kernel, std::int64_t xs) {
  const std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x;
  if (i >= n_seqs * channels) return;
  const std::int64_t s = i / channels, c = i % channels, hist = kernel - 1;
  const std::int32_t t0 = start[s], t1 = start[s + 1];
  const bool fresh = ctx[s] == t1 - t0;
  float* st = state + static_cast<std::int64_t>(slot[s]) * hist * channels + c;
  float window[kMaxConvHistory];
  for (std::int64_t j = 0; j < hist; ++j) window[j] = fresh ? 0.0f : st[j * channels];
  for (std::int32_t t = t0; t < t1; ++t) {
    const float xt = x[t * xs + c];
    float acc = w[c * kernel + hist] * xt;
    for (std::int64_t j = 0; j < hist; ++j) acc += w[c * kernel + j] * window[j];
    out[t * channels + c] = acc / (1.0f + expf(-acc));
    for (std::int64_t j = 0; j + 1 < hist; ++j) window[j] = window[j + 1];
    window[hist - 1] = xt;
  }
  for (std::int64_t j = 0; j < hist; ++j) st[j * channels] = window[j];
}

struct DeltaShape {
  std::int64_t n_k, n_v, d_k, d_v, qkv, gs;
  bool tiled;
  float eps, scale;
};

__global__ void delta_rule_kernel(DeltaRulePtrs p, DeltaShape sh) {
  __shared__ float qs[kThreads], ks[kThreads], red_q[kThreads], red_k[kThreads];
  const std::int64_t s = blockIdx.x / sh.n_v, h = blockIdx.x % sh.n_v;
  const int j = threadIdx.x;
  const std::int64_t g = sh.tiled ? h % sh.n_k : h / (sh.n_v / sh.n_k);
  const std::int32_t t0 = p.seq_token_start[s], t1 = p.seq_token_start[s + 1];
  const bool fresh = p.seq_context_len[s] == t1 - t0;
  float* S = p.state + (static_cast<std::int64_t>(p.seq_slot[s]) * sh.n_v + h) * sh.d_k * sh.d_v;
  if (fresh && j < sh.d_v) {
    for (std::int64_t i = 0; i < sh.d_k; ++i) S[i * sh.d_v + j] = 0.0f;
  }
  for (std::int32_t t = t0; t < t1; ++t) {
    const std::int64_t row = static_cast<std::int64_t>(t) * sh.qkv;
    const float qv = j < sh.d_k ? p.q[row + g * sh.d_k + j] : 0.0f;
    const float kv = j < sh.d_k ? p.k[row + g * sh.d_k + j] : 0.0f;
    red_q[j] = qv * qv;
    red_k[j] = kv * kv;
    __syncthreads();
    for (int w = kThreads / 2; w > 0; w >>= 1) {
      if (j < w) {
        red_q[j] += red_q[j + w];
        red_k[j] += red_k[j + w];
      }
      __syncthreads();
    }
    qs[j] = qv * sh.scale / sqrtf(red_q[0] + sh.eps);
    ks[j] = kv / sqrtf(red_k[0] + sh.eps);
    __syncthreads();
    const std::int64_t gate = static_cast<std::int64_t>(t) * sh.gs + h;
    const float x = p.alpha[gate] + p.dt_bias[h];
    const float softplus = x > 20.0f ? x : logf(1.0f + expf(x));
    const float decay = expf(p.a[h] * softplus);
    const float b = 1.0f / (1.0f + expf(-p.beta[gate]));
    if (j < sh.d_v) {
      float sk = 0.0f;
      for (std::int64_t i = 0; i < sh.d_k; ++i) sk += S[i * sh.d_v + j] * ks[i];
      const float u = b * (p.v[row + h * sh.d_v + j] - decay * sk);
      float acc = 0.0f;
      for (std::int64_t i = 0; i < sh.d_k; ++i) {
        const float nv = decay * S[i * sh.d_v + j] + ks[i] * u;
        S[i * sh.d_v + j] = nv;
        acc += nv * qs[i];
      }
      p.out[(static_cast<std::int64_t>(t) * sh.n_v + h) * sh.d_v + j] = acc;
    }
    __syncthreads();  // qs / ks / red_* are rewritten by the next token
  }
}

}  // namespace

cudaError_t launch_sigmoid_mul(cudaStream_t s, const hal::SigmoidMulArgs& a, const float* x, const float* gate,
                               float* out) {
  if (a.n_rows <= 0 || a.n_cols <= 0) return cudaSuccess;
  const std::int64_t xs = a.x_stride > 0 ? a.x_stride : a.n_cols;
  const std::int64_t gs = a.gate_stride > 0 ? a.gate_stride : (a.gate_per_row ? 1 : a.n_cols);
  const std::int64_t os = a.out_stride > 0 ? a.out_stride : a.n_cols;
  sigmoid_mul_kernel<<<grid_for(a.n_rows * a.n_cols, kThreads), kThreads, 0, s>>>(x, gate, out, a.n_rows, a.n_cols,
                                                                                  xs, gs, os, a.gate_per_row);
  return cudaGetLastError();
}

cudaError_t launch_gated_norm(cudaStream_t s, const hal::GatedNormArgs& a, const float* x, const float* z,
                              const float* weight, float* out) {
  if (a.n_rows <= 0) return cudaSuccess;
  gated_norm_kernel<<<static_cast<unsigned>(a.n_rows), kThreads, 0, s>>>(x, z, weight, out, a.dim, a.eps);
  return cudaGetLastError();
}

cudaError_t launch_conv_state(cudaStream_t s, const hal::ConvStateArgs& a, const ConvStatePtrs& p) {
  if (a.n_seqs <= 0) return cudaSuccess;
  const std::int64_t n = a.n_seqs * a.channels;
  const std::int64_t xs = a.x_stride > 0 ? a.x_stride : a.channels;
  conv_state_kernel<<<static_cast<unsigned>((n + kThreads - 1) / kThreads), kThreads, 0, s>>>(
      p.x, p.weight, p.state, p.out, p.seq_token_start, p.seq_context_len, p.seq_slot, a.n_seqs, a.channels, a.kernel,
      xs);
  return cudaGetLastError();
}

cudaError_t launch_delta_rule(cudaStream_t s, const hal::DeltaRuleArgs& a, const DeltaRulePtrs& p) {
  if (a.n_seqs <= 0) return cudaSuccess;
  DeltaShape sh{a.n_k_heads, a.n_v_heads, a.d_k, a.d_v,
                a.qkv_stride > 0 ? a.qkv_stride : 2 * a.n_k_heads * a.d_k + a.n_v_heads * a.d_v,
                a.gate_stride > 0 ? a.gate_stride : a.n_v_heads, a.tiled, a.eps, a.scale};
  delta_rule_kernel<<<static_cast<unsigned>(a.n_seqs * a.n_v_heads), kThreads, 0, s>>>(p, sh);
  return cudaGetLastError();
}

}  // namespace sx::kernels
