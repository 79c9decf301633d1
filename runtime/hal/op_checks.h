// Argument checks of HAL ops that every backend makes the same way (backends add their own
// limits). Kept out of ops.h, which the CUDA kernels include (nvcc does not compile fmt, which
// Status brings).
#pragma once

#include "runtime/base/status.h"
#include "runtime/hal/ops.h"

namespace sx::hal {

// A MoeFfnArgs: counts (tokens >= 0, dim, ffn > 0, 1 <= k <= kMaxTopK, local experts >= 0 from
// expert_begin >= 0, ids within int32) and the experts' rows whole blocks of their formats.
// INVALID_ARGUMENT naming the field.
Status check_moe_ffn(const MoeFfnArgs& a);

}  // namespace sx::hal
