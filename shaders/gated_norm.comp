// out = x * rsqrt(mean(x^2) + eps) * weight * silu(z) over rows of dim, one workgroup per row
// (hal::GatedNormArgs: Gated DeltaNet's output norm). out may be x: every element is read (twice)
// and written by one invocation, the write last.
#version 450
layout(local_size_x = 256) in;
layout(std430, binding = 0) readonly buffer X { float x[]; };
layout(std430, binding = 1) readonly buffer Z { float z[]; };
layout(std430, binding = 2) readonly buffer W { float w[]; };
layout(std430, binding = 3) writeonly buffer O { float o[]; };
layout(push_constant) uniform Params {
  uint x_off, z_off, w_off, o_off;
  uint n_rows, dim;
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
    const float v = x[p.x_off + base + i];
    ss += v * v;
  }
  partial[t] = ss;
  barrier();
  for (uint s = 128; s > 0; s >>= 1) {
    if (t < s) partial[t] += partial[t + s];
    barrier();
  }
  const float scale = inversesqrt(partial[0] / float(p.dim) + p.eps);
  for (uint i = t; i < p.dim; i += 256) {
    const float gate = z[p.z_off + base + i];
    o[p.o_off + base + i] = x[p.x_off + base + i] * scale * w[p.w_off + i] * (gate / (1.0 + exp(-gate)));
  }
}
