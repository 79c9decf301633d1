// Gated DeltaNet and gated attention on the CPU (hal::ConvStateArgs, DeltaRuleArgs, GatedNormArgs,
// SigmoidMulArgs; cpu_ops.h): the reference the other backends are tested against. The delta rule
// has both its forms here, the recurrent one (a token at a time) and the chunked one (the state read
// and written once per chunk, the tokens of a chunk combined pairwise), so that a test can hold
// one against the other.
#include <algorithm>
#include <cmath>
#include <vector>

#include "backends/cpu/ops/cpu_ops.h"
#include "runtime/hal/op_checks.h"

namespace sx::cpu {
namespace {

float silu(float x) { return x / (1.0f + std::exp(-x)); }
float sigmoid(float x) { return 1.0f / (1.0f + std::exp(-x)); }
// As llama.cpp computes it (ggml's unary softplus), so that the decay rounds alike.
float softplus(float x) { return x > 20.0f ? x : std::log(1.0f + std::exp(x)); }

// dst = src / sqrt(|src|^2 + eps) * scale.
void l2_normalise(const float* src, float* dst, std::int64_t n, float eps, float scale) {
  const float s = scale / std::sqrt(dot_f32(src, src, n) + eps);
  for (std::int64_t i = 0; i < n; ++i) dst[i] = src[i] * s;
}

constexpr std::int64_t kConvChannelBlock = 256;

}  // namespace

void conv_state(ThreadPool& pool, const float* x, std::int64_t x_stride, const float* weight, float* state, float* out,
                const StateBatch& b, std::int64_t channels, std::int64_t kernel) {
  const std::int64_t blocks = (channels + kConvChannelBlock - 1) / kConvChannelBlock;
  const std::int64_t hist = kernel - 1;
  pool.parallel_for(b.n_seqs * blocks, [&](std::int64_t task) {
    const std::int64_t s = task / blocks, c0 = task % blocks * kConvChannelBlock;
    const std::int64_t nc = std::min(kConvChannelBlock, channels - c0);
    const std::int64_t t0 = b.seq_token_start[s], t1 = b.seq_token_start[s + 1];
    float* st = state + static_cast<std::int64_t>(b.seq_slot[s]) * hist * channels;
    // window[j][c]: the input j steps before the newest of the kernel's taps (j = hist - 1 oldest).
    float window[hal::kMaxConvKernel - 1][kConvChannelBlock];
    const bool fresh = b.seq_context_len[s] == t1 - t0;
    for (std::int64_t j = 0; j < hist; ++j) {
      for (std::int64_t c = 0; c < nc; ++c) window[j][c] = fresh ? 0.0f : st[j * channels + c0 + c];
    }
    // window rows are kept oldest first, as the state stores them; row hist - 1 is the latest input.
    for (std::int64_t t = t0; t < t1; ++t) {
      const float* xt = x + t * x_stride + c0;
      float* ot = out + t * channels + c0;
      for (std::int64_t c = 0; c < nc; ++c) {
        const float* w = weight + (c0 + c) * kernel;
        float acc = w[hist] * xt[c];
        for (std::int64_t j = 0; j < hist; ++j) acc += w[j] * window[j][c];
        ot[c] = silu(acc);
      }
      for (std::int64_t j = 0; j + 1 < hist; ++j) std::copy_n(window[j + 1], nc, window[j]);
      std::copy_n(xt, nc, window[hist - 1]);
    }
    for (std::int64_t j = 0; j < hist; ++j) std::copy_n(window[j], nc, st + j * channels + c0);
  });
}

namespace {

// One sequence's tokens [t0, t1) for V head h, in the recurrent form, on the state S (d_k x d_v).
void delta_recurrent(const DeltaRulePtrs& p, const hal::DeltaRuleArgs& a, std::int64_t t0, std::int64_t t1,
                     std::int64_t h, std::int64_t g, float* S) {
  const std::int64_t dk = a.d_k, dv = a.d_v;
  std::vector<float> qn(dk), kn(dk), u(dv);
  for (std::int64_t t = t0; t < t1; ++t) {
    l2_normalise(p.q + t * p.qkv_stride + g * dk, qn.data(), dk, a.eps, a.scale);
    l2_normalise(p.k + t * p.qkv_stride + g * dk, kn.data(), dk, a.eps, 1.0f);
    const float* v = p.v + t * p.qkv_stride + h * dv;
    const float decay = std::exp(p.a[h] * softplus(p.alpha[t * p.gate_stride + h] + p.dt_bias[h]));
    const float beta = sigmoid(p.beta[t * p.gate_stride + h]);
    // u = beta (v - (decay S)^T kn)
    std::fill(u.begin(), u.end(), 0.0f);
    for (std::int64_t i = 0; i < dk; ++i) axpy_f32(kn[i], S + i * dv, u.data(), dv);
    for (std::int64_t j = 0; j < dv; ++j) u[j] = beta * (v[j] - decay * u[j]);
    // S = decay S + kn u^T; out = S^T qn
    float* o = p.out + (t * a.n_v_heads + h) * dv;
    std::fill_n(o, dv, 0.0f);
    for (std::int64_t i = 0; i < dk; ++i) {
      float* row = S + i * dv;
      for (std::int64_t j = 0; j < dv; ++j) row[j] = decay * row[j] + kn[i] * u[j];
      axpy_f32(qn[i], row, o, dv);
    }
  }
}

// The same in the chunked form, over chunks at absolute positions [kC, (k+1)C): `first` is the
// position of token t0, so a step that begins inside a chunk takes the rest of that chunk first.
// Within a chunk of C tokens with log-decays g_i and their running sums G_i (so that the state
// after token i is e^{G_i} S0 + sum_{j<=i} e^{G_i - G_j} k_j u_j^T):
//   u_i = beta_i (v_i - e^{G_i} S0^T k_i) - beta_i sum_{j<i} e^{G_i - G_j} (k_i . k_j) u_j   (forward substitution)
//   o_i = e^{G_i} S0^T q_i + sum_{j<=i} e^{G_i - G_j} (q_i . k_j) u_j
//   S   = e^{G_C} S0 + sum_j e^{G_C - G_j} k_j u_j^T
void delta_chunked(const DeltaRulePtrs& p, const hal::DeltaRuleArgs& a, std::int64_t t0, std::int64_t t1,
                   std::int64_t first, std::int64_t h, std::int64_t g, float* S) {
  const std::int64_t dk = a.d_k, dv = a.d_v, C = a.chunk;
  std::vector<float> qn(C * dk), kn(C * dk), u(C * dv), G(C), beta(C), kk(C * C), qk(C * C);
  for (std::int64_t c0 = t0, n = 0; c0 < t1; c0 += n) {
    n = std::min(C - (first + (c0 - t0)) % C, t1 - c0);
    float run = 0.0f;
    for (std::int64_t i = 0; i < n; ++i) {
      const std::int64_t t = c0 + i;
      l2_normalise(p.q + t * p.qkv_stride + g * dk, &qn[i * dk], dk, a.eps, a.scale);
      l2_normalise(p.k + t * p.qkv_stride + g * dk, &kn[i * dk], dk, a.eps, 1.0f);
      run += p.a[h] * softplus(p.alpha[t * p.gate_stride + h] + p.dt_bias[h]);
      G[i] = run;
      beta[i] = sigmoid(p.beta[t * p.gate_stride + h]);
    }
    for (std::int64_t i = 0; i < n; ++i) {
      for (std::int64_t j = 0; j <= i; ++j) {
        kk[i * C + j] = dot_f32(&kn[i * dk], &kn[j * dk], dk);
        qk[i * C + j] = dot_f32(&qn[i * dk], &kn[j * dk], dk);
      }
    }
    // S0^T k_i and S0^T q_i, the chunk's one read of the state.
    std::vector<float> sk(n * dv, 0.0f), sq(n * dv, 0.0f);
    for (std::int64_t r = 0; r < dk; ++r) {
      const float* row = S + r * dv;
      for (std::int64_t i = 0; i < n; ++i) {
        axpy_f32(kn[i * dk + r], row, &sk[i * dv], dv);
        axpy_f32(qn[i * dk + r], row, &sq[i * dv], dv);
      }
    }
    for (std::int64_t i = 0; i < n; ++i) {
      const float* v = p.v + (c0 + i) * p.qkv_stride + h * dv;
      const float gi = std::exp(G[i]);
      float* ui = &u[i * dv];
      for (std::int64_t j = 0; j < dv; ++j) ui[j] = beta[i] * (v[j] - gi * sk[i * dv + j]);
      for (std::int64_t j = 0; j < i; ++j) axpy_f32(-beta[i] * std::exp(G[i] - G[j]) * kk[i * C + j], &u[j * dv], ui, dv);
      float* o = p.out + ((c0 + i) * a.n_v_heads + h) * dv;
      for (std::int64_t j = 0; j < dv; ++j) o[j] = gi * sq[i * dv + j];
      for (std::int64_t j = 0; j <= i; ++j) axpy_f32(std::exp(G[i] - G[j]) * qk[i * C + j], &u[j * dv], o, dv);
    }
    const float gn = std::exp(G[n - 1]);
    for (std::int64_t r = 0; r < dk; ++r) {
      float* row = S + r * dv;
      for (std::int64_t j = 0; j < dv; ++j) row[j] *= gn;
      for (std::int64_t i = 0; i < n; ++i) axpy_f32(std::exp(G[n - 1] - G[i]) * kn[i * dk + r], &u[i * dv], row, dv);
    }
  }
}

}  // namespace

void delta_rule(ThreadPool& pool, const DeltaRulePtrs& p, const hal::DeltaRuleArgs& a) {
  const std::int64_t per_k = a.n_v_heads / a.n_k_heads;
  const std::int64_t state_elems = a.d_k * a.d_v;
  pool.parallel_for(p.batch.n_seqs * a.n_v_heads, [&](std::int64_t task) {
    const std::int64_t s = task / a.n_v_heads, h = task % a.n_v_heads;
    const std::int64_t g = a.tiled ? h % a.n_k_heads : h / per_k;
    const std::int64_t t0 = p.batch.seq_token_start[s], t1 = p.batch.seq_token_start[s + 1];
    float* S = p.state + (static_cast<std::int64_t>(p.batch.seq_slot[s]) * a.n_v_heads + h) * state_elems;
    if (p.batch.seq_context_len[s] == t1 - t0) std::fill_n(S, state_elems, 0.0f);
    if (a.chunk > 0) {
      delta_chunked(p, a, t0, t1, p.batch.seq_context_len[s] - (t1 - t0), h, g, S);
    } else {
      delta_recurrent(p, a, t0, t1, h, g, S);
    }
  });
}

void gated_norm(ThreadPool& pool, const float* x, const float* z, const float* weight, float* out,
                std::int64_t n_rows, std::int64_t dim, float eps) {
  pool.parallel_for(n_rows, [&](std::int64_t r) {
    const float* xr = x + r * dim;
    const float* zr = z + r * dim;
    float* o = out + r * dim;
    const float inv = 1.0f / std::sqrt(dot_f32(xr, xr, dim) / static_cast<float>(dim) + eps);
    for (std::int64_t c = 0; c < dim; ++c) o[c] = xr[c] * inv * weight[c] * silu(zr[c]);
  });
}

void sigmoid_mul(ThreadPool& pool, const float* x, const float* gate, float* out, std::int64_t n_rows,
                 std::int64_t n_cols, std::int64_t x_stride, std::int64_t gate_stride, std::int64_t out_stride,
                 bool gate_per_row) {
  pool.parallel_for(n_rows, [&](std::int64_t r) {
    const float* xr = x + r * x_stride;
    const float* gr = gate + r * gate_stride;
    float* o = out + r * out_stride;
    if (gate_per_row) {
      const float g = sigmoid(gr[0]);
      for (std::int64_t c = 0; c < n_cols; ++c) o[c] = xr[c] * g;
      return;
    }
    for (std::int64_t c = 0; c < n_cols; ++c) o[c] = xr[c] * sigmoid(gr[c]);
  });
}

}  // namespace sx::cpu
