// The boundary between the `sextant` binary and the loadable CUDA module (libsextant-cuda.so):
// one C entry point that returns the module's hal::Backend. Both sides are built from the same
// tree by the same compiler, so C++ HAL objects cross it; kAbi (with the sizes below) catches a
// module from another build. The module keeps its own copies of runtime/base and runtime/hal
// (linked statically, symbols hidden) except logging, which it forwards to the binary's sink
// through HostHooks so that its lines keep the binary's level and format.
//
// Threading: the entry is called once, from the thread that first asks for the backend.
#pragma once

#include <cstddef>

namespace sx::hal {
class Backend;
}

extern "C" {

struct SxCudaHostHooks {
  int abi;
  std::size_t op_size;      // sizeof(hal::Op)
  std::size_t status_size;  // sizeof(Status)
  void (*log_line)(int level, const char* text, std::size_t size);
  int (*log_level)();
};

// Returns a new backend (owned by the caller) or null with a reason in `why` (a static string).
typedef sx::hal::Backend* (*SxCudaModuleEntry)(const SxCudaHostHooks* hooks, const char** why);
#define SX_CUDA_MODULE_ENTRY "sx_cuda_module_create"
}

namespace sx::cuda {
inline constexpr int kAbi = 3;
}
