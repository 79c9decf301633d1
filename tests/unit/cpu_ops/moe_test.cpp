// The mixture-of-experts ops on the CPU device (hal::MoeRouterArgs, hal::MoeFfnArgs) against a
// plain reference written from their definitions (ops.h): the router's softmax, top-k order (ties
// to the lower id) and renormalisation; the experts' FFN for F32, F16 and Q8_0 weights (Q8_0 in the
// device's interleaved layout, whose groups must not straddle experts), and expert parallelism: the
// outputs of disjoint expert ranges sum to the whole, a token routed to none of a rank's experts
// getting zeros.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>
#include <vector>

#include "backends/cpu/cpu_device.h"
#include "backends/cpu/kernels/kernel_table.h"
#include "tests/unit/cpu_ops/cpu_test_device.h"
#include "runtime/hal/quant.h"

namespace sx::cpu {
namespace {

using ops_test::Dev;

std::vector<float> randoms(std::size_t n, unsigned seed, float scale = 1.0f) {
  std::mt19937 gen(seed);
  std::uniform_real_distribution<float> d(-scale, scale);
  std::vector<float> v(n);
  for (float& x : v) x = d(gen);
  return v;
}

TEST(MoeRouter, SoftmaxTopKInOrderTiesToTheLowerIdRenormalised) {
  Dev d;
  const std::int64_t T = 5, E = 12, k = 4;
  std::vector<float> logits = randoms(static_cast<std::size_t>(T * E), 3, 4.0f);
  // Token 4: every logit equal: experts 0..3 in order, weights 1/k each (renormalised).
  std::fill_n(logits.begin() + 4 * E, E, 0.5f);
  auto x = d.upload(logits);
  auto ids = *d.device->alloc(T * k * 4), w = *d.device->alloc(T * k * 4);
  for (bool normalize : {true, false}) {
    ASSERT_TRUE(d.stream->run(hal::MoeRouterArgs{{x.get(), 0}, {ids.get(), 0}, {w.get(), 0}, T, E, k, normalize}).ok());
    const auto got_ids = d.download<std::int32_t>(*ids, T * k);
    const auto got_w = d.download<float>(*w, T * k);
    for (std::int64_t t = 0; t < T; ++t) {
      std::vector<double> p(E);
      double mx = *std::max_element(logits.begin() + t * E, logits.begin() + (t + 1) * E), sum = 0;
      for (std::int64_t e = 0; e < E; ++e) sum += p[e] = std::exp(logits[t * E + e] - mx);
      std::vector<int> order(E);
      std::iota(order.begin(), order.end(), 0);
      std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return p[a] > p[b]; });
      double chosen = 0;
      for (int j = 0; j < k; ++j) chosen += p[order[j]] / sum;
      for (int j = 0; j < k; ++j) {
        EXPECT_EQ(got_ids[t * k + j], order[j]) << "token " << t << " choice " << j;
        const double want = p[order[j]] / sum / (normalize ? chosen : 1.0);
        EXPECT_NEAR(got_w[t * k + j], want, 1e-6) << "token " << t << " choice " << j;
      }
    }
  }
  const auto ties = d.download<std::int32_t>(*ids, T * k);
  EXPECT_EQ(std::vector<std::int32_t>(ties.begin() + 4 * k, ties.end()), (std::vector<std::int32_t>{0, 1, 2, 3}));
}

// out[t] = sum of the routed experts in [begin, begin + n) of w * down(silu(gate x) * up x), from the
// weights as F32 (dequantised where quantised).
std::vector<float> reference(const std::vector<float>& x, const std::vector<std::int32_t>& ids,
                             const std::vector<float>& w, const std::vector<float>& gate, const std::vector<float>& up,
                             const std::vector<float>& down, std::int64_t T, std::int64_t H, std::int64_t F,
                             std::int64_t k, std::int64_t begin, std::int64_t n) {
  std::vector<float> out(static_cast<std::size_t>(T * H), 0.0f);
  for (std::int64_t t = 0; t < T; ++t) {
    for (std::int64_t j = 0; j < k; ++j) {
      const std::int64_t e = ids[t * k + j];
      if (e < begin || e >= begin + n) continue;
      std::vector<double> act(F);
      for (std::int64_t f = 0; f < F; ++f) {
        double g = 0, u = 0;
        for (std::int64_t i = 0; i < H; ++i) {
          g += double(gate[(e * F + f) * H + i]) * x[t * H + i];
          u += double(up[(e * F + f) * H + i]) * x[t * H + i];
        }
        act[f] = g / (1 + std::exp(-g)) * u;
      }
      for (std::int64_t i = 0; i < H; ++i) {
        double y = 0;
        for (std::int64_t f = 0; f < F; ++f) y += double(down[(e * H + i) * F + f]) * act[f];
        out[t * H + i] += static_cast<float>(w[t * k + j] * y);
      }
    }
  }
  return out;
}

class MoeFfn : public ::testing::TestWithParam<hal::DType> {};

