// The launchers of every CUDA kernel in kernels/ (DESIGN.md §7.8: one op family per file, one
// launcher contract). Each takes the stream, the op's HAL argument struct (runtime/hal/ops.h: its
// shapes and scalars; its buffer views are ignored) and the device pointers the CUDA stream has
// resolved and bounds-checked for it; it validates nothing, enqueues its kernels and returns
// cudaGetLastError() (cudaSuccess when n is 0).
//
// Errors found in the data (a token id outside the vocabulary, a KV slot or block id outside the
// cache) are written into `err` (4 ints on the device, zero when none): err[0] a kind (kErr*),
// err[1..3] the op's values; the first error wins. The stream reads it back at sync.
//
// Threading: launchers are reentrant; each call enqueues on `stream` only.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "runtime/hal/ops.h"

namespace sx::kernels {

enum DeviceError : int {
  kErrNone = 0,
  kErrEmbeddingId = 1,
  kErrAttentionBlock = 2,
  kErrKvSlot = 3,
  kErrAttentionContext = 4,  // a sequence's context shorter than its new tokens, or beyond its blocks
};

cudaError_t launch_add(cudaStream_t s, const hal::AddArgs& a, const float* x, const float* y, float* out);
cudaError_t launch_silu_mul(cudaStream_t s, const hal::SiluMulArgs& a, const float* gate, const float* up, float* out);
cudaError_t launch_rmsnorm(cudaStream_t s, const hal::RmsNormArgs& a, float* x, const float* add, const float* weight,
                           float* out);
// rope in double precision like the CPU reference (backends/cpu/ops/rope.cpp).
cudaError_t launch_rope(cudaStream_t s, const hal::RopeArgs& a, float* x, const std::int32_t* positions);
cudaError_t launch_embedding(cudaStream_t s, const hal::EmbeddingArgs& a, const std::uint8_t* table,
                             const std::int32_t* ids, float* out, int* err);
// cache_type F32 or F16.
cudaError_t launch_kv_write(cudaStream_t s, const hal::KvWriteArgs& a, const float* k, const float* v, void* k_cache,
                            void* v_cache, const std::int32_t* slots, int* err);
struct AttentionPtrs {
  const float* q;
  const void* k_cache;
  const void* v_cache;
  float* out;
  const std::int32_t* seq_token_start;
  const std::int32_t* seq_context_len;
  const std::int32_t* block_table;
};
// head_dim <= 256, cache F32 or F16. splits > 1 (backends/cuda/launch_plan.h plan_attention):
// each (token, head)'s context in splits of `chunk` positions, partial states in `partials`
// (n_tokens x n_heads x splits x (head_dim + 2) floats), combined into out by a second kernel.
cudaError_t launch_attention(cudaStream_t s, const hal::AttentionArgs& a, const AttentionPtrs& p, int* err,
                             std::int64_t splits = 1, std::int64_t chunk = 0, float* partials = nullptr);
cudaError_t launch_top_k(cudaStream_t s, const hal::TopKArgs& a, const float* x, float* values, std::int32_t* ids);

// Gated DeltaNet and gated attention (kernels/deltanet.cu). The state ops' batch arrays are the
// engine's, checked before the step; d_k, d_v <= 256.
cudaError_t launch_sigmoid_mul(cudaStream_t s, const hal::SigmoidMulArgs& a, const float* x, const float* gate,
                               float* out);
cudaError_t launch_gated_norm(cudaStream_t s, const hal::GatedNormArgs& a, const float* x, const float* z,
                              const float* weight, float* out);
struct ConvStatePtrs {
  const float* x;
  const float* weight;
  float* state;
  float* out;
  const std::int32_t *seq_token_start, *seq_context_len, *seq_slot;
};
cudaError_t launch_conv_state(cudaStream_t s, const hal::ConvStateArgs& a, const ConvStatePtrs& p);
struct DeltaRulePtrs {
  const float *q, *k, *v, *alpha, *beta, *a, *dt_bias;
  float* state;
  float* out;
  const std::int32_t *seq_token_start, *seq_context_len, *seq_slot;
};
cudaError_t launch_delta_rule(cudaStream_t s, const hal::DeltaRuleArgs& a, const DeltaRulePtrs& p);

// y[m][n] = x[m][:] . W[n][:] (+ bias) for m <= 8, W in any weight format (kernels/dequant.cuh):
// one warp per output row reads the row once for all m rows of x.
cudaError_t launch_gemv(cudaStream_t s, const hal::MatmulArgs& a, const std::uint8_t* w, const float* x,
                        const float* bias, float* y);
// Rows [row_begin, row_begin + rows) of W (k columns of `w_type`, row_bytes each) as F32 into
// out[rows][k].
cudaError_t launch_dequantize_rows(cudaStream_t s, int w_type, const std::uint8_t* w, std::size_t row_bytes,
                                   std::int64_t row_begin, std::int64_t rows, std::int64_t k, float* out);
// Q8_0 with 8-bit activations, the CPU's arithmetic to the bit (matmul_q8.cu): rows of x
// quantised into qs (int8 [rows][k]) and d (F32 [rows][k / 32]), then y[m][n] (+ bias) from them
// and the Q8_0 weight rows w; m <= 524280 a call (grid.y).
cudaError_t launch_quantize_q8(cudaStream_t s, const float* x, std::int64_t rows, std::int64_t k, std::int8_t* qs,
                               float* d);
cudaError_t launch_gemm_q8(cudaStream_t s, const std::uint8_t* w, const std::int8_t* qs, const float* d,
                           const float* bias, float* y, std::int64_t m, std::int64_t n, std::int64_t k);
// y[r][:] += bias[:] for m rows of n.
cudaError_t launch_add_bias(cudaStream_t s, float* y, const float* bias, std::int64_t m, std::int64_t n);

// Mixtures of experts (moe.cu). The router: one block per token, the softmax of its logits and the
// k most probable experts in top_k_before's order with their (renormalised) probabilities.
cudaError_t launch_moe_router(cudaStream_t s, const hal::MoeRouterArgs& a, const float* logits, std::int32_t* ids,
                              float* weights);
// The routed experts' FFNs (hal::MoeFfnArgs) through `ws`, laid out by
// cuda::plan_moe_workspace: routes [n_local][n_tokens] and counts [n_local] (int32), gate and up
// outputs [n_tokens * k][ffn], down outputs [n_tokens * k][dim] (F32). n_local and
// n_tokens / 8 at most 65535 (grid.z, grid.y: the stream checks).
struct MoePtrs {
  const float* x;
  const std::int32_t* ids;
  const float* weights;
  const std::uint8_t* gate;
  const std::uint8_t* up;
  const std::uint8_t* down;
  float* out;
};
struct MoeScratch {
  std::int32_t* routes;
  std::int32_t* counts;
  float* gate;
  float* up;
  float* down;
};
cudaError_t launch_moe_ffn(cudaStream_t s, const hal::MoeFfnArgs& a, const MoePtrs& p, const MoeScratch& ws);

// The channels' device work (collective.cu). RankBuffers: one buffer per rank of a group on one
// GPU (the loopback channel), at most kMaxLoopbackRanks.
inline constexpr int kMaxLoopbackRanks = 16;
struct RankBuffers {
  void* data[kMaxLoopbackRanks];
};
// In place on every rank's buffer: element i = the sum over ranks 0, 1, ... of element i, added in
// rank order in F32 and rounded once to `dtype` (F32, F16 or BF16), as the CPU's channel sums.
cudaError_t launch_rank_sum(cudaStream_t s, const RankBuffers& b, int ranks, std::int64_t n, hal::DType dtype);
// dst[i] = src[i] as F32 (src F16, BF16 or F32); and back, rounded to nearest even.
cudaError_t launch_widen(cudaStream_t s, const void* src, hal::DType dtype, float* dst, std::int64_t n);
cudaError_t launch_narrow(cudaStream_t s, const float* src, hal::DType dtype, void* dst, std::int64_t n);

// The probe of the preflight: writes 0x5e7a47 to *out. Fails with cudaErrorNoKernelImageForDevice
// (or cudaErrorInvalidDeviceFunction) where this build has no code for the device.
cudaError_t launch_probe(cudaStream_t s, int* out);

}  // namespace sx::kernels
