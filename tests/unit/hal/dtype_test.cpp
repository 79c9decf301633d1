// Reference formats: block layouts, Q8_0 quantisation exactly as GGML defines it, names.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <string_view>
#include <vector>

#include "runtime/base/half.h"
#include "runtime/hal/dtype.h"
#include "runtime/hal/quant.h"

namespace sx::hal {
namespace {

TEST(DType, TableAndNames) {
  EXPECT_EQ(row_bytes(DType::kQ8_0, 896), 28u * 34u);
  EXPECT_EQ(row_bytes(DType::kF16, 7), 14u);
  EXPECT_EQ(dtype_from_name("Q8_0"), DType::kQ8_0);
  EXPECT_EQ(dtype_from_name("bf16"), DType::kBF16);
  EXPECT_FALSE(dtype_from_name("q4_k_m").has_value());  // a file recipe, not one format
  EXPECT_FALSE(dtype_from_name("awq-int4").has_value());
  EXPECT_EQ(dtype_name(DType::kI32), "i32");
}

// Sizes of the formats known for planning: GGML's ggml-common.h blocks and Sextant's AWQ groups.
TEST(DType, PlanningFormats) {
  const struct {
    DType t;
    std::string_view name;
    int elems, bytes;
  } expected[] = {
      {DType::kQ4_0, "q4_0", 32, 2 + 16},            // d, qs[16]
      {DType::kQ5_0, "q5_0", 32, 2 + 4 + 16},        // d, qh[4], qs[16]
      {DType::kQ4_K, "q4_k", 256, 2 + 2 + 12 + 128},  // d, dmin, scales[12], qs[128]
      {DType::kQ6_K, "q6_k", 256, 128 + 64 + 16 + 2},  // ql, qh, scales, d
      {DType::kAwqInt4, "awq_int4", 128, 64 + 2 + 2},  // nibbles, fp16 scale, fp16 zero
  };
  for (const auto& e : expected) {
    EXPECT_EQ(dtype_name(e.t), e.name);
    EXPECT_EQ(dtype_from_name(e.name), e.t);
    EXPECT_EQ(dtype_info(e.t).block_elems, e.elems) << e.name;
    EXPECT_EQ(dtype_info(e.t).block_bytes, e.bytes) << e.name;
    EXPECT_TRUE(dtype_info(e.t).quantized) << e.name;
  }
  EXPECT_EQ(dtype_from_name("Q4_K"), DType::kQ4_K);
  EXPECT_EQ(row_bytes(DType::kAwqInt4, 8192), 64u * 68u);
  EXPECT_EQ(row_bytes(DType::kQ6_K, 3584), 14u * 210u);
  EXPECT_EQ(dtype_name(DType::kF32), "f32");
}

TEST(DType, Q8_0KnownBlock) {
  std::vector<float> x(32);
  for (int i = 0; i < 32; ++i) x[i] = static_cast<float>(i - 16) * 0.5f;  // max |x| = 8
  BlockQ8_0 b{};
  quantize_row(DType::kQ8_0, x.data(), &b, 32);
  EXPECT_EQ(b.d, f32_to_f16(8.0f / 127.0f));
  EXPECT_EQ(b.qs[0], -127);                        // -8 / (8/127)
  EXPECT_EQ(b.qs[16], 0);
  EXPECT_EQ(b.qs[17], static_cast<std::int8_t>(std::lround(0.5f * 127.0f / 8.0f)));  // 7.9375 -> 8
  std::vector<float> zeros(32, 0.0f);
  quantize_row(DType::kQ8_0, zeros.data(), &b, 32);
  EXPECT_EQ(b.d, 0);
  for (int i = 0; i < 32; ++i) EXPECT_EQ(b.qs[i], 0);
}

TEST(DType, RoundTripErrorBounds) {
  std::mt19937 rng(3);
  std::normal_distribution<float> d(0.0f, 2.0f);
  std::vector<float> x(32 * 64), y(x.size());
  for (auto& v : x) v = d(rng);
  for (DType t : {DType::kF32, DType::kF16, DType::kBF16, DType::kQ8_0}) {
    std::vector<std::uint8_t> packed(row_bytes(t, static_cast<std::int64_t>(x.size())));
    quantize_row(t, x.data(), packed.data(), static_cast<std::int64_t>(x.size()));
    dequantize_row(t, packed.data(), y.data(), static_cast<std::int64_t>(y.size()));
    for (std::size_t blk = 0; blk < x.size() / 32; ++blk) {
      float amax = 0;
      for (int j = 0; j < 32; ++j) amax = std::max(amax, std::fabs(x[blk * 32 + j]));
      for (int j = 0; j < 32; ++j) {
        const float v = x[blk * 32 + j], r = y[blk * 32 + j];
        switch (t) {
          case DType::kF32: ASSERT_EQ(r, v); break;
          case DType::kF16: ASSERT_LE(std::fabs(r - v), std::fabs(v) * 0x1p-11f); break;
          case DType::kBF16: ASSERT_LE(std::fabs(r - v), std::fabs(v) * 0x1p-8f); break;
          default:  // half a quantisation step, plus the fp16 rounding of the scale
            ASSERT_LE(std::fabs(r - v), amax / 127.0f * 0.5f + amax * 0x1p-10f);
        }
      }
    }
  }
}

TEST(DType, TensorBytesAreRowsTimesRowBytes) {
  EXPECT_EQ(tensor_bytes(DType::kQ8_0, 37, 96), 37u * 3u * sizeof(BlockQ8_0));
  EXPECT_EQ(tensor_bytes(DType::kF32, 3, 5), 60u);
}

}  // namespace
}  // namespace sx::hal
