// out = a + b over n floats (hal::AddArgs). The push constants of every shader here: the
// operands' element offsets (each bound from its offset rounded down to the device's alignment),
// the op's parameters, then gx, the workgroups of one row of the grid (a grid of more than
// maxComputeWorkGroupCount[0] groups is 2-D; the linear workgroup index is x + y * gx).
#version 450
layout(local_size_x = 256) in;
layout(std430, set = 0, binding = 0) readonly buffer A { float a[]; };
layout(std430, set = 0, binding = 1) readonly buffer B { float b[]; };
layout(std430, set = 0, binding = 2) writeonly buffer O { float o[]; };
layout(push_constant) uniform Params {
  uint a_off, b_off, o_off;
  uint n;
  uint gx;
} p;

void main() {
  const uint i = (gl_WorkGroupID.x + gl_WorkGroupID.y * p.gx) * 256 + gl_LocalInvocationID.x;
  if (i >= p.n) return;
  o[p.o_off + i] = a[p.a_off + i] + b[p.b_off + i];
}
