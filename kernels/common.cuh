// Helpers shared by the kernels: warp reductions, grid-stride loops, the device error word.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/launch.h"

namespace sx::kernels {

__device__ __forceinline__ float warp_sum(float v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
__device__ __forceinline__ double warp_sum(double v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// The first error of a stream wins: err[0] is claimed with a compare-and-swap, then its values
// written (read by the host only after the stream completed).
__device__ __forceinline__ void report_error(int* err, int kind, int a, int b, int c) {
  if (atomicCAS(err, 0, -1) == 0) {
    err[1] = a;
    err[2] = b;
    err[3] = c;
    __threadfence();
    atomicExch(err, kind);
  }
}

// hal::top_k_before's order (top_k.cu, moe.cu): larger first, the lower index among equals, NaN
// after every number (and equal to NaN).
__device__ __forceinline__ bool top_k_before(float a, std::int64_t ia, float b, std::int64_t ib) {
  const bool a_nan = a != a, b_nan = b != b;
  if (a_nan != b_nan) return b_nan;
  if (a_nan || a == b) return ia < ib;
  return a > b;
}

inline unsigned grid_for(std::int64_t n, int threads) {
  std::int64_t b = (n + threads - 1) / threads;
  if (b < 1) b = 1;
  if (b > 65535LL * 1024) b = 65535LL * 1024;  // grid-stride loops cover the rest
  return static_cast<unsigned>(b);
}

}  // namespace sx::kernels
