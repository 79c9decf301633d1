// The Gated DeltaNet ops on the CPU device (hal::ConvStateArgs, DeltaRuleArgs, GatedNormArgs,
// SigmoidMulArgs) against plain double-precision references written from their definitions
// (ops.h): the convolution with its rolling state, the delta rule in its recurrent and chunked
// forms (each against the reference, and one against the other within F32 rounding), with tiled
// and grouped head sharing; a sequence's tokens given in one call, in chunks and one at a time end
// in the same outputs and state; a sequence that starts reads zeros whatever its slot held; and bad
// batches are refused with the field named.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <vector>

#include "backends/cpu/cpu_device.h"
#include "tests/unit/cpu_ops/cpu_test_device.h"
#include "tests/cts/deltanet_reference.h"

namespace sx::cpu {
namespace {

using ops_test::Dev;

std::vector<float> randoms(std::size_t n, unsigned seed, float lo = -1.0f, float hi = 1.0f) {
  std::mt19937 gen(seed);
  std::uniform_real_distribution<float> d(lo, hi);
  std::vector<float> v(n);
  for (float& x : v) x = d(gen);
  return v;
}

double sigmoid(double x) { return 1.0 / (1.0 + std::exp(-x)); }
double silu(double x) { return x * sigmoid(x); }

// ---- the causal convolution ----

struct ConvCase {
  std::int64_t channels = 40, kernel = 4, x_stride = 45;
};

TEST(ConvState, MatchesItsDefinitionAndCarriesTheStateAcrossCalls) {
  Dev d;
  const ConvCase c;
  const std::int64_t hist = c.kernel - 1;
  // Three sequences: 7 new tokens continuing 5, 1 token continuing 9, and 6 tokens starting now.
  const std::vector<std::int32_t> start = {0, 7, 8, 14}, ctx = {12, 10, 6}, slot = {2, 0, 1};
  const std::int64_t T = 14, S = 3, n_slots = 3;
  const auto x = randoms(T * c.x_stride, 1);
  const auto w = randoms(c.channels * c.kernel, 2);
  auto state0 = randoms(n_slots * hist * c.channels, 3);  // slot 1's garbage must be ignored (it starts)
  auto bx = d.upload(x), bw = d.upload(w), bst = d.upload(state0), bs = d.upload(start), bc = d.upload(ctx),
       bl = d.upload(slot);
  auto bo = *d.device->alloc(T * c.channels * 4);
  hal::ConvStateArgs a{{bx.get(), 0}, {bw.get(), 0}, {bst.get(), 0}, {bo.get(), 0}, {bs.get(), 0}, {bc.get(), 0},
                       {bl.get(), 0}, S, T, c.channels, c.kernel, n_slots, c.x_stride};
  ASSERT_TRUE(d.stream->run(a).ok());
  const auto out = d.download<float>(*bo, T * c.channels);
  const auto state = d.download<float>(*bst, n_slots * hist * c.channels);
  std::vector<double> want_state(state0.begin(), state0.end()), want_out;
  testing::conv_state_reference(x, c.x_stride, w, c.channels, c.kernel, {start, ctx, slot}, want_state, want_out);
  for (std::size_t i = 0; i < out.size(); ++i) EXPECT_NEAR(out[i], want_out[i], 1e-5) << i;
  // The new state holds inputs, copied: exact.
  for (std::size_t i = 0; i < state.size(); ++i) EXPECT_EQ(state[i], static_cast<float>(want_state[i])) << i;
}

// ---- the delta rule ----

using DeltaShape = testing::DeltaShapeRef;

struct DeltaInputs {
  std::vector<float> qkv, alpha, beta, a, dt_bias;
};

DeltaInputs delta_inputs(const DeltaShape& sh, std::int64_t T, unsigned seed) {
  DeltaInputs in;
  in.qkv = randoms(T * sh.qkv(), seed);
  in.alpha = randoms(T * sh.n_v, seed + 1, -3.0f, 2.0f);
  in.beta = randoms(T * sh.n_v, seed + 2, -3.0f, 3.0f);
  in.a = randoms(sh.n_v, seed + 3, -2.0f, -0.05f);
  in.dt_bias = randoms(sh.n_v, seed + 4, -1.0f, 1.0f);
  return in;
}

void delta_reference(const DeltaShape& sh, const DeltaInputs& in, const std::vector<std::int32_t>& start,
                     const std::vector<std::int32_t>& ctx, const std::vector<std::int32_t>& slot,
                     std::vector<double>& state, std::vector<double>& out) {
  testing::delta_rule_reference(sh, in.qkv, in.alpha, in.beta, in.a, in.dt_bias, {start, ctx, slot}, state, out);
}

struct DeltaRun {
  std::vector<float> out, state;
};

// Runs the op on tokens [t0, t1) of a one-sequence batch whose context after the call is ctx_after.
class DeltaDevice {
 public:
  DeltaDevice(Dev& d, const DeltaShape& sh, const DeltaInputs& in, std::int64_t n_slots,
              const std::vector<float>& state)
      : d_(d), sh_(sh), n_slots_(n_slots) {
    qkv_ = d.upload(in.qkv), alpha_ = d.upload(in.alpha), beta_ = d.upload(in.beta), a_ = d.upload(in.a),
    dt_ = d.upload(in.dt_bias), state_ = d.upload(state);
    out_ = *d.device->alloc(std::max<std::size_t>(in.alpha.size() * sh.dv * 4, 4));
    starts_ = *d.device->alloc(4 * 64), ctx_ = *d.device->alloc(4 * 64), slots_ = *d.device->alloc(4 * 64);
  }
  // A batch of sequences over tokens [t0, t0 + start.back()) of the inputs.
  Status run(std::int64_t t0, const std::vector<std::int32_t>& start, const std::vector<std::int32_t>& ctx,
             const std::vector<std::int32_t>& slot, std::int64_t chunk) {
    d_.put(*starts_, start), d_.put(*ctx_, ctx), d_.put(*slots_, slot);
    const std::int64_t qkv = sh_.qkv();
    hal::DeltaRuleArgs a;
    a.q = {qkv_.get(), static_cast<std::size_t>(t0 * qkv * 4)};
    a.k = a.q.at(static_cast<std::size_t>(sh_.n_k * sh_.dk * 4));
    a.v = a.q.at(static_cast<std::size_t>(2 * sh_.n_k * sh_.dk * 4));
    a.alpha = {alpha_.get(), static_cast<std::size_t>(t0 * sh_.n_v * 4)};
    a.beta = {beta_.get(), static_cast<std::size_t>(t0 * sh_.n_v * 4)};
    a.a = {a_.get(), 0}, a.dt_bias = {dt_.get(), 0}, a.state = {state_.get(), 0};
    a.out = {out_.get(), static_cast<std::size_t>(t0 * sh_.n_v * sh_.dv * 4)};
    a.seq_token_start = {starts_.get(), 0}, a.seq_context_len = {ctx_.get(), 0}, a.seq_slot = {slots_.get(), 0};
    a.n_seqs = static_cast<std::int64_t>(slot.size()), a.n_tokens = start.back();
    a.n_k_heads = sh_.n_k, a.n_v_heads = sh_.n_v, a.d_k = sh_.dk, a.d_v = sh_.dv, a.n_slots = n_slots_;
    a.chunk = chunk, a.tiled = sh_.tiled, a.eps = 1e-6f, a.scale = 1.0f / std::sqrt(static_cast<float>(sh_.dk));
    SX_RETURN_IF_ERROR(d_.stream->run(a));
    return d_.stream->sync();
  }
  DeltaRun result(std::int64_t T) {
    return {d_.download<float>(*out_, T * sh_.n_v * sh_.dv),
            d_.download<float>(*state_, n_slots_ * sh_.n_v * sh_.dk * sh_.dv)};
  }

