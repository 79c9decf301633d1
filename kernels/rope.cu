// NeoX rotary embedding in place (hal::RopeArgs). Angles in double, like the CPU reference
// (backends/cpu/ops/rope.cpp): inv_freq = theta^(-2i/rot_dim), angle = pos * inv_freq, cos and sin
// rounded to float, then the rotation in float.
#include "kernels/common.cuh"

namespace sx::kernels {
namespace {

__global__ void rope_kernel(float* x, const std::int32_t* positions, std::int64_t n_tokens, std::int64_t n_heads,
                            std::int64_t head_dim, std::int64_t half, double theta, double rot_dim) {
  const std::int64_t n = n_tokens * n_heads * half;
  for (std::int64_t idx = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; idx < n;
       idx += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    const std::int64_t i = idx % half, th = idx / half, t = th / n_heads;
    const double inv_freq = pow(theta, -2.0 * static_cast<double>(i) / rot_dim);
    const double angle = static_cast<double>(positions[t]) * inv_freq;
    const float cs = static_cast<float>(cos(angle)), sn = static_cast<float>(sin(angle));
    float* v = x + th * head_dim;
    const float a = v[i], b = v[i + half];
    v[i] = a * cs - b * sn;
    v[i + half] = a * sn + b * cs;
  }
}

}  // namespace

cudaError_t launch_rope(cudaStream_t s, const hal::RopeArgs& a, float* x, const std::int32_t* positions) {
  const std::int64_t half = a.rot_dim / 2;
  const std::int64_t n = a.n_tokens * a.n_heads * half;
  if (n <= 0) return cudaSuccess;
  rope_kernel<<<grid_for(n, 256), 256, 0, s>>>(x, positions, a.n_tokens, a.n_heads, a.head_dim, half,
                                                static_cast<double>(a.theta), static_cast<double>(a.rot_dim));
  return cudaGetLastError();
}

}  // namespace sx::kernels
