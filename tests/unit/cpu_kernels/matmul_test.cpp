// Parity tests of the CPU matmul kernels against the scalar references, every format and path.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "backends/cpu/kernels/kernel_table.h"
#include "backends/cpu/kernels/matmul.h"
#include "runtime/base/half.h"
#include "runtime/base/thread_pool.h"
#include "runtime/hal/dtype.h"

namespace sx::cpu {
namespace {

using hal::DType;

constexpr float kGuard = -12345.0f;
constexpr int kGuardElems = 19;

// Owns inputs laid out the way the engine passes them: x at an odd float offset (not 32-byte
// aligned), W at a 2-byte offset, y surrounded by guard values.
struct Case {
  DType type;
  std::int64_t m, n, k;
  bool bias;
  std::vector<float> x_store, bias_v, y_store, w_f32;
  std::vector<std::byte> w_store;
  std::vector<std::byte> w_plain;  // the weights as plain rows (Q8_0 for kQ8_0R16)
  DType plain_type;
  MatmulProblem p;

  Case(DType t, std::int64_t m_, std::int64_t n_, std::int64_t k_, bool with_bias, std::uint32_t seed)
      : type(t), m(m_), n(n_), k(k_), bias(with_bias), plain_type(t == sx::cpu::kQ8_0R16 ? DType::kQ8_0 : t) {
    std::mt19937 rng(seed);
    std::normal_distribution<float> nd(0.0f, 1.0f);
    x_store.resize(static_cast<std::size_t>(m * k + 3));
    for (float& v : x_store) v = nd(rng);
    // A few outliers per row (realistic activations) and an all-zero block.
    for (std::int64_t i = 0; i < m; ++i) x_store[1 + i * k + (i * 7) % k] *= 20.0f;
    if (k >= 64) std::fill_n(x_store.begin() + 1 + 32, 32, 0.0f);
    w_f32.resize(static_cast<std::size_t>(n * k));
    for (float& v : w_f32) v = 0.05f * nd(rng);
    const std::size_t rb = hal::row_bytes(plain_type, k);
    w_plain.resize(rb * n);
    for (std::int64_t j = 0; j < n; ++j) hal::quantize_row(plain_type, w_f32.data() + j * k, w_plain.data() + rb * j, k);
    if (plain_type == DType::kQ8_0 && n > 0) {
      // GGML files may hold -128; the int8 kernels must handle it (|-128| does not fit in int8).
      auto* b = reinterpret_cast<hal::BlockQ8_0*>(w_plain.data());
      b[0].qs[3] = -128;
      b[0].qs[31] = -128;
    }
    w_store.resize(sx::cpu::tensor_bytes(t, n, k) + 2);
    if (t == sx::cpu::kQ8_0R16) {
      // The device layout at a 32-byte boundary, as the CPU device allocates it.
      w_store.resize(w_store.size() + 32);
      const auto addr = reinterpret_cast<std::uintptr_t>(w_store.data());
      p.w = w_store.data() + (32 - addr % 32) % 32;
      sx::cpu::repack_q8_0_r16(reinterpret_cast<const hal::BlockQ8_0*>(w_plain.data()), n, k,
                           static_cast<sx::cpu::BlockQ8_0x16*>(const_cast<void*>(p.w)));
    } else {
      std::memcpy(w_store.data() + 2, w_plain.data(), w_plain.size());
      p.w = w_store.data() + 2;
    }
    bias_v.resize(static_cast<std::size_t>(n));
    for (float& v : bias_v) v = nd(rng);
    y_store.assign(static_cast<std::size_t>(m * n + 2 * kGuardElems), kGuard);
    p.w_type = t;
    p.x = x_store.data() + 1;
    p.bias = with_bias ? bias_v.data() : nullptr;
    p.y = y_store.data() + kGuardElems;
    p.m = m;
    p.n = n;
    p.k = k;
  }

