// GGML block layouts of the quantised weight formats (ggml-common.h), as C++ structs, and the
// reference (de)quantisers behind hal::dequantize_row / hal::quantize_row for them.
//
// Every struct is the exact byte layout of the GGML block (little-endian, no padding: each has
// 2-byte alignment and an even size, so an array of them is a GGUF row as is). fp16 fields are raw
// IEEE half bits (base/half.h converts).
//
// Dequantisation is bit-exact to ggml's dequantize_row_* (ggml-quants.c): the same float
// operations in the same order, and the library is compiled with -ffp-contract=off so that
// `d * q - m` is never fused into one FMA. The per-format formulas are written next to each
// function in quant.cpp. tests/unit/hal/dequant_reference_test.py checks them against gguf-py's
// independent numpy implementation on random blocks of every format.
//
// Quantisers (Q4_0, Q4_1, Q5_0, Q5_1, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K): reference quality, not
// llama.cpp's exact search (see quant.cpp for what each does).
// Pure functions; thread-safe.
#pragma once

#include <cstdint>

namespace sx::hal {

inline constexpr int kQK = 32;    // elements per block of the legacy formats (Q4_0 ... Q8_0)
inline constexpr int kQK_K = 256;  // elements per super-block of the K-quants

struct BlockQ4_0 {  // w = d * (q - 8); element j < 16: low nibble of qs[j], j >= 16: high nibble of qs[j-16]
  std::uint16_t d;
  std::uint8_t qs[kQK / 2];
};
struct BlockQ4_1 {  // w = d * q + m
  std::uint16_t d, m;
  std::uint8_t qs[kQK / 2];
};
struct BlockQ5_0 {  // w = d * (q - 16); bit 4 of element j is bit j of qh (as a little-endian u32)
  std::uint16_t d;
  std::uint8_t qh[4];
  std::uint8_t qs[kQK / 2];
};
struct BlockQ5_1 {  // w = d * q + m
  std::uint16_t d, m;
  std::uint8_t qh[4];
  std::uint8_t qs[kQK / 2];
};
// Q2_K: 16 sub-blocks of 16; scales[i] = 4-bit scale | 4-bit min << 4; w = d*sc*q - dmin*m.
struct BlockQ2_K {
  std::uint8_t scales[kQK_K / 16];
  std::uint8_t qs[kQK_K / 4];
  std::uint16_t d, dmin;
};
// Q3_K: 16 sub-blocks of 16 with 6-bit signed scales (packed in 12 bytes, offset 32); 2 low bits
// in qs, the third (inverted: a set bit means no -4) in hmask; w = d * (sc - 32) * q.
struct BlockQ3_K {
  std::uint8_t hmask[kQK_K / 8];
  std::uint8_t qs[kQK_K / 4];
  std::uint8_t scales[12];
  std::uint16_t d;
};
// Q4_K: 8 sub-blocks of 32 with 6-bit scale and min each (packed in 12 bytes, get_scale_min_k4);
// w = d*sc*q - dmin*m. qs[32c + l]: low nibble element 64c + l, high nibble element 64c + 32 + l.
struct BlockQ4_K {
  std::uint16_t d, dmin;
  std::uint8_t scales[12];
  std::uint8_t qs[kQK_K / 2];
};
// Q5_K: Q4_K plus a fifth bit: element 64c + l has bit 2c of qh[l], element 64c + 32 + l bit 2c+1.
struct BlockQ5_K {
  std::uint16_t d, dmin;
  std::uint8_t scales[12];
  std::uint8_t qh[kQK_K / 8];
  std::uint8_t qs[kQK_K / 2];
};
// Q6_K: 16 sub-blocks of 16 with int8 scales; w = d * sc * (q - 32). In half h (128 elements) and
// for l < 32: elements l, l+32, l+64, l+96 are low(ql[64h+l]), low(ql[64h+l+32]), high(ql[64h+l]),
// high(ql[64h+l+32]), with bits 4-5 from qh[32h+l] bits 0-1, 2-3, 4-5, 6-7.
struct BlockQ6_K {
  std::uint8_t ql[kQK_K / 2];
  std::uint8_t qh[kQK_K / 4];
  std::int8_t scales[kQK_K / 16];
  std::uint16_t d;
};
static_assert(sizeof(BlockQ4_0) == 18 && sizeof(BlockQ4_1) == 20 && sizeof(BlockQ5_0) == 22 &&
              sizeof(BlockQ5_1) == 24);
static_assert(sizeof(BlockQ2_K) == 84 && sizeof(BlockQ3_K) == 110 && sizeof(BlockQ4_K) == 144 &&
              sizeof(BlockQ5_K) == 176 && sizeof(BlockQ6_K) == 210);

// The 5-bit values (0..31) of elements j and j + kQK / 2 of a Q5_0 / Q5_1 block: low nibbles
// from qs[j], fifth bits from bits j and j + kQK / 2 of qh; and the inverse, which ORs the fifth
// bits into qh (zero it first).
void unpack_q5_pair(const std::uint8_t* qs, std::uint32_t qh, int j, int& x0, int& x1);
void pack_q5_pair(int x0, int x1, int j, std::uint8_t* qs, std::uint32_t& qh);

// The 6-bit scale and min of sub-block j (0..7) of a Q4_K / Q5_K super-block (ggml's get_scale_min_k4).
inline void q4k_scale_min(int j, const std::uint8_t* s, std::uint8_t* sc, std::uint8_t* m) {
  if (j < 4) {
    *sc = s[j] & 63;
    *m = s[j + 4] & 63;
  } else {
    *sc = static_cast<std::uint8_t>((s[j + 4] & 0xF) | ((s[j - 4] >> 6) << 4));
    *m = static_cast<std::uint8_t>((s[j + 4] >> 4) | ((s[j] >> 6) << 4));
  }
}

// The 16 scales of a Q3_K super-block, offset removed (-32..31).
void q3k_scales(const std::uint8_t* packed, std::int8_t out[16]);

// Per-format row conversions (n a multiple of the block size). Used by dtype.cpp.
void dequantize_row_q4_0(const BlockQ4_0* x, float* y, std::int64_t n);
void dequantize_row_q4_1(const BlockQ4_1* x, float* y, std::int64_t n);
void dequantize_row_q5_0(const BlockQ5_0* x, float* y, std::int64_t n);
void dequantize_row_q5_1(const BlockQ5_1* x, float* y, std::int64_t n);
void dequantize_row_q2_k(const BlockQ2_K* x, float* y, std::int64_t n);
void dequantize_row_q3_k(const BlockQ3_K* x, float* y, std::int64_t n);
void dequantize_row_q4_k(const BlockQ4_K* x, float* y, std::int64_t n);
void dequantize_row_q5_k(const BlockQ5_K* x, float* y, std::int64_t n);
void dequantize_row_q6_k(const BlockQ6_K* x, float* y, std::int64_t n);

void quantize_row_q4_0(const float* x, BlockQ4_0* y, std::int64_t n);
void quantize_row_q4_1(const float* x, BlockQ4_1* y, std::int64_t n);
void quantize_row_q5_0(const float* x, BlockQ5_0* y, std::int64_t n);
void quantize_row_q5_1(const float* x, BlockQ5_1* y, std::int64_t n);
void quantize_row_q2_k(const float* x, BlockQ2_K* y, std::int64_t n);
void quantize_row_q3_k(const float* x, BlockQ3_K* y, std::int64_t n);
void quantize_row_q4_k(const float* x, BlockQ4_K* y, std::int64_t n);
void quantize_row_q5_k(const float* x, BlockQ5_K* y, std::int64_t n);
void quantize_row_q6_k(const float* x, BlockQ6_K* y, std::int64_t n);

}  // namespace sx::hal
