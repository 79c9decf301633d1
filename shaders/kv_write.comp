// This step's K and V rows into the paged cache (hal::KvWriteArgs): cache[slot_mapping[t]][:] =
// k[t][:] (and v), f32 caches one invocation per element, f16 one per pair of elements (a word);
// a negative slot is padding and skipped, a slot past the cache is reported in the error word
// (kind 3: slot, token, n_slots).
#version 450
layout(local_size_x = 256) in;
layout(std430, binding = 0) readonly buffer K { float k[]; };
layout(std430, binding = 1) readonly buffer V { float v[]; };
layout(std430, binding = 2) writeonly buffer KC { uint kc[]; };
layout(std430, binding = 3) writeonly buffer VC { uint vc[]; };
layout(std430, binding = 4) readonly buffer S { int slots[]; };
layout(std430, binding = 5) buffer E { uint err[]; };
layout(push_constant) uniform Params {
  uint k_off, v_off, kc_off, vc_off, s_off, e_off;
  uint n_tokens, row, n_slots, f16;
  uint gx;
} p;

void main() {
  const uint per = p.f16 != 0 ? p.row / 2 : p.row;  // words of one token's row in the cache
  const uint e = (gl_WorkGroupID.x + gl_WorkGroupID.y * p.gx) * 256 + gl_LocalInvocationID.x;
  if (e >= p.n_tokens * per) return;
  const uint t = e / per, i = e % per;
  const int slot = slots[p.s_off + t];
  if (slot < 0) return;
  if (uint(slot) >= p.n_slots) {
    if (i == 0 && atomicCompSwap(err[p.e_off], 0u, 3u) == 0u) {
      err[p.e_off + 1] = uint(slot);
      err[p.e_off + 2] = t;
      err[p.e_off + 3] = p.n_slots;
    }
    return;
  }
  const uint src = t * p.row, dst = uint(slot) * per + i;
  if (p.f16 != 0) {
    kc[p.kc_off + dst] = packHalf2x16(vec2(k[p.k_off + src + 2 * i], k[p.k_off + src + 2 * i + 1]));
    vc[p.vc_off + dst] = packHalf2x16(vec2(v[p.v_off + src + 2 * i], v[p.v_off + src + 2 * i + 1]));
  } else {
    kc[p.kc_off + dst] = floatBitsToUint(k[p.k_off + src + i]);
    vc[p.vc_off + dst] = floatBitsToUint(v[p.v_off + src + i]);
  }
}
