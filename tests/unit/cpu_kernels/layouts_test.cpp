// The CPU backend's weight layouts (backends/cpu/kernels/layouts.h): Q8_0 / Q5_0 rows interleaved
// hold the same blocks as the file, in the documented positions, with zero padding rows.
#include "backends/cpu/kernels/layouts.h"

#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <type_traits>
#include <vector>

#include "backends/cpu/kernels/matmul.h"
#include "runtime/base/half.h"
#include "runtime/hal/dtype.h"
#include "runtime/hal/quant.h"

namespace sx::cpu {
namespace {

using hal::BlockQ5_0;
using hal::BlockQ8_0;
using hal::DType;
using hal::kQ8_0Block;
using hal::kQK;
using hal::dequantize_row;

TEST(CpuLayouts, ValuesLiePastHalsFormatsAndNameTheirSource) {
  EXPECT_GT(static_cast<int>(kQ8_0R16), static_cast<int>(DType::kQ5_K));
  EXPECT_EQ(layout_source(kQ8_0R16), DType::kQ8_0);
  EXPECT_EQ(interleaved_rows(kQ8_0R16), kQ8_0R16Rows);
  EXPECT_EQ(cpu::row_bytes(kQ8_0R16, 64), hal::row_bytes(DType::kQ8_0, 64));
  EXPECT_EQ(type_name(kQ5_0R8), "q5_0_r8");
  EXPECT_EQ(type_name(DType::kQ4_K), "q4_k");
  EXPECT_EQ(weight_layout(DType::kQ8_0, 64), vector_interleaved() ? kQ8_0R16 : DType::kQ8_0);
  EXPECT_EQ(weight_layout(DType::kQ5_0, 64), vector_interleaved() ? kQ5_0R8 : DType::kQ5_0);
  EXPECT_EQ(weight_layout(DType::kQ4_0, 64), vector_interleaved() ? kQ4_0R8 : DType::kQ4_0);
  EXPECT_EQ(type_name(kQ4_0R8), "q4_0_r8");
  EXPECT_EQ(weight_layout(DType::kQ4_K, 64), vector_interleaved() ? kQ4_KR8 : DType::kQ4_K);
  EXPECT_EQ(weight_layout(DType::kQ5_K, 64), vector_interleaved() ? kQ5_KR8 : DType::kQ5_K);
  EXPECT_EQ(weight_layout(DType::kQ6_K, 64), DType::kQ6_K);
  EXPECT_EQ(weight_layout(DType::kQ4_1, 64), vector_interleaved() ? kQ4_1R8 : DType::kQ4_1);
  EXPECT_EQ(weight_layout(DType::kQ5_1, 64), vector_interleaved() ? kQ5_1R8 : DType::kQ5_1);
  EXPECT_EQ(type_name(kQ5_1R8), "q5_1_r8");
  EXPECT_EQ(type_name(kQ4_KR8), "q4_k_r8");
  EXPECT_EQ(type_name(kQ5_KR8), "q5_k_r8");
  EXPECT_EQ(weight_layout(DType::kF32, 63), vector_interleaved() ? kF32R16 : DType::kF32);
  EXPECT_EQ(weight_layout(DType::kF16, 64), vector_interleaved() ? kF16R16 : DType::kF16);
  EXPECT_EQ(weight_layout(DType::kBF16, 64), vector_interleaved() ? kBF16R16 : DType::kBF16);
  EXPECT_EQ(weight_layout(DType::kF16, 63), DType::kF16);  // pairs need an even k
  EXPECT_EQ(weight_layout(DType::kBF16, 63), DType::kBF16);
  EXPECT_EQ(type_name(kBF16R16), "bf16_r16");
  EXPECT_EQ(layout_source(kF16R16), DType::kF16);
}

// kF32R16 / kF16R16 / kBF16R16 hold the file's elements where layouts.h says (element i of row r of
// a whole panel at i * 16 + r, resp. in word (i / 2) * 16 + r, half i % 2; the rows past the last
// whole panel as the file holds them), in exactly the file's bytes, and unpack_row gives each row
// back.
TEST(CpuLayouts, FloatR16RepackRoundTrip) {
  const std::int64_t rows = 37, k = 10;
  for (const DType layout : {kF32R16, kF16R16, kBF16R16}) {
    const DType plain = layout_source(layout);
    const std::size_t elem = plain == DType::kF32 ? 4 : 2;
    EXPECT_EQ(cpu::tensor_bytes(layout, rows, k), rows * k * elem);
    std::mt19937 rng(9);
    std::vector<std::uint8_t> src(rows * k * elem);
    for (auto& b : src) b = static_cast<std::uint8_t>(rng());
    std::vector<std::uint8_t> packed(cpu::tensor_bytes(layout, rows, k));
    repack_rows(layout, src.data(), rows, k, packed.data());
    const std::int64_t r = 19, i = 7;  // panel 1, row 3 of it
    const std::size_t at = 16 * k * elem + elem * (layout == kF32R16 ? i * 16 + 3 : (i / 2) * 32 + 2 * 3 + i % 2);
    EXPECT_EQ(std::memcmp(packed.data() + at, src.data() + (r * k + i) * elem, elem), 0) << type_name(layout);
    EXPECT_EQ(std::memcmp(packed.data() + 32 * k * elem, src.data() + 32 * k * elem, 5 * k * elem), 0);  // the tail
    std::vector<std::uint8_t> row(k * elem);
    for (std::int64_t j = 0; j < rows; ++j) {
      unpack_row(layout, packed.data(), k, j, rows, row.data());
      ASSERT_EQ(std::memcmp(row.data(), src.data() + j * k * elem, k * elem), 0) << type_name(layout) << " row " << j;
    }
  }
}

// kQ8_0R16 holds the same blocks as Q8_0, 16 rows interleaved; padding rows are zero.
TEST(CpuLayouts, Q8_0R16RepackRoundTrip) {
  const std::int64_t rows = 37, k = 96, nb = k / kQ8_0Block;
  EXPECT_EQ(cpu::tensor_bytes(kQ8_0R16, rows, k), 48u * nb * sizeof(BlockQ8_0));  // 37 -> 48 rows
  EXPECT_EQ(hal::tensor_bytes(DType::kQ8_0, rows, k), 37u * nb * sizeof(BlockQ8_0));
  std::mt19937 rng(5);
  std::vector<BlockQ8_0> plain(static_cast<std::size_t>(rows * nb));
  for (BlockQ8_0& b : plain) {
    b.d = static_cast<std::uint16_t>(rng());
    for (std::int8_t& q : b.qs) q = static_cast<std::int8_t>(rng());
  }
  std::vector<BlockQ8_0x16> packed(cpu::tensor_bytes(kQ8_0R16, rows, k) / sizeof(BlockQ8_0x16));
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

// kQ5_0R8 holds the same scales and 5-bit values as Q5_0, 8 rows interleaved as layouts.h
// documents; padding rows are zero. Random bytes cover every nibble and high-bit pattern.
TEST(CpuLayouts, Q5_0R8RepackRoundTrip) {
  const std::int64_t rows = 19, k = 96, nb = k / kQK;
  EXPECT_EQ(cpu::tensor_bytes(kQ5_0R8, rows, k), 24u * nb * sizeof(BlockQ5_0));  // 19 -> 24 rows
  EXPECT_EQ(layout_source(kQ5_0R8), DType::kQ5_0);
  EXPECT_EQ(interleaved_rows(kQ5_0R8), kQ5_0R8Rows);
  EXPECT_EQ(layout_source(DType::kQ4_K), DType::kQ4_K);
  EXPECT_EQ(interleaved_rows(DType::kQ4_K), 1);
  std::mt19937 rng(7);
  std::vector<BlockQ5_0> plain(static_cast<std::size_t>(rows * nb));
  for (BlockQ5_0& b : plain) {
    b.d = static_cast<std::uint16_t>(rng());
    for (std::uint8_t& q : b.qh) q = static_cast<std::uint8_t>(rng());
    for (std::uint8_t& q : b.qs) q = static_cast<std::uint8_t>(rng());
  }
  std::vector<BlockQ5_0x8> packed(cpu::tensor_bytes(kQ5_0R8, rows, k) / sizeof(BlockQ5_0x8));
  repack_rows(kQ5_0R8, plain.data(), rows, k, packed.data());
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
    unpack_row(kQ5_0R8, packed.data(), k, i, rows, row.data());
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

// kQ4_0R8 holds the same scales and 4-bit values as Q4_0, 8 rows interleaved as layouts.h
// documents (kQ5_0R8's nibbles); padding rows are zero; the Q8_0 values the int8 GEMM reads from it
// are Q4_0's, and its dequantisation is Q4_0's to the bit.
TEST(CpuLayouts, Q4_0R8RepackRoundTrip) {
  const std::int64_t rows = 21, k = 96, nb = k / kQK;
  EXPECT_EQ(cpu::tensor_bytes(kQ4_0R8, rows, k), 24u * nb * sizeof(hal::BlockQ4_0));  // 21 -> 24 rows
  EXPECT_EQ(layout_source(kQ4_0R8), DType::kQ4_0);
  EXPECT_EQ(interleaved_rows(kQ4_0R8), kQ4_0R8Rows);
  EXPECT_TRUE(converts_to_q8_0(kQ4_0R8));
  std::mt19937 rng(11);
  std::vector<hal::BlockQ4_0> plain(static_cast<std::size_t>(rows * nb));
  for (hal::BlockQ4_0& b : plain) {
    b.d = static_cast<std::uint16_t>(rng());
    for (std::uint8_t& q : b.qs) q = static_cast<std::uint8_t>(rng());
  }
  std::vector<BlockQ4_0x8> packed(cpu::tensor_bytes(kQ4_0R8, rows, k) / sizeof(BlockQ4_0x8));
  repack_rows(kQ4_0R8, plain.data(), rows, k, packed.data());
  const std::int64_t r = 17, b = 2;
  const hal::BlockQ4_0& src = plain[static_cast<std::size_t>(r * nb + b)];
  const BlockQ4_0x8& g = packed[static_cast<std::size_t>((r / 8) * nb + b)];
  const int lane = static_cast<int>(r % 8);
  EXPECT_EQ(g.d[lane], src.d);
  for (int j = 0; j < kQK; ++j) {
    const int want = j < 16 ? src.qs[j] & 15 : src.qs[j - 16] >> 4;
    const int i = j / 8, e = j % 4;
    const int nibble = j % 8 < 4 ? g.qs[32 * i + 4 * lane + e] & 15 : g.qs[32 * i + 4 * lane + e] >> 4;
    ASSERT_EQ(nibble, want) << "element " << j;
  }
  std::vector<hal::BlockQ4_0> row(static_cast<std::size_t>(nb));
  std::vector<BlockQ8_0> as_q8(static_cast<std::size_t>(nb));
  std::vector<float> want_f(static_cast<std::size_t>(k)), got_f(static_cast<std::size_t>(k));
  for (std::int64_t i = 0; i < 24; ++i) {
    unpack_row(kQ4_0R8, packed.data(), k, i, rows, row.data());
    for (std::int64_t j = 0; j < nb; ++j) {
      const hal::BlockQ4_0 want = i < rows ? plain[static_cast<std::size_t>(i * nb + j)] : hal::BlockQ4_0{};
      ASSERT_EQ(std::memcmp(&row[static_cast<std::size_t>(j)], &want, sizeof(hal::BlockQ4_0)), 0) << i << " " << j;
    }
    dequantize_row(DType::kQ4_0, row.data(), want_f.data(), k);
    dequantize_lane_q4_0_r8(&packed[static_cast<std::size_t>((i / 8) * nb)], static_cast<int>(i % 8), nb, got_f.data());
    ASSERT_EQ(std::memcmp(want_f.data(), got_f.data(), want_f.size() * sizeof(float)), 0) << "row " << i;
    if (i >= rows) continue;
    blocks_as_q8_0(kQ4_0R8, packed.data(), k, i, 0, nb, as_q8.data());
    for (std::int64_t j = 0; j < nb; ++j) {
      const hal::BlockQ4_0& in = plain[static_cast<std::size_t>(i * nb + j)];
      ASSERT_EQ(as_q8[static_cast<std::size_t>(j)].d, in.d);
      for (int c = 0; c < kQK; ++c) {
        const int q = c < 16 ? in.qs[c] & 15 : in.qs[c - 16] >> 4;
        ASSERT_EQ(as_q8[static_cast<std::size_t>(j)].qs[c], q - 8) << i << " " << j << " " << c;
      }
    }
  }
}

// kQ4_1R8 / kQ5_1R8 hold the same scales, mins and 4- or 5-bit values as Q4_1 / Q5_1, 8 rows
// interleaved as layouts.h documents (the nibbles and fifth bits of kQ4_0R8 / kQ5_0R8); padding
// rows are zero; the rows given back are the file's to the byte and dequantise to the same bits.
template <typename Block, typename Block8>
void check_1_r8(DType layout, DType source, std::uint32_t seed) {
  const std::int64_t rows = 11, k = 96, nb = k / kQK;
  EXPECT_EQ(cpu::tensor_bytes(layout, rows, k), 16u * nb * sizeof(Block));  // 11 -> 16 rows
  EXPECT_EQ(layout_source(layout), source);
  EXPECT_EQ(interleaved_rows(layout), 8);
  EXPECT_FALSE(gemm_q8_reads(layout));
  std::mt19937 rng(seed);
  std::vector<Block> plain(static_cast<std::size_t>(rows * nb));
  for (Block& b : plain) {
    auto* bytes = reinterpret_cast<std::uint8_t*>(&b);
    for (std::size_t i = 0; i < sizeof(Block); ++i) bytes[i] = static_cast<std::uint8_t>(rng());
  }
  std::vector<Block8> packed(cpu::tensor_bytes(layout, rows, k) / sizeof(Block8));
  repack_rows(layout, plain.data(), rows, k, packed.data());
  const std::int64_t r = 9, b = 1;
  const Block& src = plain[static_cast<std::size_t>(r * nb + b)];
  const Block8& g = packed[static_cast<std::size_t>((r / 8) * nb + b)];
  const int lane = static_cast<int>(r % 8);
  EXPECT_EQ(g.d[lane], src.d);
  EXPECT_EQ(g.m[lane], src.m);
  for (int j = 0; j < kQK; ++j) {
    int want = j < 16 ? src.qs[j] & 15 : src.qs[j - 16] >> 4;
    const int i = j / 8, e = j % 4;
    int got = j % 8 < 4 ? g.qs[32 * i + 4 * lane + e] & 15 : g.qs[32 * i + 4 * lane + e] >> 4;
    if constexpr (std::is_same_v<Block, hal::BlockQ5_1>) {
      std::uint32_t qh;
      std::memcpy(&qh, src.qh, 4);
      want |= static_cast<int>((qh >> j) & 1) << 4;
      got |= ((g.qh[4 * lane + e] >> (j / 4)) & 1) << 4;
    }
    ASSERT_EQ(got, want) << "element " << j;
  }
  std::vector<Block> row(static_cast<std::size_t>(nb));
  std::vector<float> want_f(static_cast<std::size_t>(k)), got_f(static_cast<std::size_t>(k));
  for (std::int64_t i = 0; i < 16; ++i) {
    unpack_row(layout, packed.data(), k, i, rows, row.data());
    for (std::int64_t j = 0; j < nb; ++j) {
      const Block want = i < rows ? plain[static_cast<std::size_t>(i * nb + j)] : Block{};
      ASSERT_EQ(std::memcmp(&row[static_cast<std::size_t>(j)], &want, sizeof(Block)), 0) << i << " " << j;
    }
    dequantize_row(source, row.data(), want_f.data(), k);
    const Block8* group = &packed[static_cast<std::size_t>((i / 8) * nb)];
    if constexpr (std::is_same_v<Block, hal::BlockQ5_1>) {
      dequantize_lane_q5_1_r8(group, static_cast<int>(i % 8), nb, got_f.data());
    } else {
      dequantize_lane_q4_1_r8(group, static_cast<int>(i % 8), nb, got_f.data());
    }
    ASSERT_EQ(std::memcmp(want_f.data(), got_f.data(), want_f.size() * sizeof(float)), 0) << "row " << i;
  }
}

TEST(CpuLayouts, Q4_1R8RepackRoundTrip) { check_1_r8<hal::BlockQ4_1, BlockQ4_1x8>(kQ4_1R8, DType::kQ4_1, 7); }
TEST(CpuLayouts, Q5_1R8RepackRoundTrip) { check_1_r8<hal::BlockQ5_1, BlockQ5_1x8>(kQ5_1R8, DType::kQ5_1, 8); }

// kQ4_KR8 / kQ5_KR8 hold the same scales, mins and 4- or 5-bit values as Q4_K / Q5_K, 8 rows
// interleaved as layouts.h documents; padding rows are zero; the row a layout gives back is the
// file's to the byte, and the Q8_0 blocks the int8 GEMM reads from it are the plain format's.
template <typename Block, typename Block8>
void check_k_r8(DType layout, DType source, std::uint32_t seed) {
  const std::int64_t rows = 13, k = 512, nsb = k / hal::kQK_K;
  EXPECT_EQ(cpu::tensor_bytes(layout, rows, k), 16u * nsb * sizeof(Block));  // 13 -> 16 rows
  EXPECT_EQ(layout_source(layout), source);
  EXPECT_EQ(interleaved_rows(layout), 8);
  EXPECT_TRUE(requantizes_to_q8_0(layout));
  std::mt19937 rng(seed);
  std::vector<Block> plain(static_cast<std::size_t>(rows * nsb));
  for (Block& b : plain) {
    auto* bytes = reinterpret_cast<std::uint8_t*>(&b);
    for (std::size_t i = 0; i < sizeof(Block); ++i) bytes[i] = static_cast<std::uint8_t>(rng());
    b.d = f32_to_f16(0.01f);
    b.dmin = f32_to_f16(0.002f);
  }
  std::vector<Block8> packed(cpu::tensor_bytes(layout, rows, k) / sizeof(Block8));
  repack_rows(layout, plain.data(), rows, k, packed.data());
  // Documented positions: row 10, super-block 1, every element.
  const std::int64_t r = 10, b = 1;
  const Block& src = plain[static_cast<std::size_t>(r * nsb + b)];
  const Block8& g = packed[static_cast<std::size_t>((r / 8) * nsb + b)];
  const int lane = static_cast<int>(r % 8);
  EXPECT_EQ(g.d[lane], src.d);
  EXPECT_EQ(g.dmin[lane], src.dmin);
  for (int j = 0; j < 3; ++j) EXPECT_EQ(std::memcmp(g.scales[j] + 4 * lane, src.scales + 4 * j, 4), 0);
  for (int e = 0; e < hal::kQK_K; ++e) {
    const int c = e / 64, l = e % 32;
    const int want = e % 64 < 32 ? src.qs[32 * c + l] & 15 : src.qs[32 * c + l] >> 4;
    const int s = e / 32, j = e % 32, i = j / 8, el = j % 4;
    const std::uint8_t byte = g.qs[128 * s + 32 * i + 4 * lane + el];
    ASSERT_EQ(j % 8 < 4 ? byte & 15 : byte >> 4, want) << "element " << e;
    if constexpr (std::is_same_v<Block, hal::BlockQ5_K>) {
      const int want_hi = (src.qh[l] >> (2 * c + (e % 64 < 32 ? 0 : 1))) & 1;
      ASSERT_EQ((g.qh[32 * s + 4 * lane + el] >> (j / 4)) & 1, want_hi) << "fifth bit of element " << e;
    }
  }
  std::vector<Block> row(static_cast<std::size_t>(nsb));
  std::vector<BlockQ8_0> as_q8(static_cast<std::size_t>(k / kQK)), want_q8(static_cast<std::size_t>(k / kQK));
  for (std::int64_t i = 0; i < 16; ++i) {
    unpack_row(layout, packed.data(), k, i, rows, row.data());
    for (std::int64_t j = 0; j < nsb; ++j) {
      const Block want = i < rows ? plain[static_cast<std::size_t>(i * nsb + j)] : Block{};
      ASSERT_EQ(std::memcmp(&row[static_cast<std::size_t>(j)], &want, sizeof(Block)), 0) << i << " " << j;
    }
    // Straight from the layout: the same floats as the plain row's dequantisation.
    std::vector<float> want_f(static_cast<std::size_t>(k)), got_f(static_cast<std::size_t>(k));
    dequantize_row(source, row.data(), want_f.data(), k);
    if constexpr (std::is_same_v<Block, hal::BlockQ5_K>) {
      dequantize_lane_q5_k_r8(&packed[static_cast<std::size_t>((i / 8) * nsb)], static_cast<int>(i % 8), nsb, got_f.data());
    } else {
      dequantize_lane_q4_k_r8(&packed[static_cast<std::size_t>((i / 8) * nsb)], static_cast<int>(i % 8), nsb, got_f.data());
    }
    ASSERT_EQ(std::memcmp(want_f.data(), got_f.data(), want_f.size() * sizeof(float)), 0) << "row " << i;
    if (i >= rows) continue;
    blocks_as_q8_0(layout, packed.data(), k, i, 1, k / kQK - 1, as_q8.data());
    blocks_as_q8_0(source, plain.data(), k, i, 1, k / kQK - 1, want_q8.data());
    ASSERT_EQ(std::memcmp(as_q8.data(), want_q8.data(), (k / kQK - 1) * sizeof(BlockQ8_0)), 0) << "row " << i;
  }
}

TEST(CpuLayouts, Q4_KR8RepackRoundTrip) { check_k_r8<hal::BlockQ4_K, BlockQ4_Kx8>(kQ4_KR8, DType::kQ4_K, 3); }
TEST(CpuLayouts, Q5_KR8RepackRoundTrip) { check_k_r8<hal::BlockQ5_K, BlockQ5_Kx8>(kQ5_KR8, DType::kQ5_K, 4); }

}  // namespace
}  // namespace sx::cpu
