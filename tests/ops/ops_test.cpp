// Every op of the HAL set on every backend by name (tests/cts/targets.h: cpu, cpu in strict mode,
// vulkan, cuda), against naive references written here over shapes and formats, with tolerances
// per format; argument errors and their latching. A target that cannot run here is skipped with
// the reason printed. (The CPU's own kernels, layouts and options: tests/unit/cpu_*.)
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <deque>
#include <numeric>
#include <random>
#include <span>
#include <tuple>
#include <vector>

#include "runtime/base/half.h"
#include "runtime/hal/registry.h"
#include "tests/cts/deltanet_reference.h"
#include "tests/cts/targets.h"

namespace sx {
namespace {

using hal::testing::Target;

class Ops : public ::testing::TestWithParam<Target> {
 protected:
  void SetUp() override {
    std::string why;
    hal::Backend* b = hal::testing::usable_backend(GetParam(), 1, why);
    if (b == nullptr) {
      std::printf("skipped on %s: %s\n", GetParam().label, why.c_str());
      GTEST_SKIP() << why;
    }
    auto d = b->create_device(0, GetParam().device_options());
    ASSERT_TRUE(d.ok()) << d.status().to_string();
    device_ = std::move(*d);
    stream_ = std::move(device_->create_stream()).value();
  }

  // A device buffer holding `host` (the host copy is kept until the fixture ends: an upload reads
  // its source until sync(), which a strict device runs late).
  template <typename T>
  std::unique_ptr<hal::Buffer> buf(const std::vector<T>& host) {
    auto b = std::move(device_->alloc(std::max<std::size_t>(host.size() * sizeof(T), 1))).value();
    const auto bytes = std::as_bytes(std::span<const T>(host));
    kept_.emplace_back(bytes.begin(), bytes.end());
    EXPECT_TRUE(stream_->upload(*b, 0, kept_.back()).ok());
    return b;
  }
  template <typename T>
  std::vector<T> read(const hal::Buffer& b, std::size_t n) {
    std::vector<T> out(n);
    EXPECT_TRUE(hal::download_span<T>(*stream_, std::span<T>(out), b, 0).ok());
    EXPECT_TRUE(stream_->sync().ok());
    return out;
  }
  // The op's error, whether the backend finds it when the op is enqueued or when it runs.
  Status run_and_sync(const hal::Op& op) {
    Status s = stream_->run(op);
    Status synced = stream_->sync();
    return s.ok() ? synced : s;
  }
  std::vector<float> random(std::size_t n, float scale = 1.0f) {
    std::normal_distribution<float> d(0.0f, scale);
    std::vector<float> v(n);
    for (auto& x : v) x = d(rng_);
    return v;
  }
  static hal::BufView V(const std::unique_ptr<hal::Buffer>& b) { return {b.get(), 0}; }

