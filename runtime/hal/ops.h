// The HAL op set (DESIGN.md §4): a small, fixed list of operations, each described by a plain
// argument struct. The same struct is used by every backend's kernel and by the CPU reference, so
// "the same call means the same thing on every backend".
//
// Conventions for every op:
// - Tensors are BufView = (buffer, byte offset). Activations are row-major F32; integer tensors
//   (ids, positions, slot mappings, block tables) are I32.
// - Weights are [n rows][k columns] in their storage format (GGUF order: ne[0] = k is contiguous).
// - Matmul computes y[m][n] = sum_k x[m][k] * W[n][k] (+ bias[n]); accumulation is F32.
// - An optional tensor is absent when its buffer is null.
// Lifetime: argument structs hold non-owning pointers; the buffers must outlive the op's
// execution on its stream (i.e. until the next sync()).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <variant>

#include "runtime/base/op_limits.h"
#include "runtime/hal/dtype.h"

namespace sx::hal {

class Buffer;

struct BufView {
  Buffer* buffer = nullptr;
  std::size_t offset = 0;  // bytes
  explicit operator bool() const { return buffer != nullptr; }
  BufView at(std::size_t extra_bytes) const { return {buffer, offset + extra_bytes}; }
};

// out[i][:] = dequant(table[ids[i]][:]) for i < n_tokens.
// A vocab shard (tensor parallelism) holds rows [vocab_offset, vocab_offset + vocab) of the full
// table: an id outside that range gives a zero row (another rank holds it; the ranks' outputs are
// summed). Without a shard an id outside [0, vocab) is an error.
struct EmbeddingArgs {
  BufView table;  // [vocab][dim] in table_type
  DType table_type = DType::kF32;
  BufView ids;    // I32 [n_tokens]
  BufView out;    // F32 [n_tokens][dim]
  std::int64_t n_tokens = 0, dim = 0, vocab = 0;
  bool shard = false;
  std::int64_t vocab_offset = 0;
};

// If add is present: x += add (written back to x). Then out = x * rsqrt(mean(x^2) + eps) * weight.
struct RmsNormArgs {
  BufView x;       // F32 [n_rows][dim]
  BufView add;     // optional F32 [n_rows][dim]
  BufView weight;  // F32 [dim]
  BufView out;     // F32 [n_rows][dim] (may alias nothing else)
  std::int64_t n_rows = 0, dim = 0;
  float eps = 1e-6f;
};

// y[m][n] = x[m][:] . W[n][:] (+ bias[n]).
struct MatmulArgs {
  BufView w;  // [n][k] in w_type
  DType w_type = DType::kF32;
  BufView x;     // F32 [m][k]
  BufView bias;  // optional F32 [n]
  BufView y;     // F32 [m][n]
  std::int64_t m = 0, n = 0, k = 0;
};

// NeoX rotary embedding in place: for each token t and head h, pairs (i, i + rot_dim/2) of
// x[t][h][:] rotate by angle pos[t] * theta^(-2i/rot_dim).
struct RopeArgs {
  BufView x;          // F32 [n_tokens][n_heads][head_dim]
  BufView positions;  // I32 [n_tokens]
  std::int64_t n_tokens = 0, n_heads = 0, head_dim = 0, rot_dim = 0;
  float theta = 10000.0f;
};

// Writes this step's K and V rows into the paged cache: cache[slot_mapping[t]][h][:] = k[t][h][:].
// A slot is block_id * block_size + offset. Negative slots are skipped (padding).
struct KvWriteArgs {
  BufView k, v;              // F32 [n_tokens][n_kv_heads][head_dim]
  BufView k_cache, v_cache;  // cache_type [n_slots][n_kv_heads][head_dim]
  DType cache_type = DType::kF32;
  BufView slot_mapping;      // I32 [n_tokens]
  std::int64_t n_tokens = 0, n_kv_heads = 0, head_dim = 0, n_slots = 0;
};

// Causal attention over a batch of sequences whose KV lives in paged blocks.
// Sequence s owns batch tokens [seq_token_start[s], seq_token_start[s+1]); its context after this
// step has seq_context_len[s] tokens, so its j-th new token (of c) is at position
// seq_context_len[s] - c + j and attends to cache positions [0, that position].
// Position p of sequence s is at slot block_table[s * max_blocks_per_seq + p / block_size] *
// block_size + p % block_size. Local query head h (global head q_head_offset + h) reads local KV
// head (q_head_offset + h) / heads_per_kv - kv_head_offset.
struct AttentionArgs {
  BufView q;                  // F32 [n_tokens][n_heads][head_dim]
  BufView k_cache, v_cache;   // cache_type [n_slots][n_kv_heads][head_dim]
  DType cache_type = DType::kF32;
  BufView out;                // F32 [n_tokens][n_heads][head_dim]
  BufView seq_token_start;    // I32 [n_seqs + 1]
  BufView seq_context_len;    // I32 [n_seqs]
  BufView block_table;        // I32 [n_seqs][max_blocks_per_seq]
  std::int64_t n_seqs = 0, n_tokens = 0, n_heads = 0, n_kv_heads = 0, head_dim = 0;
  std::int64_t block_size = 16, max_blocks_per_seq = 0, n_slots = 0;
  std::int64_t q_head_offset = 0, kv_head_offset = 0, heads_per_kv = 1;
  float scale = 1.0f;
};

// out[i] = silu(gate[i]) * up[i], rows of n_cols with separate row strides (elements) so that gate
// and up may be the two halves of one fused projection.
struct SiluMulArgs {
  BufView gate, up, out;  // F32
  std::int64_t n_rows = 0, n_cols = 0;
  std::int64_t gate_stride = 0, up_stride = 0, out_stride = 0;  // 0 = n_cols
};

// out[i] = a[i] + b[i] for n elements (F32). out may alias a.
struct AddArgs {
  BufView a, b, out;
  std::int64_t n = 0;
};

// The k largest values of each row and their column indices, for selecting tokens on the device
// (greedy is k = 1) so that only the candidates are read back. Order: larger value first, the
// lower index first among equal values, NaN below every number (and equal to NaN). values[r][i]
// is the i-th of row r, ids[r][i] its column + id_offset (the vocab shard's first token id).
// 1 <= k <= min(n_cols, kMaxTopK) (runtime/base/op_limits.h: the model config reads it too).
using op_limits::kMaxTopK;
// The order of TopKArgs: true when value a at index ia comes before value b at index ib.
inline bool top_k_before(float a, std::int64_t ia, float b, std::int64_t ib) {
  const bool a_nan = a != a, b_nan = b != b;
  if (a_nan != b_nan) return b_nan;
  if (a_nan || a == b) return ia < ib;
  return a > b;
}
struct TopKArgs {
  BufView x;       // F32 [n_rows][n_cols]
  BufView values;  // F32 [n_rows][k]
  BufView ids;     // I32 [n_rows][k]
  std::int64_t n_rows = 0, n_cols = 0, k = 1, id_offset = 0;
};

// The router of a mixture of experts (Qwen3-MoE): per token, a softmax over its n_experts router
// logits, the k most probable experts (larger probability first, the lower id first among equal
// ones: top_k_before's order), and their probabilities as weights, divided by their sum when
// `normalize` (norm_topk_prob). 1 <= k <= min(n_experts, kMaxTopK).
struct MoeRouterArgs {
  BufView logits;   // F32 [n_tokens][n_experts]
  BufView ids;      // I32 [n_tokens][k]
  BufView weights;  // F32 [n_tokens][k]
  std::int64_t n_tokens = 0, n_experts = 0, k = 1;
  bool normalize = true;
};

// The routed experts' SwiGLU FFNs, summed with the router's weights, for the experts a rank holds:
//   out[t] = sum over j < k with e = ids[t][j] in [expert_begin, expert_begin + n_local) of
//            weights[t][j] * down_e(silu(gate_e . x[t]) * (up_e . x[t]))
// (zero for a token routed to none of them: expert parallelism sums the ranks' outputs). The
// experts' matrices are stacked, local expert i's rows after those of i - 1: gate and up
// [n_local * ffn][dim] in gate_type / up_type, down [n_local * dim][ffn] in down_type, as
// Device::upload_weight prepared them whole (WeightDesc rows = n_local * ffn, resp. n_local * dim).
// A backend computes each expert once per step over the tokens routed to it, so its weights are
// read once whatever the batch.
struct MoeFfnArgs {
  BufView x;                // F32 [n_tokens][dim]
  BufView ids, weights;     // I32 / F32 [n_tokens][k] (MoeRouterArgs)
  BufView gate, up, down;   // stacked expert weights
  DType gate_type = DType::kF32, up_type = DType::kF32, down_type = DType::kF32;
  BufView out;              // F32 [n_tokens][dim]
  std::int64_t n_tokens = 0, dim = 0, ffn = 0, k = 1;
  std::int64_t expert_begin = 0, n_local = 0;
};

// ---- Gated DeltaNet (Qwen3.5 / 3.6 / 3.8 linear-attention layers) and gated attention ----
// The DeltaNet ops take a batch of sequences as AttentionArgs does: sequence s owns batch tokens
// [seq_token_start[s], seq_token_start[s+1]) and has seq_context_len[s] tokens after this step; its
// recurrent state lives in slot seq_slot[s] of a state pool. A sequence whose context equals its
// new tokens starts in this step: its state is read as zeros (the slot need not be cleared).
// Sequences must use distinct slots.

// The causal depthwise convolution over a layer's q|k|v channels, then SiLU:
//   out[t][c] = silu(sum_{j < kernel} weight[c][j] * in[t - (kernel - 1) + j][c])
// where inputs before the step's first token come from the sequence's state (its last kernel - 1
// inputs, oldest first). Afterwards the state holds the sequence's last kernel - 1 inputs.
struct ConvStateArgs {
  BufView x;                // F32 [n_tokens][x_stride], channels [0, channels) used
  BufView weight;           // F32 [channels][kernel] (GGUF ssm_conv1d: ne [kernel, channels])
  BufView state;            // F32 [n_slots][kernel - 1][channels]
  BufView out;              // F32 [n_tokens][channels]
  BufView seq_token_start;  // I32 [n_seqs + 1]
  BufView seq_context_len;  // I32 [n_seqs]
  BufView seq_slot;         // I32 [n_seqs]
  std::int64_t n_seqs = 0, n_tokens = 0, channels = 0, kernel = 4, n_slots = 0;
  std::int64_t x_stride = 0;  // 0 = channels
};

// The gated delta rule. V head h reads K head g = h % n_k_heads when `tiled` (llama.cpp's GGUF
// order), h / (n_v_heads / n_k_heads) otherwise (the Hugging Face checkpoint's), and keeps the state
// S = state[slot][h], d_k x d_v (S[i][j] at i * d_v + j). For each of a sequence's tokens in order:
//   qn = q_g / sqrt(|q_g|^2 + eps) * scale,  kn = k_g / sqrt(|k_g|^2 + eps)
//   decay = exp(a[h] * softplus(alpha[t][h] + dt_bias[h])),  b = sigmoid(beta[t][h])
//   S = decay * S;  S = S + kn (b (v_h - S^T kn))^T;  out[t][h] = S^T qn
// and the last S is written back. chunk == 0 computes it token by token (the recurrent form, which
// the engine runs: a sequence's bits do not depend on how its tokens are split into steps);
// chunk > 0 takes a sequence's tokens in the equivalent chunked form over chunks at absolute
// positions [k chunk, (k + 1) chunk) (the state read and written once per chunk; a step that starts
// inside a chunk takes the rest of it first), equal to the recurrent form within F32 rounding, and
// to itself bit for bit over any split into steps that end on multiples of chunk.
struct DeltaRuleArgs {
  BufView q, k, v;          // F32 rows of qkv_stride: q [n_k_heads][d_k], k [n_k_heads][d_k], v [n_v_heads][d_v]
  BufView alpha, beta;      // F32 [n_tokens][gate_stride], heads [0, n_v_heads) used
  BufView a, dt_bias;       // F32 [n_v_heads] (a = -exp(A_log), as GGUF's ssm_a stores it)
  BufView state;            // F32 [n_slots][n_v_heads][d_k][d_v]
  BufView out;              // F32 [n_tokens][n_v_heads][d_v]
  BufView seq_token_start;  // I32 [n_seqs + 1]
  BufView seq_context_len;  // I32 [n_seqs]
  BufView seq_slot;         // I32 [n_seqs]
  std::int64_t n_seqs = 0, n_tokens = 0, n_k_heads = 0, n_v_heads = 0, d_k = 0, d_v = 0, n_slots = 0;
  std::int64_t qkv_stride = 0, gate_stride = 0;  // 0 = 2 * n_k_heads * d_k + n_v_heads * d_v, resp. n_v_heads
  std::int64_t chunk = 0;
  bool tiled = true;
  float eps = 1e-6f, scale = 1.0f;
};

// out[r][:] = x[r][:] * rsqrt(mean(x[r]^2) + eps) * weight * silu(z[r][:]) over rows of dim
// (Gated DeltaNet's output norm, one row per token and V head, the weight shared by the heads).
struct GatedNormArgs {
  BufView x, z;     // F32 [n_rows][dim]
  BufView weight;   // F32 [dim]
  BufView out;      // F32 [n_rows][dim] (may alias x)
  std::int64_t n_rows = 0, dim = 0;
  float eps = 1e-6f;
};

// out[r][c] = x[r][c] * sigmoid(gate[r][c]) (gated attention's output gate), rows of n_cols with
// row strides in elements (0 = n_cols) so that the gate may be read where a projection interleaves
// it with something else. With gate_per_row, one gate value per row: gate[r * gate_stride] (0 =
// 1; a shared expert's gate). out may alias x.
struct SigmoidMulArgs {
  BufView x, gate, out;  // F32
  std::int64_t n_rows = 0, n_cols = 0;
  std::int64_t x_stride = 0, gate_stride = 0, out_stride = 0;
  bool gate_per_row = false;
};

using Op = std::variant<EmbeddingArgs, RmsNormArgs, MatmulArgs, RopeArgs, KvWriteArgs,
                        AttentionArgs, SiluMulArgs, AddArgs, TopKArgs, MoeRouterArgs, MoeFfnArgs,
                        ConvStateArgs, DeltaRuleArgs, GatedNormArgs, SigmoidMulArgs>;

std::string_view op_name(const Op& op);
// The op with what a backend's support depends on, for errors: "matmul with q4_k weights
// [4864 x 896]", "attention with head size 128, 7 query heads per KV head, KV cache in f16".
std::string describe_op(const Op& op);

}  // namespace sx::hal
