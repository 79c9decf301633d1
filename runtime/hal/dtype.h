// Element and weight formats that cross the HAL boundary, with their block layouts.
//
// Quantised formats follow the GGML block layouts bit for bit (so GGUF tensor data is used as is).
// A row of n elements of a blocked format occupies (n / block_elems) * block_bytes bytes;
// n must be a multiple of block_elems.
//
// The reference (de)quantisers here are the oracle for every backend's kernels.
// Pure functions; thread-safe.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string_view>

namespace sx::hal {

enum class DType : std::uint8_t {
  kF32,
  kF16,
  kBF16,
  kQ8_0,
  kI32,
};

struct DTypeInfo {
  std::string_view name;  // "f32", "q8_0", ...
  int block_elems;        // elements per block (1 for plain types)
  int block_bytes;        // bytes per block
  bool quantized;
};

const DTypeInfo& dtype_info(DType t);
std::string_view dtype_name(DType t);
std::optional<DType> dtype_from_name(std::string_view name);  // "f32", "F16", "q8_0", "bf16", ...

// Bytes of a row of n elements; n must be a multiple of the block size (checked by callers).
inline std::size_t row_bytes(DType t, std::int64_t n) {
  const DTypeInfo& i = dtype_info(t);
  return static_cast<std::size_t>(n / i.block_elems) * static_cast<std::size_t>(i.block_bytes);
}

// GGML Q8_0: 32 values, fp16 scale d, q = round(x / d), d = max|x| / 127.
inline constexpr int kQ8_0Block = 32;
struct BlockQ8_0 {
  std::uint16_t d;  // IEEE half
  std::int8_t qs[kQ8_0Block];
};
static_assert(sizeof(BlockQ8_0) == 34);

// Reference conversions of one row of n elements (n a multiple of the block size).
// Supported: F32, F16, BF16, Q8_0 in both directions.
void dequantize_row(DType t, const void* src, float* dst, std::int64_t n);
void quantize_row(DType t, const float* src, void* dst, std::int64_t n);

}  // namespace sx::hal
