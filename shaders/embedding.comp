// out[t][:] = dequant(table[ids[t]][:]) (hal::EmbeddingArgs) for tables in f32, f16, bf16, q8_0 and
// q5_0 (row-major file layout), one invocation per output element. The table is bound in windows
// of rows: this dispatch holds rows [win_begin, win_begin + win_rows) of the (shard's) table and
// writes only the tokens whose row is there; the first window also writes the zero rows of ids
// outside a vocab shard and reports an id outside an unsharded vocabulary in the error word
// (err[0] = 1, then position, id, vocab: the stream turns it into OUT_OF_RANGE at sync).
#version 450
layout(local_size_x = 256) in;
layout(std430, binding = 0) readonly buffer T { uint table[]; };
layout(std430, binding = 1) readonly buffer Ids { int ids[]; };
layout(std430, binding = 2) writeonly buffer O { float o[]; };
layout(std430, binding = 3) buffer E { uint err[]; };
layout(push_constant) uniform Params {
  uint t_off, i_off, o_off, e_off;
  uint n_tokens, dim, vocab, shard;
  int vocab_offset;
  uint format, row_bytes, win_begin, win_rows, first_window;
  uint gx;
} p;

const uint kF32 = 0, kF16 = 1, kBF16 = 2, kQ8_0 = 3, kQ5_0 = 4;

// Bytes of the window (addresses relative to the bound table).
uint byte_at(uint a) { return (table[p.t_off + a / 4] >> (8 * (a % 4))) & 0xffu; }
uint u16_at(uint a) { return (table[p.t_off + a / 4] >> (8 * (a % 4))) & 0xffffu; }  // a even
uint u32_at(uint a) { return byte_at(a) | (byte_at(a + 1) << 8) | (byte_at(a + 2) << 16) | (byte_at(a + 3) << 24); }
float half_at(uint a) { return unpackHalf2x16(u16_at(a)).x; }

float element(uint row, uint j) {
  const uint base = row * p.row_bytes;
  if (p.format == kF32) return uintBitsToFloat(table[p.t_off + (base / 4) + j]);
  if (p.format == kF16) return half_at(base + 2 * j);
  if (p.format == kBF16) return uintBitsToFloat(u16_at(base + 2 * j) << 16);
  const uint b = j / 32, i = j % 32;
  if (p.format == kQ8_0) {
    const uint blk = base + b * 34;
    const int q = int(byte_at(blk + 2 + i) << 24) >> 24;  // sign-extended
    return float(q) * half_at(blk);
  }
  // kQ5_0: d, qh (32 high bits, little-endian), 16 bytes of nibble pairs (j, j + 16).
  const uint blk = base + b * 22;
  const uint qh = u32_at(blk + 2);
  const uint qs = byte_at(blk + 6 + (i % 16));
  const uint lo = i < 16 ? (qs & 0xfu) : (qs >> 4);
  const uint hi = ((qh >> i) & 1u) << 4;
  return float(int(lo | hi) - 16) * half_at(blk);
}

void main() {
  const uint e = (gl_WorkGroupID.x + gl_WorkGroupID.y * p.gx) * 256 + gl_LocalInvocationID.x;
  if (e >= p.n_tokens * p.dim) return;
  const uint t = e / p.dim, j = e % p.dim;
  const int id = ids[p.i_off + t];
  const int local = p.shard != 0 ? id - p.vocab_offset : id;
  if (local < 0 || local >= int(p.vocab)) {
    if (p.first_window == 0) return;
    if (p.shard != 0) {
      o[p.o_off + e] = 0.0;  // another rank holds the row; the ranks' outputs are summed
    } else if (j == 0 && atomicCompSwap(err[p.e_off], 0u, 1u) == 0u) {
      err[p.e_off + 1] = t;
      err[p.e_off + 2] = uint(id);
      err[p.e_off + 3] = p.vocab;
    }
    return;
  }
  const uint row = uint(local);
  if (row < p.win_begin || row >= p.win_begin + p.win_rows) return;
  o[p.o_off + e] = element(row - p.win_begin, j);
}
