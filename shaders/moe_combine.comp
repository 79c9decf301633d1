// The output of a mixture of experts (hal::MoeFfnArgs): out[t][c] = the sum over the token's
// choices j whose expert is one of the rank's (ids[t][j] in [expert_begin, expert_begin +
// n_local)) of weights[t][j] * y[t * k + j][c], y being the experts' down projections by slot
// (matmul.comp's MOE variant wrote the rank's slots); zero for a token none of whose experts are
// here. One invocation per element.
#version 450
layout(local_size_x = 256) in;
layout(std430, binding = 0) readonly buffer Y { float y[]; };
layout(std430, binding = 1) readonly buffer Ids { int ids[]; };
layout(std430, binding = 2) readonly buffer W { float weights[]; };
layout(std430, binding = 3) writeonly buffer O { float o[]; };
layout(push_constant) uniform Params {
  uint y_off, i_off, w_off, o_off;
  uint n_tokens, dim, k, expert_begin, n_local;
  uint gx;
} p;

void main() {
  const uint i = (gl_WorkGroupID.x + gl_WorkGroupID.y * p.gx) * 256 + gl_LocalInvocationID.x;
  if (i >= p.n_tokens * p.dim) return;
  const uint t = i / p.dim, c = i % p.dim;
  precise float acc = 0.0;
  for (uint j = 0; j < p.k; ++j) {
    const uint s = t * p.k + j;
    const uint e = uint(ids[p.i_off + s]) - p.expert_begin;  // wraps below expert_begin
    if (e < p.n_local) acc = fma(weights[p.w_off + s], y[p.y_off + s * p.dim + c], acc);
  }
  o[p.o_off + i] = acc;
}
