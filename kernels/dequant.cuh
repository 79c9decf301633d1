// One weight element of any format Sextant loads, dequantised from its row (GGML block layouts,
// runtime/hal/dtype.h and quant.h): the definition every CUDA kernel that reads weights uses.
//
// Host- and device-callable: the unit test tests/unit/cuda/dequant_test.cpp compiles this file
// with the host compiler and checks every format, element by element, bit for bit against
// hal::dequantize_row (the CPU reference). The float operations are the reference's, in its
// order; the kernels are compiled with --fmad=false so that `d * q - m` is never fused.
#pragma once

#include <bit>
#include <cstdint>

#include "runtime/base/half.h"  // the host side of the conversions

#ifdef __CUDACC__
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#define SX_HD __host__ __device__ __forceinline__
#else
#define SX_HD inline
#endif

namespace sx::kernels {

// Weight formats by number, in hal::DType's order (the kernels do not include the HAL enum's
// header; static_asserts in the module check the numbers).
enum WeightType : int {
  kF32 = 0, kF16 = 1, kBF16 = 2, kQ8_0 = 3, kI32 = 4, kQ4_0 = 5, kQ4_K = 6, kQ6_K = 7, kAwqInt4 = 8,
  kQ5_0 = 9, kQ4_1 = 10, kQ5_1 = 11, kQ2_K = 12, kQ3_K = 13, kQ5_K = 14,
};

SX_HD float half_to_float(std::uint16_t h) {
#ifdef __CUDA_ARCH__
  return __half2float(__ushort_as_half(h));
#else
  return f16_to_f32(h);
#endif
}
SX_HD float bf16_bits_to_float(std::uint16_t b) {
#ifdef __CUDA_ARCH__
  return __uint_as_float(static_cast<unsigned>(b) << 16);
#else
  return bf16_to_f32(b);
#endif
}
SX_HD std::uint16_t u16_at(const std::uint8_t* p) {
  return static_cast<std::uint16_t>(p[0] | (p[1] << 8));
}
SX_HD std::uint32_t u32_at(const std::uint8_t* p) {
  return static_cast<std::uint32_t>(p[0]) | (static_cast<std::uint32_t>(p[1]) << 8) |
         (static_cast<std::uint32_t>(p[2]) << 16) | (static_cast<std::uint32_t>(p[3]) << 24);
}
// Q4_K / Q5_K: the 6-bit scale and min of sub-block j (ggml's get_scale_min_k4).
SX_HD void scale_min_k4(int j, const std::uint8_t* s, int& sc, int& m) {
  if (j < 4) {
    sc = s[j] & 63;
    m = s[j + 4] & 63;
  } else {
    sc = (s[j + 4] & 0xF) | ((s[j - 4] >> 6) << 4);
    m = (s[j + 4] >> 4) | ((s[j] >> 6) << 4);
  }
}

// Q4_K / Q5_K block `b`: sub-block j's scale and min as the reference computes them, d * sc and
// dmin * m.
SX_HD void k4_scale_min(const std::uint8_t* b, int j, float& d, float& mn) {
  int sc, m;
  scale_min_k4(j, b + 4, sc, m);
  d = half_to_float(u16_at(b)) * static_cast<float>(sc);
  mn = half_to_float(u16_at(b + 2)) * static_cast<float>(m);
}

// Bytes and elements of one block of each format.
SX_HD int block_elems(int type) {
  switch (type) {
    case kQ8_0: case kQ4_0: case kQ4_1: case kQ5_0: case kQ5_1: return 32;
    case kQ4_K: case kQ6_K: case kQ2_K: case kQ3_K: case kQ5_K: return 256;
    case kAwqInt4: return 128;
    default: return 1;
  }
}
SX_HD int block_bytes(int type) {
  switch (type) {
    case kF32: return 4;
    case kF16: case kBF16: return 2;
    case kQ8_0: return 34;
    case kQ4_0: return 18;
    case kQ4_1: return 20;
    case kQ5_0: return 22;
    case kQ5_1: return 24;
    case kQ2_K: return 84;
    case kQ3_K: return 110;
    case kQ4_K: return 144;
    case kQ5_K: return 176;
    case kQ6_K: return 210;
    case kAwqInt4: return 68;
    default: return 0;
  }
}

// Element j of a row whose bytes start at `row`.
SX_HD float dequant_element(int type, const std::uint8_t* row, std::int64_t j) {
  const int be = block_elems(type);
  const std::uint8_t* b = row + (j / be) * block_bytes(type);
  const int i = static_cast<int>(j % be);
  switch (type) {
    case kF32: {
      const std::uint32_t u = u32_at(b);
#ifdef __CUDA_ARCH__
      return __uint_as_float(u);
#else
      return std::bit_cast<float>(u);
#endif
    }
    case kF16: return half_to_float(u16_at(b));
    case kBF16: return bf16_bits_to_float(u16_at(b));
    case kQ8_0: return static_cast<float>(static_cast<std::int8_t>(b[2 + i])) * half_to_float(u16_at(b));
    case kQ4_0: {
      const int q = i < 16 ? (b[2 + i] & 0xF) : (b[2 + i - 16] >> 4);
      return static_cast<float>(q - 8) * half_to_float(u16_at(b));
    }
    case kQ4_1: {
      const int q = i < 16 ? (b[4 + i] & 0xF) : (b[4 + i - 16] >> 4);
      return static_cast<float>(q) * half_to_float(u16_at(b)) + half_to_float(u16_at(b + 2));
    }
    case kQ5_0: {
      const std::uint32_t qh = u32_at(b + 2);
      const int lo = i < 16 ? (b[6 + i] & 0xF) : (b[6 + i - 16] >> 4);
      const int q = lo | static_cast<int>(((qh >> i) & 1u) << 4);
      return static_cast<float>(q - 16) * half_to_float(u16_at(b));
    }
    case kQ5_1: {
      const std::uint32_t qh = u32_at(b + 4);
      const int lo = i < 16 ? (b[8 + i] & 0xF) : (b[8 + i - 16] >> 4);
      const int q = lo | static_cast<int>(((qh >> i) & 1u) << 4);
      return static_cast<float>(q) * half_to_float(u16_at(b)) + half_to_float(u16_at(b + 2));
    }
    case kQ2_K: {  // scales[16] qs[64] d dmin
      const int c = i / 128, r = i % 128;       // 128-element chunk; within it 4 shifts x 32
      const int shift = 2 * (r / 32), half = (r % 32) / 16, l = r % 16;
      const int is = c * 8 + (r / 32) * 2 + half;
      const std::uint8_t sc = b[is];
      const float d = half_to_float(u16_at(b + 80)), dmin = half_to_float(u16_at(b + 82));
      const float dl = d * static_cast<float>(sc & 0xF), ml = dmin * static_cast<float>(sc >> 4);
      const int q = (b[16 + c * 32 + l + 16 * half] >> shift) & 3;
      return dl * static_cast<float>(q) - ml;
    }
    case kQ3_K: {  // hmask[32] qs[64] scales[12] d
      const int c = i / 128, r = i % 128;
      const int jj = r / 32, half = (r % 32) / 16, l = (r % 32);  // l: 0..31 within qs/hmask
      const int is = c * 8 + jj * 2 + half;
      const std::uint8_t* sp = b + 96;
      const int lo = is < 8 ? (sp[is] & 0xF) : (sp[is - 8] >> 4);
      const int hi = (sp[8 + (is % 4)] >> (2 * (is / 4))) & 3;
      const int scale = (lo | (hi << 4)) - 32;
      const int m = 1 << (c * 4 + jj);
      const int v = ((b[32 + c * 32 + l] >> (2 * jj)) & 3) - ((b[l] & m) ? 0 : 4);
      return half_to_float(u16_at(b + 108)) * static_cast<float>(scale) * static_cast<float>(v);
    }
    case kQ4_K: {  // d dmin scales[12] qs[128]
      const int c = i / 64, r = i % 64, hi = r / 32, l = r % 32;
      float d, mn;
      k4_scale_min(b, 2 * c + hi, d, mn);
      const int q = hi ? (b[16 + 32 * c + l] >> 4) : (b[16 + 32 * c + l] & 0xF);
      return d * static_cast<float>(q) - mn;
    }
    case kQ5_K: {  // d dmin scales[12] qh[32] qs[128]
      const int c = i / 64, r = i % 64, hi = r / 32, l = r % 32;
      float d, mn;
      k4_scale_min(b, 2 * c + hi, d, mn);
      const int low = hi ? (b[48 + 32 * c + l] >> 4) : (b[48 + 32 * c + l] & 0xF);
      const int bit = (b[16 + l] >> (2 * c + hi)) & 1;
      return d * static_cast<float>(low + (bit ? 16 : 0)) - mn;
    }
    case kQ6_K: {  // ql[128] qh[64] scales[16] d
      const int h = i / 128, r = i % 128, quarter = r / 32, l = r % 32;
      const std::uint8_t* ql = b + 64 * h;
      const std::uint8_t* qh = b + 128 + 32 * h;
      const std::int8_t* sc = reinterpret_cast<const std::int8_t*>(b + 192 + 8 * h);
      const int low = quarter == 0 ? (ql[l] & 0xF) : quarter == 1 ? (ql[l + 32] & 0xF)
                    : quarter == 2 ? (ql[l] >> 4) : (ql[l + 32] >> 4);
      const int q = (low | (((qh[l] >> (2 * quarter)) & 3) << 4)) - 32;
      const float d = half_to_float(u16_at(b + 208));
      return d * static_cast<float>(sc[l / 16 + 2 * quarter]) * static_cast<float>(q);
    }
    case kAwqInt4: {
      const int q = (i % 2 == 0) ? (b[i / 2] & 15) : (b[i / 2] >> 4);
      const float scale = half_to_float(u16_at(b + 64)), zero = half_to_float(u16_at(b + 66));
      return (static_cast<float>(q) - zero) * scale;
    }
    default: return 0.0f;
  }
}

}  // namespace sx::kernels
