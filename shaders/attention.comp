// Causal paged attention over a mixed batch (hal::AttentionArgs), one workgroup per (token, head):
// the token's sequence is found from seq_token_start; it attends to cache positions [0, pos]
// through the block table. Pass 1 takes the largest score; pass 2 goes through the positions in
// chunks of 256: each invocation scores one position into shared memory, then invocation d (< head
// size) adds exp(score - max) * v[d] over the chunk. K / V caches in f32 or f16. A block id outside
// the cache is reported in the error word (kind 2: sequence, block index, block id).
#version 450
layout(local_size_x = 256) in;
layout(std430, binding = 0) readonly buffer Q { float q[]; };
layout(std430, binding = 1) readonly buffer K { uint kc[]; };
layout(std430, binding = 2) readonly buffer V { uint vc[]; };
layout(std430, binding = 3) writeonly buffer O { float o[]; };
layout(std430, binding = 4) readonly buffer S { int starts[]; };
layout(std430, binding = 5) readonly buffer C { int ctx[]; };
layout(std430, binding = 6) readonly buffer B { int table[]; };
layout(std430, binding = 7) buffer E { uint err[]; };
layout(push_constant) uniform Params {
  uint q_off, k_off, v_off, o_off, s_off, c_off, b_off, e_off;
  uint n_seqs, n_tokens, n_heads, n_kv_heads, head_dim, block_size, max_blocks, n_slots;
  uint q_head_offset, kv_head_offset, heads_per_kv, f16;
  float scale;
  uint gx;
} p;

shared float red[256];
shared float sc[256];
shared int slots[256];

float cache_at(uint which, uint idx) {  // which: 0 = K, 1 = V; idx in elements
  if (p.f16 != 0) {
    const uint w = which == 0 ? kc[p.k_off + idx / 2] : vc[p.v_off + idx / 2];
    return unpackHalf2x16(w)[idx % 2];
  }
  return uintBitsToFloat(which == 0 ? kc[p.k_off + idx] : vc[p.v_off + idx]);
}

// The slot of position `pos` of sequence `s`, or -1 (reported) when its block is outside the cache.
int slot_of(uint s, uint pos) {
  const uint b = pos / p.block_size;
  const int blk = table[p.b_off + s * p.max_blocks + b];
  if (blk < 0 || uint(blk) * p.block_size >= p.n_slots) {
    if (atomicCompSwap(err[p.e_off], 0u, 2u) == 0u) {
      err[p.e_off + 1] = s;
      err[p.e_off + 2] = b;
      err[p.e_off + 3] = uint(blk);
    }
    return -1;
  }
  return int(uint(blk) * p.block_size + pos % p.block_size);
}

float score(uint kv_row, uint qbase, int slot) {
  if (slot < 0) return -1.0 / 0.0;
  const uint kbase = (uint(slot) * p.n_kv_heads + kv_row) * p.head_dim;
  float d = 0.0;
  for (uint i = 0; i < p.head_dim; ++i) d += q[qbase + i] * cache_at(0, kbase + i);
  return d * p.scale;
}

void main() {
  const uint wg = gl_WorkGroupID.x + gl_WorkGroupID.y * p.gx;
  if (wg >= p.n_tokens * p.n_heads) return;  // uniform in the workgroup
  const uint t = wg / p.n_heads, h = wg % p.n_heads, tid = gl_LocalInvocationID.x;
  uint s = 0;
  while (s + 1 < p.n_seqs && uint(starts[p.s_off + s + 1]) <= t) ++s;
  const uint first = uint(starts[p.s_off + s]), count = uint(starts[p.s_off + s + 1]) - first;
  const uint pos = uint(ctx[p.c_off + s]) - count + (t - first);
  const uint kv_row = (p.q_head_offset + h) / p.heads_per_kv - p.kv_head_offset;
  const uint qbase = p.q_off + (t * p.n_heads + h) * p.head_dim;

  float m = -1.0 / 0.0;
  for (uint c = tid; c <= pos; c += 256) m = max(m, score(kv_row, qbase, slot_of(s, c)));
  red[tid] = m;
  barrier();
  for (uint w = 128; w > 0; w >>= 1) {
    if (tid < w) red[tid] = max(red[tid], red[tid + w]);
    barrier();
  }
  const float mx = red[0];
  barrier();

  float acc = 0.0, sum = 0.0;
  for (uint base = 0; base <= pos; base += 256) {
    const uint c = base + tid;
    const int slot = c <= pos ? slot_of(s, c) : -1;
    slots[tid] = slot;
    sc[tid] = c <= pos ? exp(score(kv_row, qbase, slot) - mx) : 0.0;
    barrier();
    const uint n = min(256u, pos + 1 - base);
    if (tid < p.head_dim) {
      for (uint j = 0; j < n; ++j) {
        sum += sc[j];
        if (slots[j] >= 0) acc += sc[j] * cache_at(1, (uint(slots[j]) * p.n_kv_heads + kv_row) * p.head_dim + tid);
      }
    }
    barrier();
  }
  if (tid < p.head_dim) o[p.o_off + (t * p.n_heads + h) * p.head_dim + tid] = acc / sum;
}