 private:
  Dev& d_;
  DeltaShape sh_;
  std::int64_t n_slots_;
  std::unique_ptr<hal::Buffer> qkv_, alpha_, beta_, a_, dt_, state_, out_, starts_, ctx_, slots_;
};

double max_abs_diff(const std::vector<float>& a, const std::vector<double>& b) {
  double m = 0;
  for (std::size_t i = 0; i < a.size(); ++i) m = std::max(m, std::abs(a[i] - b[i]));
  return m;
}
double max_abs_diff(const std::vector<float>& a, const std::vector<float>& b) {
  double m = 0;
  for (std::size_t i = 0; i < a.size(); ++i) m = std::max(m, static_cast<double>(std::abs(a[i] - b[i])));
  return m;
}

TEST(DeltaRule, BothFormsMatchTheDefinitionAndEachOther) {
  Dev d;
  for (const bool tiled : {true, false}) {
    SCOPED_TRACE(tiled ? "tiled" : "grouped");
    DeltaShape sh;
    sh.tiled = tiled;
    // 1 token continuing 4 (slot 3), 150 tokens starting now (slot 0: garbage ignored), 37 continuing 20 (slot 1).
    const std::vector<std::int32_t> start = {0, 1, 151, 188}, ctx = {5, 150, 57}, slot = {3, 0, 1};
    const std::int64_t T = 188, n_slots = 4;
    const DeltaInputs in = delta_inputs(sh, T, tiled ? 10 : 20);
    const std::vector<float> state0 = randoms(n_slots * sh.n_v * sh.dk * sh.dv, 7, -0.5f, 0.5f);
    std::vector<double> ref_state(state0.begin(), state0.end()), ref_out;
    delta_reference(sh, in, start, ctx, slot, ref_state, ref_out);
    std::vector<DeltaRun> runs;
    for (const std::int64_t chunk : {0, 64, 5}) {
      DeltaDevice dev(d, sh, in, n_slots, state0);
      ASSERT_TRUE(dev.run(0, start, ctx, slot, chunk).ok());
      runs.push_back(dev.result(T));
      EXPECT_LT(max_abs_diff(runs.back().out, ref_out), 2e-5) << "chunk " << chunk;
      EXPECT_LT(max_abs_diff(runs.back().state, ref_state), 2e-5) << "chunk " << chunk;
    }
    // Recurrent and chunked within F32 rounding of each other (outputs are O(1)).
    for (std::size_t r : {1u, 2u}) {
      std::printf("%s: chunked (chunk %d) vs recurrent: outputs within %.2g, states within %.2g; recurrent vs the "
                  "double-precision definition: %.2g\n",
                  tiled ? "tiled" : "grouped", r == 1 ? 64 : 5, max_abs_diff(runs[r].out, runs[0].out),
                  max_abs_diff(runs[r].state, runs[0].state), max_abs_diff(runs[0].out, ref_out));
      EXPECT_LT(max_abs_diff(runs[r].out, runs[0].out), 1e-5) << "form " << r;
      EXPECT_LT(max_abs_diff(runs[r].state, runs[0].state), 1e-5) << "form " << r;
    }
    // Slot 2 belongs to no sequence of the batch: untouched.
    const std::int64_t se = sh.n_v * sh.dk * sh.dv;
    EXPECT_TRUE(std::equal(runs[1].state.begin() + 2 * se, runs[1].state.begin() + 3 * se, state0.begin() + 2 * se));
  }
}

TEST(DeltaRule, OneCallManyChunksAndTokenByTokenEndAlike) {
  Dev d;
  DeltaShape sh;
  sh.n_k = 1, sh.n_v = 3, sh.dk = 32, sh.dv = 32;
  const std::int64_t T = 100;
  const DeltaInputs in = delta_inputs(sh, T, 30);
  const std::vector<float> state0(2 * sh.n_v * sh.dk * sh.dv, 0.0f);
  DeltaDevice whole(d, sh, in, 2, state0), pieces(d, sh, in, 2, state0), tokens(d, sh, in, 2, state0);
  ASSERT_TRUE(whole.run(0, {0, 100}, {100}, {1}, 64).ok());
  // Prefill in uneven chunks (as the scheduler's token budget cuts it), chunked form each time.
  std::int64_t done = 0;
  for (const std::int32_t n : {17, 40, 1, 30, 12}) {
    ASSERT_TRUE(pieces.run(done, {0, n}, {static_cast<std::int32_t>(done + n)}, {1}, 64).ok());
    done += n;
  }
  for (std::int64_t t = 0; t < T; ++t) {
    ASSERT_TRUE(tokens.run(t, {0, 1}, {static_cast<std::int32_t>(t + 1)}, {1}, 0).ok());
  }
  const DeltaRun a = whole.result(T), b = pieces.result(T), c = tokens.result(T);
  EXPECT_LT(max_abs_diff(b.out, a.out), 1e-5);
  EXPECT_LT(max_abs_diff(c.out, a.out), 1e-5);
  EXPECT_LT(max_abs_diff(b.state, a.state), 1e-5);
  EXPECT_LT(max_abs_diff(c.state, a.state), 1e-5);
}

// The outputs and final state of one sequence fed in pieces of the given sizes.
DeltaRun in_pieces(Dev& d, const DeltaShape& sh, const DeltaInputs& in, const std::vector<std::int32_t>& pieces,
                   std::int64_t chunk) {
  DeltaDevice dev(d, sh, in, 2, std::vector<float>(2 * sh.n_v * sh.dk * sh.dv, 0.0f));
  std::int32_t done = 0;
  for (const std::int32_t n : pieces) {
    EXPECT_TRUE(dev.run(done, {0, n}, {done + n}, {1}, chunk).ok());
    done += n;
  }
  return dev.result(done);
}

bool same_bits(const DeltaRun& a, const DeltaRun& b) {
  return a.out.size() == b.out.size() && a.state.size() == b.state.size() &&
         std::memcmp(a.out.data(), b.out.data(), a.out.size() * 4) == 0 &&
         std::memcmp(a.state.data(), b.state.data(), a.state.size() * 4) == 0;
}

// What the engine relies on (issue 53): the recurrent form gives a sequence the same bits however
// its tokens are split into steps; the chunked form does so for splits that fall on its chunks,
// whose boundaries are absolute positions, not the step's first token.
TEST(DeltaRule, TheSplitIntoStepsChangesNoBit) {
  Dev d;
  DeltaShape sh;
  sh.n_k = 1, sh.n_v = 3, sh.dk = 32, sh.dv = 32;
  const DeltaInputs in = delta_inputs(sh, 100, 31);
  const DeltaRun whole = in_pieces(d, sh, in, {100}, 0);
  for (const auto& pieces : std::vector<std::vector<std::int32_t>>{{37, 37, 26}, {16, 16, 16, 16, 16, 16, 4},
                                                                     {1, 63, 1, 35}, std::vector<std::int32_t>(100, 1)}) {
    EXPECT_TRUE(same_bits(in_pieces(d, sh, in, pieces, 0), whole)) << "recurrent, " << pieces.size() << " pieces";
  }
  // Chunks of 5 from position 0: a step starting at 3 takes [3, 5) first, so these two splits
  // compute the same chunks ([0, 3) | [3, 5) [5, 10) ... against [0, 3) | [3, 5) | [5, 10) ...).
  const DeltaRun a = in_pieces(d, sh, in, {3, 97}, 5), b = in_pieces(d, sh, in, {3, 2, 95}, 5);
  EXPECT_TRUE(same_bits(a, b));
  EXPECT_TRUE(same_bits(in_pieces(d, sh, in, {10, 90}, 5), in_pieces(d, sh, in, {100}, 5)));
}

TEST(DeltaRule, BadBatchesAreRefusedNamingTheField) {
  DeltaShape sh;
  const DeltaInputs in = delta_inputs(sh, 4, 40);
  // An error latches in its stream: each case on a device of its own.
  const auto run = [&](const std::vector<std::int32_t>& start, const std::vector<std::int32_t>& ctx,
                       const std::vector<std::int32_t>& slot) {
    Dev d;
    DeltaDevice dev(d, sh, in, 2, std::vector<float>(2 * sh.n_v * sh.dk * sh.dv));
    return dev.run(0, start, ctx, slot, 0);
  };
  Status s = run({0, 2, 4}, {2, 2}, {1, 1});
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("delta_rule: state slot 1 is given to two sequences"), std::string::npos) << s.message();
  s = run({0, 4}, {4}, {2});
  EXPECT_EQ(s.code(), StatusCode::kOutOfRange);
  EXPECT_NE(s.message().find("state slot 2 outside the pool of 2"), std::string::npos) << s.message();
  s = run({0, 4}, {3}, {0});
  EXPECT_NE(s.message().find("sequence 0 has 4 new tokens and context 3"), std::string::npos) << s.message();
  s = run({1, 3}, {4}, {0});
  EXPECT_NE(s.message().find("seq_token_start must span [0, 3]"), std::string::npos) << s.message();
  Dev d;
  hal::DeltaRuleArgs bad;
  bad.n_k_heads = 4, bad.n_v_heads = 6, bad.d_k = bad.d_v = 16;
  s = d.stream->run(bad);
  if (s.ok()) s = d.stream->sync();
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("6 V heads of 16 (a multiple of the K heads"), std::string::npos) << s.message();
}

