// The "cuda" backend as the `sextant` binary sees it: a proxy that opens the CUDA module
// (libsextant-cuda.so, backends/cuda/) on first use, so that the binary starts and serves on CPU
// or Vulkan where the CUDA libraries are missing and reports "backend cuda unavailable: <reason>"
// (module not built, not found, a library it needs missing, no driver, no device, ...).
//
// The module is looked for at $SEXTANT_CUDA_MODULE, next to the executable, in
// <executable>/../lib/sextant/, then in the build tree that built this binary.
// Threading: as hal::Backend (the module is opened once, under a once_flag).
#pragma once

#include <memory>

#include "runtime/hal/registry.h"

namespace sx::backends {

std::unique_ptr<hal::Backend> make_cuda_backend();

}  // namespace sx::backends