TEST_P(MoeFfn, GroupedByExpertEqualsThePerTokenSumAndRangesAddUp) {
  const hal::DType type = GetParam();
  Dev d;
  const std::int64_t T = 7, H = 64, F = 32, E = 6, k = 2;
  std::vector<float> x = randoms(T * H, 1), gate = randoms(E * F * H, 2, 0.2f), up = randoms(E * F * H, 3, 0.2f),
                     down = randoms(E * H * F, 4, 0.2f);
  // Stored in `type`; the reference uses the stored values.
  auto store = [&](std::vector<float>& m, std::int64_t rows, std::int64_t cols) {
    std::vector<std::byte> bytes(hal::tensor_bytes(type, rows, cols));
    for (std::int64_t r = 0; r < rows; ++r) {
      hal::quantize_row(type, m.data() + r * cols, bytes.data() + r * hal::row_bytes(type, cols), cols);
      hal::dequantize_row(type, bytes.data() + r * hal::row_bytes(type, cols), m.data() + r * cols, cols);
    }
    return bytes;
  };
  const auto gb = store(gate, E * F, H), ub = store(up, E * F, H), db = store(down, E * H, F);
  // Token 6 is routed to experts 0 and 1 only: a rank holding 3..5 gives it zeros.
  std::vector<std::int32_t> ids = {0, 5, 1, 2, 3, 4, 5, 0, 2, 3, 4, 1, 0, 1};
  std::vector<float> w = randoms(T * k, 9, 1.0f);
  for (float& v : w) v = std::fabs(v);
  auto bx = d.upload(x), bids = d.upload(ids), bw = d.upload(w);
  auto out = *d.device->alloc(T * H * 4);
  std::vector<float> sum(static_cast<std::size_t>(T * H), 0.0f);
  for (const auto& [begin, n] : {std::pair<std::int64_t, std::int64_t>{0, E}, {0, 3}, {3, 3}}) {
    SCOPED_TRACE(::testing::Message() << hal::dtype_name(type) << " experts " << begin << ".." << begin + n);
    // The rank's experts, stacked, as upload_weight prepares them.
    auto slice = [&](const std::vector<std::byte>& all, std::int64_t rows_per, std::int64_t cols) {
      const std::size_t per = hal::tensor_bytes(type, rows_per, cols);
      return std::span<const std::byte>(all.data() + begin * per, n * per);
    };
    auto g = *d.device->upload_weight(*d.stream, {type, n * F, H}, slice(gb, F, H));
    auto u = *d.device->upload_weight(*d.stream, {type, n * F, H}, slice(ub, F, H));
    auto dn = *d.device->upload_weight(*d.stream, {type, n * H, F}, slice(db, H, F));
    hal::MoeFfnArgs a;
    a.x = {bx.get(), 0};
    a.ids = {bids.get(), 0};
    a.weights = {bw.get(), 0};
    a.gate = {g.get(), 0};
    a.up = {u.get(), 0};
    a.down = {dn.get(), 0};
    a.gate_type = a.up_type = a.down_type = type;
    a.out = {out.get(), 0};
    a.n_tokens = T;
    a.dim = H;
    a.ffn = F;
    a.k = k;
    a.expert_begin = begin;
    a.n_local = n;
    ASSERT_TRUE(d.stream->run(a).ok());
    const auto got = d.download<float>(*out, T * H);
    const auto want = reference(x, ids, w, gate, up, down, T, H, F, k, begin, n);
    // Q8_0 runs int8 kernels: x rounded to 8 bits per block (matmul.h's bound), loosely here; F16
    // and BF16 on a level with BF16 dot products multiply x (and F16 W) rounded to BF16
    // (kernel_table.h: 2^-7 + 2^-16 of sum |x w| per product, ~3 such products deep here).
    const bool bf16 = (type == hal::DType::kF16 || type == hal::DType::kBF16) && cpu::kernels().bf16_dot_gemm;
    const float tol = type == hal::DType::kQ8_0 ? 2e-2f : bf16 ? 3e-3f : 1e-4f;
    for (std::int64_t i = 0; i < T * H; ++i) ASSERT_NEAR(got[i], want[i], tol) << "element " << i;
    if (begin == 3) {
      for (std::int64_t i = 6 * H; i < 7 * H; ++i) EXPECT_EQ(got[i], 0.0f);
    }
    if (n == 3) {
      for (std::int64_t i = 0; i < T * H; ++i) sum[i] += got[i];
    }
  }
  const auto whole = reference(x, ids, w, gate, up, down, T, H, F, k, 0, E);
  const bool bf16 = type == hal::DType::kF16 && cpu::kernels().bf16_dot_gemm;
  for (std::int64_t i = 0; i < T * H; ++i) {
    EXPECT_NEAR(sum[i], whole[i], type == hal::DType::kQ8_0 ? 4e-2f : bf16 ? 6e-3f : 2e-4f);
  }
}

INSTANTIATE_TEST_SUITE_P(Formats, MoeFfn, ::testing::Values(hal::DType::kF32, hal::DType::kF16, hal::DType::kQ8_0),
                         [](const auto& info) { return std::string(hal::dtype_name(info.param)); });

}  // namespace
}  // namespace sx::cpu
