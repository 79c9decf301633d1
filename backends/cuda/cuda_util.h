// CUDA and cuBLAS errors as Status values at the call site (DESIGN.md §7.1), inside the CUDA
// module only.
#pragma once

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <string_view>

#include "runtime/base/status.h"

namespace sx::cuda {

// OK for cudaSuccess; otherwise "<what>: <cudaErrorName>: <description>" with a code that says
// what kind of failure it is (memory: RESOURCE_EXHAUSTED; no device / driver: UNAVAILABLE; a
// kernel image missing: FAILED_PRECONDITION with the rebuild hint; others INTERNAL).
Status cuda_status(cudaError_t e, std::string_view what);
Status cublas_status(cublasStatus_t e, std::string_view what);

}  // namespace sx::cuda
