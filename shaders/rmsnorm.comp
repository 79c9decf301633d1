// x += add (when has_add), then out = x * rsqrt(mean(x^2) + eps) * weight, one workgroup per row
// (hal::RmsNormArgs). Without an add, binding 1 is x again and is not read.
#version 450
layout(local_size_x = 256) in;
layout(std430, binding = 0) buffer X { float x[]; };
layout(std430, binding = 1) readonly buffer A { float a[]; };
layout(std430, binding = 2) readonly buffer W { float w[]; };
layout(std430, binding = 3) writeonly buffer O { float o[]; };
layout(push_constant) uniform Params {
  uint x_off, a_off, w_off, o_off;
  uint n_rows, dim, has_add;
  float eps;
  uint gx;
} p;

shared float partial[256];

void main() {
  const uint row = gl_WorkGroupID.x + gl_WorkGroupID.y * p.gx;
  if (row >= p.n_rows) return;  // uniform in the workgroup
  const uint t = gl_LocalInvocationID.x, base = row * p.dim;
  float ss = 0.0;
  for (uint i = t; i < p.dim; i += 256) {
    float v = x[p.x_off + base + i];
    if (p.has_add != 0) {
      v += a[p.a_off + base + i];
      x[p.x_off + base + i] = v;
    }
    ss += v * v;
  }
  partial[t] = ss;
  barrier();
  for (uint s = 128; s > 0; s >>= 1) {
    if (t < s) partial[t] += partial[t + s];
    barrier();
  }
  const float scale = inversesqrt(partial[0] / float(p.dim) + p.eps);
  for (uint i = t; i < p.dim; i += 256) o[p.o_off + base + i] = x[p.x_off + base + i] * scale * w[p.w_off + i];
}
