// Q8_0 matmul with 8-bit activations, exactly as the CPU computes it (backends/cpu/kernels/
// matmul.h, matmul_reference_q8_activations): each row of x quantised per block of 32 (d = max|x|
// / 127, q = round-to-nearest-even(x / d) through the reciprocal, as quantize_activations_q8),
// then per weight row and x row an exact int32 dot product per block and
// acc = fma(float(dot), d_w * d_x, acc) in block order, then + bias: the CPU's results to the bit
// (tests/ops Q8_0MatmulQuantisesActivationsAsTheCpuDoes), so a Q8_0 model gives its greedy ids.
#include "kernels/common.cuh"
#include "kernels/dequant.cuh"

namespace sx::kernels {
namespace {

constexpr int kWarps = 4;      // gemm: one warp per weight row, 4 rows a block
constexpr int kRowsPerY = 8;   // gemm: x rows per block row (grid.y)

// One warp per block of 32 activations.
__global__ void quantize_q8_kernel(const float* x, std::int64_t blocks, std::int8_t* qs, float* d) {
  const std::int64_t b = blockIdx.x * static_cast<std::int64_t>(blockDim.x / 32) + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (b >= blocks) return;  // whole warps: b is the same for every lane of one
  const float v = x[b * 32 + lane];
  float amax = fabsf(v);
  for (int o = 16; o > 0; o >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
  const float dd = amax / 127.0f;
  const float id = dd != 0.0f ? 1.0f / dd : 0.0f;
  qs[b * 32 + lane] = static_cast<std::int8_t>(__float2int_rn(v * id));
  if (lane == 0) d[b] = dd;
}

__global__ void __launch_bounds__(kWarps * 32)
    gemm_q8_kernel(const std::uint8_t* w, const std::int8_t* qs, const float* dx, const float* bias, float* y,
                   std::int64_t m, std::int64_t n, std::int64_t k) {
  const std::int64_t row = blockIdx.x * static_cast<std::int64_t>(kWarps) + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (row >= n) return;
  const std::int64_t nb = k / 32;
  const std::uint8_t* wr = w + row * nb * 34;
  const std::int64_t i0 = static_cast<std::int64_t>(blockIdx.y) * kRowsPerY;
  for (std::int64_t i = i0; i < i0 + kRowsPerY && i < m; ++i) {
    const std::int8_t* xq = qs + i * k;
    float acc = 0.0f;
    for (std::int64_t t = 0; t < nb; t += 32) {
      const std::int64_t b = t + lane;
      int dot = 0;
      float scale = 0.0f;
      if (b < nb) {
        const std::uint8_t* wb = wr + b * 34;
        const std::int8_t* xb = xq + b * 32;
#pragma unroll 8
        for (int c = 0; c < 32; ++c) dot += static_cast<int>(static_cast<std::int8_t>(wb[2 + c])) * xb[c];
        scale = half_to_float(u16_at(wb)) * dx[i * nb + b];
      }
      const int count = nb - t < 32 ? static_cast<int>(nb - t) : 32;  // the same in every lane
      for (int l = 0; l < count; ++l) {  // block order, as the CPU
        const int v = __shfl_sync(0xffffffffu, dot, l);
        const float sc = __shfl_sync(0xffffffffu, scale, l);
        acc = fmaf(static_cast<float>(v), sc, acc);
      }
    }
    if (lane == 0) y[i * n + row] = acc + (bias != nullptr ? bias[row] : 0.0f);
  }
}

}  // namespace

cudaError_t launch_quantize_q8(cudaStream_t s, const float* x, std::int64_t rows, std::int64_t k, std::int8_t* qs,
                               float* d) {
  const std::int64_t blocks = rows * (k / 32);
  if (blocks <= 0) return cudaSuccess;
  constexpr int kWarpsPerBlock = 8;
  quantize_q8_kernel<<<static_cast<unsigned>((blocks + kWarpsPerBlock - 1) / kWarpsPerBlock), kWarpsPerBlock * 32, 0,
                       s>>>(x, blocks, qs, d);
  return cudaGetLastError();
}

cudaError_t launch_gemm_q8(cudaStream_t s, const std::uint8_t* w, const std::int8_t* qs, const float* d,
                           const float* bias, float* y, std::int64_t m, std::int64_t n, std::int64_t k) {
  if (m <= 0 || n <= 0) return cudaSuccess;
  const dim3 grid(static_cast<unsigned>((n + kWarps - 1) / kWarps), static_cast<unsigned>((m + kRowsPerY - 1) / kRowsPerY));
  if (grid.y > 65535) return cudaErrorInvalidValue;  // the stream passes at most kMaxQ8RowsPerPass rows
  gemm_q8_kernel<<<grid, kWarps * 32, 0, s>>>(w, qs, d, bias, y, m, n, k);
  return cudaGetLastError();
}

}  // namespace sx::kernels
