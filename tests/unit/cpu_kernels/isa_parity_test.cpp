// Every kernel level this machine supports (issue 23, kernels/isa.h) against the baseline level's
// kernels on the same inputs: bit-for-bit on the integer paths (Q8_0, the activation quantiser),
// within a float tolerance on the others (F16, BF16, Q4_K, Q6_K, Q5_0, attention, vector math).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "backends/cpu/kernels/isa.h"
#include "backends/cpu/kernels/kernel_table.h"
#include "runtime/base/thread_pool.h"
#include "runtime/hal/dtype.h"
#include "runtime/hal/quant.h"

namespace sx::cpu {
namespace {

using hal::DType;

std::vector<const KernelTable*> supported_levels() {
  std::vector<const KernelTable*> v;
  for (const std::string_view l : isa_levels()) {
    if (const KernelTable* t = kernels_for(l)) v.push_back(t);
  }
  return v;
}

const KernelTable& baseline() {
  const KernelTable* b = kernels_for("baseline");
  if (b == nullptr) b = kernels_for("native");
  return *b;
}

struct Weights {
  std::vector<std::byte> plain;  // rows in `type`
  std::vector<std::byte> r16;    // kQ8_0R16 (Q8_0 only)
};

Weights make_weights(DType type, std::int64_t n, std::int64_t k, std::mt19937& rng) {
  std::normal_distribution<float> nd(0.0f, 0.05f);
  std::vector<float> row(static_cast<std::size_t>(k));
  Weights w;
  const std::size_t rb = hal::row_bytes(type, k);
  w.plain.resize(rb * static_cast<std::size_t>(n));
  for (std::int64_t j = 0; j < n; ++j) {
    for (float& v : row) v = nd(rng);
    hal::quantize_row(type, row.data(), w.plain.data() + rb * static_cast<std::size_t>(j), k);
  }
  if (type == DType::kQ8_0) {
    w.r16.resize(sx::cpu::tensor_bytes(kQ8_0R16, n, k) + 64);
    auto* dst = reinterpret_cast<BlockQ8_0x16*>(w.r16.data() + (64 - reinterpret_cast<std::uintptr_t>(w.r16.data()) % 64) % 64);
    repack_q8_0_r16(reinterpret_cast<const hal::BlockQ8_0*>(w.plain.data()), n, k, dst);
  }
  return w;
}

std::vector<float> run(const KernelTable& t, ThreadPool& pool, const void* w, DType type, const std::vector<float>& x,
                       std::int64_t m, std::int64_t n, std::int64_t k, MatmulPath path, const float* bias = nullptr) {
  Scratch scratch;
  std::vector<float> y(static_cast<std::size_t>(m * n), -1.0f);
  MatmulProblem p;
  p.w = w;
  p.w_type = type;
  p.x = x.data();
  p.bias = bias;
  p.y = y.data();
  p.m = m;
  p.n = n;
  p.k = k;
  t.matmul(pool, scratch, p, path);
  return y;
}

TEST(CpuIsaParity, BaselineAndTheLevelsThisMachineHas) {
  const auto levels = supported_levels();
  ASSERT_FALSE(levels.empty());
  std::string names;
  for (const KernelTable* t : levels) names += std::string(" ") + t->level;
  std::printf("levels compared:%s (%s)\n", names.c_str(), cpu_isa_line().c_str());
}

// Shapes: one k range and whole W panels; then a partial last panel (n % 16), several k ranges of
// the large-m GEMMs (k = 1280) and a bias, with m from decode to several 16-token AMX tiles and
// beyond the AMX level's streaming limit (100).
TEST(CpuIsaParity, Q8_0IsBitExactOnEveryLevelPathAndLayout) {
  ThreadPool pool(2);
  std::mt19937 rng(7);
  struct Shape {
    std::int64_t n, k;
    bool bias;
    std::vector<std::int64_t> ms;
  };
  for (const Shape& s : {Shape{80, 256, false, {1, 3, 4, 7, 8, 16, 37}}, Shape{72, 1280, true, {5, 12, 33, 100}}}) {
    const std::int64_t n = s.n, k = s.k;
    const Weights w = make_weights(DType::kQ8_0, n, k, rng);
    const void* r16 = w.r16.data() + (64 - reinterpret_cast<std::uintptr_t>(w.r16.data()) % 64) % 64;
    std::vector<float> bias(static_cast<std::size_t>(n));
    for (std::size_t j = 0; j < bias.size(); ++j) bias[j] = 0.01f * static_cast<float>(j % 7) - 0.03f;
    const float* b = s.bias ? bias.data() : nullptr;
    for (std::int64_t m : s.ms) {
      std::normal_distribution<float> nd(0.0f, 1.0f);
      std::vector<float> x(static_cast<std::size_t>(m * k));
      for (float& v : x) v = nd(rng);
      for (MatmulPath path : {MatmulPath::kGemv, MatmulPath::kGemmQ8}) {
        const auto want = run(baseline(), pool, w.plain.data(), DType::kQ8_0, x, m, n, k, path, b);
        const auto want_r16 = run(baseline(), pool, r16, kQ8_0R16, x, m, n, k, MatmulPath::kAuto, b);
        ASSERT_EQ(0, std::memcmp(want.data(), want_r16.data(), want.size() * sizeof(float)));
        for (const KernelTable* t : supported_levels()) {
          const auto got = run(*t, pool, w.plain.data(), DType::kQ8_0, x, m, n, k, path, b);
          EXPECT_EQ(0, std::memcmp(want.data(), got.data(), want.size() * sizeof(float)))
              << t->level << " n=" << n << " k=" << k << " m=" << m << " path " << static_cast<int>(path);
          const auto got_r16 = run(*t, pool, r16, kQ8_0R16, x, m, n, k, MatmulPath::kAuto, b);
          EXPECT_EQ(0, std::memcmp(want.data(), got_r16.data(), want.size() * sizeof(float)))
              << t->level << " kQ8_0R16 n=" << n << " k=" << k << " m=" << m;
        }
      }
    }
  }
}

// Q4_0 and Q5_0 hold Q8_0 values: the int8 GEMM of every level with vector kernels (the AMX one
// included) gives the same bits.
TEST(CpuIsaParity, Q4_0AndQ5_0AreBitExactOnTheInt8Gemms) {
  ThreadPool pool(2);
  std::mt19937 rng(11);
  const std::int64_t n = 40, k = 1024;
  for (DType type : {DType::kQ4_0, DType::kQ5_0}) {
    const Weights w = make_weights(type, n, k, rng);
    for (std::int64_t m : {9, 24, 70}) {
      std::normal_distribution<float> nd(0.0f, 1.0f);
      std::vector<float> x(static_cast<std::size_t>(m * k));
      for (float& v : x) v = nd(rng);
      const KernelTable* first = nullptr;
      std::vector<float> want;
      for (const KernelTable* t : supported_levels()) {
        if (!t->vector_interleaved) continue;
        const auto got = run(*t, pool, w.plain.data(), type, x, m, n, k, MatmulPath::kGemmQ8);
        if (first == nullptr) {
          first = t;
          want = got;
          continue;
        }
        EXPECT_EQ(0, std::memcmp(want.data(), got.data(), want.size() * sizeof(float)))
            << t->level << " vs " << first->level << " " << hal::dtype_info(type).name << " m=" << m;
      }
    }
  }
}

TEST(CpuIsaParity, ActivationQuantiserIsBitExact) {
  std::mt19937 rng(3);
  std::normal_distribution<float> nd(0.0f, 3.0f);
  std::vector<float> x(1024);
  for (float& v : x) v = nd(rng);
  x[5] = 0.5f;  // ties of the rounding
  x[6] = -1.5f;
  std::vector<std::int8_t> q0(x.size()), q1(x.size());
  std::vector<float> d0(x.size() / 32), d1(x.size() / 32);
  baseline().quantize_activations_q8(x.data(), 1024, q0.data(), d0.data());
  for (const KernelTable* t : supported_levels()) {
    t->quantize_activations_q8(x.data(), 1024, q1.data(), d1.data());
    EXPECT_EQ(q0, q1) << t->level;
    EXPECT_EQ(0, std::memcmp(d0.data(), d1.data(), d0.size() * sizeof(float))) << t->level;
  }
}

TEST(CpuIsaParity, FloatAndBlockFormatsAgreeWithinTolerance) {
  ThreadPool pool(2);
  std::mt19937 rng(11);
  const std::int64_t n = 48, k = 512;
  for (DType type : {DType::kF32, DType::kF16, DType::kBF16, DType::kQ4_K, DType::kQ6_K, DType::kQ5_0, DType::kQ4_0}) {
    const Weights w = make_weights(type, n, k, rng);
    for (std::int64_t m : {1, 5, 24}) {
      std::normal_distribution<float> nd(0.0f, 1.0f);
      std::vector<float> x(static_cast<std::size_t>(m * k));
      for (float& v : x) v = nd(rng);
      const auto want = run(baseline(), pool, w.plain.data(), type, x, m, n, k, MatmulPath::kAuto);
      for (const KernelTable* t : supported_levels()) {
        const auto got = run(*t, pool, w.plain.data(), type, x, m, n, k, MatmulPath::kAuto);
        for (std::size_t i = 0; i < want.size(); ++i) {
          // |y| ~ 0.05 * sqrt(512) ~ 1.1; the int8 activation paths of the block formats differ from the
          // baseline's F32 dequantisation by their activation quantisation (matmul.h).
          ASSERT_NEAR(want[i], got[i], 0.03f + 0.02f * std::fabs(want[i]))
              << t->level << " " << hal::dtype_info(type).name << " m=" << m << " i=" << i;
        }
      }
    }
  }
}

// F32, F16 and BF16 weights, as the file holds them and in the CPU device's 16-row layouts, on every
// level: a token's output is the same bits alone, in any batch and in either layout (issue 53: the
// few-token path runs the GEMM's own chain of FMAs per element, so a decode batched beside a
// prefill chunk, or a prompt cut into other chunks, gives the same logits). n = 40 leaves a partial
// last panel, n = 12 has no whole one; k = 1030 gives the F32 path k blocks of 206 (not multiples
// of 32), k = 258 blocks of 129, which start inside a pair (the pair layouts' packed few-token
// path); the batch sizes cover the few-token kernels (1-7, one to four panels side by side), the
// tiles of AVX2 (6) and AVX-512 (12) and their partial ones.
TEST(CpuIsaParity, FloatFormatsGiveATokenTheSameBitsInEveryBatchAndLayout) {
  ThreadPool pool(2);
  std::mt19937 rng(53);
  struct Layout {
    DType plain, r16;
  };
  for (const Layout l : {Layout{DType::kF32, kF32R16}, Layout{DType::kF16, kF16R16}, Layout{DType::kBF16, kBF16R16}}) {
    for (const auto& [n, k] : {std::pair<std::int64_t, std::int64_t>{40, 64}, {80, 1030}, {16, 896}, {48, 258}, {12, 128}}) {
      const Weights w = make_weights(l.plain, n, k, rng);
      std::vector<std::byte> r16_store(cpu::tensor_bytes(l.r16, n, k) + 64);
      void* r16 = r16_store.data() + (64 - reinterpret_cast<std::uintptr_t>(r16_store.data()) % 64) % 64;
      repack_rows(l.r16, w.plain.data(), n, k, r16);
      std::vector<float> bias(static_cast<std::size_t>(n));
      for (std::size_t j = 0; j < bias.size(); ++j) bias[j] = 0.01f * static_cast<float>(j % 5) - 0.02f;
      const std::int64_t most = 30;
      std::normal_distribution<float> nd(0.0f, 1.0f);
      std::vector<float> x(static_cast<std::size_t>(most * k));
      for (float& v : x) v = nd(rng);
      for (const KernelTable* t : supported_levels()) {
        for (const float* b : {static_cast<const float*>(nullptr), static_cast<const float*>(bias.data())}) {
          const auto all = run(*t, pool, w.plain.data(), l.plain, x, most, n, k, MatmulPath::kAuto, b);
          for (const std::int64_t m : {1, 2, 3, 4, 5, 7, 8, 12, 13, 17}) {
            for (const std::int64_t t0 : {std::int64_t{0}, most - m}) {  // the batch's first and last tokens
              const std::vector<float> xs(x.begin() + t0 * k, x.begin() + (t0 + m) * k);
              for (const auto& [wp, type] : {std::pair<const void*, DType>{w.plain.data(), l.plain}, {r16, l.r16}}) {
                const auto got = run(*t, pool, wp, type, xs, m, n, k, MatmulPath::kAuto, b);
                ASSERT_EQ(0, std::memcmp(all.data() + t0 * n, got.data(), got.size() * sizeof(float)))
                    << t->level << " " << type_name(type) << " n=" << n << " k=" << k << " tokens [" << t0 << ", "
                    << t0 + m << ") of " << most << (b != nullptr ? " with bias" : "");
              }
            }
          }
        }
      }
    }
  }
}

TEST(CpuIsaParity, VectorMathAndAttentionAgreeWithinTolerance) {
  std::mt19937 rng(5);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  const std::int64_t n = 301;
  std::vector<float> a(n), b(n);
  for (float& v : a) v = nd(rng);
  for (float& v : b) v = nd(rng);
  const float dot0 = baseline().dot_f32(a.data(), b.data(), n);
  std::vector<float> e0 = a;
  const float s0 = baseline().exp_shifted_sum(e0.data(), n, 2.0f);
  std::vector<float> silu0(n);
  baseline().silu_mul_row(a.data(), b.data(), silu0.data(), n);
  for (const KernelTable* t : supported_levels()) {
    EXPECT_NEAR(dot0, t->dot_f32(a.data(), b.data(), n), 1e-4f * n) << t->level;
    std::vector<float> e1 = a;
    EXPECT_NEAR(s0, t->exp_shifted_sum(e1.data(), n, 2.0f), 1e-5f * s0 * n) << t->level;
    for (std::int64_t i = 0; i < n; ++i) EXPECT_NEAR(e0[i], e1[i], 1e-5f * (1 + e0[i])) << t->level;
    std::vector<float> silu1(n);
    t->silu_mul_row(a.data(), b.data(), silu1.data(), n);
    for (std::int64_t i = 0; i < n; ++i) EXPECT_NEAR(silu0[i], silu1[i], 1e-5f * (1 + std::fabs(silu0[i]))) << t->level;
  }
  // Paged attention: 2 sequences (a prefill of 5 tokens, a decode over 37), 4 heads, 2 KV heads.
  ThreadPool pool(2);
  const std::int64_t hd = 64, heads = 4, kv_heads = 2, bs = 16, max_blocks = 3;
  const std::int64_t tokens = 6;
  std::vector<float> q(tokens * heads * hd), kc(6 * bs * kv_heads * hd), vc(kc.size());
  for (float& v : q) v = nd(rng);
  for (float& v : kc) v = nd(rng);
  for (float& v : vc) v = nd(rng);
  // seq_token_start holds n_seqs + 1 offsets.
  const std::vector<std::int32_t> starts = {0, 5, 6}, lens = {5, 37}, table = {0, 1, 2, 3, 4, 5};
  auto attend = [&](const KernelTable& t) {
    std::vector<float> out(q.size(), 0.0f);
    AttentionPtrs p{q.data(), kc.data(), vc.data(), out.data(), starts.data(), lens.data(), table.data()};
    AttentionShape s{DType::kF32, 2, tokens, heads, kv_heads, hd, bs, max_blocks, 0, 0, heads / kv_heads,
                     1.0f / std::sqrt(static_cast<float>(hd))};
    t.paged_attention(pool, p, s);
    return out;
  };
  const auto want = attend(baseline());
  for (const KernelTable* t : supported_levels()) {
    const auto got = attend(*t);
    for (std::size_t i = 0; i < want.size(); ++i) ASSERT_NEAR(want[i], got[i], 1e-4f) << t->level << " i=" << i;
  }
}

// A query head's attention does not depend on the other heads of its KV group in the same call
// (they share the K/V rows, and on AVX-512 levels the V sums run two heads at a time): all 7 heads
// of a group, against heads 3-6 alone (a tensor-parallel rank's share), bit for bit on every level.
TEST(CpuIsaParity, AHeadsAttentionDoesNotDependOnTheOtherHeadsOfItsGroup) {
  std::mt19937 rng(9);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  ThreadPool pool(2);
  const std::int64_t hd = 64, heads = 7, bs = 16, max_blocks = 3, tokens = 3, ctx = 43;
  std::vector<float> q(tokens * heads * hd), kc(max_blocks * bs * hd), vc(kc.size());
  for (float& v : q) v = nd(rng);
  for (float& v : kc) v = nd(rng);
  for (float& v : vc) v = nd(rng);
  const std::vector<std::int32_t> starts = {0, tokens}, lens = {ctx}, table = {2, 0, 1};
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
  for (const KernelTable* t : supported_levels()) {
    auto attend = [&](std::int64_t first, std::int64_t n) {
      std::vector<float> qs(tokens * n * hd), out(qs.size(), 0.0f);
      for (std::int64_t tk = 0; tk < tokens; ++tk) {
        std::memcpy(qs.data() + tk * n * hd, q.data() + (tk * heads + first) * hd, sizeof(float) * n * hd);
      }
      AttentionPtrs p{qs.data(), kc.data(), vc.data(), out.data(), starts.data(), lens.data(), table.data()};
      AttentionShape sh{DType::kF32, 1, tokens, n, 1, hd, bs, max_blocks, first, 0, heads, scale};
      t->paged_attention(pool, p, sh);
      return out;
    };
    const auto all = attend(0, heads), part = attend(3, 4);
    for (std::int64_t tk = 0; tk < tokens; ++tk) {
      EXPECT_EQ(0, std::memcmp(all.data() + (tk * heads + 3) * hd, part.data() + tk * 4 * hd, sizeof(float) * 4 * hd))
          << t->level << " token " << tk;
    }
  }
}

// A token's attention does not depend on the tokens it is computed with (the kernel takes a prompt
// chunk's tokens in tiles that share the K/V rows): a chunk of 37 tokens at positions 43-79 of one
// sequence, next to a decode of another, against each token alone as a decode over its own
// context, bit for bit on every level, with an F32 and an F16 cache, for head sizes 24, 64 and 128.
TEST(CpuIsaParity, ATokensAttentionDoesNotDependOnTheTokensBatchedWithIt) {
  std::mt19937 rng(11);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  ThreadPool pool(2);
  for (const std::int64_t hd : {24, 64, 128}) {  // the generic path and both register-blocked ones
    SCOPED_TRACE(::testing::Message() << "head_dim " << hd);
    const std::int64_t heads = 14, kv_heads = 2, bs = 16, max_blocks = 5, chunk = 37, ctx = 80, ctx2 = 21;
    const std::int64_t tokens = chunk + 1, row = kv_heads * hd;
    std::vector<float> q(tokens * heads * hd), k(10 * bs * row), v(k.size());
    for (float& x : q) x = nd(rng);
    for (float& x : k) x = nd(rng);
    for (float& x : v) x = nd(rng);
    const std::vector<std::int32_t> table = {7, 2, 9, 0, 4, 3, 5, 1, 6, 8};  // seq 0: blocks 7 2 9 0 4; seq 1: 3 5
    const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
    for (const DType cache : {DType::kF32, DType::kF16}) {
      std::vector<std::uint16_t> k16(k.size()), v16(v.size());
      hal::quantize_row(DType::kF16, k.data(), k16.data(), static_cast<std::int64_t>(k.size()));
      hal::quantize_row(DType::kF16, v.data(), v16.data(), static_cast<std::int64_t>(v.size()));
      const void* kc = cache == DType::kF32 ? static_cast<const void*>(k.data()) : k16.data();
      const void* vc = cache == DType::kF32 ? static_cast<const void*>(v.data()) : v16.data();
      for (const KernelTable* t : supported_levels()) {
        std::vector<float> all(q.size(), 0.0f);
        const std::vector<std::int32_t> starts = {0, static_cast<std::int32_t>(chunk),
                                                  static_cast<std::int32_t>(tokens)};
        const std::vector<std::int32_t> lens = {static_cast<std::int32_t>(ctx), static_cast<std::int32_t>(ctx2)};
        AttentionPtrs p{q.data(), kc, vc, all.data(), starts.data(), lens.data(), table.data()};
        const AttentionShape sh{cache, 2, tokens, heads, kv_heads, hd, bs, max_blocks, 0, 0, heads / kv_heads, scale};
        t->paged_attention(pool, p, sh);
        for (std::int64_t tk = 0; tk < tokens; ++tk) {
          const bool first = tk < chunk;
          std::vector<float> one(heads * hd, 0.0f);
          const std::vector<std::int32_t> one_starts = {0, 1};
          const std::vector<std::int32_t> one_len = {static_cast<std::int32_t>(first ? ctx - chunk + tk + 1 : ctx2)};
          AttentionPtrs p1{q.data() + tk * heads * hd, kc, vc, one.data(), one_starts.data(), one_len.data(),
                           table.data() + (first ? 0 : max_blocks)};
          AttentionShape s1 = sh;
          s1.n_seqs = 1;
          s1.n_tokens = 1;
          t->paged_attention(pool, p1, s1);
          ASSERT_EQ(0, std::memcmp(all.data() + tk * heads * hd, one.data(), sizeof(float) * heads * hd))
              << t->level << " cache " << hal::dtype_name(cache) << " token " << tk;
        }
      }
    }
  }
}

TEST(CpuIsaParity, ChoosingALevel) {
  CpuFeatures none;
  auto c = choose_isa(none, "");
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->level, isa_levels().front() == "native" ? "native" : "baseline");
  if (isa_levels().size() == 1) return;  // a -Dcpu_march build: one level
  CpuFeatures f;
  f.avx = f.avx2 = f.fma = f.f16c = true;
  c = choose_isa(f, "");
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->level, "avx2");
  f.avxvnni = true;
  EXPECT_EQ(choose_isa(f, "")->level, "avx-vnni");
  f.avx512f = f.avx512bw = f.avx512vl = f.avx512dq = f.avx512vnni = true;
  EXPECT_EQ(choose_isa(f, "")->level, "avx512-vnni");
  EXPECT_EQ(choose_isa(f, "avx2")->level, "avx2");
  EXPECT_EQ(choose_isa(f, "auto")->level, "avx512-vnni");
  // Forcing a level the machine lacks, or one that does not exist, is refused with the reason.
  const auto lacks = choose_isa(f, "avx512-bf16");
  ASSERT_FALSE(lacks.ok());
  EXPECT_NE(lacks.status().message().find("SEXTANT_CPU_ISA=avx512-bf16: this machine"), std::string::npos);
  EXPECT_NE(lacks.status().message().find("avx512-vnni, avx512, avx-vnni, avx2, baseline"), std::string::npos)
      << lacks.status().message();
  const auto unknown = choose_isa(f, "sse9");
  ASSERT_FALSE(unknown.ok());
  EXPECT_NE(unknown.status().message().find("not a kernel level"), std::string::npos);
  // AMX: the "amx" level needs avx512-bf16, the tiles and the OS's permission; otherwise reported.
  f.amx_tile = f.amx_int8 = true;
  EXPECT_EQ(choose_isa(f, "")->level, "avx512-vnni");
  EXPECT_EQ(choose_isa(f, "")->note, "amx present but not permitted by the OS");
  f.avx512bf16 = true;
  EXPECT_EQ(choose_isa(f, "")->level, "avx512-bf16");
  EXPECT_FALSE(choose_isa(f, "amx").ok());
  f.amx_permitted = true;
  const std::vector<std::string_view> levels = isa_levels();
  const bool amx_built = std::find(levels.begin(), levels.end(), "amx") != levels.end();
  EXPECT_EQ(choose_isa(f, "")->level, amx_built ? "amx" : "avx512-bf16");
  EXPECT_EQ(choose_isa(f, "")->note, amx_built ? "" : "amx present and permitted; no amx kernels in this build");
  EXPECT_EQ(choose_isa(f, "avx512-bf16")->level, "avx512-bf16");
}

}  // namespace
}  // namespace sx::cpu
