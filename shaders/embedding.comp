// out[t][:] = dequant(table[ids[t]][:]) (hal::EmbeddingArgs) for tables in every format quant.glsl
// reads (row-major file layout), one invocation per output element. The table is bound in windows
// of rows: this dispatch holds rows [win_begin, win_begin + win_rows) of the (shard's) table and
// writes only the tokens whose row is there; the first window also writes the zero rows of ids
// outside a vocab shard and reports an id outside an unsharded vocabulary in the error word
// (err[0] = 1, then position, id, vocab: the stream turns it into OUT_OF_RANGE at sync).
#version 450
#extension GL_GOOGLE_include_directive : require
layout(local_size_x = 256) in;
layout(std430, binding = 0) readonly buffer W { uint w[]; };  // the table
layout(std430, binding = 1) readonly buffer Ids { int ids[]; };
layout(std430, binding = 2) writeonly buffer O { float o[]; };
layout(std430, binding = 3) buffer E { uint err[]; };
layout(push_constant) uniform Params {
  uint w_off, i_off, o_off, e_off;
  uint n_tokens, dim, vocab, shard;
  int vocab_offset;
  uint format, row_bytes, win_begin, win_rows, first_window;
  uint gx;
} p;

#include "quant.glsl"

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
  o[p.o_off + e] = w_element(p.format, (row - p.win_begin) * p.row_bytes, j);
}
