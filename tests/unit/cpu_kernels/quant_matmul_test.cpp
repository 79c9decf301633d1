// The CPU matmul on the GGML block formats (Q4_0 ... Q6_K) against the reference: every row
// dequantised with hal::dequantize_row, dotted in double. Weights both quantised from Gaussian
// values and random bytes (every scale, min and quant pattern, finite fp16 scales), on the GEMV
// (int8 kernels for every block format) and GEMM paths (the K-quants' int8 GEMM re-quantising
// their weights to Q8_0 blocks, bounded as such), several thread
// counts, odd m, n and k. Q5_0, Q4_0, Q4_1, Q5_1, Q4_K and Q5_K also in the CPU device's 8-row
// interleaved layouts of them (the reference dequantises the plain rows the layout was made from).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "backends/cpu/kernels/matmul.h"
#include "runtime/base/half.h"
#include "runtime/base/thread_pool.h"
#include "runtime/hal/dtype.h"

namespace sx::cpu {
namespace {

using hal::DType;

constexpr float kGuard = -12345.0f;
constexpr int kGuardElems = 7;

// Byte offsets of the fp16 scale fields in a block (random-byte weights get small finite values
// there so that outputs stay in a sane range).
std::vector<int> f16_fields(DType t) {
  switch (t) {
    case DType::kQ4_0: case DType::kQ5_0: case DType::kQ8_0: return {0};
    case DType::kQ4_1: case DType::kQ5_1: case DType::kQ4_K: case DType::kQ5_K: return {0, 2};
    case DType::kQ2_K: return {80, 82};
    case DType::kQ3_K: return {108};
    case DType::kQ6_K: return {208};
    case DType::kAwqInt4: return {64, 66};
    default: return {};
  }
}

// Block size of the activation quantisation of the int8 kernel for t, or 0 (the path is exact
// F32 on dequantised weights).
int act_block(DType t, MatmulPath path) {
  // Q4_0 / Q5_0 on the int8 GEMM (their blocks as Q8_0 values; the K-quants re-quantised to them),
  // where the kernels in use have it.
  if (path == MatmulPath::kGemmQ8) return sx::cpu::gemm_q8_reads(t) && sx::cpu::vector_interleaved() ? 32 : 0;
  if (path != MatmulPath::kGemv) return 0;
  if (t == DType::kQ2_K || t == DType::kQ3_K || t == DType::kQ4_K || t == DType::kQ5_K || t == DType::kQ6_K ||
      t == sx::cpu::kQ4_KR8 || t == sx::cpu::kQ5_KR8) {
    return 256;
  }
  if (t == DType::kQ5_0 || t == sx::cpu::kQ5_0R8 || t == sx::cpu::kQ4_0R8 || t == sx::cpu::kQ4_1R8 ||
      t == sx::cpu::kQ5_1R8 || t == DType::kQ4_0 || t == DType::kQ4_1 || t == DType::kQ5_1 ||
      t == DType::kAwqInt4) {
    return 32;
  }
  return 0;
}

struct Case {
  DType t;
  std::int64_t m, n, k;
  std::vector<float> x, bias, y_store;
  std::vector<std::byte> w_store;
  std::vector<std::byte> w_plain;  // the rows in interleaved_source(t) (the weights themselves otherwise)
  MatmulProblem p;