// ---- the gates ----

TEST(GatedNorm, RmsNormTimesWeightTimesSiluOfTheGate) {
  Dev d;
  const std::int64_t R = 9, D = 24;
  const auto x = randoms(R * D, 50), z = randoms(R * D, 51, -4.0f, 4.0f), w = randoms(D, 52);
  auto bx = d.upload(x), bz = d.upload(z), bw = d.upload(w);
  auto bo = *d.device->alloc(R * D * 4);
  ASSERT_TRUE(d.stream->run(hal::GatedNormArgs{{bx.get(), 0}, {bz.get(), 0}, {bw.get(), 0}, {bo.get(), 0}, R, D, 1e-6f})
                  .ok());
  const auto out = d.download<float>(*bo, R * D);
  for (std::int64_t r = 0; r < R; ++r) {
    double ss = 0;
    for (std::int64_t c = 0; c < D; ++c) ss += static_cast<double>(x[r * D + c]) * x[r * D + c];
    const double inv = 1.0 / std::sqrt(ss / D + 1e-6);
    for (std::int64_t c = 0; c < D; ++c) {
      EXPECT_NEAR(out[r * D + c], x[r * D + c] * inv * w[c] * silu(z[r * D + c]), 1e-5) << r << "," << c;
    }
  }
}

