// GGML block formats: hand-derived blocks (edge scales, extreme quants, sign of zero) for the
// dequantisers, and error bounds of the reference quantisers. The bit-exact comparison against
// ggml's own numpy implementation is dequant_reference_test.py.
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "runtime/base/half.h"
#include "runtime/hal/dtype.h"
#include "runtime/hal/quant.h"

namespace sx::hal {
namespace {

constexpr std::uint16_t kOne = 0x3C00, kMinusOne = 0xBC00, kMinusTwo = 0xC000, kHalf = 0x3800,
                        kQuarter = 0x3400, kSubMin = 0x0001, kF16Max = 0x7BFF;

void expect_same_bits(float got, float want, int i) {
  EXPECT_EQ(std::bit_cast<std::uint32_t>(got), std::bit_cast<std::uint32_t>(want))
      << "element " << i << ": got " << got << ", want " << want;
}

TEST(Quant, FormatTable) {
  const struct {
    DType t;
    const char* name;
    int elems, bytes;
  } expected[] = {
      {DType::kQ4_1, "q4_1", 32, 20}, {DType::kQ5_1, "q5_1", 32, 24}, {DType::kQ2_K, "q2_k", 256, 84},
      {DType::kQ3_K, "q3_k", 256, 110}, {DType::kQ5_K, "q5_k", 256, 176},
  };
  for (const auto& e : expected) {
    EXPECT_EQ(dtype_name(e.t), e.name);
    EXPECT_EQ(dtype_from_name(e.name), e.t);
    EXPECT_EQ(dtype_info(e.t).block_elems, e.elems);
    EXPECT_EQ(dtype_info(e.t).block_bytes, e.bytes);
    EXPECT_TRUE(can_dequantize(e.t));
  }
  EXPECT_TRUE(can_quantize(DType::kQ2_K));
  EXPECT_TRUE(can_quantize(DType::kQ3_K));
  EXPECT_TRUE(can_quantize(DType::kQ4_K));
  EXPECT_TRUE(can_dequantize(DType::kAwqInt4));  // quantised by the AWQ checkpoint writer instead
  EXPECT_FALSE(can_quantize(DType::kAwqInt4));
  EXPECT_FALSE(can_dequantize(DType::kI32));
}

// Sextant's AWQ int4 block: byte j holds elements 2j (low nibble) and 2j + 1 (high), then the fp16
// scale and zero point; w = (q - zero) * scale.
TEST(Quant, AwqInt4HandBlock) {
  std::uint8_t b[kAwqInt4BlockBytes] = {};
  b[0] = 0xF0;  // element 0: q 0, element 1: q 15
  b[63] = 0x38;  // element 126: q 8, element 127: q 3
  const std::uint16_t scale = 0x3800, zero = 0x4200;  // 0.5, 3.0
  std::memcpy(b + 64, &scale, 2);
  std::memcpy(b + 66, &zero, 2);
  float out[kAwqInt4Group];
  dequantize_row(DType::kAwqInt4, b, out, kAwqInt4Group);
  EXPECT_EQ(out[0], -1.5f);
  EXPECT_EQ(out[1], 6.0f);
  EXPECT_EQ(out[2], -1.5f);  // q 0 elsewhere
  EXPECT_EQ(out[126], 2.5f);
  EXPECT_EQ(out[127], 0.0f);
}

TEST(Quant, Q4_0HandBlocks) {
  BlockQ4_0 b[5];
  b[0].d = kOne;  // low nibble 15 -> +7, high nibble 0 -> -8
  std::memset(b[0].qs, 0x0F, sizeof(b[0].qs));
  b[1].d = kMinusTwo;  // low 0 -> -8 * -2 = 16, high 8 -> 0 * -2 = -0
  std::memset(b[1].qs, 0x80, sizeof(b[1].qs));
  b[2].d = kSubMin;  // 7 * 2^-24 and -8 * 2^-24, exact
  std::memset(b[2].qs, 0x0F, sizeof(b[2].qs));
  b[3].d = kF16Max;  // -8 * 65504 and 7 * 65504
  std::memset(b[3].qs, 0xF0, sizeof(b[3].qs));
  b[4].d = 0;  // zero scale: every weight +0 or -0 (q - 8 < 0 gives -0)
  std::memset(b[4].qs, 0x9F, sizeof(b[4].qs));
  std::vector<float> y(5 * 32);
  dequantize_row(DType::kQ4_0, b, y.data(), 5 * 32);
  const float sub = std::ldexp(1.0f, -24);
  for (int j = 0; j < 16; ++j) {
    expect_same_bits(y[j], 7.0f, j);
    expect_same_bits(y[16 + j], -8.0f, 16 + j);
    expect_same_bits(y[32 + j], 16.0f, 32 + j);
    expect_same_bits(y[48 + j], -0.0f, 48 + j);
    expect_same_bits(y[64 + j], 7.0f * sub, 64 + j);
    expect_same_bits(y[80 + j], -8.0f * sub, 80 + j);
    expect_same_bits(y[96 + j], -8.0f * 65504.0f, 96 + j);
    expect_same_bits(y[112 + j], 7.0f * 65504.0f, 112 + j);
    expect_same_bits(y[128 + j], 0.0f, 128 + j);   // 15 - 8 = 7, times +0
    expect_same_bits(y[144 + j], 0.0f, 144 + j);   // 9 - 8 = 1
  }
}

// Scales/mins of the eight sub-blocks: sc = {1, 2, 3, 63, 16, 33, 0, 63}, m = {0, 1, 2, 63, 17, 48, 5, 0},
// packed by hand after ggml's get_scale_min_k4.
constexpr std::uint8_t kQ4KScales[12] = {65, 130, 3, 255, 64, 193, 2, 63, 16, 1, 80, 15};
constexpr int kQ4KSc[8] = {1, 2, 3, 63, 16, 33, 0, 63};
constexpr int kQ4KM[8] = {0, 1, 2, 63, 17, 48, 5, 0};

TEST(Quant, Q4_KScaleUnpacking) {
  for (int j = 0; j < 8; ++j) {
    std::uint8_t sc, m;
    q4k_scale_min(j, kQ4KScales, &sc, &m);
    EXPECT_EQ(sc, kQ4KSc[j]) << j;
    EXPECT_EQ(m, kQ4KM[j]) << j;
  }
}

TEST(Quant, Q4_KHandBlocks) {
  BlockQ4_K b[3];
  for (auto& x : b) {
    std::memcpy(x.scales, kQ4KScales, 12);
    std::memset(x.qs, 0x5A, sizeof(x.qs));  // even sub-blocks q = 10, odd q = 5
  }
  b[0].d = kOne;
  b[0].dmin = kHalf;
  b[1].d = kMinusOne;  // negative scales: every weight negated
  b[1].dmin = 0xB800;
  b[2].d = kSubMin;  // subnormal d, zero dmin
  b[2].dmin = 0;
  // 1 * sc * q - 0.5 * m per sub-block
  const float want[8] = {10.0f, 9.5f, 29.0f, 283.5f, 151.5f, 141.0f, -2.5f, 315.0f};
  std::vector<float> y(3 * 256);
  dequantize_row(DType::kQ4_K, b, y.data(), 3 * 256);
  const float sub = std::ldexp(1.0f, -24);
  for (int i = 0; i < 256; ++i) {
    const int s = i / 32;
    const int q = s % 2 == 0 ? 10 : 5;
    expect_same_bits(y[i], want[s], i);
    expect_same_bits(y[256 + i], -want[s], 256 + i);
    expect_same_bits(y[512 + i], static_cast<float>(kQ4KSc[s] * q) * sub - 0.0f, 512 + i);
  }
  // Max nibbles at max scale: 63 * 15 * 65504 is finite in float.
  BlockQ4_K big{};
  big.d = kF16Max;
  std::memset(big.scales, 0xFF, 12);  // every sc = m = 63
  std::memset(big.qs, 0xFF, sizeof(big.qs));
  dequantize_row(DType::kQ4_K, &big, y.data(), 256);
  for (int i = 0; i < 256; ++i) expect_same_bits(y[i], 65504.0f * 63.0f * 15.0f, i);
}

TEST(Quant, Q6_KHandBlocks) {
  BlockQ6_K b[3];
  std::memset(b, 0, sizeof(b));
  b[0].d = kQuarter;  // all quants 0 -> q - 32 = -32; scales s - 8
  for (int s = 0; s < 16; ++s) b[0].scales[s] = static_cast<std::int8_t>(s - 8);
  b[1] = b[0];  // all bits set -> 31
  std::memset(b[1].ql, 0xFF, sizeof(b[1].ql));
  std::memset(b[1].qh, 0xFF, sizeof(b[1].qh));
  b[1].scales[3] = -128;
  b[2].d = kOne;  // nibble / high-bit placement
  for (int s = 0; s < 16; ++s) b[2].scales[s] = 1;
  b[2].ql[0] = 0x21;
  b[2].ql[32] = 0x43;
  b[2].qh[0] = 0xE4;  // 2-bit fields 0, 1, 2, 3
  b[2].ql[64 + 5] = 0x0F;
  b[2].qh[32 + 5] = 0x30;  // element 128+64+5 gets high bits 3
  std::vector<float> y(3 * 256);
  dequantize_row(DType::kQ6_K, b, y.data(), 3 * 256);
  for (int i = 0; i < 256; ++i) {
    const int s = i / 16;
    expect_same_bits(y[i], 0.25f * static_cast<float>(s - 8) * -32.0f, i);
    const float sc1 = s == 3 ? -128.0f : static_cast<float>(s - 8);
    expect_same_bits(y[256 + i], 0.25f * sc1 * 31.0f, 256 + i);
  }
  std::vector<float> want(256, -32.0f);
  want[0] = 1 - 32;             // low(ql[0]) = 1, qh bits 0
  want[32] = (3 | 1 << 4) - 32;   // low(ql[32]) = 3, qh bits 1
  want[64] = (2 | 2 << 4) - 32;   // high(ql[0]) = 2, qh bits 2
  want[96] = (4 | 3 << 4) - 32;   // high(ql[32]) = 4, qh bits 3
  want[128 + 5] = 15 - 32;
  want[128 + 64 + 5] = (0 | 3 << 4) - 32;
  for (int i = 0; i < 256; ++i) expect_same_bits(y[512 + i], want[i], 512 + i);
}

TEST(Quant, Q5_0HandBlock) {
  BlockQ5_0 b{};
  b.d = kHalf;
  std::memset(b.qs, 0xF0, sizeof(b.qs));    // low nibble 0, high 15
  const std::uint32_t qh = 0x0001FFFEu;     // bit j (j < 16) for element j, bit 16 + j for element 16 + j
  std::memcpy(b.qh, &qh, 4);
  std::vector<float> y(32);
  dequantize_row(DType::kQ5_0, &b, y.data(), 32);
  expect_same_bits(y[0], -8.0f, 0);                 // (0 - 16) / 2
  for (int j = 1; j < 16; ++j) expect_same_bits(y[j], 0.0f, j);  // (16 - 16) / 2
  expect_same_bits(y[16], 7.5f, 16);                // (31 - 16) / 2
  for (int j = 17; j < 32; ++j) expect_same_bits(y[j], -0.5f, j);  // (15 - 16) / 2
}

TEST(Quant, Q2_KAndQ3_KHandBlocks) {
  BlockQ2_K b{};
  b.d = kOne;
  b.dmin = kHalf;
  for (int s = 0; s < 16; ++s) b.scales[s] = static_cast<std::uint8_t>((s & 0xF) | ((15 - s) << 4));
  std::memset(b.qs, 0xE4, sizeof(b.qs));  // shifts 0, 2, 4, 6 give q = 0, 1, 2, 3
  std::vector<float> y(256);
  dequantize_row(DType::kQ2_K, &b, y.data(), 256);
  for (int i = 0; i < 256; ++i) {
    const int s = i / 16, q = (i % 128) / 32;
    expect_same_bits(y[i], static_cast<float>(s) * static_cast<float>(q) - 0.5f * static_cast<float>(15 - s), i);
  }
  BlockQ3_K c{};
  c.d = kOne;
  // scale i = i (6 bits: low nibble in scales[i % 8] (high half for i >= 8), 2 high bits in scales[8 + i % 4]);
  // every scale here is < 16, so the high bits stay 0; offset -32 => dl = i - 32.
  for (int i = 0; i < 8; ++i) c.scales[i] = static_cast<std::uint8_t>(i | ((i + 8) << 4));
  std::memset(c.qs, 0xFF, sizeof(c.qs));     // q2 = 3 everywhere
  std::memset(c.hmask, 0x0F, sizeof(c.hmask));  // first 4 groups of 32: bit set -> no -4
  std::int8_t sc[16];
  q3k_scales(c.scales, sc);
  for (int i = 0; i < 16; ++i) EXPECT_EQ(sc[i], i - 32);
  dequantize_row(DType::kQ3_K, &c, y.data(), 256);
  for (int i = 0; i < 256; ++i) {
    const int q = i / 32 < 4 ? 3 : -1;
    expect_same_bits(y[i], static_cast<float>(i / 16 - 32) * static_cast<float>(q), i);
  }
}

// Rows with varied per-block magnitude, plus all-zero, constant, all-positive and all-negative
// blocks of 256.
std::vector<float> test_row(std::uint32_t seed, std::int64_t n) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::uniform_real_distribution<float> mag(-6.0f, 3.0f);
  std::vector<float> x(static_cast<std::size_t>(n));
  for (std::int64_t b = 0; b < n / 256; ++b) {
    const float scale = std::exp2(mag(rng));
    for (int i = 0; i < 256; ++i) {
      float v = nd(rng) * scale;
      if (b % 6 == 1) v = 0.0f;
      if (b % 6 == 2) v = 0.375f;
      if (b % 6 == 3) v = std::fabs(v) + scale;
      if (b % 6 == 4) v = -std::fabs(v);
      if (b % 6 == 5 && i / 32 == 3) v *= 100.0f;  // one loud sub-block
      x[static_cast<std::size_t>(b * 256 + i)] = v;
    }
  }
  return x;
}

std::vector<float> round_trip(DType t, const std::vector<float>& x, std::vector<std::uint8_t>& packed) {
  const auto n = static_cast<std::int64_t>(x.size());
  packed.assign(row_bytes(t, n), 0);
  quantize_row(t, x.data(), packed.data(), n);
  std::vector<float> y(x.size());
  dequantize_row(t, packed.data(), y.data(), n);
  return y;
}

TEST(Quant, LegacyRoundTripBounds) {
  const std::vector<float> x = test_row(11, 256 * 24);
  std::vector<std::uint8_t> packed;
  for (DType t : {DType::kQ4_0, DType::kQ5_0, DType::kQ4_1, DType::kQ5_1}) {
    const std::vector<float> y = round_trip(t, x, packed);
    const bool sym = t == DType::kQ4_0 || t == DType::kQ5_0;
    const float levels = (t == DType::kQ4_0 || t == DType::kQ4_1) ? 15.0f : 31.0f;
    for (std::size_t b = 0; b < x.size() / 32; ++b) {
      float mn = x[b * 32], mx = x[b * 32], amax = 0;
      for (int j = 0; j < 32; ++j) {
        mn = std::min(mn, x[b * 32 + j]);
        mx = std::max(mx, x[b * 32 + j]);
        amax = std::max(amax, std::fabs(x[b * 32 + j]));
      }
      // Symmetric formats: step amax / 8 (16); the value opposite the extreme may clamp one step.
      // Min formats: half a step of (max - min) / levels, plus fp16 rounding of d and m.
      const float bound = sym ? amax / (levels == 15.0f ? 8.0f : 16.0f) * 1.001f
                              : 0.5f * (mx - mn) / levels * 1.01f + std::ldexp(std::fabs(mn) + (mx - mn), -10);
      for (int j = 0; j < 32; ++j) {
        ASSERT_LE(std::fabs(x[b * 32 + j] - y[b * 32 + j]), bound + 1e-30f)
            << dtype_name(t) << " block " << b << " element " << j;
      }
    }
  }
}

// Q2_K and Q3_K (16-element sub-blocks): every value within half a step of its sub-block, the
// step close to what the range needs, and a row's relative RMS error within what 2 and 3 bits give.
TEST(Quant, LowBitKQuantRoundTripBounds) {
  const std::vector<float> x = test_row(13, 256 * 48);
  std::vector<std::uint8_t> packed;
  for (DType t : {DType::kQ2_K, DType::kQ3_K}) {
    const std::vector<float> y = round_trip(t, x, packed);
    double err2 = 0, x2 = 0;
    for (std::size_t b = 0; b < x.size() / 256; ++b) {
      const float* xb = x.data() + b * 256;
      const float* yb = y.data() + b * 256;
      std::int8_t sc3[16] = {};
      float d = 0, dmin = 0;
      if (t == DType::kQ3_K) {
        const auto* blk = reinterpret_cast<const BlockQ3_K*>(packed.data()) + b;
        q3k_scales(blk->scales, sc3);
        d = f16_to_f32(blk->d);
      } else {
        const auto* blk = reinterpret_cast<const BlockQ2_K*>(packed.data()) + b;
        d = f16_to_f32(blk->d);
        dmin = f16_to_f32(blk->dmin);
      }
      for (int s = 0; s < 16; ++s) {
        float mn = xb[16 * s], mx = xb[16 * s], amax = 0;
        for (int l = 0; l < 16; ++l) {
          mn = std::min(mn, xb[16 * s + l]);
          mx = std::max(mx, xb[16 * s + l]);
          amax = std::max(amax, std::fabs(xb[16 * s + l]));
        }
        float step;
        if (t == DType::kQ3_K) {
          step = d * static_cast<float>(sc3[s]);
          ASSERT_GE(sc3[s], 0);
          ASSERT_LE(step, amax / 3.5f + d * 1.001f) << "q3_k block " << b << " sub " << s;
        } else {
          const auto* blk = reinterpret_cast<const BlockQ2_K*>(packed.data()) + b;
          step = d * static_cast<float>(blk->scales[s] & 0xF);
          ASSERT_LE(step, (std::max(mx, 0.0f) - std::min(mn, 0.0f)) / 3.0f * 1.0001f + dmin / 3.0f + d * 1.001f)
              << "q2_k block " << b << " sub " << s;
        }
        for (int l = 0; l < 16; ++l) {
          ASSERT_LE(std::fabs(xb[16 * s + l] - yb[16 * s + l]), 0.5f * step * 1.0001f + 1e-6f * (dmin + d) + 1e-30f)
              << dtype_name(t) << " block " << b << " element " << 16 * s + l;
        }
      }
      for (int i = 0; i < 256; ++i) {
        err2 += static_cast<double>(xb[i] - yb[i]) * (xb[i] - yb[i]);
        x2 += static_cast<double>(xb[i]) * xb[i];
      }
    }
    const double rel = std::sqrt(err2 / x2);
    EXPECT_LT(rel, t == DType::kQ2_K ? 0.45 : 0.25) << dtype_name(t);
    std::printf("%s: relative RMS error %.3f\n", std::string(dtype_name(t)).c_str(), rel);
  }
}

TEST(Quant, KQuantRoundTripBounds) {
  const std::vector<float> x = test_row(12, 256 * 48);
  std::vector<std::uint8_t> packed;
  for (DType t : {DType::kQ4_K, DType::kQ5_K, DType::kQ6_K}) {
    const std::vector<float> y = round_trip(t, x, packed);
    double err2 = 0, x2 = 0;
    for (std::size_t b = 0; b < x.size() / 256; ++b) {
      const float* xb = x.data() + b * 256;
      const float* yb = y.data() + b * 256;
      if (t == DType::kQ6_K) {
        const auto* blk = reinterpret_cast<const BlockQ6_K*>(packed.data()) + b;
        const float d = f16_to_f32(blk->d);
        for (int s = 0; s < 16; ++s) {
          float amax = 0;
          for (int l = 0; l < 16; ++l) amax = std::max(amax, std::fabs(xb[16 * s + l]));
          // Each value within half its step; the step within one d of amax / 31.5.
          const float step = d * static_cast<float>(blk->scales[s]);
          ASSERT_LE(step, amax / 31.5f + d * 1.001f) << "block " << b << " sub " << s;
          for (int l = 0; l < 16; ++l) {
            ASSERT_LE(std::fabs(xb[16 * s + l] - yb[16 * s + l]), 0.5f * step * 1.0001f + 1e-30f)
                << "q6_k block " << b << " element " << 16 * s + l;
          }
        }
      } else {
        const std::uint8_t* p = packed.data() + b * static_cast<std::size_t>(dtype_info(t).block_bytes);
        std::uint16_t dh, dminh;
        std::memcpy(&dh, p, 2);
        std::memcpy(&dminh, p + 2, 2);
        const float d = f16_to_f32(dh), dmin = f16_to_f32(dminh);
        const float levels = t == DType::kQ4_K ? 15.0f : 31.0f;
        for (int s = 0; s < 8; ++s) {
          std::uint8_t sc, m;
          q4k_scale_min(s, p + 4, &sc, &m);
          float mn = xb[32 * s], mx = xb[32 * s];
          for (int l = 0; l < 32; ++l) {
            mn = std::min(mn, xb[32 * s + l]);
            mx = std::max(mx, xb[32 * s + l]);
          }
          const float step = d * static_cast<float>(sc);
          // The step covers the range with at most one d and one dmin / levels of slack.
          ASSERT_LE(step, (std::max(mx, 0.0f) - std::min(mn, 0.0f)) / levels * 1.0001f + dmin / levels + d * 1.001f)
              << dtype_name(t) << " block " << b << " sub " << s;
          for (int l = 0; l < 32; ++l) {
            ASSERT_LE(std::fabs(xb[32 * s + l] - yb[32 * s + l]), 0.5f * step * 1.0001f + 1e-6f * dmin * m + 1e-30f)
                << dtype_name(t) << " block " << b << " element " << 32 * s + l;
          }
        }
      }
      for (int i = 0; i < 256; ++i) {
        err2 += static_cast<double>(xb[i] - yb[i]) * (xb[i] - yb[i]);
        x2 += static_cast<double>(xb[i]) * xb[i];
      }
    }
    // Overall quality: relative RMS error of the row.
    const double rel = std::sqrt(err2 / x2);
    const double limit = t == DType::kQ4_K ? 0.12 : t == DType::kQ5_K ? 0.06 : 0.03;
    EXPECT_LT(rel, limit) << dtype_name(t);
    std::printf("%s relative rms error %.4f\n", std::string(dtype_name(t)).c_str(), rel);
  }
}

TEST(Quant, ZeroRowsQuantiseToZero) {
  std::vector<float> x(512, 0.0f);
  std::vector<std::uint8_t> packed;
  for (DType t : {DType::kQ4_0, DType::kQ4_1, DType::kQ5_0, DType::kQ5_1, DType::kQ4_K, DType::kQ5_K, DType::kQ6_K}) {
    const std::vector<float> y = round_trip(t, x, packed);
    for (float v : y) ASSERT_EQ(v, 0.0f) << dtype_name(t);
  }
}

}  // namespace
}  // namespace sx::hal
