// rmsnorm with the fused residual add (hal::RmsNormArgs): one block per row; the sum of squares
// in double, like the CPU reference (backends/cpu/ops/norm.cpp).
#include <algorithm>

#include "kernels/common.cuh"

namespace sx::kernels {
namespace {

constexpr int kThreads = 256;

__global__ void rmsnorm_kernel(float* x, const float* add, const float* weight, float* out, std::int64_t dim,
                               float eps) {
  __shared__ double partial[kThreads / 32];
  __shared__ float scale_s;
  float* xr = x + blockIdx.x * dim;
  double ss = 0.0;
  for (std::int64_t i = threadIdx.x; i < dim; i += kThreads) {
    float v = xr[i];
    if (add != nullptr) {
      v += add[blockIdx.x * dim + i];
      xr[i] = v;
    }
    ss += static_cast<double>(v) * v;
  }
  ss = warp_sum(ss);
  if (threadIdx.x % 32 == 0) partial[threadIdx.x / 32] = ss;
  __syncthreads();
  if (threadIdx.x == 0) {
    double t = 0.0;
    for (int w = 0; w < kThreads / 32; ++w) t += partial[w];
    scale_s = 1.0f / sqrtf(static_cast<float>(t / static_cast<double>(dim)) + eps);
  }
  __syncthreads();
  const float scale = scale_s;
  float* o = out + blockIdx.x * dim;
  for (std::int64_t i = threadIdx.x; i < dim; i += kThreads) o[i] = xr[i] * scale * weight[i];
}

}  // namespace

cudaError_t launch_rmsnorm(cudaStream_t s, const hal::RmsNormArgs& a, float* x, const float* add, const float* weight,
                           float* out) {
  if (a.n_rows <= 0) return cudaSuccess;
  // Rows beyond the grid limit run in further launches.
  for (std::int64_t r = 0; r < a.n_rows; r += 65535LL * 1024) {
    const std::int64_t rows = std::min<std::int64_t>(a.n_rows - r, 65535LL * 1024);
    rmsnorm_kernel<<<static_cast<unsigned>(rows), kThreads, 0, s>>>(
        x + r * a.dim, add != nullptr ? add + r * a.dim : nullptr, weight, out + r * a.dim, a.dim, a.eps);
  }
  return cudaGetLastError();
}

}  // namespace sx::kernels
