// Element and weight formats that cross the HAL boundary, with their block layouts.
//
// Quantised formats follow the GGML block layouts bit for bit (so GGUF tensor data is used as is),
// except kAwqInt4, Sextant's repacked AWQ / GPTQ 4-bit layout (below).
// A row of n elements of a blocked format occupies (n / block_elems) * block_bytes bytes;
// n must be a multiple of block_elems.
//
// The GGML block formats (Q4_0 ... Q6_K) are declared as structs in hal/quant.h, with the notes on
// their reference (de)quantisers. AWQ int4 is dequantised (the CPU backend computes it that way);
// its quantiser is the AWQ checkpoint writer's (model/hf_writer.h), since checkpoints hold AutoAWQ's
// packing, which model/hf_model.h repacks into this layout.
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
  kQ4_0,     // GGML Q4_0: 32 weights = fp16 scale + 16 bytes of nibbles (18 bytes)
  kQ4_K,     // GGML Q4_K: 256 weights = fp16 d, dmin + 12 bytes of 6-bit scales/mins + 128 bytes (144)
  kQ6_K,     // GGML Q6_K: 256 weights = 128 + 64 bytes of 6-bit quants + 16 int8 scales + fp16 d (210)
  kAwqInt4,  // Sextant AWQ/GPTQ int4: 128 weights = 64 bytes of nibbles + fp16 scale + fp16 zero (68)
  kQ5_0,     // GGML Q5_0: 32 weights = fp16 scale + 4 bytes of high bits + 16 bytes of nibbles (22)
  kQ4_1,     // GGML Q4_1: 32 weights = fp16 d, m + 16 bytes of nibbles (20)
  kQ5_1,     // GGML Q5_1: 32 weights = fp16 d, m + 4 bytes of high bits + 16 bytes of nibbles (24)
  kQ2_K,     // GGML Q2_K: 256 weights = 16 bytes of 4-bit scales/mins + 64 bytes of 2-bit quants + fp16 d, dmin (84)
  kQ3_K,     // GGML Q3_K: 256 weights = 32 bytes hmask + 64 bytes 2-bit quants + 12 bytes scales + fp16 d (110)
  kQ5_K,     // GGML Q5_K: 256 weights = fp16 d, dmin + 12 bytes scales/mins + 32 bytes high bits + 128 bytes (176)
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

// Bytes of a [rows][cols] tensor as a file holds it: rows * row_bytes. (A backend may keep a
// weight in its own layout, of Device::weight_bytes.)
inline std::size_t tensor_bytes(DType t, std::int64_t rows, std::int64_t cols) {
  return row_bytes(t, cols) * static_cast<std::size_t>(rows);
}

// GGML Q8_0: 32 values, fp16 scale d, q = round(x / d), d = max|x| / 127.
inline constexpr int kQ8_0Block = 32;
struct BlockQ8_0 {
  std::uint16_t d;  // IEEE half
  std::int8_t qs[kQ8_0Block];
};
static_assert(sizeof(BlockQ8_0) == 34);

// AWQ / GPTQ int4 as Sextant stores it: every group of 128 consecutive input weights of a row is
// 64 bytes of nibbles (byte j: element 2j in the low nibble, 2j + 1 in the high one) followed by
// its fp16 scale and fp16 zero point (w = (q - zero) * scale, computed in F32: exact).
inline constexpr int kAwqInt4Group = 128;
inline constexpr int kAwqInt4BlockBytes = kAwqInt4Group / 2 + 2 + 2;

// Reference conversions of one row of n elements (n a multiple of the block size).
// dequantize_row: F32, F16, BF16 and every GGML block format (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q2_K,
// Q3_K, Q4_K, Q5_K, Q6_K), bit-identical to ggml's dequantisation; AWQ int4.
// quantize_row: F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1 (these five as ggml's reference
// quantisers), Q4_K, Q5_K, Q6_K (see hal/quant.h).
// Any other type (I32; quantize_row of Q2_K / Q3_K / AWQ int4) is a programmer error (aborts).
void dequantize_row(DType t, const void* src, float* dst, std::int64_t n);
void quantize_row(DType t, const float* src, void* dst, std::int64_t n);
// Whether dequantize_row / quantize_row take t.
bool can_dequantize(DType t);
bool can_quantize(DType t);

// `rows` rows of `cols` elements from `from` to `to` (contiguous rows of row_bytes each), each
// through F32 (dequantize_row, then quantize_row); a plain copy when the types are equal. The
// same preconditions as those two.
void convert_rows(DType from, const void* src, DType to, void* dst, std::int64_t rows, std::int64_t cols);

}  // namespace sx::hal