  Case(DType type, std::int64_t m_, std::int64_t n_, std::int64_t k_, bool random_bytes, std::uint32_t seed)
      : t(type), m(m_), n(n_), k(k_) {
    std::mt19937 rng(seed);
    std::normal_distribution<float> nd(0.0f, 1.0f);
    x.resize(static_cast<std::size_t>(m * k));
    for (float& v : x) v = nd(rng);
    for (std::int64_t i = 0; i < m; ++i) x[static_cast<std::size_t>(i * k + (i * 13) % k)] *= 30.0f;  // outliers
    const DType plain = sx::cpu::layout_source(t);
    const std::size_t rb = hal::row_bytes(plain, k);
    w_plain.resize(rb * static_cast<std::size_t>(n));
    std::byte* w = w_plain.data();
    if (random_bytes) {
      std::uniform_int_distribution<int> byte(0, 255);
      for (std::size_t i = 0; i < rb * static_cast<std::size_t>(n); ++i) w[i] = static_cast<std::byte>(byte(rng));
      const int bb = hal::dtype_info(plain).block_bytes;
      std::uniform_real_distribution<float> mag(-14.0f, -6.0f);
      for (std::size_t b = 0; b < rb * static_cast<std::size_t>(n) / static_cast<std::size_t>(bb); ++b) {
        for (int off : f16_fields(plain)) {
          const float v = std::exp2(mag(rng)) * (byte(rng) & 1 ? -1.0f : 1.0f);
          const std::uint16_t h = f32_to_f16(v);
          std::memcpy(w + b * static_cast<std::size_t>(bb) + static_cast<std::size_t>(off), &h, 2);
        }
      }
    } else {
      std::vector<float> row(static_cast<std::size_t>(k));
      for (std::int64_t j = 0; j < n; ++j) {
        for (float& v : row) v = 0.05f * nd(rng) + 0.01f;
        hal::quantize_row(plain, row.data(), w + rb * static_cast<std::size_t>(j), k);
      }
    }
    // At a 2-byte offset, as a view into a file may be; an interleaved layout as the device keeps it.
    w_store.resize(sx::cpu::tensor_bytes(t, n, k) + 2);
    if (plain != t) {
      sx::cpu::repack_rows(t, w_plain.data(), n, k, w_store.data() + 2);
    } else {
      std::memcpy(w_store.data() + 2, w_plain.data(), w_plain.size());
    }
    bias.resize(static_cast<std::size_t>(n));
    for (float& v : bias) v = nd(rng);
    y_store.assign(static_cast<std::size_t>(m * n + 2 * kGuardElems), kGuard);
    p = MatmulProblem{w_store.data() + 2, t, x.data(), bias.data(), y_store.data() + kGuardElems, m, n, k};
  }