TEST(SigmoidMul, ReadsTheGateInterleavedWithTheQuery) {
  Dev d;
  // A query projection laid out per head as [query | gate] (Qwen3.5's attn_q): rows of 2 * hd.
  const std::int64_t T = 3, H = 4, hd = 8;
  const auto qg = randoms(T * H * 2 * hd, 60, -5.0f, 5.0f), x = randoms(T * H * hd, 61);
  auto bqg = d.upload(qg), bx = d.upload(x);
  hal::SigmoidMulArgs a{{bx.get(), 0}, {bqg.get(), hd * 4}, {bx.get(), 0}, T * H, hd, 0, 2 * hd, 0};
  ASSERT_TRUE(d.stream->run(a).ok());
  const auto out = d.download<float>(*bx, T * H * hd);
  for (std::int64_t r = 0; r < T * H; ++r) {
    for (std::int64_t c = 0; c < hd; ++c) {
      EXPECT_NEAR(out[r * hd + c], x[r * hd + c] * sigmoid(qg[r * 2 * hd + hd + c]), 1e-6);
    }
  }
  // One gate per row (a shared expert's): row r scaled by sigmoid(g[r]).
  const auto g = randoms(T, 62, -3.0f, 3.0f), y = randoms(T * hd, 63);
  auto bg = d.upload(g), by = d.upload(y);
  auto bo = *d.device->alloc(T * hd * 4);
  hal::SigmoidMulArgs per_row{{by.get(), 0}, {bg.get(), 0}, {bo.get(), 0}, T, hd, 0, 0, 0, true};
  ASSERT_TRUE(d.stream->run(per_row).ok());
  const auto scaled = d.download<float>(*bo, T * hd);
  for (std::int64_t r = 0; r < T; ++r) {
    for (std::int64_t c = 0; c < hd; ++c) EXPECT_NEAR(scaled[r * hd + c], y[r * hd + c] * sigmoid(g[r]), 1e-6);
  }
}

}  // namespace
}  // namespace sx::cpu
