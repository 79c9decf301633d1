// CPU backend ops through the HAL against naive references written here; argument checking.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>
#include <span>
#include <vector>

#include "backends/cpu/cpu_device.h"
#include "backends/cpu/ops/cpu_ops.h"
#include "runtime/base/half.h"

namespace sx {
namespace {

class CpuOps : public testing::Test {
 protected:
  void SetUp() override {
    cpu::CpuOptions o;
    o.threads = 2;
    device_ = std::make_unique<cpu::CpuDevice>(0, o);
    stream_ = std::move(device_->create_stream()).value();
  }

  template <typename T>
  std::unique_ptr<hal::Buffer> buf(const std::vector<T>& host) {
    auto b = std::move(device_->alloc(host.size() * sizeof(T))).value();
    EXPECT_TRUE(hal::upload_span<T>(*stream_, *b, 0, host).ok());
    return b;
  }
  template <typename T>
  std::vector<T> read(const hal::Buffer& b, std::size_t n) {
    std::vector<T> out(n);
    EXPECT_TRUE(hal::download_span<T>(*stream_, std::span<T>(out), b, 0).ok());
    EXPECT_TRUE(stream_->sync().ok());
    return out;
  }
  std::vector<float> random(std::size_t n, float scale = 1.0f) {
    std::normal_distribution<float> d(0.0f, scale);
    std::vector<float> v(n);
    for (auto& x : v) x = d(rng_);
    return v;
  }
  static hal::BufView V(const std::unique_ptr<hal::Buffer>& b) { return {b.get(), 0}; }

