// y[m][n] = x[m][:] . W[n][:] (+ bias[n]) (hal::MatmulArgs) for weights in their file formats
// (quant.glsl), accumulating in F32 along k, over tiles of MT rows of x (MT, a specialisation
// constant: 1 for decode, more for prefill so each weight element is decoded once per tile). The
// weight is bound in windows of whole rows: this dispatch holds rows [n_begin, n_begin + rows),
// p.rows_per_group of them per workgroup. Two variants of one source:
//   default   one invocation per weight row (64 rows per workgroup); no shared memory, no
//             barriers, no subgroup operations: runs everywhere.
//   SUBGROUP  one subgroup per weight row, its lanes striding along k, then subgroupAdd (rows per
//             workgroup: 64 / the device's subgroup size; a subgroup takes further rows when the
//             driver chose smaller subgroups). For devices with subgroup arithmetic in compute.
//   MOE       (with either) the experts of a mixture of experts (hal::MoeFfnArgs): the window holds
//             p.n_experts experts of p.rows rows each, and expert e of it multiplies the rows of x
//             moe_route.comp listed for it (routes[e * p.cap + i], i < counts[e]: slots t * k + j,
//             x's row being slot / p.x_div), writing row `slot` of y. Workgroups: row groups x
//             tiles of p.cap rows x experts; a tile past the expert's count does nothing.
// Q8_0 weights meet int8 activations (quantize_q8.comp: qx, dx): per block of 32 an exact integer
// dot product, then acc = fma(float(dot), d_w * d_x, acc), + bias at the end: the arithmetic of
// the CPU backend's int8 paths (matmul_reference_q8_activations), up to the order of the sum.
#version 450
#extension GL_GOOGLE_include_directive : require
#ifdef SUBGROUP
#extension GL_KHR_shader_subgroup_basic : require
#extension GL_KHR_shader_subgroup_arithmetic : require
#endif
layout(local_size_x = 64) in;
layout(constant_id = 0) const uint MT = 1;
layout(std430, binding = 0) readonly buffer W { uint w[]; };
layout(std430, binding = 1) readonly buffer X { float x[]; };
layout(std430, binding = 2) readonly buffer Bias { float bias[]; };
layout(std430, binding = 3) writeonly buffer Y { float y[]; };
layout(std430, binding = 4) readonly buffer QX { uint qx[]; };
layout(std430, binding = 5) readonly buffer DX { float dx[]; };
#ifdef MOE
layout(std430, binding = 6) readonly buffer Routes { uint routes[]; };
layout(std430, binding = 7) readonly buffer Counts { uint counts[]; };
#endif
layout(push_constant) uniform Params {
  uint w_off, x_off, b_off, y_off, qx_off, dx_off;
#ifdef MOE
  uint routes_off, counts_off;
#endif
  uint m, n, k, format, row_bytes, n_begin, rows, has_bias, rows_per_group;
#ifdef MOE
  uint x_div, cap, e_begin, n_experts;
#endif
  uint gx;
} p;

#include "quant.glsl"

// The sum of the four products of the signed bytes of a and b.
int dot4(uint a, uint b) {
  int s = 0;
  for (int i = 0; i < 32; i += 8) s += bitfieldExtract(int(a), i, 8) * bitfieldExtract(int(b), i, 8);
  return s;
}

