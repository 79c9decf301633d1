// Format table and reference (de)quantisation.
#include "runtime/hal/dtype.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstring>
#include <iterator>
#include <string>
#include <vector>

#include "runtime/base/half.h"
#include "runtime/base/status.h"
#include "runtime/hal/quant.h"

namespace sx::hal {

namespace {
const DTypeInfo kInfos[] = {
    {"f32", 1, 4, false},
    {"f16", 1, 2, false},
    {"bf16", 1, 2, false},
    {"q8_0", kQ8_0Block, static_cast<int>(sizeof(BlockQ8_0)), true},
    {"i32", 1, 4, false},
    {"q4_0", 32, 18, true},   // ggml-common.h block_q4_0: ggml_half d; uint8_t qs[QK4_0 / 2]
    {"q4_k", 256, 144, true},  // block_q4_K: ggml_half d, dmin; uint8_t scales[12]; uint8_t qs[QK_K / 2]
    {"q6_k", 256, 210, true},  // block_q6_K: uint8_t ql[QK_K / 2], qh[QK_K / 4]; int8_t scales[QK_K / 16]; ggml_half d
    {"awq_int4", kAwqInt4Group, kAwqInt4BlockBytes, true},
    {"q5_0", 32, 22, true},   // block_q5_0: ggml_half d; uint8_t qh[4]; uint8_t qs[QK5_0 / 2]
    {"q4_1", kQK, static_cast<int>(sizeof(BlockQ4_1)), true},
    {"q5_1", kQK, static_cast<int>(sizeof(BlockQ5_1)), true},
    {"q2_k", kQK_K, static_cast<int>(sizeof(BlockQ2_K)), true},
    {"q3_k", kQK_K, static_cast<int>(sizeof(BlockQ3_K)), true},
    {"q5_k", kQK_K, static_cast<int>(sizeof(BlockQ5_K)), true},
};
static_assert(std::size(kInfos) == static_cast<std::size_t>(DType::kQ5_K) + 1, "one row per DType, in order");
static_assert(sizeof(BlockQ4_0) == 18 && sizeof(BlockQ5_0) == 22 && sizeof(BlockQ4_K) == 144 &&
              sizeof(BlockQ6_K) == 210);
}  // namespace

const DTypeInfo& dtype_info(DType t) {
  const auto i = static_cast<std::size_t>(t);
  // A value past the table is a backend's private layout (e.g. backends/cpu/kernels/layouts.h)
  // that reached shared code: a programmer error, never an out-of-bounds read.
  if (i >= std::size(kInfos)) fatal("dtype_info", "value " + std::to_string(i) + " is not a hal::DType format");
  return kInfos[i];
}
std::string_view dtype_name(DType t) { return dtype_info(t).name; }

std::optional<DType> dtype_from_name(std::string_view name) {
  std::string lower(name);
  std::transform(lower.begin(), lower.end(), lower.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  for (int i = 0; i < static_cast<int>(std::size(kInfos)); ++i) {
    if (kInfos[i].name == lower) return static_cast<DType>(i);
  }
  return std::nullopt;
}

void dequantize_row(DType t, const void* src, float* dst, std::int64_t n) {
  switch (t) {
    case DType::kF32:
      std::memcpy(dst, src, static_cast<std::size_t>(n) * sizeof(float));
      return;
    case DType::kF16: {
      const auto* s = static_cast<const std::uint16_t*>(src);
      for (std::int64_t i = 0; i < n; ++i) dst[i] = f16_to_f32(s[i]);
      return;
    }
    case DType::kBF16: {
      const auto* s = static_cast<const std::uint16_t*>(src);
      for (std::int64_t i = 0; i < n; ++i) dst[i] = bf16_to_f32(s[i]);
      return;
    }
    case DType::kQ8_0: {
      const auto* b = static_cast<const BlockQ8_0*>(src);
      for (std::int64_t blk = 0; blk < n / kQ8_0Block; ++blk) {
        const float d = f16_to_f32(b[blk].d);
        for (int j = 0; j < kQ8_0Block; ++j) dst[blk * kQ8_0Block + j] = d * static_cast<float>(b[blk].qs[j]);
      }
      return;
    }
    case DType::kQ4_0: dequantize_row_q4_0(static_cast<const BlockQ4_0*>(src), dst, n); return;
    case DType::kQ4_1: dequantize_row_q4_1(static_cast<const BlockQ4_1*>(src), dst, n); return;
    case DType::kQ5_0: dequantize_row_q5_0(static_cast<const BlockQ5_0*>(src), dst, n); return;
    case DType::kQ5_1: dequantize_row_q5_1(static_cast<const BlockQ5_1*>(src), dst, n); return;
    case DType::kQ2_K: dequantize_row_q2_k(static_cast<const BlockQ2_K*>(src), dst, n); return;
    case DType::kQ3_K: dequantize_row_q3_k(static_cast<const BlockQ3_K*>(src), dst, n); return;
    case DType::kQ4_K: dequantize_row_q4_k(static_cast<const BlockQ4_K*>(src), dst, n); return;
    case DType::kQ5_K: dequantize_row_q5_k(static_cast<const BlockQ5_K*>(src), dst, n); return;
    case DType::kQ6_K: dequantize_row_q6_k(static_cast<const BlockQ6_K*>(src), dst, n); return;
    case DType::kAwqInt4: {
      const auto* b = static_cast<const std::uint8_t*>(src);
      for (std::int64_t blk = 0; blk < n / kAwqInt4Group; ++blk, b += kAwqInt4BlockBytes) {
        std::uint16_t sh, zh;
        std::memcpy(&sh, b + kAwqInt4Group / 2, 2);
        std::memcpy(&zh, b + kAwqInt4Group / 2 + 2, 2);
        const float scale = f16_to_f32(sh), zero = f16_to_f32(zh);
        float* out = dst + blk * kAwqInt4Group;
        for (int j = 0; j < kAwqInt4Group / 2; ++j) {
          out[2 * j] = (static_cast<float>(b[j] & 15) - zero) * scale;
          out[2 * j + 1] = (static_cast<float>(b[j] >> 4) - zero) * scale;
        }
      }
      return;
    }
    case DType::kI32:
      break;
  }
  fatal("dequantize_row", std::string("unsupported type ") + std::string(dtype_name(t)));
}

void quantize_row(DType t, const float* src, void* dst, std::int64_t n) {
  switch (t) {
    case DType::kF32:
      std::memcpy(dst, src, static_cast<std::size_t>(n) * sizeof(float));
      return;
    case DType::kF16: {
      auto* d = static_cast<std::uint16_t*>(dst);
      for (std::int64_t i = 0; i < n; ++i) d[i] = f32_to_f16(src[i]);
      return;
    }
    case DType::kBF16: {
      auto* d = static_cast<std::uint16_t*>(dst);
      for (std::int64_t i = 0; i < n; ++i) d[i] = f32_to_bf16(src[i]);
      return;
    }
    case DType::kQ8_0: {
      auto* b = static_cast<BlockQ8_0*>(dst);
      for (std::int64_t blk = 0; blk < n / kQ8_0Block; ++blk) {
        const float* x = src + blk * kQ8_0Block;
        float amax = 0.0f;
        for (int j = 0; j < kQ8_0Block; ++j) amax = std::max(amax, std::fabs(x[j]));
        const float d = amax / 127.0f;
        const float id = d != 0.0f ? 1.0f / d : 0.0f;
        b[blk].d = f32_to_f16(d);
        for (int j = 0; j < kQ8_0Block; ++j) b[blk].qs[j] = static_cast<std::int8_t>(std::lround(x[j] * id));
      }
      return;
    }
    case DType::kQ4_0: quantize_row_q4_0(src, static_cast<BlockQ4_0*>(dst), n); return;
    case DType::kQ4_1: quantize_row_q4_1(src, static_cast<BlockQ4_1*>(dst), n); return;
    case DType::kQ5_0: quantize_row_q5_0(src, static_cast<BlockQ5_0*>(dst), n); return;
    case DType::kQ5_1: quantize_row_q5_1(src, static_cast<BlockQ5_1*>(dst), n); return;
    case DType::kQ2_K: quantize_row_q2_k(src, static_cast<BlockQ2_K*>(dst), n); return;
    case DType::kQ3_K: quantize_row_q3_k(src, static_cast<BlockQ3_K*>(dst), n); return;
    case DType::kQ4_K: quantize_row_q4_k(src, static_cast<BlockQ4_K*>(dst), n); return;
    case DType::kQ5_K: quantize_row_q5_k(src, static_cast<BlockQ5_K*>(dst), n); return;
    case DType::kQ6_K: quantize_row_q6_k(src, static_cast<BlockQ6_K*>(dst), n); return;
    case DType::kI32:
    case DType::kAwqInt4:
      break;
  }
  fatal("quantize_row", std::string("unsupported type ") + std::string(dtype_name(t)));
}

bool can_dequantize(DType t) {
  return t != DType::kI32;
}

bool can_quantize(DType t) {
  return can_dequantize(t) && t != DType::kAwqInt4;
}

void convert_rows(DType from, const void* src, DType to, void* dst, std::int64_t rows, std::int64_t cols) {
  const std::size_t in_row = row_bytes(from, cols), out_row = row_bytes(to, cols);
  if (from == to) {
    std::memcpy(dst, src, in_row * static_cast<std::size_t>(rows));
    return;
  }
  std::vector<float> row(static_cast<std::size_t>(cols));
  for (std::int64_t r = 0; r < rows; ++r) {
    dequantize_row(from, static_cast<const std::byte*>(src) + in_row * static_cast<std::size_t>(r), row.data(), cols);
    quantize_row(to, row.data(), static_cast<std::byte*>(dst) + out_row * static_cast<std::size_t>(r), cols);
  }
}


}  // namespace sx::hal
