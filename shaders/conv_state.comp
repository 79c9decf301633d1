// Gated DeltaNet's causal depthwise conv with each sequence's rolling state, then SiLU
// (hal::ConvStateArgs). One invocation per (sequence, channel) walks the sequence's tokens in order:
// its window holds the last kernel - 1 inputs (from the state, zeros for a sequence that starts in
// this step), and goes back to the state at the end.
#version 450
layout(local_size_x = 256) in;
layout(std430, binding = 0) readonly buffer X { float x[]; };
layout(std430, binding = 1) readonly buffer W { float w[]; };
layout(std430, binding = 2) buffer S { float st[]; };
layout(std430, binding = 3) writeonly buffer O { float o[]; };
layout(std430, binding = 4) readonly buffer Start { int seq_start[]; };
layout(std430, binding = 5) readonly buffer Ctx { int seq_ctx[]; };
layout(std430, binding = 6) readonly buffer Slot { int seq_slot[]; };
layout(push_constant) uniform Params {
  uint x_off, w_off, s_off, o_off, start_off, ctx_off, slot_off;
  uint n_seqs, channels, kernel, x_stride;
  uint gx;
} p;

const uint kMaxHistory = 7;  // hal::kMaxConvKernel - 1

void main() {
  const uint i = (gl_WorkGroupID.x + gl_WorkGroupID.y * p.gx) * 256 + gl_LocalInvocationID.x;
  if (i >= p.n_seqs * p.channels) return;
  const uint s = i / p.channels, c = i % p.channels;
  const int t0 = seq_start[p.start_off + s], t1 = seq_start[p.start_off + s + 1];
  const bool fresh = seq_ctx[p.ctx_off + s] == t1 - t0;
  const uint hist = p.kernel - 1;
  const uint state = p.s_off + uint(seq_slot[p.slot_off + s]) * hist * p.channels + c;
  float window[kMaxHistory];  // oldest first
  for (uint j = 0; j < hist; ++j) window[j] = fresh ? 0.0 : st[state + j * p.channels];
  for (int t = t0; t < t1; ++t) {
    const float xt = x[p.x_off + uint(t) * p.x_stride + c];
    float acc = w[p.w_off + c * p.kernel + hist] * xt;
    for (uint j = 0; j < hist; ++j) acc += w[p.w_off + c * p.kernel + j] * window[j];
    o[p.o_off + uint(t) * p.channels + c] = acc / (1.0 + exp(-acc));
    for (uint j = 0; j + 1 < hist; ++j) window[j] = window[j + 1];
    window[hist - 1] = xt;
  }
  for (uint j = 0; j < hist; ++j) st[state + j * p.channels] = window[j];
}
