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

// kQ8_0R16 holds the same blocks as Q8_0, 16 rows interleaved; padding rows are zero.
TEST(DType, Q8_0R16RepackRoundTrip) {
  const std::int64_t rows = 37, k = 96, nb = k / kQ8_0Block;
  EXPECT_EQ(tensor_bytes(DType::kQ8_0R16, rows, k), 48u * nb * sizeof(BlockQ8_0));  // 37 -> 48 rows
  EXPECT_EQ(tensor_bytes(DType::kQ8_0, rows, k), 37u * nb * sizeof(BlockQ8_0));
  EXPECT_EQ(tensor_bytes(DType::kF32, 3, 5), 60u);
  std::mt19937 rng(5);
  std::vector<BlockQ8_0> plain(static_cast<std::size_t>(rows * nb));
  for (BlockQ8_0& b : plain) {
    b.d = static_cast<std::uint16_t>(rng());
    for (std::int8_t& q : b.qs) q = static_cast<std::int8_t>(rng());
  }
  std::vector<BlockQ8_0x16> packed(tensor_bytes(DType::kQ8_0R16, rows, k) / sizeof(BlockQ8_0x16));
  repack_q8_0_r16(plain.data(), rows, k, packed.data());
  // Documented position of element 2p + e of row r, block b: group r / 16.
  const std::int64_t r = 21, b = 2, p = 5;
  const BlockQ8_0x16& g = packed[static_cast<std::size_t>((r / 16) * nb + b)];
  EXPECT_EQ(g.d[r % 16], plain[static_cast<std::size_t>(r * nb + b)].d);
  EXPECT_EQ(g.qs[32 * p + 2 * (r % 16) + 1], plain[static_cast<std::size_t>(r * nb + b)].qs[2 * p + 1]);
  std::vector<BlockQ8_0> row(static_cast<std::size_t>(nb));
  for (std::int64_t i = 0; i < 48; ++i) {
    unpack_row_q8_0_r16(packed.data(), k, i, row.data());
    for (std::int64_t j = 0; j < nb; ++j) {
      const BlockQ8_0 want = i < rows ? plain[static_cast<std::size_t>(i * nb + j)] : BlockQ8_0{};
      ASSERT_EQ(row[static_cast<std::size_t>(j)].d, want.d) << i << " " << j;
      for (int c = 0; c < kQ8_0Block; ++c) ASSERT_EQ(row[static_cast<std::size_t>(j)].qs[c], want.qs[c]) << i;
    }
  }
}

// kQ5_0R8 holds the same scales and 5-bit values as Q5_0, 8 rows interleaved as hal/quant.h
// documents; padding rows are zero. Random bytes cover every nibble and high-bit pattern.
TEST(DType, Q5_0R8RepackRoundTrip) {
  const std::int64_t rows = 19, k = 96, nb = k / kQK;
  EXPECT_EQ(tensor_bytes(DType::kQ5_0R8, rows, k), 24u * nb * sizeof(BlockQ5_0));  // 19 -> 24 rows
  EXPECT_EQ(interleaved_source(DType::kQ5_0R8), DType::kQ5_0);
  EXPECT_EQ(interleaved_rows(DType::kQ5_0R8), kQ5_0R8Rows);
  EXPECT_EQ(interleaved_source(DType::kQ4_K), DType::kQ4_K);
  EXPECT_EQ(interleaved_rows(DType::kQ4_K), 1);
  std::mt19937 rng(7);
  std::vector<BlockQ5_0> plain(static_cast<std::size_t>(rows * nb));
  for (BlockQ5_0& b : plain) {
    b.d = static_cast<std::uint16_t>(rng());
    for (std::uint8_t& q : b.qh) q = static_cast<std::uint8_t>(rng());
    for (std::uint8_t& q : b.qs) q = static_cast<std::uint8_t>(rng());
  }
  std::vector<BlockQ5_0x8> packed(tensor_bytes(DType::kQ5_0R8, rows, k) / sizeof(BlockQ5_0x8));
  repack_rows(DType::kQ5_0R8, plain.data(), rows, k, packed.data());
  // The documented positions, for every element of one block: q(j) = low nibble of qs[j] (j < 16) or
  // high nibble of qs[j - 16], plus bit j of qh as bit 4.
  const std::int64_t r = 13, b = 1;
  const BlockQ5_0& src = plain[static_cast<std::size_t>(r * nb + b)];
  const BlockQ5_0x8& g = packed[static_cast<std::size_t>((r / 8) * nb + b)];
  const int lane = static_cast<int>(r % 8);
  EXPECT_EQ(g.d[lane], src.d);
  std::uint32_t qh;
  std::memcpy(&qh, src.qh, 4);
  for (int j = 0; j < kQK; ++j) {
    const int want = (j < 16 ? src.qs[j] & 15 : src.qs[j - 16] >> 4) | static_cast<int>(((qh >> j) & 1) << 4);
    const int i = j / 8, e = j % 4;
    const int nibble = j % 8 < 4 ? g.qs[32 * i + 4 * lane + e] & 15 : g.qs[32 * i + 4 * lane + e] >> 4;
    const int high = (g.qh[4 * lane + j % 4] >> (j / 4)) & 1;
    ASSERT_EQ(nibble | high << 4, want) << "element " << j;
  }
  std::vector<BlockQ5_0> row(static_cast<std::size_t>(nb));
  std::vector<float> want_f(static_cast<std::size_t>(k)), got_f(static_cast<std::size_t>(k));
  for (std::int64_t i = 0; i < 24; ++i) {
    unpack_row(DType::kQ5_0R8, packed.data(), k, i, row.data());
    for (std::int64_t j = 0; j < nb; ++j) {
      const BlockQ5_0 want = i < rows ? plain[static_cast<std::size_t>(i * nb + j)] : BlockQ5_0{};
      ASSERT_EQ(std::memcmp(&row[static_cast<std::size_t>(j)], &want, sizeof(BlockQ5_0)), 0) << i << " " << j;
    }
    // Straight from the layout: the same floats as the plain row's dequantisation (NaN scales included).
    dequantize_row(DType::kQ5_0, row.data(), want_f.data(), k);
    dequantize_lane_q5_0_r8(&packed[static_cast<std::size_t>((i / 8) * nb)], static_cast<int>(i % 8), nb, got_f.data());
    ASSERT_EQ(std::memcmp(want_f.data(), got_f.data(), want_f.size() * sizeof(float)), 0) << "row " << i;
  }
}

}  // namespace
}  // namespace sx::hal
