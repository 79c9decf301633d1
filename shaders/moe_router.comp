// The router of a mixture of experts (hal::MoeRouterArgs), one workgroup per token: the softmax of
// its n_experts logits (max, then the sum of exp(l - max), each over the invocations' strided
// columns and reduced in shared memory), then k rounds that each find the most probable expert
// coming after the previous round's in hal::top_k_before's order (the lower id first among equal
// probabilities), and the chosen probabilities as weights, divided by their sum when
// p.normalize. Probabilities are exp(l - max) / sum in F32, as the CPU backend rounds them.
#version 450
#extension GL_GOOGLE_include_directive : require
layout(local_size_x = 256) in;
layout(std430, binding = 0) readonly buffer L { float logits[]; };
layout(std430, binding = 1) writeonly buffer I { int ids[]; };
layout(std430, binding = 2) writeonly buffer W { float weights[]; };
layout(push_constant) uniform Params {
  uint l_off, i_off, w_off;
  uint n_tokens, n_experts, k, normalize;
  uint gx;
} p;

const uint kNone = 0xffffffffu;
shared float sv[256];
shared uint si[256];
shared float chosen[64];  // hal::kMaxTopK

#include "top_k_order.glsl"

void main() {
  const uint tok = gl_WorkGroupID.x + gl_WorkGroupID.y * p.gx;
  if (tok >= p.n_tokens) return;  // uniform in the workgroup
  const uint t = gl_LocalInvocationID.x, base = p.l_off + tok * p.n_experts;
  float mx = -1.0 / 0.0;
  for (uint c = t; c < p.n_experts; c += 256) mx = max(mx, logits[base + c]);
  sv[t] = mx;
  barrier();
  for (uint s = 128; s > 0; s >>= 1) {
    if (t < s) sv[t] = max(sv[t], sv[t + s]);
    barrier();
  }
  mx = sv[0];
  barrier();
  float sum = 0.0;
  for (uint c = t; c < p.n_experts; c += 256) sum += exp(logits[base + c] - mx);
  sv[t] = sum;
  barrier();
  for (uint s = 128; s > 0; s >>= 1) {
    if (t < s) sv[t] += sv[t + s];
    barrier();
  }
  sum = sv[0];
  barrier();
  float last_v = 0.0;
  uint last_i = kNone;
  for (uint r = 0; r < p.k; ++r) {
    float best_v = 0.0;
    uint best_i = kNone;
    for (uint c = t; c < p.n_experts; c += 256) {
      const float v = exp(logits[base + c] - mx) / sum;
      if (last_i != kNone && !before(last_v, last_i, v, c)) continue;  // taken in an earlier round
      if (best_i == kNone || before(v, c, best_v, best_i)) {
        best_v = v;
        best_i = c;
      }
    }
    sv[t] = best_v;
    si[t] = best_i;
    barrier();
    for (uint s = 128; s > 0; s >>= 1) {
      if (t < s && si[t + s] != kNone && (si[t] == kNone || before(sv[t + s], si[t + s], sv[t], si[t]))) {
        sv[t] = sv[t + s];
        si[t] = si[t + s];
      }
      barrier();
    }
    last_v = sv[0];
    last_i = si[0];
    if (t == 0) {
      chosen[r] = last_v;
      ids[p.i_off + tok * p.k + r] = int(last_i);
    }
    barrier();
  }
  if (t == 0) {
    float total = 0.0;
    for (uint r = 0; r < p.k; ++r) total += chosen[r];
    for (uint r = 0; r < p.k; ++r) {
      weights[p.w_off + tok * p.k + r] = p.normalize != 0 && total > 0.0 ? chosen[r] / total : chosen[r];
    }
  }
}
