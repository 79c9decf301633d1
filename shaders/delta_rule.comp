// The gated delta rule (hal::DeltaRuleArgs) in its recurrent form, which the op's chunked form
// equals within F32 rounding. One workgroup per (sequence, V head); invocation j < d_v owns column
// j of the head's d_k x d_v state S (in the state pool), so no two invocations write one value. For
// each token: q and k of the head's K head L2-normalised (q also scaled), decay = exp(a *
// softplus(alpha + dt_bias)), b = sigmoid(beta); then S = decay S + k (b (v - decay S^T k))^T and
// out = S^T q.
#version 450
layout(local_size_x = 256) in;
layout(std430, binding = 0) readonly buffer Q { float q[]; };
layout(std430, binding = 1) readonly buffer K { float k[]; };
layout(std430, binding = 2) readonly buffer V { float v[]; };
layout(std430, binding = 3) readonly buffer Alpha { float alpha[]; };
layout(std430, binding = 4) readonly buffer Beta { float beta[]; };
layout(std430, binding = 5) readonly buffer A { float a[]; };
layout(std430, binding = 6) readonly buffer Dt { float dt[]; };
layout(std430, binding = 7) buffer S { float st[]; };
layout(std430, binding = 8) writeonly buffer O { float o[]; };
layout(std430, binding = 9) readonly buffer Start { int seq_start[]; };
layout(std430, binding = 10) readonly buffer Ctx { int seq_ctx[]; };
layout(std430, binding = 11) readonly buffer Slot { int seq_slot[]; };
layout(push_constant) uniform Params {
  uint q_off, k_off, v_off, alpha_off, beta_off, a_off, dt_off, s_off, o_off, start_off, ctx_off, slot_off;
  uint n_seqs, n_k, n_v, d_k, d_v, qkv_stride, gate_stride, tiled;
  float eps, scale;
  uint gx;
} p;

shared float qs[256], ks[256], red_q[256], red_k[256];

void main() {
  const uint wg = gl_WorkGroupID.x + gl_WorkGroupID.y * p.gx;
  if (wg >= p.n_seqs * p.n_v) return;  // uniform in the workgroup
  const uint s = wg / p.n_v, h = wg % p.n_v, j = gl_LocalInvocationID.x;
  const uint g = p.tiled != 0 ? h % p.n_k : h / (p.n_v / p.n_k);
  const int t0 = seq_start[p.start_off + s], t1 = seq_start[p.start_off + s + 1];
  const bool fresh = seq_ctx[p.ctx_off + s] == t1 - t0;
  const uint state = p.s_off + (uint(seq_slot[p.slot_off + s]) * p.n_v + h) * p.d_k * p.d_v;
  if (fresh && j < p.d_v) {
    for (uint i = 0; i < p.d_k; ++i) st[state + i * p.d_v + j] = 0.0;
  }
  for (int t = t0; t < t1; ++t) {
    const uint row = uint(t) * p.qkv_stride;
    const float qv = j < p.d_k ? q[p.q_off + row + g * p.d_k + j] : 0.0;
    const float kv = j < p.d_k ? k[p.k_off + row + g * p.d_k + j] : 0.0;
    red_q[j] = qv * qv;
    red_k[j] = kv * kv;
    barrier();
    for (uint w = 128; w > 0; w >>= 1) {
      if (j < w) {
        red_q[j] += red_q[j + w];
        red_k[j] += red_k[j + w];
      }
      barrier();
    }
    qs[j] = qv * p.scale / sqrt(red_q[0] + p.eps);
    ks[j] = kv / sqrt(red_k[0] + p.eps);
    barrier();
    const uint gate = uint(t) * p.gate_stride + h;
    const float x = alpha[p.alpha_off + gate] + dt[p.dt_off + h];
    const float softplus = x > 20.0 ? x : log(1.0 + exp(x));
    const float decay = exp(a[p.a_off + h] * softplus);
    const float b = 1.0 / (1.0 + exp(-beta[p.beta_off + gate]));
    if (j < p.d_v) {
      float sk = 0.0;
      for (uint i = 0; i < p.d_k; ++i) sk += st[state + i * p.d_v + j] * ks[i];
      const float u = b * (v[p.v_off + row + h * p.d_v + j] - decay * sk);
      float acc = 0.0;
      for (uint i = 0; i < p.d_k; ++i) {
        const float nv = decay * st[state + i * p.d_v + j] + ks[i] * u;
        st[state + i * p.d_v + j] = nv;
        acc += nv * qs[i];
      }
      o[p.o_off + (uint(t) * p.n_v + h) * p.d_v + j] = acc;
    }
    barrier();  // qs / ks / red_* are rewritten by the next token
  }
}
