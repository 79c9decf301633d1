// CUDA / cuBLAS error conversion (cuda_util.h).
#include "backends/cuda/cuda_util.h"

namespace sx::cuda {

Status cuda_status(cudaError_t e, std::string_view what) {
  if (e == cudaSuccess) return ok_status();
  const char* name = cudaGetErrorName(e);
  const char* text = cudaGetErrorString(e);
  switch (e) {
    case cudaErrorMemoryAllocation:
      return resource_exhausted_error("{}: {}: {}", what, name, text);
    case cudaErrorNoDevice:
    case cudaErrorInsufficientDriver:
    case cudaErrorInitializationError:
    case cudaErrorDevicesUnavailable:
      return unavailable_error("{}: {}: {}", what, name, text);
    case cudaErrorNoKernelImageForDevice:
    case cudaErrorInvalidDeviceFunction:
      return failed_precondition_error("{}: {}: {} (this build has no code for the GPU's architecture: rebuild with "
                                       "-Dnvcc_archs=<its compute capability>, see `sextant doctor`)",
                                       what, name, text);
    default:
      return internal_error("{}: {}: {}", what, name, text);
  }
}

Status cublas_status(cublasStatus_t e, std::string_view what) {
  if (e == CUBLAS_STATUS_SUCCESS) return ok_status();
  const char* name = cublasGetStatusName(e);
  const char* text = cublasGetStatusString(e);
  if (e == CUBLAS_STATUS_ALLOC_FAILED) return resource_exhausted_error("{}: {}: {}", what, name, text);
  return internal_error("{}: {}: {}", what, name, text);
}

}  // namespace sx::cuda
