// kernels/dequant.cuh compiled for the host: every weight element of every format, bit for bit,
// against hal::dequantize_row (the CPU reference the GPU kernels must equal), on random blocks
// with finite scales.
#include "kernels/dequant.cuh"

#include <cstring>
#include <random>
#include <vector>

#include <gtest/gtest.h>

#include "runtime/base/half.h"
#include "runtime/hal/dtype.h"

namespace sx::kernels {
namespace {

// Random bytes for `blocks` blocks of `t`, every fp16 field a finite value of modest size (the
// field offsets of each GGML block, dtype.h / quant.h).
std::vector<std::uint8_t> random_row(hal::DType t, int blocks, std::mt19937& rng) {
  const hal::DTypeInfo& info = hal::dtype_info(t);
  std::vector<std::uint8_t> bytes(static_cast<std::size_t>(blocks) * info.block_bytes);
  std::uniform_int_distribution<int> byte(0, 255);
  for (auto& b : bytes) b = static_cast<std::uint8_t>(byte(rng));
  std::uniform_real_distribution<float> scale(-2.0f, 2.0f);
  auto set_half = [&](std::size_t at) {
    const std::uint16_t h = f32_to_f16(scale(rng));
    std::memcpy(&bytes[at], &h, 2);
  };
  for (int blk = 0; blk < blocks; ++blk) {
    const std::size_t b = static_cast<std::size_t>(blk) * info.block_bytes;
    switch (t) {
      case hal::DType::kF16:
      case hal::DType::kBF16:
        if (t == hal::DType::kF16) set_half(b);
        else { const std::uint16_t v = f32_to_bf16(scale(rng)); std::memcpy(&bytes[b], &v, 2); }
        break;
      case hal::DType::kF32: { const float v = scale(rng); std::memcpy(&bytes[b], &v, 4); break; }
      case hal::DType::kQ8_0: case hal::DType::kQ4_0: case hal::DType::kQ5_0: set_half(b); break;
      case hal::DType::kQ4_1: case hal::DType::kQ5_1: case hal::DType::kQ4_K: case hal::DType::kQ5_K:
        set_half(b), set_half(b + 2);
        break;
      case hal::DType::kQ2_K: set_half(b + 80), set_half(b + 82); break;
      case hal::DType::kQ3_K: set_half(b + 108); break;
      case hal::DType::kQ6_K: set_half(b + 208); break;
      case hal::DType::kAwqInt4: set_half(b + 64), set_half(b + 66); break;
      default: break;
    }
  }
  return bytes;
}

class Dequant : public ::testing::TestWithParam<hal::DType> {};

TEST_P(Dequant, EveryElementEqualsTheCpuReferenceBitForBit) {
  const hal::DType t = GetParam();
  std::mt19937 rng(1234 + static_cast<int>(t));
  const int be = hal::dtype_info(t).block_elems;
  EXPECT_EQ(block_elems(static_cast<int>(t)), be);
  EXPECT_EQ(block_bytes(static_cast<int>(t)), hal::dtype_info(t).block_bytes);
  for (int trial = 0; trial < 20; ++trial) {
    const int blocks = 1 + trial % 4;
    const std::int64_t n = static_cast<std::int64_t>(blocks) * be;
    const std::vector<std::uint8_t> row = random_row(t, blocks, rng);
    std::vector<float> want(static_cast<std::size_t>(n));
    hal::dequantize_row(t, row.data(), want.data(), n);
    for (std::int64_t j = 0; j < n; ++j) {
      const float got = dequant_element(static_cast<int>(t), row.data(), j);
      std::uint32_t gb, wb;
      std::memcpy(&gb, &got, 4);
      std::memcpy(&wb, &want[static_cast<std::size_t>(j)], 4);
      ASSERT_EQ(gb, wb) << hal::dtype_name(t) << " element " << j << " of " << n << ": " << got << " vs "
                        << want[static_cast<std::size_t>(j)];
    }
  }
}

INSTANTIATE_TEST_SUITE_P(AllWeightFormats, Dequant,
                         ::testing::Values(hal::DType::kF32, hal::DType::kF16, hal::DType::kBF16, hal::DType::kQ8_0,
                                           hal::DType::kQ4_0, hal::DType::kQ4_1, hal::DType::kQ5_0, hal::DType::kQ5_1,
                                           hal::DType::kQ2_K, hal::DType::kQ3_K, hal::DType::kQ4_K, hal::DType::kQ5_K,
                                           hal::DType::kQ6_K, hal::DType::kAwqInt4),
                         [](const auto& info) { return std::string(hal::dtype_name(info.param)); });

}  // namespace
}  // namespace sx::kernels