  std::mt19937 rng_{42};
  std::unique_ptr<hal::Device> device_;
  std::unique_ptr<hal::Stream> stream_;
  std::deque<std::vector<std::byte>> kept_;
};

TEST_P(Ops, RmsNormWithResidual) {
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

TEST_P(Ops, RopeNeox) {
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

TEST_P(Ops, EmbeddingAllFormats) {
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
  // Tables uploaded as weights (upload_weight: the device keeps them in its own layout; tied
  // embeddings are read from them) give the rows of the plain table, also for a vocab shard (ids
  // outside it are zero rows). The op names the file format; the buffer knows its layout.
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
    EXPECT_FALSE(run_and_sync(e).ok());
    stream_ = std::move(device_->create_stream()).value();
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

TEST_P(Ops, PagedAttentionMixedBatchMatchesNaive) {
  struct Seq { int ctx, n_new; std::vector<std::int32_t> blocks; };
  // The sequences `seqs` ({context, new tokens}) in a cache of n_blocks blocks of `block` slots,
  // block tables of max_blocks, for each head size, F32 and F16 caches, against naive_attention.
  const auto check = [&](const std::vector<Seq>& layout, const int block, const int n_blocks, const int max_blocks) {
  for (const int hd : {16, 24, 64, 128}) {
  SCOPED_TRACE(hd);
  std::vector<Seq> seqs = layout;  // block lists filled afresh for each head size
  const int heads = 14, kv_heads = 2;
  const int n_slots = n_blocks * block;
  std::vector<int> perm(n_blocks);
  std::iota(perm.begin(), perm.end(), 0);
  std::shuffle(perm.begin(), perm.end(), rng_);
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
  };
  // Three sequences: one prefill chunk of 5 tokens continuing a context of 20, one decode token at
  // 37, and a chunk of 3 tokens at 147-149 (the V rows are summed in several passes of 32).
  // Head sizes cover the register-blocked paths (16, 64, 128) and the generic one (24).
  check({{25, 5, {}}, {38, 1, {}}, {150, 3, {}}}, 4, 64, 40);
  // Decode of two sequences with block tables of 1024 positions, contexts of 700 and 90: a GPU
  // splits such contexts over several blocks (CUDA: splits of 256 positions, some past the
  // shorter context, combined afterwards).
  check({{700, 1, {}}, {90, 1, {}}}, 16, 64, 64);
}

// K and V rows into their slots of the paged cache in f32 and f16 (f16: within one f16 ulp of
// the rounded value, which a GPU may round either way at a tie), padding slots (-1) skipped and
// the slots not written keeping what they held; a slot past the cache is OUT_OF_RANGE.
TEST_P(Ops, KvWriteIntoPagedSlots) {
  const int T = 5, kv_heads = 2, hd = 8, n_slots = 12, row = kv_heads * hd;
  const std::vector<std::int32_t> slots = {7, -1, 0, 11, 3};
  auto k = random(T * row), v = random(T * row);
  auto bk = buf(k), bv = buf(v), bs = buf(slots);
  for (hal::DType cache_type : {hal::DType::kF32, hal::DType::kF16}) {
    SCOPED_TRACE(hal::dtype_name(cache_type));
    const std::size_t elem = hal::dtype_info(cache_type).block_bytes;
    const std::vector<std::uint8_t> sentinel(n_slots * row * elem, 0x3c);  // f32 0.0115, f16 1.05
    auto kc = buf(sentinel), vc = buf(sentinel);
    hal::KvWriteArgs a{V(bk), V(bv), V(kc), V(vc), cache_type, V(bs), T, kv_heads, hd, n_slots};
    ASSERT_TRUE(stream_->run(a).ok());
    for (const auto& [cache, src] : {std::pair{&kc, &k}, std::pair{&vc, &v}}) {
      const auto got = read<std::uint8_t>(**cache, sentinel.size());
      std::vector<float> as_float(n_slots * row), before(n_slots * row);
      hal::dequantize_row(cache_type, got.data(), as_float.data(), n_slots * row);
      hal::dequantize_row(cache_type, sentinel.data(), before.data(), n_slots * row);
      for (int slot = 0; slot < n_slots; ++slot) {
        int t = -1;
        for (int i = 0; i < T; ++i) {
          if (slots[i] == slot) t = i;
        }
        for (int e = 0; e < row; ++e) {
          const float out = as_float[slot * row + e];
          if (t < 0) {
            ASSERT_EQ(out, before[slot * row + e]) << "slot " << slot << " was not written";
            continue;
          }
          const float x = (*src)[t * row + e];
          if (cache_type == hal::DType::kF32) {
            ASSERT_EQ(out, x) << "slot " << slot;
          } else {
            ASSERT_NEAR(out, f16_to_f32(f32_to_f16(x)), std::ldexp(std::fabs(x), -10)) << "slot " << slot;
          }
        }
      }
    }
  }
  auto bad = buf(std::vector<std::int32_t>{0, 12, 1, 2, 3});
  auto kc = buf(std::vector<float>(n_slots * row)), vc = buf(std::vector<float>(n_slots * row));
  const Status st = run_and_sync(
      hal::KvWriteArgs{V(bk), V(bv), V(kc), V(vc), hal::DType::kF32, V(bad), T, kv_heads, hd, n_slots});
  EXPECT_EQ(st.code(), StatusCode::kOutOfRange) << st.to_string();
  EXPECT_NE(st.message().find("slot 12"), std::string::npos) << st.to_string();
}

TEST_P(Ops, SiluMul) {
  auto g = random(2 * 40), u = random(2 * 40);
  auto bg = buf(g), bu = buf(u), bo = buf(std::vector<float>(80));
  ASSERT_TRUE(stream_->run(hal::SiluMulArgs{V(bg), V(bu), V(bo), 2, 40, 0, 0, 0}).ok());
  auto o = read<float>(*bo, 80);
  for (int i = 0; i < 80; ++i) EXPECT_NEAR(o[i], g[i] / (1 + std::exp(-g[i])) * u[i], 1e-6);
}

// Every k of hal::TopKArgs against a full sort in its order, on rows with ties (values on a
// coarse grid), NaN and infinities, with an id offset (a vocab shard).
TEST_P(Ops, TopKIsTheSortedPrefixWithTiesToTheLowerIndex) {
  const std::int64_t rows = 3, cols = 300, offset = 1000;
  std::vector<float> x = random(rows * cols);
  for (float& v : x) v = std::round(v * 8.0f) / 8.0f;  // many equal values
  x[5] = std::nanf("");
  x[cols + 7] = INFINITY;
  x[cols + 9] = -INFINITY;
  x[2 * cols + 0] = std::nanf("");
  x[2 * cols + 1] = std::nanf("");
  auto bx = buf(x);
  for (std::int64_t k : {std::int64_t{1}, std::int64_t{2}, std::int64_t{7}, hal::kMaxTopK}) {
    SCOPED_TRACE(::testing::Message() << "k " << k);
    auto bv = buf(std::vector<float>(static_cast<std::size_t>(rows * k)));
    auto bi = buf(std::vector<std::int32_t>(static_cast<std::size_t>(rows * k)));
    ASSERT_TRUE(stream_->run(hal::TopKArgs{V(bx), V(bv), V(bi), rows, cols, k, offset}).ok());
    const auto v = read<float>(*bv, static_cast<std::size_t>(rows * k));
    const auto ids = read<std::int32_t>(*bi, static_cast<std::size_t>(rows * k));
    for (std::int64_t r = 0; r < rows; ++r) {
      std::vector<std::int64_t> order(static_cast<std::size_t>(cols));
      std::iota(order.begin(), order.end(), 0);
      const float* row = x.data() + r * cols;
      std::stable_sort(order.begin(), order.end(),
                       [&](std::int64_t a, std::int64_t b) { return hal::top_k_before(row[a], a, row[b], b); });
      for (std::int64_t i = 0; i < k; ++i) {
        const std::int64_t want = order[static_cast<std::size_t>(i)];
        EXPECT_EQ(ids[static_cast<std::size_t>(r * k + i)], want + offset) << "row " << r << " rank " << i;
        const float got = v[static_cast<std::size_t>(r * k + i)];
        EXPECT_TRUE(got == row[want] || (std::isnan(got) && std::isnan(row[want]))) << "row " << r << " rank " << i;
      }
    }
  }
  // The order itself: a larger value first, NaN last, the lower index among equals.
  EXPECT_TRUE(hal::top_k_before(2.0f, 9, 1.0f, 0));
  EXPECT_TRUE(hal::top_k_before(1.0f, 3, 1.0f, 4));
  EXPECT_TRUE(hal::top_k_before(-INFINITY, 9, std::nanf(""), 0));
  EXPECT_FALSE(hal::top_k_before(std::nanf(""), 0, -INFINITY, 9));
  EXPECT_TRUE(hal::top_k_before(std::nanf(""), 0, std::nanf(""), 1));
  // k outside [1, min(n_cols, kMaxTopK)] is an error.
  auto small = buf(std::vector<float>(static_cast<std::size_t>(rows * (hal::kMaxTopK + 1))));
  auto small_ids = buf(std::vector<std::int32_t>(static_cast<std::size_t>(rows * (hal::kMaxTopK + 1))));
  EXPECT_EQ(run_and_sync(hal::TopKArgs{V(bx), V(small), V(small_ids), rows, cols, hal::kMaxTopK + 1, 0}).code(),
            StatusCode::kInvalidArgument);
  stream_ = std::move(device_->create_stream()).value();
  EXPECT_EQ(run_and_sync(hal::TopKArgs{V(bx), V(small), V(small_ids), rows, cols, 0, 0}).code(),
            StatusCode::kInvalidArgument);
}

TEST_P(Ops, BadArgumentsAreErrorsAndLatch) {
  auto small = buf(std::vector<float>(10));
  auto ids = buf(std::vector<std::int32_t>{0, 99});
  auto table = buf(std::vector<float>(4 * 8));
  // A token id outside the vocabulary.
  auto out = buf(std::vector<float>(2 * 8));
  Status s = run_and_sync(hal::EmbeddingArgs{V(table), hal::DType::kF32, V(ids), V(out), 2, 8, 4});
  EXPECT_EQ(s.code(), StatusCode::kOutOfRange);
  EXPECT_NE(s.message().find("99"), std::string::npos) << s.to_string();
  // The error latches: later work fails with the same status, sync reports it.
  EXPECT_EQ(stream_->run(hal::AddArgs{V(small), V(small), V(small), 10}).code(), StatusCode::kOutOfRange);
  EXPECT_EQ(stream_->sync().code(), StatusCode::kOutOfRange);

  stream_ = std::move(device_->create_stream()).value();
  // Output too small for the op.
  Status s2 = run_and_sync(hal::AddArgs{V(small), V(small), V(small), 11});
  EXPECT_EQ(s2.code(), StatusCode::kOutOfRange);
  EXPECT_NE(s2.message().find("add"), std::string::npos);
  // A missing buffer.
  stream_ = std::move(device_->create_stream()).value();
  EXPECT_EQ(run_and_sync(hal::AddArgs{hal::BufView{}, V(small), V(small), 1}).code(), StatusCode::kInvalidArgument);
}

// y = x W^T (+ bias) for every weight format the HAL can quantise, uploaded as a weight: rows not a
// multiple of any interleave (37), one row (a decode step) and several (a prefill), against the
// dequantised weights in double. The tolerance is per format, relative to sum |x| |w| of the row:
// F32 is read as it is; BF16 may meet activations rounded to BF16 (the CPU's vdpbf16ps GEMM on
// avx512-bf16: half a unit of an 8-bit significand, 2^-8), F16 too, with its weights also rounded
// to BF16 there (2^-7 + 2^-16); block formats may meet activations quantised to 8 bits (as the
// CPU's int8 kernels do).
TEST_P(Ops, MatmulEveryFormatAgainstTheDequantisedWeights) {
  const int n = 37, k = 512;
  const auto w = random(static_cast<std::size_t>(n) * k, 0.05f);
  const auto bias = random(n);
  for (hal::DType t : {hal::DType::kF32, hal::DType::kF16, hal::DType::kBF16, hal::DType::kQ8_0, hal::DType::kQ4_0,
                       hal::DType::kQ4_1, hal::DType::kQ5_0, hal::DType::kQ5_1, hal::DType::kQ4_K, hal::DType::kQ5_K,
                       hal::DType::kQ6_K}) {
    if (!hal::can_quantize(t)) continue;
    SCOPED_TRACE(hal::dtype_name(t));
    const std::size_t rb = hal::row_bytes(t, k);
    std::vector<std::uint8_t> packed(rb * n);
    std::vector<float> dq(static_cast<std::size_t>(n) * k);
    for (int r = 0; r < n; ++r) {
      hal::quantize_row(t, &w[static_cast<std::size_t>(r) * k], &packed[rb * r], k);
      hal::dequantize_row(t, &packed[rb * r], &dq[static_cast<std::size_t>(r) * k], k);
    }
    kept_.emplace_back(reinterpret_cast<const std::byte*>(packed.data()),
                       reinterpret_cast<const std::byte*>(packed.data()) + packed.size());
    auto bw = device_->upload_weight(*stream_, hal::WeightDesc{t, n, k}, kept_.back());
    ASSERT_TRUE(bw.ok()) << bw.status().to_string();
    const bool is_float = t == hal::DType::kF32 || t == hal::DType::kF16 || t == hal::DType::kBF16;
    // 8-bit activations: ~2^-8 of sum|x w| at worst; BF16 ones: 2^-8 at most (2^-7 with F16 W).
    const double tol = t == hal::DType::kBF16  ? 1.0 / 256 + 1e-5
                       : t == hal::DType::kF16 ? 2.0 / 256 + 1e-5
                       : is_float              ? 1e-5
                                               : 1e-2;
    for (const int m : {1, 5, 11}) {  // 11: more than one tile of a tiled kernel
      for (const bool with_bias : {false, true}) {
        const auto x = random(static_cast<std::size_t>(m) * k);
        auto bx = buf(x), by = buf(std::vector<float>(static_cast<std::size_t>(m) * n)), bb = buf(bias);
        hal::MatmulArgs a;
        a.w = V(*bw);
        a.w_type = t;
        a.x = V(bx);
        if (with_bias) a.bias = V(bb);
        a.y = V(by);
        a.m = m;
        a.n = n;
        a.k = k;
        ASSERT_TRUE(stream_->run(a).ok());
        const auto y = read<float>(*by, static_cast<std::size_t>(m) * n);
        double worst = 0;
        for (int i = 0; i < m; ++i) {
          for (int r = 0; r < n; ++r) {
            double ref = with_bias ? bias[static_cast<std::size_t>(r)] : 0.0, mag = 0;
            for (int j = 0; j < k; ++j) {
              const double p = double(x[static_cast<std::size_t>(i) * k + j]) * dq[static_cast<std::size_t>(r) * k + j];
              ref += p;
              mag += std::fabs(p);
            }
            worst = std::max(worst, std::fabs(y[static_cast<std::size_t>(i) * n + r] - ref) / mag);
          }
        }
        EXPECT_LE(worst, tol) << "m " << m << (with_bias ? " with bias" : "");
        std::printf("%s matmul %s m %d%s: max |y - ref| / sum|x w| = %.2g\n", GetParam().label,
                    std::string(hal::dtype_name(t)).c_str(), m, with_bias ? " +bias" : "", worst);
      }
    }
  }
}

// Q8_0 weights meet 8-bit activations on the CPU (backends/cpu/kernels/matmul.h: per block of 32,
// d = max|x| / 127, an exact integer dot product, F32 accumulation in block order). Every backend
// quantises them the same way, so that a Q8_0 model gives the CPU's greedy ids: its results
// equal the CPU device's within F32 rounding (1e-6 of sum |x w|, where 8-bit activations alone
// differ by up to ~1e-3), at decode and at prefill sizes, whatever the tiling.
TEST_P(Ops, Q8_0MatmulQuantisesActivationsAsTheCpuDoes) {
  std::string why;
  hal::Backend* cpu = hal::testing::usable_backend(hal::testing::targets()[0], 1, why);
  ASSERT_NE(cpu, nullptr) << why;
  auto cpu_device = std::move(cpu->create_device(0, hal::testing::targets()[0].device_options())).value();
  auto cpu_stream = std::move(cpu_device->create_stream()).value();
  const int n = 45, k = 1024;
  const auto w = random(static_cast<std::size_t>(n) * k, 0.05f);
  const std::size_t rb = hal::row_bytes(hal::DType::kQ8_0, k);
  std::vector<std::uint8_t> packed(rb * n);
  for (int r = 0; r < n; ++r) hal::quantize_row(hal::DType::kQ8_0, &w[static_cast<std::size_t>(r) * k], &packed[rb * r], k);
  const auto bytes = std::as_bytes(std::span<const std::uint8_t>(packed));
  kept_.emplace_back(bytes.begin(), bytes.end());
  const hal::WeightDesc desc{hal::DType::kQ8_0, n, k};
  auto bw = std::move(device_->upload_weight(*stream_, desc, kept_.back())).value();
  auto cw = std::move(cpu_device->upload_weight(*cpu_stream, desc, kept_.back())).value();
  for (const int m : {1, 3, 8, 13}) {
    // Activations spanning magnitudes, as hidden states do (a few large ones per block).
    auto x = random(static_cast<std::size_t>(m) * k);
    for (std::size_t i = 0; i < x.size(); i += 37) x[i] *= 20.0f;
    const auto run_on = [&](hal::Device& d, hal::Stream& s, hal::Buffer& weight) {
      auto bx = std::move(d.alloc(x.size() * 4)).value();
      auto by = std::move(d.alloc(static_cast<std::size_t>(m) * n * 4)).value();
      EXPECT_TRUE(s.upload(*bx, 0, std::as_bytes(std::span<const float>(x))).ok());
      hal::MatmulArgs a;
      a.w = {&weight, 0};
      a.w_type = hal::DType::kQ8_0;
      a.x = {bx.get(), 0};
      a.y = {by.get(), 0};
      a.m = m;
      a.n = n;
      a.k = k;
      EXPECT_TRUE(s.run(a).ok());
      std::vector<float> y(static_cast<std::size_t>(m) * n);
      EXPECT_TRUE(hal::download_span<float>(s, std::span<float>(y), *by, 0).ok());
      EXPECT_TRUE(s.sync().ok());
      return y;
    };
    const auto y = run_on(*device_, *stream_, *bw);
    const auto ref = run_on(*cpu_device, *cpu_stream, *cw);
    double worst = 0;
    int identical = 0;
    for (int i = 0; i < m; ++i) {
      for (int r = 0; r < n; ++r) {
        double mag = 0;
        for (int j = 0; j < k; ++j) {
          mag += std::fabs(double(x[static_cast<std::size_t>(i) * k + j]) * w[static_cast<std::size_t>(r) * k + j]);
        }
        const std::size_t at = static_cast<std::size_t>(i) * n + r;
        worst = std::max(worst, std::fabs(double(y[at]) - ref[at]) / mag);
        identical += y[at] == ref[at];
      }
    }
    EXPECT_LE(worst, 1e-6) << "m " << m;
    std::printf("%s q8_0 matmul m %d: max |y - y_cpu| / sum|x w| = %.2g, %d of %d outputs bit-identical\n",
                GetParam().label, m, worst, identical, m * n);
  }
}

// hal::MoeRouterArgs against its definition: softmax, the k most probable experts in top_k_before's
// order (a row of equal logits gives experts 0..k-1), their probabilities renormalised or not.
TEST_P(Ops, MoeRouterSoftmaxTopKTiesToTheLowerIdRenormalised) {
  for (const auto& [T, E, k] : {std::tuple<int, int, int>{6, 12, 4}, {3, 128, 8}, {2, 300, 64}}) {
    auto logits = random(static_cast<std::size_t>(T) * E, 3.0f);
    std::fill_n(logits.begin() + (T - 1) * E, E, 0.25f);  // the last token: every logit equal
    auto bl = buf(logits), bi = buf(std::vector<std::int32_t>(T * k)), bw = buf(std::vector<float>(T * k));
    for (const bool normalize : {true, false}) {
      SCOPED_TRACE(::testing::Message() << E << " experts, k " << k << (normalize ? ", renormalised" : ""));
      ASSERT_TRUE(stream_->run(hal::MoeRouterArgs{V(bl), V(bi), V(bw), T, E, k, normalize}).ok());
      const auto ids = read<std::int32_t>(*bi, static_cast<std::size_t>(T * k));
      const auto w = read<float>(*bw, static_cast<std::size_t>(T * k));
      for (int t = 0; t < T; ++t) {
        std::vector<double> p(E);
        const float* row = &logits[static_cast<std::size_t>(t) * E];
        const double mx = *std::max_element(row, row + E);
        double sum = 0;
        for (int e = 0; e < E; ++e) sum += p[e] = std::exp(row[e] - mx);
        std::vector<int> order(E);
        std::iota(order.begin(), order.end(), 0);
        std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return p[a] > p[b]; });
        double chosen = 0;
        for (int j = 0; j < k; ++j) chosen += p[order[j]] / sum;
        for (int j = 0; j < k; ++j) {
          ASSERT_EQ(ids[t * k + j], order[j]) << "token " << t << " choice " << j;
          EXPECT_NEAR(w[t * k + j], p[order[j]] / sum / (normalize ? chosen : 1.0), 1e-6) << "token " << t;
        }
      }
    }
  }
  auto small = buf(std::vector<float>(16));
  EXPECT_EQ(run_and_sync(hal::MoeRouterArgs{V(small), V(small), V(small), 1, 4, 5, true}).code(),
            StatusCode::kInvalidArgument);
}

// hal::MoeFfnArgs in every weight format against its definition from the dequantised weights: at
// decode and prefill sizes, for all experts and for expert-parallel ranges whose outputs add up to
// the whole (a token routed to none of a rank's experts gets zeros; a rank of no experts, zeros
// everywhere); a step whose every token goes to the same two experts.
TEST_P(Ops, MoeFfnEveryFormatAgainstTheDequantisedExperts) {
  const int H = 256, F = 256, E = 6, k = 2;  // K-quants: whole 256-element blocks along both
  const auto gate = random(static_cast<std::size_t>(E) * F * H, 0.06f), up = random(gate.size(), 0.06f),
             down = random(static_cast<std::size_t>(E) * H * F, 0.06f);
  for (hal::DType t : {hal::DType::kF32, hal::DType::kF16, hal::DType::kBF16, hal::DType::kQ8_0, hal::DType::kQ4_0,
                       hal::DType::kQ4_K, hal::DType::kQ6_K}) {
    if (!hal::can_quantize(t)) continue;
    const std::size_t rb = hal::row_bytes(t, H);  // H == F: one row size for the three
    auto pack = [&](const std::vector<float>& m, std::vector<float>& dq) {
      std::vector<std::byte> bytes(rb * (m.size() / H));
      dq.resize(m.size());
      for (std::size_t r = 0; r < m.size() / H; ++r) {
        hal::quantize_row(t, &m[r * H], &bytes[r * rb], H);
        hal::dequantize_row(t, &bytes[r * rb], &dq[r * H], H);
      }
      return bytes;
    };
    std::vector<float> gq, uq, dq;
    kept_.push_back(pack(gate, gq));
    const auto& gb = kept_.back();
    kept_.push_back(pack(up, uq));
    const auto& ub = kept_.back();
    kept_.push_back(pack(down, dq));
    const auto& db = kept_.back();
    const bool is_float = t == hal::DType::kF32 || t == hal::DType::kF16 || t == hal::DType::kBF16;
    const double moe_tol = t == hal::DType::kBF16  ? 3.0 / 256
                           : t == hal::DType::kF16 ? 6.0 / 256 + 1e-5
                           : is_float              ? 1e-5
                                                   : 3e-2;
    for (const int T : {1, 13}) {
      auto x = random(static_cast<std::size_t>(T) * H);
      std::vector<std::int32_t> ids(static_cast<std::size_t>(T) * k);
      for (int i = 0; i < T; ++i) {  // two different experts per token; the last token to 0 and 1
        const auto a = static_cast<std::int32_t>(rng_() % E);
        ids[i * k] = i == T - 1 ? 1 : a;
        ids[i * k + 1] = i == T - 1 ? 0 : static_cast<std::int32_t>((a + 1 + rng_() % (E - 1)) % E);
      }
      std::vector<float> w(ids.size());
      for (auto& v : w) v = 0.1f + static_cast<float>(rng_() % 90) / 100.0f;
      for (const bool crowded : {false, true}) {
        if (crowded) {  // every token to experts 4 and 2
          for (int i = 0; i < T; ++i) ids[i * k] = 4, ids[i * k + 1] = 2;
        }
        auto bx = buf(x), bi = buf(ids), bwt = buf(w), bo = buf(std::vector<float>(static_cast<std::size_t>(T) * H, 7.0f));
        // The definition, per choice, from the dequantised experts; |terms| for the scale of errors.
        std::vector<double> want(static_cast<std::size_t>(T) * H, 0.0), parts(want.size() * k), mag(want.size(), 0.0);
        for (int i = 0; i < T; ++i) {
          for (int j = 0; j < k; ++j) {
            const int e = ids[i * k + j];
            std::vector<double> act(F);
            for (int f = 0; f < F; ++f) {
              double g = 0, u = 0;
              for (int c = 0; c < H; ++c) {
                g += double(gq[(static_cast<std::size_t>(e) * F + f) * H + c]) * x[static_cast<std::size_t>(i) * H + c];
                u += double(uq[(static_cast<std::size_t>(e) * F + f) * H + c]) * x[static_cast<std::size_t>(i) * H + c];
              }
              act[f] = g / (1 + std::exp(-g)) * u;
            }
            for (int c = 0; c < H; ++c) {
              double yv = 0, ym = 0;
              for (int f = 0; f < F; ++f) {
                yv += double(dq[(static_cast<std::size_t>(e) * H + c) * F + f]) * act[f];
                ym += std::fabs(double(dq[(static_cast<std::size_t>(e) * H + c) * F + f]) * act[f]);
              }
              parts[(static_cast<std::size_t>(i) * H + c) * k + j] = w[i * k + j] * yv;
              mag[static_cast<std::size_t>(i) * H + c] += w[i * k + j] * ym;
            }
          }
        }
        std::vector<float> sum(want.size(), 0.0f);
        for (const auto& [begin, n] : {std::pair<int, int>{0, E}, {0, 3}, {3, 3}, {2, 0}}) {
          SCOPED_TRACE(::testing::Message() << hal::dtype_name(t) << ", " << T << " tokens"
                                            << (crowded ? " all to experts 4 and 2" : "") << ", experts " << begin
                                            << ".." << begin + n);
          std::unique_ptr<hal::Buffer> g, u, d;
          if (n > 0) {
            const std::size_t per = rb * F;  // bytes of one expert's matrix (F rows of H, or H of F)
            auto up_w = [&](const std::vector<std::byte>& all) {
              auto r = device_->upload_weight(*stream_, hal::WeightDesc{t, static_cast<std::int64_t>(n) * F, H},
                                              std::span<const std::byte>(all).subspan(begin * per, n * per));
              EXPECT_TRUE(r.ok()) << r.status().to_string();
              return std::move(r).value();
            };
            g = up_w(gb);
            u = up_w(ub);
            d = up_w(db);
          }
          hal::MoeFfnArgs a;
          a.x = V(bx);
          a.ids = V(bi);
          a.weights = V(bwt);
          if (n > 0) a.gate = V(g), a.up = V(u), a.down = V(d);
          a.gate_type = a.up_type = a.down_type = t;
          a.out = V(bo);
          a.n_tokens = T;
          a.dim = H;
          a.ffn = F;
          a.k = k;
          a.expert_begin = begin;
          a.n_local = n;
          ASSERT_TRUE(stream_->run(a).ok());
          const auto got = read<float>(*bo, want.size());
          double worst = 0;
          for (int i = 0; i < T; ++i) {
            for (int c = 0; c < H; ++c) {
              const std::size_t at = static_cast<std::size_t>(i) * H + c;
              double ref = 0;
              for (int j = 0; j < k; ++j) {
                if (ids[i * k + j] >= begin && ids[i * k + j] < begin + n) ref += parts[at * k + j];
              }
              if (ref == 0) {
                ASSERT_EQ(got[at], 0.0f) << "token " << i << " has no expert here";
              }
              worst = std::max(worst, std::fabs(got[at] - ref) / (mag[at] + 1e-30));
              if (n == 3) sum[at] += got[at];
            }
          }
          // Quantised formats: the activations rounded to 8 bits (Q8_0, and int8 paths of others);
          // BF16: to BF16 by the CPU's prefill GEMM (2^-8 per matmul, three in a row; F16, whose
          // weights that GEMM rounds to BF16 too, 2^-7 per matmul).
          EXPECT_LE(worst, moe_tol);
          std::printf("%s moe_ffn %s T %d%s experts %d..%d: max |out - ref| / sum|terms| = %.2g\n", GetParam().label,
                      std::string(hal::dtype_name(t)).c_str(), T, crowded ? " crowded" : "", begin, begin + n, worst);
        }
        double worst = 0;
        for (std::size_t at = 0; at < want.size(); ++at) {
          double ref = 0;
          for (int j = 0; j < k; ++j) ref += parts[at * k + j];
          worst = std::max(worst, std::fabs(sum[at] - ref) / (mag[at] + 1e-30));
        }
        EXPECT_LE(worst, moe_tol) << hal::dtype_name(t) << ": experts 0..3 + 3..6";
      }
    }
  }
}

// ---- Gated DeltaNet and gated attention (issue 42) ----

TEST_P(Ops, SigmoidMulWithAnInterleavedGateAndOnePerRow) {
  const std::int64_t R = 6, C = 40;
  auto qg = random(R * 2 * C, 3.0f), x = random(R * C), g = random(R, 3.0f);
  auto bqg = buf(qg), bx = buf(x), bg = buf(g), bo = buf(std::vector<float>(R * C)), bo2 = buf(std::vector<float>(R * C));
  // The gate read where the query projection interleaves it ([query | gate] rows of 2C).
  ASSERT_TRUE(stream_->run(hal::SigmoidMulArgs{V(bx), {bqg.get(), C * 4}, V(bo), R, C, 0, 2 * C, 0, false}).ok());
  ASSERT_TRUE(stream_->run(hal::SigmoidMulArgs{V(bx), V(bg), V(bo2), R, C, 0, 0, 0, true}).ok());
  auto o = read<float>(*bo, R * C), o2 = read<float>(*bo2, R * C);
  for (std::int64_t r = 0; r < R; ++r) {
    for (std::int64_t c = 0; c < C; ++c) {
      EXPECT_NEAR(o[r * C + c], x[r * C + c] / (1 + std::exp(-qg[r * 2 * C + C + c])), 1e-6);
      EXPECT_NEAR(o2[r * C + c], x[r * C + c] / (1 + std::exp(-g[r])), 1e-6);
    }
  }
}

TEST_P(Ops, GatedNormInPlace) {
  const std::int64_t R = 7, D = 96;
  auto x = random(R * D), z = random(R * D, 2.0f), w = random(D);
  auto bx = buf(x), bz = buf(z), bw = buf(w);
  ASSERT_TRUE(stream_->run(hal::GatedNormArgs{V(bx), V(bz), V(bw), V(bx), R, D, 1e-6f}).ok());
  auto o = read<float>(*bx, R * D);
  for (std::int64_t r = 0; r < R; ++r) {
    double ss = 0;
    for (std::int64_t c = 0; c < D; ++c) ss += static_cast<double>(x[r * D + c]) * x[r * D + c];
    const double inv = 1 / std::sqrt(ss / D + 1e-6);
    for (std::int64_t c = 0; c < D; ++c) {
      const double gate = z[r * D + c];
      EXPECT_NEAR(o[r * D + c], x[r * D + c] * inv * w[c] * gate / (1 + std::exp(-gate)), 2e-5) << r << "," << c;
    }
  }
}

// Three sequences (continuing, one token, starting in this step) over rows wider than the channels.
TEST_P(Ops, ConvStateCarriesEachSequencesState) {
  const std::int64_t channels = 300, kernel = 4, stride = 310, slots = 4, T = 14;
  const testing::StateBatchRef b{{0, 7, 8, 14}, {12, 10, 6}, {2, 0, 3}};
  auto x = random(T * stride), w = random(channels * kernel), st = random(slots * (kernel - 1) * channels);
  auto bx = buf(x), bw = buf(w), bst = buf(st), bo = buf(std::vector<float>(T * channels));
  auto bs = buf(b.start), bc = buf(b.ctx), bl = buf(b.slot);
  hal::ConvStateArgs a{V(bx), V(bw), V(bst), V(bo), V(bs), V(bc), V(bl), 3, T, channels, kernel, slots, stride};
  ASSERT_TRUE(run_and_sync(a).ok());
  std::vector<double> want_state(st.begin(), st.end()), want;
  testing::conv_state_reference(x, stride, w, channels, kernel, b, want_state, want);
  auto o = read<float>(*bo, T * channels), s2 = read<float>(*bst, slots * (kernel - 1) * channels);
  for (std::size_t i = 0; i < o.size(); ++i) ASSERT_NEAR(o[i], want[i], 1e-5) << i;
  for (std::size_t i = 0; i < s2.size(); ++i) ASSERT_EQ(s2[i], static_cast<float>(want_state[i])) << i;
}

// Both forms (a backend may compute the chunked one as the recurrent one), tiled and grouped heads.
TEST_P(Ops, DeltaRuleMatchesItsDefinition) {
  for (const bool tiled : {true, false}) {
    for (const std::int64_t chunk : {0, 64}) {
      SCOPED_TRACE(::testing::Message() << (tiled ? "tiled" : "grouped") << " chunk " << chunk);
      testing::DeltaShapeRef sh;
      sh.n_k = 2, sh.n_v = 6, sh.dk = 32, sh.dv = 24, sh.tiled = tiled;
      const testing::StateBatchRef b{{0, 1, 91, 110}, {5, 90, 40}, {3, 0, 1}};
      const std::int64_t T = 110, slots = 4;
      auto qkv = random(T * sh.qkv()), alpha = random(T * sh.n_v, 1.5f), beta = random(T * sh.n_v, 2.0f);
      std::vector<float> av(sh.n_v), dt = random(sh.n_v);
      for (std::int64_t h = 0; h < sh.n_v; ++h) av[h] = -0.1f - 0.3f * static_cast<float>(h);
      auto state = random(slots * sh.n_v * sh.dk * sh.dv, 0.3f);
      auto bq = buf(qkv), ba = buf(alpha), bb = buf(beta), bav = buf(av), bdt = buf(dt), bst = buf(state);
      auto bo = buf(std::vector<float>(T * sh.n_v * sh.dv));
      auto bs = buf(b.start), bc = buf(b.ctx), bl = buf(b.slot);
      hal::DeltaRuleArgs a;
      a.q = V(bq), a.k = {bq.get(), static_cast<std::size_t>(sh.n_k * sh.dk * 4)};
      a.v = {bq.get(), static_cast<std::size_t>(2 * sh.n_k * sh.dk * 4)};
      a.alpha = V(ba), a.beta = V(bb), a.a = V(bav), a.dt_bias = V(bdt), a.state = V(bst), a.out = V(bo);
      a.seq_token_start = V(bs), a.seq_context_len = V(bc), a.seq_slot = V(bl);
      a.n_seqs = 3, a.n_tokens = T, a.n_k_heads = sh.n_k, a.n_v_heads = sh.n_v, a.d_k = sh.dk, a.d_v = sh.dv;
      a.n_slots = slots, a.chunk = chunk, a.tiled = tiled, a.eps = 1e-6f;
      a.scale = 1.0f / std::sqrt(static_cast<float>(sh.dk));
      ASSERT_TRUE(run_and_sync(a).ok());
      std::vector<double> want_state(state.begin(), state.end()), want;
      testing::delta_rule_reference(sh, qkv, alpha, beta, av, dt, b, want_state, want);
      auto o = read<float>(*bo, T * sh.n_v * sh.dv), s2 = read<float>(*bst, state.size());
      double d_out = 0, d_state = 0;
      for (std::size_t i = 0; i < o.size(); ++i) d_out = std::max(d_out, std::abs(o[i] - want[i]));
      for (std::size_t i = 0; i < s2.size(); ++i) d_state = std::max(d_state, std::abs(s2[i] - want_state[i]));
      EXPECT_LT(d_out, 1e-4);
      EXPECT_LT(d_state, 1e-4);
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Backends, Ops, ::testing::ValuesIn(hal::testing::targets()), hal::testing::target_name);

}  // namespace
}  // namespace sx
