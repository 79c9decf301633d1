// Plain double-precision references of the Gated DeltaNet ops, written from their definitions in
// runtime/hal/ops.h (hal::ConvStateArgs, hal::DeltaRuleArgs), for the CPU's unit tests and the
// every-backend op tests. Sequences are given as in the ops: token starts, contexts after the
// step, and state slots; a sequence whose context equals its new tokens starts from zeros.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

namespace sx::testing {

struct StateBatchRef {
  std::vector<std::int32_t> start, ctx, slot;
  bool fresh(std::size_t s) const { return ctx[s] == start[s + 1] - start[s]; }
};

// out[t][c] and the new states of a causal depthwise conv (+ SiLU) over rows of x_stride.
inline void conv_state_reference(const std::vector<float>& x, std::int64_t x_stride, const std::vector<float>& w,
                                 std::int64_t channels, std::int64_t kernel, const StateBatchRef& b,
                                 std::vector<double>& state, std::vector<double>& out) {
  const std::int64_t hist = kernel - 1;
  out.assign(static_cast<std::size_t>(b.start.back() * channels), 0.0);
  for (std::size_t s = 0; s + 1 < b.start.size(); ++s) {
    for (std::int64_t c = 0; c < channels; ++c) {
      std::vector<double> seq;  // the history, then the new inputs
      for (std::int64_t j = 0; j < hist; ++j) {
        seq.push_back(b.fresh(s) ? 0.0 : state[static_cast<std::size_t>((b.slot[s] * hist + j) * channels + c)]);
      }
      for (std::int64_t t = b.start[s]; t < b.start[s + 1]; ++t) seq.push_back(x[static_cast<std::size_t>(t * x_stride + c)]);
      for (std::int64_t i = 0; i < b.start[s + 1] - b.start[s]; ++i) {
        double acc = 0;
        for (std::int64_t j = 0; j < kernel; ++j) acc += w[static_cast<std::size_t>(c * kernel + j)] * seq[static_cast<std::size_t>(i + j)];
        out[static_cast<std::size_t>((b.start[s] + i) * channels + c)] = acc / (1.0 + std::exp(-acc));
      }
      for (std::int64_t j = 0; j < hist; ++j) {
        state[static_cast<std::size_t>((b.slot[s] * hist + j) * channels + c)] = seq[seq.size() - static_cast<std::size_t>(hist - j)];
      }
    }
  }
}

struct DeltaShapeRef {
  std::int64_t n_k = 2, n_v = 6, dk = 16, dv = 12;
  bool tiled = true;
  std::int64_t qkv() const { return 2 * n_k * dk + n_v * dv; }
};

// The gated delta rule token by token: rows of qkv [q | k | v], alpha / beta rows of n_v, eps 1e-6,
// q scaled by 1 / sqrt(dk).
inline void delta_rule_reference(const DeltaShapeRef& sh, const std::vector<float>& qkv,
                                 const std::vector<float>& alpha, const std::vector<float>& beta,
                                 const std::vector<float>& a, const std::vector<float>& dt_bias,
                                 const StateBatchRef& b, std::vector<double>& state, std::vector<double>& out) {
  const std::int64_t per_k = sh.n_v / sh.n_k, se = sh.dk * sh.dv;
  out.assign(static_cast<std::size_t>(b.start.back() * sh.n_v * sh.dv), 0.0);
  for (std::size_t s = 0; s + 1 < b.start.size(); ++s) {
    for (std::int64_t h = 0; h < sh.n_v; ++h) {
      const std::int64_t g = sh.tiled ? h % sh.n_k : h / per_k;
      double* S = &state[static_cast<std::size_t>((b.slot[s] * sh.n_v + h) * se)];
      if (b.fresh(s)) std::fill_n(S, se, 0.0);
      for (std::int64_t t = b.start[s]; t < b.start[s + 1]; ++t) {
        const float* row = &qkv[static_cast<std::size_t>(t * sh.qkv())];
        std::vector<double> q(row + g * sh.dk, row + (g + 1) * sh.dk);
        std::vector<double> k(row + (sh.n_k + g) * sh.dk, row + (sh.n_k + g + 1) * sh.dk);
        const float* v = row + 2 * sh.n_k * sh.dk + h * sh.dv;
        double qq = 0, kk = 0;
        for (std::int64_t i = 0; i < sh.dk; ++i) qq += q[i] * q[i], kk += k[i] * k[i];
        for (std::int64_t i = 0; i < sh.dk; ++i) {
          q[i] = q[i] / std::sqrt(qq + 1e-6) / std::sqrt(static_cast<double>(sh.dk));
          k[i] = k[i] / std::sqrt(kk + 1e-6);
        }
        const double x = alpha[static_cast<std::size_t>(t * sh.n_v + h)] + dt_bias[static_cast<std::size_t>(h)];
        const double decay = std::exp(a[static_cast<std::size_t>(h)] * std::log1p(std::exp(x)));
        const double bt = 1.0 / (1.0 + std::exp(-static_cast<double>(beta[static_cast<std::size_t>(t * sh.n_v + h)])));
        for (std::int64_t i = 0; i < se; ++i) S[i] *= decay;
        for (std::int64_t j = 0; j < sh.dv; ++j) {
          double sk = 0;
          for (std::int64_t i = 0; i < sh.dk; ++i) sk += S[i * sh.dv + j] * k[i];
          const double u = bt * (v[j] - sk);
          for (std::int64_t i = 0; i < sh.dk; ++i) S[i * sh.dv + j] += k[i] * u;
        }
        for (std::int64_t j = 0; j < sh.dv; ++j) {
          double o = 0;
          for (std::int64_t i = 0; i < sh.dk; ++i) o += S[i * sh.dv + j] * q[i];
          out[static_cast<std::size_t>((t * sh.n_v + h) * sh.dv + j)] = o;
        }
      }
    }
  }
}

}  // namespace sx::testing
