// The fixed sizes the HAL's op set is written for on every backend (DESIGN.md §4): not any
// device's limits (a device states those through supports()), but shapes no backend's kernels
// take. They live here, below both, so that the model config can refuse a model no backend can run
// when it is read (model/ never includes the HAL's ops; issue 54 item 4) while the HAL's checks and
// every backend use the same numbers: runtime/hal/ops.h and op_checks.h name them hal::kMaxTopK,
// hal::kMaxConvKernel and hal::kMaxDeltaHeadDim.
//
// Only <cstdint>: nvcc compiles this (through kernels/launch.h -> runtime/hal/ops.h).
#pragma once

#include <cstdint>

namespace sx::op_limits {

// top_k and the MoE router: 1 <= k <= kMaxTopK (a model's experts used per token too).
inline constexpr std::int64_t kMaxTopK = 64;
// The DeltaNet ops: conv1d kernels of 2 .. kMaxConvKernel taps, heads of at most kMaxDeltaHeadDim.
inline constexpr std::int64_t kMaxConvKernel = 8, kMaxDeltaHeadDim = 256;

}  // namespace sx::op_limits
