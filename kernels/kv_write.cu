// KV write into the paged cache (hal::KvWriteArgs), F32 or F16 (round to nearest even) caches.
#include <cuda_fp16.h>

#include "kernels/common.cuh"

namespace sx::kernels {
namespace {

__global__ void kv_write_kernel(const float* k, const float* v, void* k_cache, void* v_cache, const std::int32_t* slots,
                                std::int64_t n_tokens, std::int64_t row, std::int64_t n_slots, bool f16, int* err) {
  const std::int64_t n = n_tokens * row;
  for (std::int64_t idx = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; idx < n;
       idx += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    const std::int64_t t = idx / row, j = idx % row;
    const std::int64_t slot = slots[t];
    if (slot < 0) continue;  // padding
    if (slot >= n_slots) {
      if (j == 0) report_error(err, kErrKvSlot, static_cast<int>(slot), static_cast<int>(t), static_cast<int>(n_slots));
      continue;
    }
    const std::int64_t at = slot * row + j;
    if (f16) {
      static_cast<__half*>(k_cache)[at] = __float2half_rn(k[idx]);
      static_cast<__half*>(v_cache)[at] = __float2half_rn(v[idx]);
    } else {
      static_cast<float*>(k_cache)[at] = k[idx];
      static_cast<float*>(v_cache)[at] = v[idx];
    }
  }
}

}  // namespace

cudaError_t launch_kv_write(cudaStream_t s, const hal::KvWriteArgs& a, const float* k, const float* v, void* k_cache,
                            void* v_cache, const std::int32_t* slots, int* err) {
  const std::int64_t row = a.n_kv_heads * a.head_dim;
  if (a.n_tokens <= 0 || row <= 0) return cudaSuccess;
  kv_write_kernel<<<grid_for(a.n_tokens * row, 256), 256, 0, s>>>(k, v, k_cache, v_cache, slots, a.n_tokens, row,
                                                                    a.n_slots, a.cache_type == hal::DType::kF16, err);
  return cudaGetLastError();
}

}  // namespace sx::kernels
