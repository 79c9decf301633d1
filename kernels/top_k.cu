// The k largest values of each row and their ids (hal::TopKArgs), in top_k_before's order
// (larger first, lower index first among equals, NaN last). One block per row, k passes: pass i
// takes the best element that comes after pass i-1's pick in that order. k <= 64 and rows of a
// vocabulary (150k) make this a few microseconds; greedy (k = 1) is one pass.
#include <algorithm>

#include "kernels/common.cuh"

namespace sx::kernels {
namespace {

constexpr int kThreads = 256;

__global__ void top_k_kernel(const float* x, float* values, std::int32_t* ids, std::int64_t n_cols, std::int64_t k,
                             std::int64_t id_offset) {
  __shared__ float best_v[kThreads];
  __shared__ std::int64_t best_i[kThreads];
  const float* row = x + blockIdx.x * n_cols;
  float last_v = 0.0f;
  std::int64_t last_i = -1;
  for (std::int64_t pass = 0; pass < k; ++pass) {
    float bv = 0.0f;
    std::int64_t bi = -1;
    for (std::int64_t j = threadIdx.x; j < n_cols; j += kThreads) {
      const float v = row[j];
      if (last_i >= 0 && !top_k_before(last_v, last_i, v, j)) continue;  // taken by an earlier pass
      if (bi < 0 || top_k_before(v, j, bv, bi)) {
        bv = v;
        bi = j;
      }
    }
    best_v[threadIdx.x] = bv;
    best_i[threadIdx.x] = bi;
    __syncthreads();
    for (int stride = kThreads / 2; stride > 0; stride >>= 1) {
      if (threadIdx.x < stride) {
        const float ov = best_v[threadIdx.x + stride];
        const std::int64_t oi = best_i[threadIdx.x + stride];
        if (oi >= 0 && (best_i[threadIdx.x] < 0 || top_k_before(ov, oi, best_v[threadIdx.x], best_i[threadIdx.x]))) {
          best_v[threadIdx.x] = ov;
          best_i[threadIdx.x] = oi;
        }
      }
      __syncthreads();
    }
    last_v = best_v[0];
    last_i = best_i[0];
    if (threadIdx.x == 0) {
      values[blockIdx.x * k + pass] = last_v;
      ids[blockIdx.x * k + pass] = static_cast<std::int32_t>(last_i + id_offset);
    }
    __syncthreads();  // best_* are rewritten by the next pass
  }
}

}  // namespace

cudaError_t launch_top_k(cudaStream_t s, const hal::TopKArgs& a, const float* x, float* values, std::int32_t* ids) {
  for (std::int64_t r = 0; r < a.n_rows; r += 65535LL * 1024) {
    const std::int64_t rows = std::min<std::int64_t>(a.n_rows - r, 65535LL * 1024);
    top_k_kernel<<<static_cast<unsigned>(rows), kThreads, 0, s>>>(x + r * a.n_cols, values + r * a.k, ids + r * a.k,
                                                                   a.n_cols, a.k, a.id_offset);
  }
  return cudaGetLastError();
}

}  // namespace sx::kernels