  std::vector<float> y() const {
    return {y_store.begin() + kGuardElems, y_store.begin() + kGuardElems + m * n};
  }
  void check_guards() const {
    for (int i = 0; i < kGuardElems; ++i) {
      ASSERT_EQ(y_store[static_cast<std::size_t>(i)], kGuard) << "write before y";
      ASSERT_EQ(y_store[y_store.size() - 1 - static_cast<std::size_t>(i)], kGuard) << "write after y";
    }
  }
  // Per output: sum over k of |x| |w| (+|bias|), the scale of the rounding error.
  std::vector<double> abs_scale() const {
    std::vector<double> s(static_cast<std::size_t>(m * n));
    std::vector<float> w(static_cast<std::size_t>(k));
    const std::size_t rb = hal::row_bytes(plain_type, k);
    for (std::int64_t j = 0; j < n; ++j) {
      hal::dequantize_row(plain_type, w_plain.data() + rb * j, w.data(), k);
      for (std::int64_t i = 0; i < m; ++i) {
        double a = bias ? std::fabs(bias_v[static_cast<std::size_t>(j)]) : 0.0;
        for (std::int64_t c = 0; c < k; ++c) a += std::fabs(static_cast<double>(p.x[i * k + c]) * w[c]);
        s[static_cast<std::size_t>(i * n + j)] = a;
      }
    }
    return s;
  }
  // The documented bound of activation quantisation: sum_b amax_b(x) / 254 * sum_{j in b} |w_j|.
  std::vector<double> q8_bound() const {
    std::vector<double> s(static_cast<std::size_t>(m * n));
    std::vector<float> w(static_cast<std::size_t>(k));
    const std::size_t rb = hal::row_bytes(plain_type, k);
    for (std::int64_t j = 0; j < n; ++j) {
      hal::dequantize_row(plain_type, w_plain.data() + rb * j, w.data(), k);
      for (std::int64_t i = 0; i < m; ++i) {
        double a = 0;
        for (std::int64_t b = 0; b < k / 32; ++b) {
          double amax = 0, wsum = 0;
          for (int c = 0; c < 32; ++c) {
            amax = std::max(amax, std::fabs(static_cast<double>(p.x[i * k + b * 32 + c])));
            wsum += std::fabs(w[b * 32 + c]);
          }
          a += amax / 254.0 * wsum;
        }
        s[static_cast<std::size_t>(i * n + j)] = a;
      }
    }
    return s;
  }
};

std::string describe(const Case& c, MatmulPath path, int threads) {
  return std::string(sx::cpu::type_name(c.type)) + " m=" + std::to_string(c.m) + " n=" + std::to_string(c.n) +
         " k=" + std::to_string(c.k) + (c.bias ? " bias" : "") + " path=" + std::to_string(static_cast<int>(path)) +
         " threads=" + std::to_string(threads);
}

// Runs one case on one path and compares against the matching reference.
void check(DType t, std::int64_t m, std::int64_t n, std::int64_t k, bool bias, MatmulPath path,
           ThreadPool& pool, Scratch& scratch) {
  Case c(t, m, n, k, bias, static_cast<std::uint32_t>(m * 1000003 + n * 101 + k + (bias ? 7 : 0)));
  SCOPED_TRACE(describe(c, path, pool.size()));
  matmul(pool, scratch, c.p, path);
  c.check_guards();
  const std::vector<float> got = c.y();

  const MatmulPath actual = path == MatmulPath::kAuto ? select_matmul_path(c.p) : path;
  const bool int8 = t == sx::cpu::kQ8_0R16 ||
                    (t == DType::kQ8_0 && (actual == MatmulPath::kGemv || actual == MatmulPath::kGemmQ8));
  std::vector<float> ref(got.size());
  MatmulProblem rp = c.p;
  rp.y = ref.data();
  const std::vector<double> scale = c.abs_scale();
  if (int8) {
    // Bit for bit: every int8 path (and thread count) computes the reference's arithmetic, so a
    // token's result does not depend on the batch it is in.
    matmul_reference_q8_activations(rp);
    for (std::size_t i = 0; i < got.size(); ++i) {
      ASSERT_EQ(got[i], ref[i]) << "vs q8-activation reference, index " << i;
    }
    // Loosely against the pure F32 reference: within the documented quantisation bound.
    matmul_reference(rp);
    const std::vector<double> bound = c.q8_bound();
    for (std::size_t i = 0; i < got.size(); ++i) {
      ASSERT_NEAR(got[i], ref[i], bound[i] + 1e-5 * scale[i] + 1e-6) << "vs f32 reference, index " << i;
    }
  } else {
    matmul_reference(rp);
    // BF16 weights on a level with BF16 dot products (every path: F32, F16 and BF16 run the GEMM at
    // every m): x rounded to BF16 too, at most half a unit of its 8-bit significand (2^-8 of the
    // element) per element; F16 weights there are rounded to BF16 as well: (1 + 2^-8)^2 - 1 =
    // 2^-7 + 2^-16. (kGemmQ8 asked for a format it cannot read runs the F32 GEMM.)
    const bool bf16_dot = (t == DType::kBF16 || t == DType::kF16) && sx::cpu::kernels().bf16_dot_gemm && k % 2 == 0;
    const double rel = !bf16_dot ? 1e-5 : t == DType::kBF16 ? 0x1p-8 + 1e-5 : 0x1p-7 + 0x1p-16 + 1e-5;
    for (std::size_t i = 0; i < got.size(); ++i) {
      ASSERT_NEAR(got[i], ref[i], rel * scale[i] + 1e-6) << "index " << i;
    }
  }
}

const DType kTypes[] = {DType::kF32, DType::kF16, DType::kBF16, DType::kQ8_0, sx::cpu::kQ8_0R16};
const MatmulPath kPaths[] = {MatmulPath::kAuto, MatmulPath::kGemv, MatmulPath::kGemmF32, MatmulPath::kGemmQ8};

TEST(CpuMatmul, OddShapesAllPathsAllFormats) {
  ThreadPool pool(2);
  Scratch scratch;
  for (DType t : kTypes) {
    for (MatmulPath path : kPaths) {
      for (std::int64_t m : {1, 2, 3, 5, 17}) {
        for (std::int64_t n : {1, 7, 129}) {
          for (std::int64_t k : {32, 64, 896}) {
            for (bool bias : {false, true}) {
              check(t, m, n, k, bias, path, pool, scratch);
              if (HasFatalFailure()) return;
            }
          }
        }
      }
    }
  }
}

// The interleaved layout gives the same bits as plain Q8_0 for every batch size (each microkernel
// width, partial W panels, the streaming and the k-blocked orders), and a token's row does not
// depend on the batch: row t of a batch of m equals that token computed alone. A decode step runs
// 4 W streams in lockstep (kernel_1xS, for_row_streams): with n = 952 each of the 3 tasks has 20
// panels, all in streams, the partial last panel too; with n = 1000 a task has 21, one left over.
TEST(CpuMatmul, Q8_0R16EqualsQ8_0AtEveryBatchSize) {
  ThreadPool pool(3);
  Scratch scratch;
  for (std::int64_t k : {64, 1088}) {
    for (std::int64_t n : {40, 16, 952, 1000}) {
      for (std::int64_t m = 1; m <= 25; m += (m < 20 ? 1 : 5)) {
        Case r16(sx::cpu::kQ8_0R16, m, n, k, true, 77);
        Case plain(DType::kQ8_0, m, n, k, true, 77);
        SCOPED_TRACE(describe(r16, MatmulPath::kAuto, pool.size()));
        matmul(pool, scratch, r16.p);
        matmul(pool, scratch, plain.p, MatmulPath::kGemv);
        r16.check_guards();
        const std::vector<float> a = r16.y(), b = plain.y();
        ASSERT_EQ(std::memcmp(a.data(), b.data(), a.size() * sizeof(float)), 0);
        matmul(pool, scratch, plain.p, MatmulPath::kGemmQ8);
        const std::vector<float> c = plain.y();
        ASSERT_EQ(std::memcmp(a.data(), c.data(), a.size() * sizeof(float)), 0);
        for (std::int64_t t = 0; t < m; t += 7) {
          MatmulProblem one = r16.p;
          std::vector<float> y(static_cast<std::size_t>(n));
          one.x = r16.p.x + t * k;
          one.y = y.data();
          one.m = 1;
          matmul(pool, scratch, one);
          ASSERT_EQ(std::memcmp(y.data(), a.data() + t * n, y.size() * sizeof(float)), 0) << "token " << t;
        }
      }
    }
  }
}

TEST(CpuMatmul, LongRows) {
  ThreadPool pool(2);
  Scratch scratch;
  for (DType t : kTypes) {
    for (MatmulPath path : kPaths) {
      for (std::int64_t m : {1, 3, 17}) {
        check(t, m, 129, 4864, true, path, pool, scratch);
        if (HasFatalFailure()) return;
      }
    }
  }
}

TEST(CpuMatmul, PrefillBatch) {
  ThreadPool pool(2);
  Scratch scratch;
  for (DType t : kTypes) {
    for (MatmulPath path : kPaths) {
      check(t, 512, 129, 896, true, path, pool, scratch);
      if (HasFatalFailure()) return;
      check(t, 512, 7, 64, false, path, pool, scratch);
      if (HasFatalFailure()) return;
    }
  }
}

TEST(CpuMatmul, FloatPathsAcceptKNotMultipleOf8) {
  ThreadPool pool(2);
  Scratch scratch;
  for (DType t : {DType::kF32, DType::kF16, DType::kBF16}) {
    for (MatmulPath path : kPaths) {
      for (std::int64_t k : {1, 5, 13, 67, 300}) {
        check(t, 7, 19, k, true, path, pool, scratch);
        if (HasFatalFailure()) return;
      }
    }
  }
}

// The BF16-dot GEMM (avx512-bf16, amx) computes exactly the products of x and W rounded to BF16
// (to nearest even; F16 weights rounded too), summed in F32: against that reference in double it
// is within F32 summation error, which a wrong pairing, transpose or rounding is not. n = 37 leaves
// a 5-row panel and k = 514 a tail word, both read through the scalar loader.
TEST(CpuMatmul, Bf16DotGemmMultipliesTheRoundedOperands) {
  if (!sx::cpu::kernels().bf16_dot_gemm) GTEST_SKIP() << "this level has no BF16 dot-product GEMM";
  ThreadPool pool(2);
  Scratch scratch;
  for (DType t : {DType::kBF16, DType::kF16}) {
    for (std::int64_t k : {514, 896}) {
      Case c(t, 29, 37, k, true, static_cast<std::uint32_t>(k) + 11);
      SCOPED_TRACE(describe(c, MatmulPath::kGemmF32, pool.size()));
      matmul(pool, scratch, c.p, MatmulPath::kGemmF32);
      c.check_guards();
      const std::vector<float> got = c.y();
      std::vector<float> w(static_cast<std::size_t>(k));
      const std::size_t rb = hal::row_bytes(t, k);
      for (std::int64_t j = 0; j < c.n; ++j) {
        hal::dequantize_row(t, c.w_plain.data() + rb * j, w.data(), k);
        for (std::int64_t i = 0; i < c.m; ++i) {
          double ref = c.p.bias[j], mag = std::fabs(c.p.bias[j]);
          for (std::int64_t e = 0; e < k; ++e) {
            const double xr = bf16_to_f32(f32_to_bf16(c.p.x[i * k + e]));
            const double wr = bf16_to_f32(f32_to_bf16(w[static_cast<std::size_t>(e)]));
            ref += xr * wr;
            mag += std::fabs(xr * wr);
          }
          ASSERT_NEAR(got[static_cast<std::size_t>(i * c.n + j)], ref, 1e-6 * mag + 1e-7)
              << "row " << i << ", col " << j;
        }
      }
    }
  }
}

TEST(CpuMatmul, ThreadCountsAgree) {
  Scratch scratch;
  for (int threads : {1, 3, 4}) {
    ThreadPool pool(threads);
    for (DType t : kTypes) {
      for (MatmulPath path : kPaths) {
        check(t, 9, 200, 128, true, path, pool, scratch);
        if (HasFatalFailure()) return;
      }
    }
  }
}

TEST(CpuMatmul, ScratchReusedAcrossShapes) {
  ThreadPool pool(2);
  Scratch scratch;
  for (std::int64_t k : {4864, 32, 896, 64}) {
    for (std::int64_t m : {512, 1, 40}) {
      check(DType::kQ8_0, m, 33, k, false, MatmulPath::kAuto, pool, scratch);
      if (HasFatalFailure()) return;
    }
  }
}

TEST(CpuMatmul, ZeroSizedIsANoOp) {
  ThreadPool pool(2);
  Scratch scratch;
  MatmulProblem p;
  p.m = 0;
  p.n = 5;
  p.k = 32;
  matmul(pool, scratch, p);  // must not touch null pointers
}

TEST(CpuMatmul, EmptyDotProductsGiveBias) {
  ThreadPool pool(2);
  Scratch scratch;
  const float bias[3] = {1.0f, -2.0f, 3.5f};
  float y[6] = {9, 9, 9, 9, 9, 9};
  const float x[1] = {0.0f};
  const float w[1] = {0.0f};
  for (MatmulPath path : kPaths) {
    MatmulProblem p;
    p.w = w;
    p.x = x;
    p.bias = bias;
    p.y = y;
    p.m = 2;
    p.n = 3;
    p.k = 0;
    matmul(pool, scratch, p, path);
    for (int i = 0; i < 6; ++i) ASSERT_EQ(y[i], bias[i % 3]);
  }
}

TEST(CpuMatmul, ActivationQuantiserMatchesDefinition) {
  std::mt19937 rng(3);
  std::normal_distribution<float> nd(0.0f, 3.0f);
  std::vector<float> x(256 + 1);
  for (float& v : x) v = nd(rng);
  std::fill_n(x.begin() + 1 + 64, 32, 0.0f);
  x[1 + 100] = 0.5f * 127.0f;  // a tie-breaking candidate once scaled
  std::vector<std::int8_t> q(256);
  std::vector<float> d(8);
  quantize_activations_q8(x.data() + 1, 256, q.data(), d.data());
  for (int b = 0; b < 8; ++b) {
    float amax = 0;
    for (int j = 0; j < 32; ++j) amax = std::max(amax, std::fabs(x[1 + b * 32 + j]));
    const float dd = amax / 127.0f;
    ASSERT_EQ(d[b], dd);
    const float id = dd != 0.0f ? 1.0f / dd : 0.0f;
    for (int j = 0; j < 32; ++j) {
      ASSERT_EQ(q[b * 32 + j], static_cast<std::int8_t>(std::nearbyint(x[1 + b * 32 + j] * id))) << b << " " << j;
      ASSERT_LE(std::fabs(x[1 + b * 32 + j] - dd * q[b * 32 + j]), amax / 254.0f * 1.0001f + 1e-30f);
    }
  }
}

}  // namespace
}  // namespace sx::cpu
