// CPU implementations of the HAL op set (except matmul, in kernels/). Each takes the HAL argument
// struct with its buffers already resolved to host pointers and checked against their sizes.
// Threading: each call may use the whole pool; one call at a time per pool.
#pragma once

#include <cstdint>

#include "runtime/base/status.h"
#include "runtime/base/thread_pool.h"
#include "runtime/hal/dtype.h"
#include "runtime/hal/ops.h"

namespace sx::cpu {

// `rows`: the table's (a layout's plain tail begins by it).
void embedding(ThreadPool& pool, const void* table, hal::DType type, std::int64_t rows, const std::int32_t* ids,
               float* out, std::int64_t n_tokens, std::int64_t dim);

void rmsnorm(ThreadPool& pool, float* x, const float* add, const float* weight, float* out,
             std::int64_t n_rows, std::int64_t dim, float eps);

void rope_neox(ThreadPool& pool, float* x, const std::int32_t* positions, std::int64_t n_tokens,
               std::int64_t n_heads, std::int64_t head_dim, std::int64_t rot_dim, float theta);

struct AttentionPtrs {
  const float* q;
  const void* k_cache;
  const void* v_cache;
  float* out;
  const std::int32_t* seq_token_start;
  const std::int32_t* seq_context_len;
  const std::int32_t* block_table;
};
struct AttentionShape {
  hal::DType cache_type;
  std::int64_t n_seqs, n_tokens, n_heads, n_kv_heads, head_dim, block_size, max_blocks_per_seq;
  std::int64_t q_head_offset, kv_head_offset, heads_per_kv;
  float scale;
};
void paged_attention(ThreadPool& pool, const AttentionPtrs& p, const AttentionShape& s);

void kv_write(ThreadPool& pool, const float* k, const float* v, void* k_cache, void* v_cache,
              hal::DType cache_type, const std::int32_t* slots, std::int64_t n_tokens,
              std::int64_t n_kv_heads, std::int64_t head_dim);

void silu_mul(ThreadPool& pool, const float* gate, const float* up, float* out, std::int64_t n_rows,
              std::int64_t n_cols, std::int64_t gate_stride, std::int64_t up_stride,
              std::int64_t out_stride);

void add(ThreadPool& pool, const float* a, const float* b, float* out, std::int64_t n);

// hal::TopKArgs: per row the k first of hal::top_k_before's order, ids offset by id_offset.
void top_k_rows(ThreadPool& pool, const float* x, float* values, std::int32_t* ids, std::int64_t n_rows,
                std::int64_t n_cols, std::int64_t k, std::int64_t id_offset);

// hal::MoeRouterArgs: per token softmax, the k most probable experts (top_k_before's order), their
// probabilities (divided by their sum when `normalize`).
void moe_router(ThreadPool& pool, const float* logits, std::int32_t* ids, float* weights, std::int64_t n_tokens,
                std::int64_t n_experts, std::int64_t k, bool normalize);

// hal::MoeFfnArgs with its buffers resolved; gate_type / up_type / down_type are the types the
// kernels read (the buffers' layouts). Errors: an interleaved layout whose groups straddle experts.
class Scratch;
struct MoeFfnPtrs {
  const float* x;
  const std::int32_t* ids;
  const float* weights;
  const void *gate, *up, *down;
  hal::DType gate_type, up_type, down_type;
  float* out;
};
Status moe_ffn(ThreadPool& pool, Scratch& scratch, const MoeFfnPtrs& p, const hal::MoeFfnArgs& a);

// The batch of a state op (hal::ConvStateArgs, hal::DeltaRuleArgs), checked by hal::check_state_batch.
struct StateBatch {
  const std::int32_t* seq_token_start;
  const std::int32_t* seq_context_len;
  const std::int32_t* seq_slot;
  std::int64_t n_seqs;
};

// hal::ConvStateArgs: x rows of x_stride, weight [channels][kernel], state [slots][kernel - 1][channels].
void conv_state(ThreadPool& pool, const float* x, std::int64_t x_stride, const float* weight, float* state, float* out,
                const StateBatch& b, std::int64_t channels, std::int64_t kernel);

// hal::DeltaRuleArgs with its buffers resolved and its strides made explicit; a.chunk picks the form.
struct DeltaRulePtrs {
  const float *q, *k, *v, *alpha, *beta, *a, *dt_bias;
  float* state;
  float* out;
  StateBatch batch;
  std::int64_t qkv_stride, gate_stride;
};
void delta_rule(ThreadPool& pool, const DeltaRulePtrs& p, const hal::DeltaRuleArgs& a);

// hal::GatedNormArgs: out may alias x.
void gated_norm(ThreadPool& pool, const float* x, const float* z, const float* weight, float* out,
                std::int64_t n_rows, std::int64_t dim, float eps);

// hal::SigmoidMulArgs with explicit strides.
void sigmoid_mul(ThreadPool& pool, const float* x, const float* gate, float* out, std::int64_t n_rows,
                 std::int64_t n_cols, std::int64_t x_stride, std::int64_t gate_stride, std::int64_t out_stride,
                 bool gate_per_row);

// Vectorised helpers shared by the ops.
float dot_f32(const float* a, const float* b, std::int64_t n);
void axpy_f32(float a, const float* x, float* y, std::int64_t n);  // y += a * x
void load_row_f32(hal::DType type, const void* row, float* dst, std::int64_t n);  // F32/F16/BF16/Q8_0
// x[i] = exp(x[i] - shift) for i < n; returns the sum of the results. Relative error < 2e-7.
float exp_shifted_sum(float* x, std::int64_t n, float shift);
// out[i] = silu(gate[i]) * up[i] = gate[i] / (1 + exp(-gate[i])) * up[i].
void silu_mul_row(const float* gate, const float* up, float* out, std::int64_t n);

}  // namespace sx::cpu
