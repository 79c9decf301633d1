// out = a + b over n floats (hal::AddArgs). Operands are bound from their offset rounded down to
// the device's alignment; *_off are the remaining elements. The grid may be 2-D (more than
// maxComputeWorkGroupCount[0] groups): row_stride is the invocations of one row of groups.
#version 450
layout(local_size_x = 256) in;
layout(std430, set = 0, binding = 0) readonly buffer A { float a[]; };
layout(std430, set = 0, binding = 1) readonly buffer B { float b[]; };
layout(std430, set = 0, binding = 2) writeonly buffer O { float o[]; };
layout(push_constant) uniform Params {
  uint n;
  uint a_off;
  uint b_off;
  uint o_off;
  uint row_stride;
} p;

void main() {
  const uint i = gl_GlobalInvocationID.x + gl_GlobalInvocationID.y * p.row_stride;
  if (i >= p.n) return;
  o[p.o_off + i] = a[p.a_off + i] + b[p.b_off + i];
}
