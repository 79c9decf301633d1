// Reading weights in their file formats (hal/quant.h) from a uint buffer `W` bound as `w[]` with
// element offset p.w_off: bytes, halves and one element of a row, for the formats the matmul and
// embedding shaders read. Included by them after their buffer declarations.
uint w_byte(uint a) { return (w[p.w_off + a / 4] >> (8 * (a % 4))) & 0xffu; }
uint w_u16(uint a) { return (w[p.w_off + a / 4] >> (8 * (a % 4))) & 0xffffu; }  // a even
uint w_u32(uint a) { return w_byte(a) | (w_byte(a + 1) << 8) | (w_byte(a + 2) << 16) | (w_byte(a + 3) << 24); }
float w_half(uint a) { return unpackHalf2x16(w_u16(a)).x; }

const uint kF32 = 0, kF16 = 1, kBF16 = 2, kQ8_0 = 3, kQ5_0 = 4, kQ4_0 = 5, kQ4_1 = 6, kQ5_1 = 7, kQ4_K = 8,
           kQ5_K = 9, kQ6_K = 10;

// The 6-bit scale (x) and min (y) of sub-block j of a Q4_K / Q5_K super-block at `s`.
uvec2 k_scale_min(uint s, uint j) {
  if (j < 4) return uvec2(w_byte(s + j) & 63u, w_byte(s + j + 4) & 63u);
  return uvec2((w_byte(s + j + 4) & 0xfu) | ((w_byte(s + j - 4) >> 6) << 4),
               (w_byte(s + j + 4) >> 4) | ((w_byte(s + j) >> 6) << 4));
}

// Element j of the row starting at byte `base`.
float w_element(uint format, uint base, uint j) {
  if (format == kF32) return uintBitsToFloat(w[p.w_off + base / 4 + j]);
  if (format == kF16) return w_half(base + 2 * j);
  if (format == kBF16) return uintBitsToFloat(w_u16(base + 2 * j) << 16);
  if (format <= kQ5_1) {  // blocks of 32
    const uint i = j % 32;
    if (format == kQ8_0) {
      const uint blk = base + (j / 32) * 34;
      return float(int(w_byte(blk + 2 + i) << 24) >> 24) * w_half(blk);
    }
    if (format == kQ4_0) {
      const uint blk = base + (j / 32) * 18, q = w_byte(blk + 2 + i % 16);
      return float(int(i < 16 ? (q & 0xfu) : (q >> 4)) - 8) * w_half(blk);
    }
    if (format == kQ4_1) {
      const uint blk = base + (j / 32) * 20, q = w_byte(blk + 4 + i % 16);
      return float(i < 16 ? (q & 0xfu) : (q >> 4)) * w_half(blk) + w_half(blk + 2);
    }
    const bool q5_1 = format == kQ5_1;
    const uint blk = base + (j / 32) * (q5_1 ? 24 : 22);
    const uint qh = w_u32(blk + (q5_1 ? 4 : 2)), q = w_byte(blk + (q5_1 ? 8 : 6) + i % 16);
    const uint v = (i < 16 ? (q & 0xfu) : (q >> 4)) | (((qh >> i) & 1u) << 4);
    return q5_1 ? float(v) * w_half(blk) + w_half(blk + 2) : float(int(v) - 16) * w_half(blk);
  }
  const uint e = j % 256;
  if (format == kQ6_K) {
    const uint blk = base + (j / 256) * 210;
    const uint h = e / 128, r = e % 128, quarter = r / 32, l = r % 32;
    const uint ql = w_byte(blk + 64 * h + l + (quarter % 2) * 32);
    const uint nib = quarter < 2 ? (ql & 0xfu) : (ql >> 4);
    const uint hb = (w_byte(blk + 128 + 32 * h + l) >> (2 * quarter)) & 3u;
    const float sc = float(int(w_byte(blk + 192 + 8 * h + l / 16 + 2 * quarter) << 24) >> 24);
    return w_half(blk + 208) * sc * float(int(nib | (hb << 4)) - 32);
  }
  // Q4_K (144 bytes: d, dmin, scales[12], qs[128]) and Q5_K (176: ..., qh[32] before qs).
  const bool q5 = format == kQ5_K;
  const uint blk = base + (j / 256) * (q5 ? 176 : 144);
  const uint c = e / 64, hi = (e % 64) / 32, l = e % 32;
  const uvec2 sm = k_scale_min(blk + 4, 2 * c + hi);
  const uint qb = w_byte(blk + (q5 ? 48 : 16) + 32 * c + l);
  uint q = hi == 0 ? (qb & 0xfu) : (qb >> 4);
  if (q5 && ((w_byte(blk + 16 + l) >> (2 * c + hi)) & 1u) != 0) q += 16;
  return w_half(blk) * float(sm.x) * float(q) - w_half(blk + 2) * float(sm.y);
}
