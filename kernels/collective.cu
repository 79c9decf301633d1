// The device side of the CUDA channels (backends/cuda/loopback_channel.cpp, nccl_channel.cpp):
// the loopback all-reduce's rank-order sum, and widening / narrowing between F16 / BF16 and F32.
#include "kernels/common.cuh"
#include "kernels/dequant.cuh"

namespace sx::kernels {
namespace {

// Element i of a buffer of F32, F16 or BF16 (dequant.cuh's format numbers and widening).
__device__ __forceinline__ float load(const void* p, int t, std::int64_t i) {
  if (t == kF16) return half_to_float(static_cast<const std::uint16_t*>(p)[i]);
  if (t == kBF16) return bf16_bits_to_float(static_cast<const std::uint16_t*>(p)[i]);
  return static_cast<const float*>(p)[i];
}

// Round to nearest even, quiet NaN: runtime/base/half.h's f32_to_bf16 to the bit.
__device__ __forceinline__ std::uint16_t to_bf16(float f) {
  const std::uint32_t x = __float_as_uint(f);
  if ((x & 0x7fffffffu) > 0x7f800000u) return static_cast<std::uint16_t>((x >> 16) | 0x40u);
  return static_cast<std::uint16_t>((x + 0x7fffu + ((x >> 16) & 1u)) >> 16);
}

// Round to nearest even, NaN as 0x7e00 with its sign, overflow to infinity: runtime/base/half.h's
// f32_to_f16 to the bit (__float2half_rn differs for NaN).
__device__ __forceinline__ std::uint16_t to_f16(float f) {
  const std::uint32_t x = __float_as_uint(f);
  const std::uint32_t sign = (x >> 16) & 0x8000u;
  const std::uint32_t absx = x & 0x7fffffffu;
  if (absx >= 0x7f800000u) return static_cast<std::uint16_t>(sign | 0x7c00u | (absx > 0x7f800000u ? 0x200u : 0u));
  if (absx >= 0x477ff000u) return static_cast<std::uint16_t>(sign | 0x7c00u);
  if (absx < 0x38800000u) {
    if (absx < 0x33000000u) return static_cast<std::uint16_t>(sign);
    const std::uint32_t e = absx >> 23;
    const std::uint32_t mant = (absx & 0x7fffffu) | 0x800000u;
    const std::uint32_t shift = 126 - e;
    std::uint32_t q = mant >> shift;
    const std::uint32_t rem = mant & ((1u << shift) - 1);
    const std::uint32_t half = 1u << (shift - 1);
    if (rem > half || (rem == half && (q & 1u))) ++q;
    return static_cast<std::uint16_t>(sign | q);
  }
  std::uint32_t h = (absx >> 13) - ((127u - 15u) << 10);
  const std::uint32_t rem = absx & 0x1fffu;
  if (rem > 0x1000u || (rem == 0x1000u && (h & 1u))) ++h;
  return static_cast<std::uint16_t>(sign | h);
}

__device__ __forceinline__ void store(void* p, int t, std::int64_t i, float v) {
  if (t == kF16) {
    static_cast<std::uint16_t*>(p)[i] = to_f16(v);
  } else if (t == kBF16) {
    static_cast<std::uint16_t*>(p)[i] = to_bf16(v);
  } else {
    static_cast<float*>(p)[i] = v;
  }
}

// Element i of every rank's buffer, summed in rank order in F32 and rounded once, written back to
// every rank's buffer: each element is read and written by one thread, so the sum is in place.
__global__ void rank_sum_kernel(RankBuffers b, int ranks, std::int64_t n, int t) {
  for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    float sum = load(b.data[0], t, i);
    for (int r = 1; r < ranks; ++r) sum += load(b.data[r], t, i);
    for (int r = 0; r < ranks; ++r) store(b.data[r], t, i, sum);
  }
}

__global__ void widen_kernel(const void* src, int t, float* dst, std::int64_t n) {
  for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    dst[i] = load(src, t, i);
  }
}

__global__ void narrow_kernel(const float* src, int t, void* dst, std::int64_t n) {
  for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    store(dst, t, i, src[i]);
  }
}

int code_of(hal::DType t) { return t == hal::DType::kF16 ? kF16 : t == hal::DType::kBF16 ? kBF16 : kF32; }

}  // namespace

cudaError_t launch_rank_sum(cudaStream_t s, const RankBuffers& b, int ranks, std::int64_t n, hal::DType dtype) {
  if (n <= 0 || ranks <= 0) return cudaSuccess;
  rank_sum_kernel<<<grid_for(n, 256), 256, 0, s>>>(b, ranks, n, code_of(dtype));
  return cudaGetLastError();
}

cudaError_t launch_widen(cudaStream_t s, const void* src, hal::DType dtype, float* dst, std::int64_t n) {
  if (n <= 0) return cudaSuccess;
  widen_kernel<<<grid_for(n, 256), 256, 0, s>>>(src, code_of(dtype), dst, n);
  return cudaGetLastError();
}

cudaError_t launch_narrow(cudaStream_t s, const float* src, hal::DType dtype, void* dst, std::int64_t n) {
  if (n <= 0) return cudaSuccess;
  narrow_kernel<<<grid_for(n, 256), 256, 0, s>>>(src, code_of(dtype), dst, n);
  return cudaGetLastError();
}

}  // namespace sx::kernels
