// y[m][n] = x[m][:] . W[n][:] (+ bias[n]) (hal::MatmulArgs) for weights in their file formats
// (quant.glsl), one workgroup per output element: 256 invocations over k, then a reduction. The
// weight is bound in windows of whole rows: this dispatch holds rows [n_begin, n_begin + rows).
// Correct first, not fast: no tiling, no cooperative matrices yet.
#version 450
#extension GL_GOOGLE_include_directive : require
layout(local_size_x = 256) in;
layout(std430, binding = 0) readonly buffer W { uint w[]; };
layout(std430, binding = 1) readonly buffer X { float x[]; };
layout(std430, binding = 2) readonly buffer Bias { float bias[]; };
layout(std430, binding = 3) writeonly buffer Y { float y[]; };
layout(push_constant) uniform Params {
  uint w_off, x_off, b_off, y_off;
  uint m, n, k, format, row_bytes, n_begin, rows, has_bias;
  uint gx;
} p;

#include "quant.glsl"

shared float partial[256];

void main() {
  const uint wg = gl_WorkGroupID.x + gl_WorkGroupID.y * p.gx;
  if (wg >= p.m * p.rows) return;  // uniform in the workgroup
  const uint mi = wg / p.rows, r = wg % p.rows, tid = gl_LocalInvocationID.x;
  const uint base = r * p.row_bytes;
  float acc = 0.0;
  for (uint j = tid; j < p.k; j += 256) acc += x[p.x_off + mi * p.k + j] * w_element(p.format, base, j);
  partial[tid] = acc;
  barrier();
  for (uint s = 128; s > 0; s >>= 1) {
    if (tid < s) partial[tid] += partial[tid + s];
    barrier();
  }
  if (tid == 0) {
    const uint ni = p.n_begin + r;
    y[p.y_off + mi * p.n + ni] = partial[0] + (p.has_bias != 0 ? bias[p.b_off + ni] : 0.0);
  }
}