  void check(ThreadPool& pool, Scratch& scratch, MatmulPath path) {
    std::fill(y_store.begin(), y_store.end(), kGuard);
    matmul(pool, scratch, p, path);
    for (int i = 0; i < kGuardElems; ++i) {
      ASSERT_EQ(y_store[static_cast<std::size_t>(i)], kGuard) << "write before y";
      ASSERT_EQ(y_store[y_store.size() - 1 - static_cast<std::size_t>(i)], kGuard) << "write after y";
    }
    const MatmulPath actual = path == MatmulPath::kAuto ? select_matmul_path(p) : path;
    const int ab = act_block(t, actual);
    // K-quants on the int8 GEMM: each 32 weights re-quantised to Q8_0 too, at most half a step
    // (max|w| / 254) and the fp16 rounding of its scale (2^-11 of max|w|) per weight.
    const bool requantized = actual == MatmulPath::kGemmQ8 && ab == 32 && sx::cpu::requantizes_to_q8_0(t);
    std::vector<float> w(static_cast<std::size_t>(k));
    const DType plain = sx::cpu::layout_source(t);
    const std::size_t rb = hal::row_bytes(plain, k);
    for (std::int64_t j = 0; j < n; ++j) {
      hal::dequantize_row(plain, w_plain.data() + rb * static_cast<std::size_t>(j), w.data(), k);
      for (std::int64_t i = 0; i < m; ++i) {
        const float* xi = x.data() + i * k;
        double ref = bias[static_cast<std::size_t>(j)], scale = std::fabs(ref), qbound = 0;
        for (std::int64_t c = 0; c < k; ++c) {
          ref += static_cast<double>(xi[c]) * w[static_cast<std::size_t>(c)];
          scale += std::fabs(static_cast<double>(xi[c]) * w[static_cast<std::size_t>(c)]);
        }
        if (ab > 0) {  // activation quantisation: at most amax(block) / 254 per element
          for (std::int64_t b = 0; b < k / ab; ++b) {
            double amax = 0, wsum = 0, wmax = 0, xsum = 0;
            for (int c = 0; c < ab; ++c) {
              amax = std::max(amax, std::fabs(static_cast<double>(xi[b * ab + c])));
              wsum += std::fabs(w[static_cast<std::size_t>(b * ab + c)]);
              wmax = std::max(wmax, std::fabs(static_cast<double>(w[static_cast<std::size_t>(b * ab + c)])));
              xsum += std::fabs(static_cast<double>(xi[b * ab + c]));
            }
            qbound += amax / 254.0 * wsum;
            if (requantized) qbound += wmax * (1.0 / 254 + 1.0 / 2048) * (xsum + ab * amax / 254.0);
          }
        }
        const float got = p.y[i * n + j];
        ASSERT_NEAR(got, ref, qbound + 3e-5 * scale + 1e-6) << "row " << j << " token " << i;
      }
    }
  }
};

const DType kBlockTypes[] = {DType::kQ4_0, DType::kQ4_1, DType::kQ5_0, DType::kQ5_1, DType::kQ2_K,  DType::kQ3_K,
                             DType::kQ4_K, DType::kQ5_K, DType::kQ6_K, DType::kAwqInt4, sx::cpu::kQ5_0R8,
                             sx::cpu::kQ4_0R8, sx::cpu::kQ4_KR8, sx::cpu::kQ5_KR8, sx::cpu::kQ4_1R8,
                             sx::cpu::kQ5_1R8};

TEST(CpuQuantMatmul, EveryFormatPathAndShape) {
  Scratch scratch;
  for (int threads : {1, 2, 3}) {
    ThreadPool pool(threads);
    for (DType t : kBlockTypes) {
      const int be = hal::dtype_info(sx::cpu::layout_source(t)).block_elems;
      const std::vector<std::int64_t> ks = be == 32    ? std::vector<std::int64_t>{32, 96, 896}
                                           : be == 128 ? std::vector<std::int64_t>{128, 384}  // AWQ: 384 = 1.5 x 256
                                                       : std::vector<std::int64_t>{256, 768};
      for (std::int64_t k : ks) {
        for (std::int64_t m : {1, 2, 5, 9, 13}) {
          for (std::int64_t n : {1, 7, 37}) {
            for (bool random_bytes : {false, true}) {
              if (!random_bytes && !hal::can_quantize(sx::cpu::layout_source(t))) continue;  // Q2_K, Q3_K, AWQ: random bytes only
              Case c(t, m, n, k, random_bytes,
                     static_cast<std::uint32_t>(threads * 7 + m * 1000003 + n * 101 + k + (random_bytes ? 5 : 0)));
              for (MatmulPath path : {MatmulPath::kAuto, MatmulPath::kGemv, MatmulPath::kGemmF32, MatmulPath::kGemmQ8}) {
                SCOPED_TRACE(std::string(sx::cpu::type_name(t)) + " m=" + std::to_string(m) + " n=" + std::to_string(n) +
                             " k=" + std::to_string(k) + (random_bytes ? " random bytes" : " quantised") +
                             " path=" + std::to_string(static_cast<int>(path)) + " threads=" + std::to_string(threads));
                c.check(pool, scratch, path);
                if (HasFatalFailure()) return;
              }
            }
          }
        }
      }
    }
  }
}

// Real 0.5B decode shapes on the int8 kernels, many rows per thread (the row chunking; for
// the 8-row layouts the 4 lockstep group streams and the groups left over: 1001 rows are 126
// groups, the last one partial, in tasks of 16 groups, the last of 14: 3 lockstep steps, then the
// 2 groups left over in lockstep).
TEST(CpuQuantMatmul, DecodeShapes) {
  Scratch scratch;
  ThreadPool pool(2);
  for (auto [t, n, k] : {std::tuple{DType::kQ4_K, 896, 4864}, std::tuple{DType::kQ6_K, 896, 4864},
                         std::tuple{DType::kQ5_0, 4864, 896}, std::tuple{DType::kQ4_K, 1000, 1024},
                         std::tuple{sx::cpu::kQ5_0R8, 4864, 896}, std::tuple{sx::cpu::kQ5_0R8, 1001, 4864},
                         std::tuple{DType::kQ4_0, 4864, 896}, std::tuple{sx::cpu::kQ4_0R8, 4864, 896},
                         std::tuple{sx::cpu::kQ4_0R8, 1001, 4864}, std::tuple{DType::kQ4_1, 1001, 1024},
                         std::tuple{DType::kQ5_1, 896, 4864}, std::tuple{DType::kQ5_K, 896, 4864},
                         std::tuple{DType::kAwqInt4, 1001, 896}, std::tuple{DType::kQ2_K, 896, 4864},
                         std::tuple{DType::kQ3_K, 1001, 1024}, std::tuple{sx::cpu::kQ4_KR8, 4864, 896 + 128},
                         std::tuple{sx::cpu::kQ4_KR8, 1001, 4864}, std::tuple{sx::cpu::kQ5_KR8, 896, 4864},
                         std::tuple{sx::cpu::kQ5_KR8, 1001, 1024}, std::tuple{sx::cpu::kQ4_1R8, 4864, 896},
                         std::tuple{sx::cpu::kQ4_1R8, 1001, 4864}, std::tuple{sx::cpu::kQ5_1R8, 4864, 896},
                         std::tuple{sx::cpu::kQ5_1R8, 1001, 896}}) {
    for (bool random_bytes : {false, true}) {
      if (!random_bytes && !hal::can_quantize(t)) continue;  // Q2_K, Q3_K, AWQ: random bytes only
      Case c(t, 1, n, k, random_bytes, 99);
      SCOPED_TRACE(std::string(sx::cpu::type_name(t)) + " " + std::to_string(n) + "x" + std::to_string(k));
      c.check(pool, scratch, MatmulPath::kAuto);
      if (HasFatalFailure()) return;
    }
  }
}

// The int8 GEMM interleaves kQ5_0R8 / kQ4_0R8 panels straight from the layout (in registers where
// the level has AVX2): the same Q8_0 values as the plain Q5_0 / Q4_0 rows, so the same bits, with
// the panels' second group of 8 rows partly (n = 37, 45) or wholly (n = 7, 40) past n.
TEST(CpuQuantMatmul, InterleavedLayoutsGiveThePlainFormatsBitsOnTheInt8Gemm) {
  Scratch scratch;
  ThreadPool pool(2);
  for (auto [layout, plain] : {std::pair{sx::cpu::kQ5_0R8, DType::kQ5_0}, std::pair{sx::cpu::kQ4_0R8, DType::kQ4_0}}) {
    for (std::int64_t n : {7, 37, 40, 45}) {
      for (bool random_bytes : {false, true}) {
        Case a(layout, 13, n, 96, random_bytes, 7), b(plain, 13, n, 96, random_bytes, 7);
        ASSERT_EQ(a.w_plain, b.w_plain);
        a.check(pool, scratch, MatmulPath::kGemmQ8);
        b.check(pool, scratch, MatmulPath::kGemmQ8);
        if (HasFatalFailure()) return;
        ASSERT_EQ(std::memcmp(a.y_store.data(), b.y_store.data(), a.y_store.size() * sizeof(float)), 0)
            << sx::cpu::type_name(layout) << " n=" << n << (random_bytes ? " random bytes" : "");
      }
    }
  }
}

}  // namespace
}  // namespace sx::cpu
