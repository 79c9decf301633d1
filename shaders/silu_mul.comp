// out = silu(gate) * up over rows of n_cols with row strides (hal::SiluMulArgs). Push constants:
// the bindings' element offsets, then the op's parameters, then gx (workgroups per grid row).
#version 450
layout(local_size_x = 256) in;
layout(std430, binding = 0) readonly buffer G { float g[]; };
layout(std430, binding = 1) readonly buffer U { float u[]; };
layout(std430, binding = 2) writeonly buffer O { float o[]; };
layout(push_constant) uniform Params {
  uint g_off, u_off, o_off;
  uint n_rows, n_cols, g_stride, u_stride, o_stride;
  uint gx;
} p;

void main() {
  const uint i = (gl_WorkGroupID.x + gl_WorkGroupID.y * p.gx) * 256 + gl_LocalInvocationID.x;
  if (i >= p.n_rows * p.n_cols) return;
  const uint r = i / p.n_cols, c = i % p.n_cols;
  const float x = g[p.g_off + r * p.g_stride + c];
  o[p.o_off + r * p.o_stride + c] = x / (1.0 + exp(-x)) * u[p.u_off + r * p.u_stride + c];
}