// Row r of the window against the rows xr of x (a tile: the last one repeated past the end; those
// are not written), this lane's share of k: elements (blocks, for Q8_0) lane, lane + lanes, ...
void row_tile(uint r, uint xr[MT], uint lane, uint lanes, inout float acc[MT]) {
  const uint base = r * p.row_bytes;
  if (p.format == kQ8_0) {
    const uint nb = p.k / 32, qrow = p.k / 4, last = w.length() - 1;
    for (uint b = lane; b < nb; b += lanes) {
      // The 32 quants start 2 bytes into the 34-byte block: at a word, or half-way into one.
      const uint blk = base + b * 34, start = blk + 2, a = p.w_off + start / 4, s = 8 * (start % 4);
      int dot[MT];
      for (uint t = 0; t < MT; ++t) dot[t] = 0;
      uint lo = w[a];
      for (uint i = 0; i < 8; ++i) {
        const uint hi = w[min(a + i + 1, last)];
        const uint wq = s == 0 ? lo : (lo >> s) | (hi << (32 - s));
        lo = hi;
        for (uint t = 0; t < MT; ++t) dot[t] += dot4(wq, qx[p.qx_off + xr[t] * qrow + b * 8 + i]);
      }
      const float dw = w_half(blk);
      for (uint t = 0; t < MT; ++t) {
        precise float scale = dw * dx[p.dx_off + xr[t] * nb + b];
        acc[t] = fma(float(dot[t]), scale, acc[t]);
      }
    }
  } else if (p.format == kF32) {
    const uint a = p.w_off + base / 4;
    uint j = lane;
    for (; j + 7 * lanes < p.k; j += 8 * lanes) {  // unrolled: lavapipe's loops cost more than their bodies
      for (uint u = 0; u < 8; ++u) {
        const float v = uintBitsToFloat(w[a + j + u * lanes]);
        for (uint t = 0; t < MT; ++t) acc[t] = fma(x[p.x_off + xr[t] * p.k + j + u * lanes], v, acc[t]);
      }
    }
    for (; j < p.k; j += lanes) {
      const float v = uintBitsToFloat(w[a + j]);
      for (uint t = 0; t < MT; ++t) acc[t] = fma(x[p.x_off + xr[t] * p.k + j], v, acc[t]);
    }
  } else {
    for (uint j = lane; j < p.k; j += lanes) {
      const float v = w_element(p.format, base, j);
      for (uint t = 0; t < MT; ++t) acc[t] = fma(x[p.x_off + xr[t] * p.k + j], v, acc[t]);
    }
  }
}

// Writes row r of the window for the tile's rows yr (count of them real).
void store(uint r, uint yr[MT], uint count, float acc[MT]) {
  const uint ni = p.n_begin + r;
  const float bv = p.has_bias != 0 ? bias[p.b_off + ni] : 0.0;
  for (uint t = 0; t < MT; ++t) {
    if (t < count) y[p.y_off + yr[t] * p.n + ni] = acc[t] + bv;
  }
}

void main() {
  const uint row_groups = (p.rows + p.rows_per_group - 1) / p.rows_per_group;
  const uint wg = gl_WorkGroupID.x + gl_WorkGroupID.y * p.gx;
  const uint first = (wg % row_groups) * p.rows_per_group;
  uint xr[MT], yr[MT], count, row0 = 0;  // row0: the window's first row of this workgroup's matrix
#ifdef MOE
  const uint tiles = (p.cap + MT - 1) / MT, rest = wg / row_groups, ew = rest / tiles, m0 = (rest % tiles) * MT;
  if (ew >= p.n_experts) return;
  const uint e = p.e_begin + ew, routed = counts[p.counts_off + e];
  if (m0 >= routed) return;
  count = min(MT, routed - m0);
  for (uint t = 0; t < MT; ++t) {
    yr[t] = routes[p.routes_off + e * p.cap + m0 + min(t, count - 1)];
    xr[t] = yr[t] / p.x_div;
  }
  row0 = ew * p.rows;
#else
  const uint m0 = (wg / row_groups) * MT;
  if (m0 >= p.m) return;
  count = min(MT, p.m - m0);
  for (uint t = 0; t < MT; ++t) xr[t] = yr[t] = min(m0 + t, p.m - 1);
#endif
#ifdef SUBGROUP
  // r is uniform in the subgroup: a subgroup returns or reduces as a whole.
  for (uint i = gl_SubgroupID; i < p.rows_per_group; i += gl_NumSubgroups) {
    const uint r = first + i;
    if (r >= p.rows) return;
    precise float acc[MT];
    for (uint t = 0; t < MT; ++t) acc[t] = 0.0;
    row_tile(row0 + r, xr, gl_SubgroupInvocationID, gl_SubgroupSize, acc);
    for (uint t = 0; t < MT; ++t) acc[t] = subgroupAdd(acc[t]);
    if (subgroupElect()) store(r, yr, count, acc);
  }
#else
  const uint r = first + gl_LocalInvocationID.x;
  if (r >= p.rows) return;
  precise float acc[MT];
  for (uint t = 0; t < MT; ++t) acc[t] = 0.0;
  row_tile(row0 + r, xr, 0, 1, acc);
  store(r, yr, count, acc);
#endif
}
