// The tokens of a step grouped by expert for the experts' matmuls (matmul.comp's MOE variant), from
// the router's ids (hal::MoeFfnArgs): one invocation per local expert e scans the n_slots = n_tokens
// * k choices in order and lists the slots t * k + j choosing expert_begin + e, in token order, at
// routes[e * cap ...], their number in counts[e]. A token chooses an expert at most once, so at
// most cap = n_tokens slots per expert; ids outside the rank's experts are not listed.
#version 450
layout(local_size_x = 64) in;
layout(std430, binding = 0) readonly buffer Ids { int ids[]; };
layout(std430, binding = 1) writeonly buffer Routes { uint routes[]; };
layout(std430, binding = 2) writeonly buffer Counts { uint counts[]; };
layout(push_constant) uniform Params {
  uint i_off, r_off, c_off;
  uint n_slots, cap, expert_begin, n_local;
  uint gx;
} p;

void main() {
  const uint e = (gl_WorkGroupID.x + gl_WorkGroupID.y * p.gx) * 64 + gl_LocalInvocationID.x;
  if (e >= p.n_local) return;
  const int want = int(p.expert_begin + e);
  uint n = 0;
  for (uint s = 0; s < p.n_slots && n < p.cap; ++s) {
    if (ids[p.i_off + s] == want) routes[p.r_off + e * p.cap + n++] = s;
  }
  counts[p.c_off + e] = n;
}
