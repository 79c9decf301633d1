// The CPU backend's weight layouts: block-format, F32, F16 and BF16 matrices with their rows
// interleaved in groups, so that the SIMD kernels stream one contiguous run per group of rows
// (CpuDevice::upload_weight repacks a weight into them where those kernels are built). They hold
// the same values and bytes as the file's rows; the block formats' last group is padded with zero
// rows, the float layouts keep their last rows % 16 rows plain.
//
// Inside backends/cpu a kernel's weight type is a hal::DType: a file format as is, or one of the
// layout values below, which lie past hal's formats (hal::DType's underlying type is uint8_t,
// so they are valid values of it) and never leave this backend. hal::dtype_info does not know
// them: CPU code asks layout_source / row_bytes / tensor_bytes / type_name here instead.
// Pure functions; thread-safe.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "runtime/hal/dtype.h"
#include "runtime/hal/quant.h"

namespace sx::cpu {

inline constexpr hal::DType kQ8_0R16 = static_cast<hal::DType>(0x80);  // Q8_0, 16 rows interleaved
inline constexpr hal::DType kQ5_0R8 = static_cast<hal::DType>(0x81);   // Q5_0, 8 rows interleaved
inline constexpr hal::DType kQ4_0R8 = static_cast<hal::DType>(0x82);   // Q4_0, 8 rows interleaved
inline constexpr hal::DType kQ4_KR8 = static_cast<hal::DType>(0x83);   // Q4_K, 8 rows interleaved
inline constexpr hal::DType kQ5_KR8 = static_cast<hal::DType>(0x84);   // Q5_K, 8 rows interleaved
inline constexpr hal::DType kQ4_1R8 = static_cast<hal::DType>(0x85);   // Q4_1, 8 rows interleaved
inline constexpr hal::DType kQ5_1R8 = static_cast<hal::DType>(0x86);   // Q5_1, 8 rows interleaved
inline constexpr hal::DType kF32R16 = static_cast<hal::DType>(0x87);   // F32, 16 rows interleaved
inline constexpr hal::DType kF16R16 = static_cast<hal::DType>(0x88);   // F16, 16 rows interleaved by pairs
inline constexpr hal::DType kBF16R16 = static_cast<hal::DType>(0x89);  // BF16, 16 rows interleaved by pairs

// F32, F16 and BF16 with 16 rows interleaved (issue 53): the panel of rows [16g, 16g + 16) is
// row_bytes * 16 bytes at g * 16 * row_bytes, laid out as the GEMM's microkernels read a panel, so
// that every m (decode's one token too) runs the GEMM's own arithmetic without transposing W:
//   kF32R16: [k][16]: element i of row r at float i * 16 + r;
//   kF16R16, kBF16R16 (k even): [k / 2][16] 32-bit words, word p * 16 + r holding elements 2p (low
//   half) and 2p + 1 (high half) of row r: a BF16 row's pairs as vdpbf16ps multiplies them.
// The rows past the last whole group (rows % 16) follow as the file holds them, so these layouts
// take exactly the file's bytes (row r of such a tail at r * row_bytes, as in the file). A matmul
// takes all of such a tensor's rows or whole panels of it (where its tail begins depends on the
// rows uploaded), from a 64-byte boundary (CpuDevice's buffers; the kernels read panels directly).
inline constexpr int kFloatR16Rows = 16;

// Q8_0 with 16 rows interleaved (kQ8_0R16): rows [16g, 16g + 16) x block b of a [rows][k] tensor is
// BlockQ8_0x16 number g * (k / 32) + b, arranged so that each k-pair of the 16 rows is in 32
// consecutive bytes: qs[32 * p + 2 * r + e] is element 2p + e of the block of row r.
inline constexpr int kQ8_0R16Rows = 16;
struct BlockQ8_0x16 {
  std::uint16_t d[kQ8_0R16Rows];  // IEEE half scale of each row's block
  std::int8_t qs[kQ8_0R16Rows * hal::kQ8_0Block];
};
static_assert(sizeof(BlockQ8_0x16) == kQ8_0R16Rows * sizeof(hal::BlockQ8_0));

// Q5_0 with 8 rows interleaved (kQ5_0R8): rows [8g, 8g + 8) x block b of a [rows][k] tensor is
// BlockQ5_0x8 number g * (k / 32) + b. It holds the same scales and 5-bit values q (0..31,
// w = d * (q - 16)) as the 8 Q5_0 blocks, arranged for 32-byte vectors whose 4-byte lane r belongs
// to row r. With q_r(j) element j of row r's block, i < 4 and e, v < 4 or 8:
//   qs[32i + 4r + e]: q_r(8i + e) in the low nibble, q_r(8i + 4 + e) in the high one;
//   qh[4r + e], bit v: bit 4 of q_r(4v + e).
// So vector i of qs gives, per lane, elements 8i .. 8i + 3 (low nibbles) and 8i + 4 .. 8i + 7 (high),
// and the fifth bits of elements 4v .. 4v + 3 are qh shifted by 4 - v, masked to bit 4 of each byte.
inline constexpr int kQ5_0R8Rows = 8;
struct BlockQ5_0x8 {
  std::uint16_t d[kQ5_0R8Rows];  // IEEE half scale of each row's block
  std::uint8_t qh[kQ5_0R8Rows * 4];
  std::uint8_t qs[kQ5_0R8Rows * hal::kQK / 2];
};
static_assert(sizeof(BlockQ5_0x8) == kQ5_0R8Rows * sizeof(hal::BlockQ5_0));

// Q4_0 with 8 rows interleaved (kQ4_0R8, issue 44): kQ5_0R8 without the fifth bits. Rows
// [8g, 8g + 8) x block b is BlockQ4_0x8 number g * (k / 32) + b: the 8 scales, then the 4-bit
// values q (0..15, w = d * (q - 8)) arranged as kQ5_0R8's qs: qs[32i + 4r + e] holds q_r(8i + e) in
// the low nibble and q_r(8i + 4 + e) in the high one, so a 32-byte vector's lane r is row r's.
inline constexpr int kQ4_0R8Rows = 8;
struct BlockQ4_0x8 {
  std::uint16_t d[kQ4_0R8Rows];
  std::uint8_t qs[kQ4_0R8Rows * hal::kQK / 2];
};
static_assert(sizeof(BlockQ4_0x8) == kQ4_0R8Rows * sizeof(hal::BlockQ4_0));

// Q4_1 and Q5_1 with 8 rows interleaved (kQ4_1R8, kQ5_1R8, issue 44): kQ4_0R8 / kQ5_0R8 with each
// row's min m (w = d * q + m) beside its scale: rows [8g, 8g + 8) x block b is block number
// g * (k / 32) + b, qs (and qh) as in BlockQ4_0x8 (BlockQ5_0x8).
struct BlockQ4_1x8 {
  std::uint16_t d[kQ4_0R8Rows];
  std::uint16_t m[kQ4_0R8Rows];
  std::uint8_t qs[kQ4_0R8Rows * hal::kQK / 2];
};
static_assert(sizeof(BlockQ4_1x8) == kQ4_0R8Rows * sizeof(hal::BlockQ4_1));
struct BlockQ5_1x8 {
  std::uint16_t d[kQ5_0R8Rows];
  std::uint16_t m[kQ5_0R8Rows];
  std::uint8_t qh[kQ5_0R8Rows * 4];
  std::uint8_t qs[kQ5_0R8Rows * hal::kQK / 2];
};
static_assert(sizeof(BlockQ5_1x8) == kQ5_0R8Rows * sizeof(hal::BlockQ5_1));

// Q4_K and Q5_K with 8 rows interleaved (kQ4_KR8, kQ5_KR8, issue 44), so that their GEMV takes 8
// rows per vector as the Q4_0 one does (one row per 4-byte lane, no horizontal sums) instead of one
// row and its per-sub-block scale shuffles at a time. Rows [8g, 8g + 8) x super-block b of a
// [rows][k] tensor is block number g * (k / 256) + b. It holds the 8 rows' super-blocks' bytes:
//   d[r], dmin[r]    row r's fp16 scales;
//   scales[j][4r ..] bytes 4j .. 4j + 3 of row r's 12 packed 6-bit scales and mins (hal::q4k_scale_min),
//                    so that one 32-byte load of scales[j] is the same dword of all 8 rows (bytes, not
//                    uint32: the blocks need only 2-byte alignment, as a view into a file may give);
//   qs[128s + ...]   sub-block s (elements 32s .. 32s + 31) as a BlockQ4_0x8's qs: with q_r(j) the
//                    4 low bits of element 32s + j of row r, qs[128s + 32i + 4r + e] holds
//                    q_r(8i + e) in its low nibble and q_r(8i + 4 + e) in its high one;
//   qh[32s + ...]    (Q5_K) sub-block s's fifth bits as a BlockQ5_0x8's qh: qh[32s + 4r + e], bit v,
//                    is bit 4 of element 32s + 4v + e of row r.
inline constexpr int kQ4_KR8Rows = 8;
struct BlockQ4_Kx8 {
  std::uint16_t d[kQ4_KR8Rows];
  std::uint16_t dmin[kQ4_KR8Rows];
  std::uint8_t scales[3][kQ4_KR8Rows * 4];
  std::uint8_t qs[kQ4_KR8Rows * hal::kQK_K / 2];
};
static_assert(sizeof(BlockQ4_Kx8) == kQ4_KR8Rows * sizeof(hal::BlockQ4_K));
struct BlockQ5_Kx8 {
  std::uint16_t d[kQ4_KR8Rows];
  std::uint16_t dmin[kQ4_KR8Rows];
  std::uint8_t scales[3][kQ4_KR8Rows * 4];
  std::uint8_t qh[kQ4_KR8Rows * hal::kQK_K / 8];
  std::uint8_t qs[kQ4_KR8Rows * hal::kQK_K / 2];
};
static_assert(sizeof(BlockQ5_Kx8) == kQ4_KR8Rows * sizeof(hal::BlockQ5_K));

// The file format a type holds (Q8_0 for kQ8_0R16, Q5_0 for kQ5_0R8, Q4_0 for kQ4_0R8, Q4_1 / Q5_1
// for kQ4_1R8 / kQ5_1R8, Q4_K / Q5_K for kQ4_KR8 / kQ5_KR8, F32 / F16 / BF16 for kF32R16 / kF16R16 /
// kBF16R16, t itself otherwise) and the rows per group (1 for a file format).
hal::DType layout_source(hal::DType t);
int interleaved_rows(hal::DType t);
// The layout CpuDevice keeps a weight of file format `format` with rows of `cols` elements in:
// kQ8_0R16 / kQ5_0R8 / kQ4_0R8 / kQ4_1R8 / kQ5_1R8 / kQ4_KR8 / kQ5_KR8 for Q8_0 / Q5_0 / Q4_0 / Q4_1
// / Q5_1 / Q4_K / Q5_K, kF32R16 / kF16R16 / kBF16R16 for F32 / F16 / BF16 (the 16-bit ones with
// cols even) where the vector kernels for them are built (AVX2 + FMA + F16C), else `format`.
hal::DType weight_layout(hal::DType format, std::int64_t cols);
// hal's row_bytes / tensor_bytes / dtype_name for every CPU weight type: a row of a layout is its
// share of its group, and a block layout's tensor has its rows rounded up to a whole group (a float
// layout's takes exactly the file's bytes).
std::size_t row_bytes(hal::DType t, std::int64_t n);
std::size_t tensor_bytes(hal::DType t, std::int64_t rows, std::int64_t cols);
std::string_view type_name(hal::DType t);

// [rows][k] of layout_source(layout) -> layout (dst holds tensor_bytes(layout, rows, k)), and row
// `row` of such a tensor back to its source blocks (dst holds hal::row_bytes(source, k)). layout is
// kQ8_0R16, kQ5_0R8, kQ4_0R8, kQ4_1R8, kQ5_1R8 (k a multiple of 32), kQ4_KR8 or kQ5_KR8 (k a
// multiple of 256), kF32R16, kF16R16 or kBF16R16 (k even for the last two).
void repack_rows(hal::DType layout, const void* src, std::int64_t rows, std::int64_t k, void* dst);
// (`rows`: the tensor's, where the float layouts' plain tail begins.)
void unpack_row(hal::DType layout, const void* src, std::int64_t k, std::int64_t row, std::int64_t rows, void* dst);
// Row `row` of a [rows][k] tensor of type t as F32: hal::dequantize_row on the row, or, for a
// layout, on the row gathered from its group first.
void dequantize_tensor_row(hal::DType t, const void* tensor, std::int64_t k, std::int64_t row, std::int64_t rows,
                           float* dst);

// kF32R16 / kF16R16 / kBF16R16 <-> their file formats (repack_rows, unpack_row).
void repack_float_r16(hal::DType layout, const void* src, std::int64_t rows, std::int64_t k, void* dst);
void unpack_row_float_r16(hal::DType layout, const void* src, std::int64_t k, std::int64_t row, std::int64_t rows,
                          void* dst);
void repack_q8_0_r16(const hal::BlockQ8_0* src, std::int64_t rows, std::int64_t k, BlockQ8_0x16* dst);
void unpack_row_q8_0_r16(const BlockQ8_0x16* src, std::int64_t k, std::int64_t row, hal::BlockQ8_0* dst);
void repack_q5_0_r8(const hal::BlockQ5_0* src, std::int64_t rows, std::int64_t k, BlockQ5_0x8* dst);
void unpack_row_q5_0_r8(const BlockQ5_0x8* src, std::int64_t k, std::int64_t row, hal::BlockQ5_0* dst);
// Row `lane` (0..7) of nb consecutive BlockQ5_0x8 blocks, dequantised straight from the layout:
// bit-identical to unpack_row_q5_0_r8 followed by dequantize_row_q5_0.
void dequantize_lane_q5_0_r8(const BlockQ5_0x8* src, int lane, std::int64_t nb, float* y);
void repack_q4_0_r8(const hal::BlockQ4_0* src, std::int64_t rows, std::int64_t k, BlockQ4_0x8* dst);
void unpack_row_q4_0_r8(const BlockQ4_0x8* src, std::int64_t k, std::int64_t row, hal::BlockQ4_0* dst);
// The same for kQ4_0R8: bit-identical to unpack_row_q4_0_r8 followed by dequantize_row_q4_0.
void dequantize_lane_q4_0_r8(const BlockQ4_0x8* src, int lane, std::int64_t nb, float* y);

// Q4_1 / Q5_1 <-> kQ4_1R8 / kQ5_1R8 (Block = hal::BlockQ4_1 or hal::BlockQ5_1), and row `lane` of
// nb consecutive blocks of the layout dequantised: bit-identical to the unpacked row's dequantisation.
template <typename Block>
void repack_1_r8(const Block* src, std::int64_t rows, std::int64_t k, void* dst);
template <typename Block>
void unpack_row_1_r8(const void* src, std::int64_t k, std::int64_t row, Block* dst);
void dequantize_lane_q4_1_r8(const BlockQ4_1x8* src, int lane, std::int64_t nb, float* y);
void dequantize_lane_q5_1_r8(const BlockQ5_1x8* src, int lane, std::int64_t nb, float* y);

// Q4_K / Q5_K <-> kQ4_KR8 / kQ5_KR8 (Block = hal::BlockQ4_K or hal::BlockQ5_K).
template <typename Block>
void repack_k_r8(const Block* src, std::int64_t rows, std::int64_t k, void* dst);
template <typename Block>
void unpack_row_k_r8(const void* src, std::int64_t k, std::int64_t row, Block* dst);
// Row `lane` (0..7) of nsb consecutive BlockQ4_Kx8 / BlockQ5_Kx8 blocks, dequantised: bit-identical
// to unpack_row_k_r8 followed by hal's dequantisation of the row.
void dequantize_lane_q4_k_r8(const BlockQ4_Kx8* src, int lane, std::int64_t nsb, float* y);
void dequantize_lane_q5_k_r8(const BlockQ5_Kx8* src, int lane, std::int64_t nsb, float* y);

// Formats whose blocks hold exactly Q8_0 values (same fp16 scale, int8 q - 8 for Q4_0, q - 16 for
// Q5_0), so the Q8_0 int8 GEMM runs them: kQ8_0, kQ4_0, kQ5_0, kQ5_0R8, kQ4_0R8.
bool converts_to_q8_0(hal::DType t);
// The K-quants (Q2_K .. Q6_K, kQ4_KR8, kQ5_KR8): their 32-element sub-blocks carry a scale and a min of their own, so
// no Q8_0 block holds them exactly; the int8 GEMM takes them re-quantised, each 32 dequantised
// weights rounded as activations are (quantize_activations_q8: d = max|w| / 127, then d to fp16),
// an error of at most half a step, ~1/254 of the block's largest |w|, beside the 8-bit
// activations' own. Prefill-sized products only (select_matmul_path); the GEMVs read the K-quant
// blocks themselves.
bool requantizes_to_q8_0(hal::DType t);
// What the Q8_0 int8 GEMM reads: converts_to_q8_0 or requantizes_to_q8_0.
inline bool gemm_q8_reads(hal::DType t) { return converts_to_q8_0(t) || requantizes_to_q8_0(t); }
// Blocks [b0, b0 + nb) of row `row` of a [rows][k] tensor in such a format, as Q8_0 blocks.
void blocks_as_q8_0(hal::DType t, const void* tensor, std::int64_t k, std::int64_t row, std::int64_t b0,
                    std::int64_t nb, hal::BlockQ8_0* dst);
// The same for a panel of 16 rows [row0, row0 + 16) of an [n][k] tensor (rows at or past n read as
// zero blocks), 16 blocks of a row at a time: fn(r, b, block) for row row0 + r, block b0 + b. The
// int8 GEMMs interleave panels with it (each into its own layout).
template <typename Fn>
void for_panel_blocks_as_q8_0(hal::DType t, const void* tensor, std::int64_t k, std::int64_t n, std::int64_t row0,
                              std::int64_t b0, std::int64_t nb, Fn&& fn) {
  constexpr std::int64_t kChunk = 16;
  hal::BlockQ8_0 tmp[kChunk];
  for (int r = 0; r < kQ8_0R16Rows; ++r) {
    for (std::int64_t c0 = 0; c0 < nb; c0 += kChunk) {
      const std::int64_t cn = std::min(kChunk, nb - c0);
      if (row0 + r < n) {
        blocks_as_q8_0(t, tensor, k, row0 + r, b0 + c0, cn, tmp);
      } else {
        for (std::int64_t b = 0; b < cn; ++b) tmp[b] = hal::BlockQ8_0{};
      }
      for (std::int64_t b = 0; b < cn; ++b) fn(r, c0 + b, tmp[b]);
    }
  }
}

}  // namespace sx::cpu