  std::mt19937 rng_{42};
  std::unique_ptr<cpu::CpuDevice> device_;
  std::unique_ptr<hal::Stream> stream_;
};

TEST_F(CpuOps, RmsNormWithResidual) {
  const int rows = 5, dim = 96;
  auto x = random(rows * dim), add = random(rows * dim), w = random(dim);
  auto bx = buf(x), badd = buf(add), bw = buf(w), bout = buf(std::vector<float>(rows * dim));
  ASSERT_TRUE(stream_->run(hal::RmsNormArgs{V(bx), V(badd), V(bw), V(bout), rows, dim, 1e-6f}).ok());
  auto out = read<float>(*bout, rows * dim);
  auto newx = read<float>(*bx, rows * dim);
  for (int r = 0; r < rows; ++r) {
    double ss = 0;
    for (int i = 0; i < dim; ++i) {
      const double v = static_cast<double>(x[r * dim + i]) + add[r * dim + i];
      EXPECT_NEAR(newx[r * dim + i], v, 1e-6);
      ss += v * v;
    }
    const double scale = 1.0 / std::sqrt(ss / dim + 1e-6);
    for (int i = 0; i < dim; ++i) {
      const double v = (static_cast<double>(x[r * dim + i]) + add[r * dim + i]) * scale * w[i];
      EXPECT_NEAR(out[r * dim + i], v, 1e-5 * (1 + std::fabs(v)));
    }
  }
}

TEST_F(CpuOps, RopeNeox) {
  const int T = 3, heads = 2, hd = 8;
  auto x = random(T * heads * hd);
  std::vector<std::int32_t> pos = {0, 7, 1000};
  auto bx = buf(x), bp = buf(pos);
  ASSERT_TRUE(stream_->run(hal::RopeArgs{V(bx), V(bp), T, heads, hd, hd, 10000.0f}).ok());
  auto out = read<float>(*bx, x.size());
  for (int t = 0; t < T; ++t) {
    for (int h = 0; h < heads; ++h) {
      for (int i = 0; i < hd / 2; ++i) {
        const double ang = pos[t] * std::pow(10000.0, -2.0 * i / hd);
        const double a = x[(t * heads + h) * hd + i], b = x[(t * heads + h) * hd + i + hd / 2];
        EXPECT_NEAR(out[(t * heads + h) * hd + i], a * std::cos(ang) - b * std::sin(ang), 1e-5);
        EXPECT_NEAR(out[(t * heads + h) * hd + i + hd / 2], a * std::sin(ang) + b * std::cos(ang), 1e-5);
      }
    }
  }
}

TEST_F(CpuOps, EmbeddingAllFormats) {
  const int vocab = 10, dim = 64;
  auto table = random(vocab * dim);
  std::vector<std::int32_t> ids = {3, 0, 9, 3};
  for (hal::DType t : {hal::DType::kF32, hal::DType::kF16, hal::DType::kBF16, hal::DType::kQ8_0}) {
    std::vector<std::uint8_t> packed(hal::row_bytes(t, dim) * vocab);
    for (int r = 0; r < vocab; ++r) hal::quantize_row(t, &table[r * dim], &packed[hal::row_bytes(t, dim) * r], dim);
    auto bt = buf(packed), bi = buf(ids), bo = buf(std::vector<float>(ids.size() * dim));
    ASSERT_TRUE(stream_->run(hal::EmbeddingArgs{V(bt), t, V(bi), V(bo), 4, dim, vocab}).ok());
    auto out = read<float>(*bo, ids.size() * dim);
    std::vector<float> expect(dim);
    for (std::size_t i = 0; i < ids.size(); ++i) {
      hal::dequantize_row(t, &packed[hal::row_bytes(t, dim) * ids[i]], expect.data(), dim);
      for (int j = 0; j < dim; ++j) ASSERT_EQ(out[i * dim + j], expect[j]) << hal::dtype_name(t);
    }
  }
  // Tables uploaded as weights (upload_weight: the CPU device keeps Q8_0 and Q5_0 in its
  // interleaved layouts where it has the AVX2 kernels; tied embeddings are read from them) give
  // the rows of the plain table, also for a vocab shard (ids outside it are zero rows). The op
  // names the file format; the buffer knows its layout.
  for (hal::DType source : {hal::DType::kQ8_0, hal::DType::kQ5_0}) {
    const std::size_t rb = hal::row_bytes(source, dim);
    std::vector<std::uint8_t> plain(rb * vocab);
    for (int r = 0; r < vocab; ++r) hal::quantize_row(source, &table[r * dim], &plain[rb * r], dim);
    auto upload = [&](const std::uint8_t* rows, int n) {
      auto b = device_->upload_weight(*stream_, hal::WeightDesc{source, n, dim},
                                      std::as_bytes(std::span(rows, rb * static_cast<std::size_t>(n))));
      EXPECT_TRUE(b.ok()) << b.status().to_string();
      EXPECT_TRUE(stream_->sync().ok());
      return std::move(b).value();
    };
    auto bt = upload(plain.data(), vocab);
    EXPECT_EQ(bt->size(), device_->weight_bytes(hal::WeightDesc{source, vocab, dim}));
    EXPECT_EQ(static_cast<cpu::CpuBuffer&>(*bt).layout(), cpu::weight_layout(source));
    auto bi = buf(ids), bo = buf(std::vector<float>(ids.size() * dim));
    hal::EmbeddingArgs e{V(bt), source, V(bi), V(bo), 4, dim, vocab};
    ASSERT_TRUE(stream_->run(e).ok());
    auto out = read<float>(*bo, ids.size() * dim);
    std::vector<float> expect(dim);
    for (std::size_t i = 0; i < ids.size(); ++i) {
      hal::dequantize_row(source, &plain[rb * ids[i]], expect.data(), dim);
      for (int j = 0; j < dim; ++j) ASSERT_EQ(out[i * dim + j], expect[j]) << hal::dtype_name(source) << " id " << ids[i];
    }
    e.shard = true;
    e.vocab_offset = 2;
    e.vocab = 3;  // rows 2..4 of the table: ids 3 -> local 1, others outside
    auto bs = upload(plain.data() + rb * 2, 3);
    e.table = V(bs);
    ASSERT_TRUE(stream_->run(e).ok());
    out = read<float>(*bo, ids.size() * dim);
    for (std::size_t i = 0; i < ids.size(); ++i) {
      const bool inside = ids[i] >= 2 && ids[i] < 5;
      if (inside) hal::dequantize_row(source, &plain[rb * ids[i]], expect.data(), dim);
      for (int j = 0; j < dim; ++j) {
        ASSERT_EQ(out[i * dim + j], inside ? expect[j] : 0.0f) << hal::dtype_name(source) << " shard id " << ids[i];
      }
    }
    // A weight buffer is read only as the format it was uploaded as.
    e.table = V(bt);
    e.table_type = hal::DType::kQ4_0;
    e.shard = false;
    e.vocab = vocab;
    EXPECT_EQ(stream_->run(e).code(), StatusCode::kInvalidArgument);
    auto fresh = std::move(device_->create_stream()).value();
    stream_ = std::move(fresh);
  }
}

// Naive attention for one sequence over contiguous K/V.
std::vector<float> naive_attention(const std::vector<float>& q, const std::vector<float>& k,
                                   const std::vector<float>& v, int n_new, int ctx, int heads, int kv_heads,
                                   int hd) {
  std::vector<float> out(static_cast<std::size_t>(n_new * heads * hd));
  const int group = heads / kv_heads;
  for (int j = 0; j < n_new; ++j) {
    const int pos = ctx - n_new + j;
    for (int h = 0; h < heads; ++h) {
      const int g = h / group;
      std::vector<double> sc(pos + 1);
      double mx = -1e300;
      for (int c = 0; c <= pos; ++c) {
        double d = 0;
        for (int i = 0; i < hd; ++i) d += static_cast<double>(q[(j * heads + h) * hd + i]) * k[(c * kv_heads + g) * hd + i];
        sc[c] = d / std::sqrt(static_cast<double>(hd));
        mx = std::max(mx, sc[c]);
      }
      double sum = 0;
      for (auto& s : sc) sum += (s = std::exp(s - mx));
      for (int i = 0; i < hd; ++i) {
        double acc = 0;
        for (int c = 0; c <= pos; ++c) acc += sc[c] * v[(c * kv_heads + g) * hd + i];
        out[(j * heads + h) * hd + i] = static_cast<float>(acc / sum);
      }
    }
  }
  return out;
}

TEST_F(CpuOps, PagedAttentionMixedBatchMatchesNaive) {
  // Three sequences: one prefill chunk of 5 tokens continuing a context of 20, one decode token at
  // 37, and a chunk of 3 tokens at 147-149 (the V rows are summed in several passes of 32).
  // Head sizes cover the register-blocked paths (16, 64, 128) and the generic one (24).
  for (const int hd : {16, 24, 64, 128}) {
  SCOPED_TRACE(hd);
  const int heads = 14, kv_heads = 2, block = 4, n_blocks = 64, max_blocks = 40;
  const int n_slots = n_blocks * block;
  struct Seq { int ctx, n_new; std::vector<std::int32_t> blocks; };
  std::vector<int> perm(n_blocks);
  std::iota(perm.begin(), perm.end(), 0);
  std::shuffle(perm.begin(), perm.end(), rng_);
  std::vector<Seq> seqs = {{25, 5, {}}, {38, 1, {}}, {150, 3, {}}};
  int next_block = 0;
  for (auto& s : seqs) {
    for (int b = 0; b < (s.ctx + block - 1) / block; ++b) s.blocks.push_back(perm[next_block++]);
  }
  for (hal::DType cache_type : {hal::DType::kF32, hal::DType::kF16}) {
    const std::size_t elem = hal::dtype_info(cache_type).block_bytes;
    std::vector<std::uint8_t> kc(n_slots * kv_heads * hd * elem), vc(kc.size());
    std::vector<float> q_all, expect_all;
    std::vector<std::int32_t> starts = {0}, ctxs, table(seqs.size() * max_blocks, 0);
    for (std::size_t si = 0; si < seqs.size(); ++si) {
      const Seq& s = seqs[si];
      auto k = random(static_cast<std::size_t>(s.ctx * kv_heads * hd));
      auto v = random(static_cast<std::size_t>(s.ctx * kv_heads * hd));
      auto q = random(static_cast<std::size_t>(s.n_new * heads * hd));
      // Round K/V through the cache format so that the reference sees the same values.
      for (auto* arr : {&k, &v}) {
        for (float& x : *arr) x = cache_type == hal::DType::kF16 ? f16_to_f32(f32_to_f16(x)) : x;
      }
      for (int c = 0; c < s.ctx; ++c) {
        const int slot = s.blocks[c / block] * block + c % block;
        const std::size_t row = kv_heads * hd;
        hal::quantize_row(cache_type, &k[c * row], &kc[slot * row * elem], static_cast<std::int64_t>(row));
        hal::quantize_row(cache_type, &v[c * row], &vc[slot * row * elem], static_cast<std::int64_t>(row));
      }
      auto e = naive_attention(q, k, v, s.n_new, s.ctx, heads, kv_heads, hd);
      q_all.insert(q_all.end(), q.begin(), q.end());
      expect_all.insert(expect_all.end(), e.begin(), e.end());
      starts.push_back(starts.back() + s.n_new);
      ctxs.push_back(s.ctx);
      std::copy(s.blocks.begin(), s.blocks.end(), table.begin() + static_cast<std::ptrdiff_t>(si * max_blocks));
    }
    const int T = starts.back();
    auto bq = buf(q_all), bk = buf(kc), bv = buf(vc), bo = buf(std::vector<float>(T * heads * hd));
    auto bs = buf(starts), bc = buf(ctxs), bt = buf(table);
    hal::AttentionArgs a;
    a.q = V(bq); a.k_cache = V(bk); a.v_cache = V(bv); a.cache_type = cache_type; a.out = V(bo);
    a.seq_token_start = V(bs); a.seq_context_len = V(bc); a.block_table = V(bt);
    a.n_seqs = static_cast<std::int64_t>(seqs.size()); a.n_tokens = T; a.n_heads = heads; a.n_kv_heads = kv_heads; a.head_dim = hd;
    a.block_size = block; a.max_blocks_per_seq = max_blocks; a.n_slots = n_slots;
    a.heads_per_kv = heads / kv_heads; a.scale = 1.0f / std::sqrt(static_cast<float>(hd));
    ASSERT_TRUE(stream_->run(a).ok());
    auto out = read<float>(*bo, expect_all.size());
    for (std::size_t i = 0; i < out.size(); ++i) ASSERT_NEAR(out[i], expect_all[i], 2e-5) << "element " << i;
  }
  }
}

TEST(CpuVectorMath, ExpAndSiluMatchLibm) {
  std::vector<float> x;
  for (float v = -100.0f; v <= 0.0f; v += 0.01f) x.push_back(v);
  std::vector<float> e = x;
  const float sum = cpu::exp_shifted_sum(e.data(), static_cast<std::int64_t>(e.size()), -1.0f);
  double ref_sum = 0;
  for (std::size_t i = 0; i < x.size(); ++i) {
    const double ref = std::exp(static_cast<double>(x[i]) + 1.0);
    ref_sum += ref;
    ASSERT_NEAR(e[i], ref, ref * 3e-7 + 1e-37) << x[i];
  }
  EXPECT_NEAR(sum, ref_sum, ref_sum * 1e-6);
  std::vector<float> g, u, o;
  for (float v = -120.0f; v <= 120.0f; v += 0.05f) {
    g.push_back(v);
    u.push_back(0.5f - v / 240.0f);
  }
  o.resize(g.size());
  cpu::silu_mul_row(g.data(), u.data(), o.data(), static_cast<std::int64_t>(g.size()));
  for (std::size_t i = 0; i < g.size(); ++i) {
    const double ref = g[i] / (1.0 + std::exp(-static_cast<double>(g[i]))) * u[i];
    ASSERT_NEAR(o[i], ref, std::fabs(ref) * 1e-6 + 1e-30) << g[i];
  }
}

TEST_F(CpuOps, SiluMulAndArgmax) {
  auto g = random(2 * 40), u = random(2 * 40);
  auto bg = buf(g), bu = buf(u), bo = buf(std::vector<float>(80));
  ASSERT_TRUE(stream_->run(hal::SiluMulArgs{V(bg), V(bu), V(bo), 2, 40, 0, 0, 0}).ok());
  auto o = read<float>(*bo, 80);
  for (int i = 0; i < 80; ++i) EXPECT_NEAR(o[i], g[i] / (1 + std::exp(-g[i])) * u[i], 1e-6);
  std::vector<float> x = {1, 5, 5, 2, -1, -3, -1, -2};
  auto bx = buf(x), bi = buf(std::vector<std::int32_t>(2));
  ASSERT_TRUE(stream_->run(hal::ArgmaxArgs{V(bx), V(bi), 2, 4}).ok());
  EXPECT_EQ(read<std::int32_t>(*bi, 2), (std::vector<std::int32_t>{1, 0}));
}

TEST_F(CpuOps, BadArgumentsAreErrorsAndLatch) {
  auto small = buf(std::vector<float>(10));
  auto ids = buf(std::vector<std::int32_t>{0, 99});
  auto table = buf(std::vector<float>(4 * 8));
  // A token id outside the vocabulary.
  auto out = buf(std::vector<float>(2 * 8));
  Status s = stream_->run(hal::EmbeddingArgs{V(table), hal::DType::kF32, V(ids), V(out), 2, 8, 4});
  EXPECT_EQ(s.code(), StatusCode::kOutOfRange);
  EXPECT_NE(s.message().find("99"), std::string::npos);
  // The error latches: later work fails with the same status, sync reports it.
  EXPECT_EQ(stream_->run(hal::AddArgs{V(small), V(small), V(small), 10}).code(), StatusCode::kOutOfRange);
  EXPECT_EQ(stream_->sync().code(), StatusCode::kOutOfRange);

  auto fresh = std::move(device_->create_stream()).value();
  // Output too small for the op.
  Status s2 = fresh->run(hal::AddArgs{V(small), V(small), V(small), 11});
  EXPECT_EQ(s2.code(), StatusCode::kOutOfRange);
  EXPECT_NE(s2.message().find("add"), std::string::npos);
  // A missing buffer.
  auto fresh2 = std::move(device_->create_stream()).value();
  EXPECT_EQ(fresh2->run(hal::AddArgs{hal::BufView{}, V(small), V(small), 1}).code(), StatusCode::kInvalidArgument);
}

// The CPU's device options arrive by name: known ones parsed, a bad value or an unknown name
// refused naming it; a group's threads are split between its ranks.
TEST(CpuOptions, AreParsedByNameAndUnknownNamesAreRefused) {
  const std::unique_ptr<hal::Backend> backend = cpu::make_cpu_backend();
  hal::DeviceOptions o;
  o.set("threads", 4).set("memory_budget", std::uint64_t{1} << 30).set("strict", true).set("fail_at_op", 9);
  auto parsed = cpu::parse_cpu_options(o);
  ASSERT_TRUE(parsed.ok()) << parsed.status().to_string();
  EXPECT_EQ(parsed->threads, 4);
  EXPECT_EQ(parsed->memory_budget, std::uint64_t{1} << 30);
  EXPECT_TRUE(parsed->strict);
  EXPECT_EQ(parsed->fail_at_op, 9u);
  auto group = backend->create_devices(2, o);
  ASSERT_TRUE(group.ok()) << group.status().to_string();
  EXPECT_EQ((*group)[1]->info().name, "cpu:1 (2 threads, strict)");
  EXPECT_EQ((*group)[1]->info().memory_bytes, std::uint64_t{1} << 30);
  EXPECT_TRUE((*group)[1]->info().shared_memory);

  hal::DeviceOptions unknown;
  unknown.set("threads", 1).set("device_memory_fraction", "0.5");
  auto refused = backend->create_device(0, unknown);
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(refused.status().message(), "backend 'cpu' has no device option 'device_memory_fraction' (it takes: "
                                        "threads, memory_budget, strict, fail_at_op)");
  hal::DeviceOptions bad;
  bad.set("strict", "yes");
  EXPECT_EQ(cpu::parse_cpu_options(bad).status().message(),
            "backend 'cpu': device option 'strict' must be true or false, got 'yes'");
  bad = {};
  bad.set("threads", "-1");
  EXPECT_EQ(cpu::parse_cpu_options(bad).status().message(),
            "backend 'cpu': device option 'threads' must be an integer in [0, 4096], got '-1'");
}

TEST_F(CpuOps, MemoryBudgetIsEnforced) {
  cpu::CpuOptions o;
  o.threads = 1;
  o.memory_budget = 1 << 20;
  cpu::CpuDevice d(1, o);
  auto a = d.alloc(800 << 10);
  ASSERT_TRUE(a.ok());
  auto b = d.alloc(800 << 10);
  EXPECT_EQ(b.status().code(), StatusCode::kResourceExhausted);
  EXPECT_EQ(d.memory().used_bytes, 800u << 10);
  a.value().reset();
  EXPECT_EQ(d.memory().used_bytes, 0u);
  EXPECT_TRUE(d.alloc(900 << 10).ok());
}

}  // namespace
}  // namespace sx
