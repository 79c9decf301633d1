// Argument checks of HAL ops that every backend makes the same way (backends add their own
// limits). Kept out of ops.h, which the CUDA kernels include (nvcc does not compile fmt, which
// Status brings).
#pragma once

#include <cstdint>
#include <string_view>

#include "runtime/base/status.h"
#include "runtime/hal/ops.h"

namespace sx::hal {

// A MoeFfnArgs: counts (tokens >= 0, dim, ffn > 0, 1 <= k <= kMaxTopK, local experts >= 0 from
// expert_begin >= 0, ids within int32) and the experts' rows whole blocks of their formats.
// INVALID_ARGUMENT naming the field.
Status check_moe_ffn(const MoeFfnArgs& a);

// What the DeltaNet ops are written for on every backend (the kernel and head limits in
// runtime/base/op_limits.h, which the model config reads too).
using op_limits::kMaxConvKernel;
using op_limits::kMaxDeltaHeadDim;
inline constexpr std::int64_t kMaxDeltaChunk = 128;

// A ConvStateArgs' counts: sequences, tokens and slots >= 0, channels > 0 within rows of x_stride,
// 2 <= kernel <= kMaxConvKernel. INVALID_ARGUMENT naming the field.
Status check_conv_state(const ConvStateArgs& a);
// A DeltaRuleArgs' counts: heads > 0 with V heads a multiple of K heads, head sizes up to
// kMaxDeltaHeadDim, strides that hold the rows, 0 <= chunk <= kMaxDeltaChunk.
Status check_delta_rule(const DeltaRuleArgs& a);
// The batch of a state op, read on the host: seq_token_start spans [0, n_tokens] in order, each
// context holds its new tokens, each slot is in [0, n_slots) and no two sequences share one.
Status check_state_batch(std::string_view op, const std::int32_t* seq_token_start, const std::int32_t* seq_context_len,
                         const std::int32_t* seq_slot, std::int64_t n_seqs, std::int64_t n_tokens,
                         std::int64_t n_slots);

}  // namespace sx::hal
