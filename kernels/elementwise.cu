// add and silu(gate) * up (hal::AddArgs, hal::SiluMulArgs).
#include "kernels/common.cuh"

namespace sx::kernels {
namespace {

__global__ void add_kernel(const float* a, const float* b, float* out, std::int64_t n) {
  for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    out[i] = a[i] + b[i];
  }
}

__global__ void silu_mul_kernel(const float* gate, const float* up, float* out, std::int64_t rows, std::int64_t cols,
                                std::int64_t gs, std::int64_t us, std::int64_t os) {
  const std::int64_t n = rows * cols;
  for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    const std::int64_t r = i / cols, c = i % cols;
    const float g = gate[r * gs + c];
    out[r * os + c] = g / (1.0f + expf(-g)) * up[r * us + c];
  }
}

__global__ void add_bias_kernel(float* y, const float* bias, std::int64_t m, std::int64_t n) {
  const std::int64_t total = m * n;
  for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    y[i] += bias[i % n];
  }
}

}  // namespace

cudaError_t launch_add(cudaStream_t s, const hal::AddArgs& a, const float* x, const float* y, float* out) {
  if (a.n <= 0) return cudaSuccess;
  add_kernel<<<grid_for(a.n, 256), 256, 0, s>>>(x, y, out, a.n);
  return cudaGetLastError();
}

cudaError_t launch_silu_mul(cudaStream_t s, const hal::SiluMulArgs& a, const float* gate, const float* up, float* out) {
  if (a.n_rows <= 0 || a.n_cols <= 0) return cudaSuccess;
  const std::int64_t gs = a.gate_stride > 0 ? a.gate_stride : a.n_cols;
  const std::int64_t us = a.up_stride > 0 ? a.up_stride : a.n_cols;
  const std::int64_t os = a.out_stride > 0 ? a.out_stride : a.n_cols;
  silu_mul_kernel<<<grid_for(a.n_rows * a.n_cols, 256), 256, 0, s>>>(gate, up, out, a.n_rows, a.n_cols, gs, us, os);
  return cudaGetLastError();
}

cudaError_t launch_add_bias(cudaStream_t s, float* y, const float* bias, std::int64_t m, std::int64_t n) {
  if (m <= 0 || n <= 0) return cudaSuccess;
  add_bias_kernel<<<grid_for(m * n, 256), 256, 0, s>>>(y, bias, m, n);
  return cudaGetLastError();
}

}  // namespace sx::kernels
