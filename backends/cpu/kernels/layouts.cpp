// The CPU weight layouts (layouts.h): repacking, unpacking and dequantising them.
#include "backends/cpu/kernels/layouts.h"

#include <algorithm>
#include <cstring>
#include <type_traits>
#include <string>
#include <vector>

#include "backends/cpu/kernels/matmul.h"
#include "runtime/base/half.h"
#include "runtime/base/status.h"

namespace sx::cpu {

hal::DType layout_source(hal::DType t) {
  if (t == kQ8_0R16) return hal::DType::kQ8_0;
  if (t == kQ5_0R8) return hal::DType::kQ5_0;
  if (t == kQ4_0R8) return hal::DType::kQ4_0;
  if (t == kQ4_1R8) return hal::DType::kQ4_1;
  if (t == kQ5_1R8) return hal::DType::kQ5_1;
  if (t == kQ4_KR8) return hal::DType::kQ4_K;
  if (t == kQ5_KR8) return hal::DType::kQ5_K;
  if (t == kF32R16) return hal::DType::kF32;
  if (t == kF16R16) return hal::DType::kF16;
  if (t == kBF16R16) return hal::DType::kBF16;
  return t;
}

int interleaved_rows(hal::DType t) {
  if (t == kQ8_0R16) return kQ8_0R16Rows;
  if (t == kQ5_0R8) return kQ5_0R8Rows;
  if (t == kQ4_0R8) return kQ4_0R8Rows;
  if (t == kQ4_1R8 || t == kQ5_1R8 || t == kQ4_KR8 || t == kQ5_KR8) return 8;
  if (t == kF32R16 || t == kF16R16 || t == kBF16R16) return kFloatR16Rows;
  return 1;
}

hal::DType weight_layout(hal::DType format, std::int64_t cols) {
  if (!vector_interleaved()) return format;
  if (format == hal::DType::kF32) return kF32R16;
  if (format == hal::DType::kF16 && cols % 2 == 0) return kF16R16;
  if (format == hal::DType::kBF16 && cols % 2 == 0) return kBF16R16;
  if (format == hal::DType::kQ8_0) return kQ8_0R16;
  if (format == hal::DType::kQ5_0) return kQ5_0R8;
  if (format == hal::DType::kQ4_0) return kQ4_0R8;
  if (format == hal::DType::kQ4_1) return kQ4_1R8;
  if (format == hal::DType::kQ5_1) return kQ5_1R8;
  if (format == hal::DType::kQ4_K) return kQ4_KR8;
  if (format == hal::DType::kQ5_K) return kQ5_KR8;
  return format;
}

std::size_t row_bytes(hal::DType t, std::int64_t n) { return hal::row_bytes(layout_source(t), n); }

std::size_t tensor_bytes(hal::DType t, std::int64_t rows, std::int64_t cols) {
  const int g = t == kF32R16 || t == kF16R16 || t == kBF16R16 ? 1 : interleaved_rows(t);  // tails kept plain
  rows = (rows + g - 1) / g * g;
  return cpu::row_bytes(t, cols) * static_cast<std::size_t>(rows);
}

std::string_view type_name(hal::DType t) {
  if (t == kQ8_0R16) return "q8_0_r16";  // Q8_0, 16 rows interleaved
  if (t == kQ5_0R8) return "q5_0_r8";  // Q5_0, 8 rows interleaved
  if (t == kQ4_0R8) return "q4_0_r8";  // Q4_0, 8 rows interleaved
  if (t == kQ4_1R8) return "q4_1_r8";  // Q4_1, 8 rows interleaved
  if (t == kQ5_1R8) return "q5_1_r8";  // Q5_1, 8 rows interleaved
  if (t == kQ4_KR8) return "q4_k_r8";  // Q4_K, 8 rows interleaved
  if (t == kQ5_KR8) return "q5_k_r8";  // Q5_K, 8 rows interleaved
  if (t == kF32R16) return "f32_r16";  // F32, 16 rows interleaved
  if (t == kF16R16) return "f16_r16";  // F16, 16 rows interleaved by pairs
  if (t == kBF16R16) return "bf16_r16";  // BF16, 16 rows interleaved by pairs
  return hal::dtype_name(t);
}

void repack_rows(hal::DType layout, const void* src, std::int64_t rows, std::int64_t k, void* dst) {
  if (layout == kQ8_0R16) {
    repack_q8_0_r16(static_cast<const hal::BlockQ8_0*>(src), rows, k, static_cast<BlockQ8_0x16*>(dst));
  } else if (layout == kQ5_0R8) {
    repack_q5_0_r8(static_cast<const hal::BlockQ5_0*>(src), rows, k, static_cast<BlockQ5_0x8*>(dst));
  } else if (layout == kQ4_0R8) {
    repack_q4_0_r8(static_cast<const hal::BlockQ4_0*>(src), rows, k, static_cast<BlockQ4_0x8*>(dst));
  } else if (layout == kQ4_1R8) {
    repack_1_r8(static_cast<const hal::BlockQ4_1*>(src), rows, k, dst);
  } else if (layout == kQ5_1R8) {
    repack_1_r8(static_cast<const hal::BlockQ5_1*>(src), rows, k, dst);
  } else if (layout == kQ4_KR8) {
    repack_k_r8(static_cast<const hal::BlockQ4_K*>(src), rows, k, dst);
  } else if (layout == kQ5_KR8) {
    repack_k_r8(static_cast<const hal::BlockQ5_K*>(src), rows, k, dst);
  } else if (layout == kF32R16 || layout == kF16R16 || layout == kBF16R16) {
    repack_float_r16(layout, src, rows, k, dst);
  } else {
    fatal("repack_rows", std::string(type_name(layout)) + " is not an interleaved layout");
  }
}

void unpack_row(hal::DType layout, const void* src, std::int64_t k, std::int64_t row, std::int64_t rows, void* dst) {
  if (layout == kQ8_0R16) {
    unpack_row_q8_0_r16(static_cast<const BlockQ8_0x16*>(src), k, row, static_cast<hal::BlockQ8_0*>(dst));
  } else if (layout == kQ5_0R8) {
    unpack_row_q5_0_r8(static_cast<const BlockQ5_0x8*>(src), k, row, static_cast<hal::BlockQ5_0*>(dst));
  } else if (layout == kQ4_0R8) {
    unpack_row_q4_0_r8(static_cast<const BlockQ4_0x8*>(src), k, row, static_cast<hal::BlockQ4_0*>(dst));
  } else if (layout == kQ4_1R8) {
    unpack_row_1_r8(src, k, row, static_cast<hal::BlockQ4_1*>(dst));
  } else if (layout == kQ5_1R8) {
    unpack_row_1_r8(src, k, row, static_cast<hal::BlockQ5_1*>(dst));
  } else if (layout == kQ4_KR8) {
    unpack_row_k_r8(src, k, row, static_cast<hal::BlockQ4_K*>(dst));
  } else if (layout == kQ5_KR8) {
    unpack_row_k_r8(src, k, row, static_cast<hal::BlockQ5_K*>(dst));
  } else if (layout == kF32R16 || layout == kF16R16 || layout == kBF16R16) {
    unpack_row_float_r16(layout, src, k, row, rows, dst);
  } else {
    fatal("unpack_row", std::string(type_name(layout)) + " is not an interleaved layout");
  }
}

void dequantize_tensor_row(hal::DType t, const void* tensor, std::int64_t k, std::int64_t row, std::int64_t rows,
                           float* dst) {
  const hal::DType source = layout_source(t);
  if (source == t) {
    hal::dequantize_row(t, static_cast<const std::byte*>(tensor) + hal::row_bytes(t, k) * static_cast<std::size_t>(row),
                        dst, k);
    return;
  }
  thread_local std::vector<std::byte> gathered;
  gathered.resize(hal::row_bytes(source, k));
  unpack_row(t, tensor, k, row, rows, gathered.data());
  hal::dequantize_row(source, gathered.data(), dst, k);
}


namespace {

// The float layouts as 32-bit words: kF32R16's elements, kF16R16's / kBF16R16's pairs (k even), the
// panel of rows [16g, 16g + 16) holding word w of row r at w * 16 + r.
std::int64_t float_r16_words(hal::DType layout, std::int64_t k) {
  if (layout != kF32R16 && k % 2 != 0) fatal("float R16 layout", std::string(type_name(layout)) + " needs an even k");
  return layout == kF32R16 ? k : k / 2;
}

}  // namespace

void repack_float_r16(hal::DType layout, const void* src, std::int64_t rows, std::int64_t k, void* dst) {
  const std::int64_t words = float_r16_words(layout, k);
  const auto* in = static_cast<const std::byte*>(src);
  auto* out = static_cast<std::byte*>(dst);
  const std::int64_t whole = rows / kFloatR16Rows * kFloatR16Rows;
  for (std::int64_t g = 0; g < whole / kFloatR16Rows; ++g) {
    const std::byte* from = in + 4 * static_cast<std::size_t>(g * kFloatR16Rows * words);
    std::byte* panel = out + 4 * static_cast<std::size_t>(g * kFloatR16Rows * words);
    for (std::int64_t w = 0; w < words; ++w) {
      for (int r = 0; r < kFloatR16Rows; ++r) {
        std::memcpy(panel + 4 * static_cast<std::size_t>(w * kFloatR16Rows + r), from + 4 * static_cast<std::size_t>(r * words + w), 4);
      }
    }
  }
  const std::size_t tail = 4 * static_cast<std::size_t>(whole * words);  // the last rows % 16 rows as they are
  std::memcpy(out + tail, in + tail, 4 * static_cast<std::size_t>((rows - whole) * words));
}

void unpack_row_float_r16(hal::DType layout, const void* src, std::int64_t k, std::int64_t row, std::int64_t rows,
                          void* dst) {
  const std::int64_t words = float_r16_words(layout, k);
  const auto* in = static_cast<const std::byte*>(src);
  auto* out = static_cast<std::byte*>(dst);
  if (row >= rows / kFloatR16Rows * kFloatR16Rows) {  // a tail row, as the file holds it
    std::memcpy(out, in + 4 * static_cast<std::size_t>(row * words), 4 * static_cast<std::size_t>(words));
    return;
  }
  const std::byte* panel = in + 4 * static_cast<std::size_t>(row / kFloatR16Rows * kFloatR16Rows * words);
  const int r = static_cast<int>(row % kFloatR16Rows);
  for (std::int64_t w = 0; w < words; ++w) {
    std::memcpy(out + 4 * static_cast<std::size_t>(w), panel + 4 * static_cast<std::size_t>(w * kFloatR16Rows + r), 4);
  }
}

void repack_q8_0_r16(const hal::BlockQ8_0* src, std::int64_t rows, std::int64_t k, BlockQ8_0x16* dst) {
  const std::int64_t nb = k / hal::kQ8_0Block;
  const std::int64_t groups = (rows + kQ8_0R16Rows - 1) / kQ8_0R16Rows;
  for (std::int64_t g = 0; g < groups; ++g) {
    for (std::int64_t b = 0; b < nb; ++b) {
      BlockQ8_0x16& out = dst[g * nb + b];
      out = BlockQ8_0x16{};
      for (int r = 0; r < kQ8_0R16Rows && g * kQ8_0R16Rows + r < rows; ++r) {
        const hal::BlockQ8_0& in = src[(g * kQ8_0R16Rows + r) * nb + b];
        out.d[r] = in.d;
        for (int p = 0; p < hal::kQ8_0Block / 2; ++p) {
          out.qs[32 * p + 2 * r] = in.qs[2 * p];
          out.qs[32 * p + 2 * r + 1] = in.qs[2 * p + 1];
        }
      }
    }
  }
}

void unpack_row_q8_0_r16(const BlockQ8_0x16* src, std::int64_t k, std::int64_t row, hal::BlockQ8_0* dst) {
  const std::int64_t nb = k / hal::kQ8_0Block;
  const std::int64_t g = row / kQ8_0R16Rows;
  const int r = static_cast<int>(row % kQ8_0R16Rows);
  for (std::int64_t b = 0; b < nb; ++b) {
    const BlockQ8_0x16& in = src[g * nb + b];
    dst[b].d = in.d[r];
    for (int p = 0; p < hal::kQ8_0Block / 2; ++p) {
      dst[b].qs[2 * p] = in.qs[32 * p + 2 * r];
      dst[b].qs[2 * p + 1] = in.qs[32 * p + 2 * r + 1];
    }
  }
}


namespace {

// The low 4 bits of a block's 32 values q into lane r of an 8-row interleaved qs (kQ5_0R8,
// kQ4_0R8: layouts.h), and back (q 0..15).
void put_lane_nibbles(const int (&q)[hal::kQK], int r, std::uint8_t* qs) {
  for (int i = 0; i < 4; ++i) {
    for (int e = 0; e < 4; ++e) {
      qs[32 * i + 4 * r + e] = static_cast<std::uint8_t>((q[8 * i + e] & 0x0F) | (q[8 * i + 4 + e] & 0x0F) << 4);
    }
  }
}
void lane_nibbles(const std::uint8_t* qs, int lane, int (&q)[hal::kQK]) {
  for (int i = 0; i < 4; ++i) {
    for (int e = 0; e < 4; ++e) {
      const int byte = qs[32 * i + 4 * lane + e];
      q[8 * i + e] = byte & 0x0F;
      q[8 * i + 4 + e] = byte >> 4;
    }
  }
}
// Bit 4 of a block's 32 values into lane r of an 8-row qh (kQ5_0R8, kQ5_1R8, each sub-block of
// kQ5_KR8: qh[4r + e], bit v, is bit 4 of element 4v + e), ORed into qh; and back, ORed into q.
void put_lane_fifth_bits(const int (&q)[hal::kQK], int r, std::uint8_t* qh) {
  for (int v = 0; v < 8; ++v) {
    for (int e = 0; e < 4; ++e) qh[4 * r + e] |= static_cast<std::uint8_t>(((q[4 * v + e] >> 4) & 1) << v);
  }
}
void add_lane_fifth_bits(const std::uint8_t* qh, int lane, int (&q)[hal::kQK]) {
  for (int v = 0; v < 8; ++v) {
    for (int e = 0; e < 4; ++e) q[4 * v + e] |= ((qh[4 * lane + e] >> v) & 1) << 4;
  }
}

}  // namespace

// Q5_0 <-> kQ5_0R8 (layout in layouts.h), through each block's 32 values.
void repack_q5_0_r8(const hal::BlockQ5_0* src, std::int64_t rows, std::int64_t k, BlockQ5_0x8* dst) {
  const std::int64_t nb = k / hal::kQK;
  const std::int64_t groups = (rows + kQ5_0R8Rows - 1) / kQ5_0R8Rows;
  for (std::int64_t g = 0; g < groups; ++g) {
    for (std::int64_t b = 0; b < nb; ++b) {
      BlockQ5_0x8& out = dst[g * nb + b];
      out = BlockQ5_0x8{};
      for (int r = 0; r < kQ5_0R8Rows && g * kQ5_0R8Rows + r < rows; ++r) {
        const hal::BlockQ5_0& in = src[(g * kQ5_0R8Rows + r) * nb + b];
        std::uint32_t qh;
        std::memcpy(&qh, in.qh, 4);
        int q[hal::kQK];
        for (int j = 0; j < hal::kQK / 2; ++j) hal::unpack_q5_pair(in.qs, qh, j, q[j], q[j + hal::kQK / 2]);
        out.d[r] = in.d;
        put_lane_nibbles(q, r, out.qs);
        put_lane_fifth_bits(q, r, out.qh);
      }
    }
  }
}

namespace {

// The 32 values of row `lane` of an 8-row block of 32 (layout in layouts.h): 4-bit, or 5-bit
// (0..31) where the block has fifth bits (BlockQ5_0x8, BlockQ5_1x8).
template <typename Block8>
void lane_values_r8(const Block8& in, int lane, int (&q)[hal::kQK]) {
  lane_nibbles(in.qs, lane, q);
  if constexpr (requires { in.qh; }) add_lane_fifth_bits(in.qh, lane, q);
}
// The 32 values of a plain Q4_1 / Q5_1 block, and back into its qs (and qh).
template <typename Block>
void block_values(const Block& in, int (&q)[hal::kQK]) {
  if constexpr (requires { in.qh; }) {
    std::uint32_t qh;
    std::memcpy(&qh, in.qh, 4);
    for (int j = 0; j < hal::kQK / 2; ++j) hal::unpack_q5_pair(in.qs, qh, j, q[j], q[j + hal::kQK / 2]);
  } else {
    for (int j = 0; j < hal::kQK / 2; ++j) {
      q[j] = in.qs[j] & 0x0F;
      q[j + hal::kQK / 2] = in.qs[j] >> 4;
    }
  }
}
template <typename Block>
void put_block_values(const int (&q)[hal::kQK], Block& out) {
  if constexpr (requires { out.qh; }) {
    std::uint32_t qh = 0;
    for (int j = 0; j < hal::kQK / 2; ++j) hal::pack_q5_pair(q[j], q[j + hal::kQK / 2], j, out.qs, qh);
    std::memcpy(out.qh, &qh, 4);
  } else {
    for (int j = 0; j < hal::kQK / 2; ++j) out.qs[j] = static_cast<std::uint8_t>(q[j] | q[j + hal::kQK / 2] << 4);
  }
}
template <typename Block>
using OneBlockx8 = std::conditional_t<std::is_same_v<Block, hal::BlockQ5_1>, BlockQ5_1x8, BlockQ4_1x8>;

template <typename Block8>
void dequantize_lane_1_r8(const Block8* src, int lane, std::int64_t nb, float* y) {
  for (std::int64_t b = 0; b < nb; ++b) {
    const float d = f16_to_f32(src[b].d[lane]), m = f16_to_f32(src[b].m[lane]);
    int q[hal::kQK];
    lane_values_r8(src[b], lane, q);
    for (int j = 0; j < hal::kQK; ++j) y[b * hal::kQK + j] = static_cast<float>(q[j]) * d + m;  // as hal's
  }
}

// The 256 values of a Q4_K / Q5_K super-block (0..15 / 0..31) in element order, and back into its
// qs (and qh).
template <typename Block>
void k_values(const Block& in, int (&q)[hal::kQK_K]) {
  for (int c = 0; c < 4; ++c) {
    for (int l = 0; l < 32; ++l) {
      q[64 * c + l] = in.qs[32 * c + l] & 0x0F;
      q[64 * c + 32 + l] = in.qs[32 * c + l] >> 4;
      if constexpr (std::is_same_v<Block, hal::BlockQ5_K>) {
        q[64 * c + l] |= ((in.qh[l] >> (2 * c)) & 1) << 4;
        q[64 * c + 32 + l] |= ((in.qh[l] >> (2 * c + 1)) & 1) << 4;
      }
    }
  }
}
template <typename Block>
void put_k_values(const int (&q)[hal::kQK_K], Block& out) {
  for (int c = 0; c < 4; ++c) {
    for (int l = 0; l < 32; ++l) {
      out.qs[32 * c + l] = static_cast<std::uint8_t>((q[64 * c + l] & 0x0F) | (q[64 * c + 32 + l] & 0x0F) << 4);
      if constexpr (std::is_same_v<Block, hal::BlockQ5_K>) {
        if (c == 0) out.qh[l] = 0;
        out.qh[l] |= static_cast<std::uint8_t>(((q[64 * c + l] >> 4) & 1) << (2 * c) |
                                               ((q[64 * c + 32 + l] >> 4) & 1) << (2 * c + 1));
      }
    }
  }
}

// The 8-row K block type of a K-quant block type.
template <typename Block>
using KBlockx8 = std::conditional_t<std::is_same_v<Block, hal::BlockQ5_K>, BlockQ5_Kx8, BlockQ4_Kx8>;

// Row `lane` of a BlockQ4_Kx8 / BlockQ5_Kx8 as its Q4_K / Q5_K super-block, and back.
template <typename Block>
void gather_k_r8_lane(const KBlockx8<Block>& in, int lane, Block& out) {
  out.d = in.d[lane];
  out.dmin = in.dmin[lane];
  for (int j = 0; j < 3; ++j) std::memcpy(out.scales + 4 * j, in.scales[j] + 4 * lane, 4);
  int q[hal::kQK_K];
  for (int s = 0; s < 8; ++s) {
    int sub[hal::kQK];
    lane_nibbles(in.qs + 128 * s, lane, sub);
    if constexpr (std::is_same_v<Block, hal::BlockQ5_K>) add_lane_fifth_bits(in.qh + 32 * s, lane, sub);
    std::copy(sub, sub + hal::kQK, q + 32 * s);
  }
  put_k_values(q, out);
}
template <typename Block>
void scatter_k_r8_lane(const Block& in, int lane, KBlockx8<Block>& out) {
  out.d[lane] = in.d;
  out.dmin[lane] = in.dmin;
  for (int j = 0; j < 3; ++j) std::memcpy(out.scales[j] + 4 * lane, in.scales + 4 * j, 4);
  int q[hal::kQK_K];
  k_values(in, q);
  for (int s = 0; s < 8; ++s) {
    int sub[hal::kQK];
    std::copy(q + 32 * s, q + 32 * s + 32, sub);
    put_lane_nibbles(sub, lane, out.qs + 128 * s);
    if constexpr (std::is_same_v<Block, hal::BlockQ5_K>) put_lane_fifth_bits(sub, lane, out.qh + 32 * s);
  }
}

// Row `lane` of one BlockQ4_Kx8 / BlockQ5_Kx8 as 256 floats, straight from the layout with
// hal::dequantize_row_q4_k's (q5_k's) arithmetic, y = (d * sc) * q - dmin * m, so the same bits.
template <typename Block8>
void dequantize_k_r8_lane(const Block8& in, int lane, float* y) {
  std::uint8_t scales[12];
  for (int j = 0; j < 3; ++j) std::memcpy(scales + 4 * j, in.scales[j] + 4 * lane, 4);
  const float d = f16_to_f32(in.d[lane]), min = f16_to_f32(in.dmin[lane]);
  for (int s = 0; s < 8; ++s) {
    std::uint8_t sc, m;
    hal::q4k_scale_min(s, scales, &sc, &m);
    const float d1 = d * static_cast<float>(sc), m1 = min * static_cast<float>(m);
    const std::uint8_t* qs = in.qs + 128 * s + 4 * lane;
    for (int i = 0; i < 4; ++i) {
      for (int e = 0; e < 4; ++e) {
        int lo = qs[32 * i + e] & 0x0F, hi = qs[32 * i + e] >> 4;
        if constexpr (std::is_same_v<Block8, BlockQ5_Kx8>) {
          const int h = in.qh[32 * s + 4 * lane + e];
          lo += ((h >> (2 * i)) & 1) << 4;
          hi += ((h >> (2 * i + 1)) & 1) << 4;
        }
        y[32 * s + 8 * i + e] = d1 * static_cast<float>(lo) - m1;
        y[32 * s + 8 * i + 4 + e] = d1 * static_cast<float>(hi) - m1;
      }
    }
  }
}

}  // namespace

template <typename Block>
void repack_k_r8(const Block* src, std::int64_t rows, std::int64_t k, void* dst) {
  const std::int64_t nsb = k / hal::kQK_K;
  const std::int64_t groups = (rows + kQ4_KR8Rows - 1) / kQ4_KR8Rows;
  auto* out = static_cast<KBlockx8<Block>*>(dst);
  for (std::int64_t g = 0; g < groups; ++g) {
    for (std::int64_t b = 0; b < nsb; ++b) {
      KBlockx8<Block>& o = out[g * nsb + b];
      o = KBlockx8<Block>{};
      for (int r = 0; r < kQ4_KR8Rows && g * kQ4_KR8Rows + r < rows; ++r) {
        scatter_k_r8_lane(src[(g * kQ4_KR8Rows + r) * nsb + b], r, o);
      }
    }
  }
}

template <typename Block>
void unpack_row_k_r8(const void* src, std::int64_t k, std::int64_t row, Block* dst) {
  const std::int64_t nsb = k / hal::kQK_K;
  const auto* in = static_cast<const KBlockx8<Block>*>(src) + (row / kQ4_KR8Rows) * nsb;
  for (std::int64_t b = 0; b < nsb; ++b) gather_k_r8_lane(in[b], static_cast<int>(row % kQ4_KR8Rows), dst[b]);
}

void dequantize_lane_q4_k_r8(const BlockQ4_Kx8* src, int lane, std::int64_t nsb, float* y) {
  for (std::int64_t b = 0; b < nsb; ++b) dequantize_k_r8_lane(src[b], lane, y + b * hal::kQK_K);
}

void dequantize_lane_q5_k_r8(const BlockQ5_Kx8* src, int lane, std::int64_t nsb, float* y) {
  for (std::int64_t b = 0; b < nsb; ++b) dequantize_k_r8_lane(src[b], lane, y + b * hal::kQK_K);
}

template void repack_k_r8(const hal::BlockQ4_K*, std::int64_t, std::int64_t, void*);
template void repack_k_r8(const hal::BlockQ5_K*, std::int64_t, std::int64_t, void*);
template void unpack_row_k_r8(const void*, std::int64_t, std::int64_t, hal::BlockQ4_K*);
template void unpack_row_k_r8(const void*, std::int64_t, std::int64_t, hal::BlockQ5_K*);

template <typename Block>
void repack_1_r8(const Block* src, std::int64_t rows, std::int64_t k, void* dst) {
  const std::int64_t nb = k / hal::kQK;
  const std::int64_t groups = (rows + 7) / 8;
  auto* out = static_cast<OneBlockx8<Block>*>(dst);
  for (std::int64_t g = 0; g < groups; ++g) {
    for (std::int64_t b = 0; b < nb; ++b) {
      OneBlockx8<Block>& o = out[g * nb + b];
      o = OneBlockx8<Block>{};
      for (int r = 0; r < 8 && g * 8 + r < rows; ++r) {
        const Block& in = src[(g * 8 + r) * nb + b];
        int q[hal::kQK];
        block_values(in, q);
        o.d[r] = in.d;
        o.m[r] = in.m;
        put_lane_nibbles(q, r, o.qs);
        if constexpr (requires { in.qh; }) put_lane_fifth_bits(q, r, o.qh);
      }
    }
  }
}

template <typename Block>
void unpack_row_1_r8(const void* src, std::int64_t k, std::int64_t row, Block* dst) {
  const std::int64_t nb = k / hal::kQK;
  const auto* in = static_cast<const OneBlockx8<Block>*>(src) + (row / 8) * nb;
  const int lane = static_cast<int>(row % 8);
  for (std::int64_t b = 0; b < nb; ++b) {
    int q[hal::kQK];
    lane_values_r8(in[b], lane, q);
    dst[b] = Block{};
    dst[b].d = in[b].d[lane];
    dst[b].m = in[b].m[lane];
    put_block_values(q, dst[b]);
  }
}

template void repack_1_r8(const hal::BlockQ4_1*, std::int64_t, std::int64_t, void*);
template void repack_1_r8(const hal::BlockQ5_1*, std::int64_t, std::int64_t, void*);
template void unpack_row_1_r8(const void*, std::int64_t, std::int64_t, hal::BlockQ4_1*);
template void unpack_row_1_r8(const void*, std::int64_t, std::int64_t, hal::BlockQ5_1*);

void dequantize_lane_q4_1_r8(const BlockQ4_1x8* src, int lane, std::int64_t nb, float* y) {
  dequantize_lane_1_r8(src, lane, nb, y);
}
void dequantize_lane_q5_1_r8(const BlockQ5_1x8* src, int lane, std::int64_t nb, float* y) {
  dequantize_lane_1_r8(src, lane, nb, y);
}

bool converts_to_q8_0(hal::DType t) {
  return t == hal::DType::kQ8_0 || t == hal::DType::kQ4_0 || t == hal::DType::kQ5_0 || t == kQ5_0R8 ||
         t == kQ4_0R8;
}

bool requantizes_to_q8_0(hal::DType t) {
  return t == hal::DType::kQ2_K || t == hal::DType::kQ3_K || t == hal::DType::kQ4_K || t == hal::DType::kQ5_K ||
         t == hal::DType::kQ6_K || t == kQ4_KR8 || t == kQ5_KR8;
}

void blocks_as_q8_0(hal::DType t, const void* tensor, std::int64_t k, std::int64_t row, std::int64_t b0,
                    std::int64_t nb, hal::BlockQ8_0* dst) {
  const std::int64_t nb_row = k / hal::kQK;
  if (requantizes_to_q8_0(t)) {  // super-blocks of 256 dequantised and re-quantised once each
    constexpr std::int64_t kPer = hal::kQK_K / hal::kQK;
    const hal::DType source = layout_source(t);
    const std::size_t sb_bytes = hal::row_bytes(source, hal::kQK_K);
    const auto* base = static_cast<const std::byte*>(tensor) + static_cast<std::size_t>(row) * hal::row_bytes(source, k);
    alignas(64) float w[hal::kQK_K], d[kPer];
    alignas(64) std::int8_t q[hal::kQK_K];
    std::int64_t held = -1;
    for (std::int64_t b = 0; b < nb; ++b) {
      const std::int64_t sb = (b0 + b) / kPer, j = (b0 + b) % kPer;
      if (sb != held) {
        if (t == kQ4_KR8 || t == kQ5_KR8) {  // the row's super-block, straight from its group
          const std::int64_t at = (row / kQ4_KR8Rows) * (k / hal::kQK_K) + sb;
          const int lane = static_cast<int>(row % kQ4_KR8Rows);
          if (t == kQ4_KR8) {
            dequantize_k_r8_lane(static_cast<const BlockQ4_Kx8*>(tensor)[at], lane, w);
          } else {
            dequantize_k_r8_lane(static_cast<const BlockQ5_Kx8*>(tensor)[at], lane, w);
          }
        } else {
          hal::dequantize_row(t, base + static_cast<std::size_t>(sb) * sb_bytes, w, hal::kQK_K);
        }
        quantize_activations_q8(w, hal::kQK_K, q, d);  // the activations' quantiser: vectorised
        held = sb;
      }
      dst[b].d = f32_to_f16(d[j]);
      std::memcpy(dst[b].qs, q + j * hal::kQK, hal::kQK);
    }
    return;
  }
  for (std::int64_t b = 0; b < nb; ++b) {
    hal::BlockQ8_0& out = dst[b];
    const std::int64_t at = row * nb_row + b0 + b;
    if (t == hal::DType::kQ8_0) {
      out = static_cast<const hal::BlockQ8_0*>(tensor)[at];
    } else if (t == hal::DType::kQ4_0) {
      const hal::BlockQ4_0& in = static_cast<const hal::BlockQ4_0*>(tensor)[at];
      out.d = in.d;
      for (int j = 0; j < hal::kQK / 2; ++j) {
        out.qs[j] = static_cast<std::int8_t>((in.qs[j] & 0x0F) - 8);
        out.qs[j + hal::kQK / 2] = static_cast<std::int8_t>((in.qs[j] >> 4) - 8);
      }
    } else if (t == hal::DType::kQ5_0) {
      const hal::BlockQ5_0& in = static_cast<const hal::BlockQ5_0*>(tensor)[at];
      std::uint32_t qh;
      std::memcpy(&qh, in.qh, 4);
      out.d = in.d;
      for (int j = 0; j < hal::kQK / 2; ++j) {
        int x0, x1;
        hal::unpack_q5_pair(in.qs, qh, j, x0, x1);
        out.qs[j] = static_cast<std::int8_t>(x0 - 16);
        out.qs[j + hal::kQK / 2] = static_cast<std::int8_t>(x1 - 16);
      }
    } else if (t == kQ5_0R8) {
      const BlockQ5_0x8& in = static_cast<const BlockQ5_0x8*>(tensor)[(row / kQ5_0R8Rows) * nb_row + b0 + b];
      const int lane = static_cast<int>(row % kQ5_0R8Rows);
      int q[hal::kQK];
      lane_values_r8(in, lane, q);
      out.d = in.d[lane];
      for (int j = 0; j < hal::kQK; ++j) out.qs[j] = static_cast<std::int8_t>(q[j] - 16);
    } else if (t == kQ4_0R8) {
      const BlockQ4_0x8& in = static_cast<const BlockQ4_0x8*>(tensor)[(row / kQ4_0R8Rows) * nb_row + b0 + b];
      const std::uint8_t* qs = in.qs + 4 * (row % kQ4_0R8Rows);
      out.d = in.d[row % kQ4_0R8Rows];
      for (int i = 0; i < 4; ++i) {  // lane_nibbles, straight to q - 8 (the int8 GEMM's panels)
        for (int e = 0; e < 4; ++e) {
          out.qs[8 * i + e] = static_cast<std::int8_t>((qs[32 * i + e] & 0x0F) - 8);
          out.qs[8 * i + 4 + e] = static_cast<std::int8_t>((qs[32 * i + e] >> 4) - 8);
        }
      }
    } else {
      fatal("blocks_as_q8_0", std::string(type_name(t)) + " does not hold Q8_0 values");
    }
  }
}

// y = (q - 16) * d, as dequantize_row_q5_0.
void dequantize_lane_q5_0_r8(const BlockQ5_0x8* src, int lane, std::int64_t nb, float* y) {
  for (std::int64_t b = 0; b < nb; ++b) {
    const float d = sx::f16_to_f32(src[b].d[lane]);
    int q[hal::kQK];
    lane_values_r8(src[b], lane, q);
    for (int j = 0; j < hal::kQK; ++j) y[b * hal::kQK + j] = static_cast<float>(q[j] - 16) * d;
  }
}

void unpack_row_q5_0_r8(const BlockQ5_0x8* src, std::int64_t k, std::int64_t row, hal::BlockQ5_0* dst) {
  const std::int64_t nb = k / hal::kQK;
  const std::int64_t g = row / kQ5_0R8Rows;
  const int r = static_cast<int>(row % kQ5_0R8Rows);
  for (std::int64_t b = 0; b < nb; ++b) {
    const BlockQ5_0x8& in = src[g * nb + b];
    int q[hal::kQK];
    lane_values_r8(in, r, q);
    hal::BlockQ5_0& out = dst[b];
    out = hal::BlockQ5_0{};
    out.d = in.d[r];
    std::uint32_t qh = 0;
    for (int j = 0; j < hal::kQK / 2; ++j) hal::pack_q5_pair(q[j], q[j + hal::kQK / 2], j, out.qs, qh);
    std::memcpy(out.qh, &qh, 4);
  }
}

// Q4_0 <-> kQ4_0R8 (layout in layouts.h), through each block's 32 values.
void repack_q4_0_r8(const hal::BlockQ4_0* src, std::int64_t rows, std::int64_t k, BlockQ4_0x8* dst) {
  const std::int64_t nb = k / hal::kQK;
  const std::int64_t groups = (rows + kQ4_0R8Rows - 1) / kQ4_0R8Rows;
  for (std::int64_t g = 0; g < groups; ++g) {
    for (std::int64_t b = 0; b < nb; ++b) {
      BlockQ4_0x8& out = dst[g * nb + b];
      out = BlockQ4_0x8{};
      for (int r = 0; r < kQ4_0R8Rows && g * kQ4_0R8Rows + r < rows; ++r) {
        const hal::BlockQ4_0& in = src[(g * kQ4_0R8Rows + r) * nb + b];
        int q[hal::kQK];
        for (int j = 0; j < hal::kQK / 2; ++j) {
          q[j] = in.qs[j] & 0x0F;
          q[j + hal::kQK / 2] = in.qs[j] >> 4;
        }
        out.d[r] = in.d;
        put_lane_nibbles(q, r, out.qs);
      }
    }
  }
}

void unpack_row_q4_0_r8(const BlockQ4_0x8* src, std::int64_t k, std::int64_t row, hal::BlockQ4_0* dst) {
  const std::int64_t nb = k / hal::kQK;
  const std::int64_t g = row / kQ4_0R8Rows;
  const int r = static_cast<int>(row % kQ4_0R8Rows);
  for (std::int64_t b = 0; b < nb; ++b) {
    int q[hal::kQK];
    lane_nibbles(src[g * nb + b].qs, r, q);
    dst[b].d = src[g * nb + b].d[r];
    for (int j = 0; j < hal::kQK / 2; ++j) dst[b].qs[j] = static_cast<std::uint8_t>(q[j] | q[j + hal::kQK / 2] << 4);
  }
}

// y = (q - 8) * d, as dequantize_row_q4_0.
void dequantize_lane_q4_0_r8(const BlockQ4_0x8* src, int lane, std::int64_t nb, float* y) {
  for (std::int64_t b = 0; b < nb; ++b) {
    const float d = sx::f16_to_f32(src[b].d[lane]);
    int q[hal::kQK];
    lane_nibbles(src[b].qs, lane, q);
    for (int j = 0; j < hal::kQK; ++j) y[b * hal::kQK + j] = static_cast<float>(q[j] - 8) * d;
  }
}

}  // namespace sx::cpu
