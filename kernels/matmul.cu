// Matrix products (hal::MatmulArgs) for every weight format:
// - gemv for decode (m <= 8): one warp per output row, reading the row once for all m rows of x;
//   F32/F16/BF16 rows 16-byte aligned take vector loads (8 or 4 elements a lane), every other
//   format dequantises element by element through dequant.cuh (lanes read consecutive bytes);
// - dequantize_rows for prefill: row chunks of W to F32, which the stream multiplies with cuBLAS.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "kernels/common.cuh"
#include "kernels/dequant.cuh"

namespace sx::kernels {
namespace {

constexpr int kWarps = 4;
constexpr int kMaxM = 8;

__device__ __forceinline__ void unpack8(const uint4& u, int type, float* f) {
  const std::uint32_t w[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    if (type == kBF16) {
      f[2 * i] = __uint_as_float(w[i] << 16);
      f[2 * i + 1] = __uint_as_float(w[i] & 0xffff0000u);
    } else {
      f[2 * i] = half_to_float(static_cast<std::uint16_t>(w[i] & 0xffffu));
      f[2 * i + 1] = half_to_float(static_cast<std::uint16_t>(w[i] >> 16));
    }
  }
}

__global__ void __launch_bounds__(kWarps * 32) gemv_kernel(const std::uint8_t* w, int type, std::size_t row_bytes, const float* x, const float* bias,
                            float* y, int m, std::int64_t n, std::int64_t k, bool vec) {
  const std::int64_t row = blockIdx.x * static_cast<std::int64_t>(kWarps) + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (row >= n) return;
  const std::uint8_t* wr = w + row * row_bytes;
  float acc[kMaxM];
#pragma unroll
  for (int i = 0; i < kMaxM; ++i) acc[i] = 0.0f;
  if (vec && (type == kF16 || type == kBF16)) {
    const uint4* wv = reinterpret_cast<const uint4*>(wr);
#pragma unroll 4  // several 16-byte loads in flight per lane: decode is bound by these reads
    for (std::int64_t c = lane; c < k / 8; c += 32) {
      float f[8];
      unpack8(wv[c], type, f);
#pragma unroll
      for (int i = 0; i < kMaxM; ++i) {
        if (i < m) {
          const float4 a = reinterpret_cast<const float4*>(x + i * k)[2 * c];
          const float4 b = reinterpret_cast<const float4*>(x + i * k)[2 * c + 1];
          float s = acc[i];
          s = fmaf(f[0], a.x, s), s = fmaf(f[1], a.y, s), s = fmaf(f[2], a.z, s), s = fmaf(f[3], a.w, s);
          s = fmaf(f[4], b.x, s), s = fmaf(f[5], b.y, s), s = fmaf(f[6], b.z, s), s = fmaf(f[7], b.w, s);
          acc[i] = s;
        }
      }
    }
  } else if (vec && type == kF32) {
    const float4* wv = reinterpret_cast<const float4*>(wr);
#pragma unroll 4
    for (std::int64_t c = lane; c < k / 4; c += 32) {
      const float4 f = wv[c];
#pragma unroll
      for (int i = 0; i < kMaxM; ++i) {
        if (i < m) {
          const float4 a = reinterpret_cast<const float4*>(x + i * k)[c];
          float s = acc[i];
          s = fmaf(f.x, a.x, s), s = fmaf(f.y, a.y, s), s = fmaf(f.z, a.z, s), s = fmaf(f.w, a.w, s);
          acc[i] = s;
        }
      }
    }
  } else {
    for (std::int64_t j = lane; j < k; j += 32) {
      const float v = dequant_element(type, wr, j);
#pragma unroll
      for (int i = 0; i < kMaxM; ++i) {
        if (i < m) acc[i] = fmaf(v, x[i * k + j], acc[i]);
      }
    }
  }
#pragma unroll
  for (int i = 0; i < kMaxM; ++i) {
    if (i < m) {
      const float s = warp_sum(acc[i]);
      if (lane == 0) y[i * n + row] = bias != nullptr ? s + bias[row] : s;
    }
  }
}

__global__ void dequantize_rows_kernel(const std::uint8_t* w, int type, std::size_t row_bytes, std::int64_t row_begin,
                                       std::int64_t rows, std::int64_t k, float* out) {
  const std::int64_t n = rows * k;
  for (std::int64_t idx = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; idx < n;
       idx += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    const std::int64_t r = idx / k, j = idx % k;
    out[idx] = dequant_element(type, w + (row_begin + r) * row_bytes, j);
  }
}

}  // namespace

cudaError_t launch_gemv(cudaStream_t s, const hal::MatmulArgs& a, const std::uint8_t* w, const float* x,
                        const float* bias, float* y) {
  if (a.m <= 0 || a.n <= 0) return cudaSuccess;
  if (a.m > kMaxM) return cudaErrorInvalidValue;
  const int type = static_cast<int>(a.w_type);
  const std::size_t row_bytes = static_cast<std::size_t>(a.k / block_elems(type)) * static_cast<std::size_t>(block_bytes(type));
  const auto aligned = [](const void* p) { return reinterpret_cast<std::uintptr_t>(p) % 16 == 0; };
  const std::int64_t per = type == kF32 ? 4 : 8;
  const bool vec = (type == kF32 || type == kF16 || type == kBF16) && a.k % per == 0 && row_bytes % 16 == 0 &&
                   aligned(w) && aligned(x) && (a.k * 4) % 16 == 0;
  const std::int64_t blocks = (a.n + kWarps - 1) / kWarps;
  gemv_kernel<<<static_cast<unsigned>(blocks), kWarps * 32, 0, s>>>(w, type, row_bytes, x, bias, y,
                                                                     static_cast<int>(a.m), a.n, a.k, vec);
  return cudaGetLastError();
}

cudaError_t launch_dequantize_rows(cudaStream_t s, int w_type, const std::uint8_t* w, std::size_t row_bytes,
                                   std::int64_t row_begin, std::int64_t rows, std::int64_t k, float* out) {
  if (rows <= 0 || k <= 0) return cudaSuccess;
  dequantize_rows_kernel<<<grid_for(rows * k, 256), 256, 0, s>>>(w, w_type, row_bytes, row_begin, rows, k, out);
  return cudaGetLastError();
}

}  // namespace sx::kernels
