// out = x * sigmoid(gate) over rows of n_cols with row strides (hal::SigmoidMulArgs): gated
// attention's output gate, or with per_row one gate value per row (a shared expert's). out may be
// x (each element is read and written by one invocation).
#version 450
layout(local_size_x = 256) in;
layout(std430, binding = 0) readonly buffer X { float x[]; };
layout(std430, binding = 1) readonly buffer G { float g[]; };
layout(std430, binding = 2) writeonly buffer O { float o[]; };
layout(push_constant) uniform Params {
  uint x_off, g_off, o_off;
  uint n_rows, n_cols, x_stride, g_stride, o_stride, per_row;
  uint gx;
} p;

void main() {
  const uint i = (gl_WorkGroupID.x + gl_WorkGroupID.y * p.gx) * 256 + gl_LocalInvocationID.x;
  if (i >= p.n_rows * p.n_cols) return;
  const uint r = i / p.n_cols, c = i % p.n_cols;
  const float gate = g[p.g_off + r * p.g_stride + (p.per_row != 0 ? 0 : c)];
  o[p.o_off + r * p.o_stride + c] = x[p.x_off + r * p.x_stride + c] / (1.0 + exp(-gate));
}
