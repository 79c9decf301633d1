// The k best of each row in hal::top_k_before's order (larger first, lower index among equals,
// NaN last), one workgroup per row (hal::TopKArgs): k rounds, each finding the best element that
// comes after the previous round's winner (each invocation over its strided columns, then a
// reduction in shared memory). ids get id_offset added.
#version 450
#extension GL_GOOGLE_include_directive : require
layout(local_size_x = 256) in;
layout(std430, binding = 0) readonly buffer X { float x[]; };
layout(std430, binding = 1) writeonly buffer V { float values[]; };
layout(std430, binding = 2) writeonly buffer I { int ids[]; };
layout(push_constant) uniform Params {
  uint x_off, v_off, i_off;
  uint n_rows, n_cols, k;
  int id_offset;
  uint gx;
} p;

const uint kNone = 0xffffffffu;
shared float sv[256];
shared uint si[256];

#include "top_k_order.glsl"

void main() {
  const uint row = gl_WorkGroupID.x + gl_WorkGroupID.y * p.gx;
  if (row >= p.n_rows) return;  // uniform in the workgroup
  const uint t = gl_LocalInvocationID.x, base = p.x_off + row * p.n_cols;
  float last_v = 0.0;
  uint last_i = kNone;
  for (uint r = 0; r < p.k; ++r) {
    float best_v = 0.0;
    uint best_i = kNone;
    for (uint c = t; c < p.n_cols; c += 256) {
      const float v = x[base + c];
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
      values[p.v_off + row * p.k + r] = last_v;
      ids[p.i_off + row * p.k + r] = int(last_i) + p.id_offset;
    }
    barrier();
  }
}
