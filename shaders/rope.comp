// NeoX rotary embedding in place (hal::RopeArgs): pairs (i, i + half) of each head rotate by
// pos * inv_freq[i], one invocation per pair. A float angle loses 1e-4 at position 1000, so the
// angle is taken in turns with integer arithmetic: the host gives g = inv_freq[i] / (2 pi) as a
// 64-bit binary fraction (two words, high first), and the fraction of pos * g comes from two
// 32 x 32 -> 64-bit products (exact), then turns in [-1/2, 1/2) times 2 pi go to sin and cos.
#version 450
layout(local_size_x = 256) in;
layout(std430, binding = 0) buffer X { float x[]; };
layout(std430, binding = 1) readonly buffer P { int pos[]; };
layout(std430, binding = 2) readonly buffer F { uint g[]; };  // per pair: high word, low word
layout(push_constant) uniform Params {
  uint x_off, p_off, f_off;
  uint n_tokens, n_heads, head_dim, half_rot;
  uint gx;
} p;

void main() {
  const uint e = (gl_WorkGroupID.x + gl_WorkGroupID.y * p.gx) * 256 + gl_LocalInvocationID.x;
  if (e >= p.n_tokens * p.n_heads * p.half_rot) return;
  const uint i = e % p.half_rot, th = e / p.half_rot, t = th / p.n_heads;
  const int ps = pos[p.p_off + t];
  const uint ap = uint(abs(ps));
  uint hi_msb, hi_lsb, lo_msb, lo_lsb;
  umulExtended(ap, g[p.f_off + 2 * i], hi_msb, hi_lsb);
  umulExtended(ap, g[p.f_off + 2 * i + 1], lo_msb, lo_lsb);
  const uint frac = hi_lsb + lo_msb;  // the fraction of ap * g in 2^-32 turns (mod 1)
  float turns = float(int(frac)) * (1.0 / 4294967296.0);
  if (ps < 0) turns = -turns;
  const float r = turns * 6.28318530717958648;
  const float c = cos(r), s = sin(r);
  const uint base = p.x_off + th * p.head_dim;
  const float a = x[base + i], b = x[base + i + p.half_rot];
  x[base + i] = a * c - b * s;
  x[base + i + p.half_rot] = a * s + b * c;
}
