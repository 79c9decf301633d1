// The preflight's probe: one tiny kernel per module, launched once per device before any weight
// is read, so that "no kernel image is available for execution on the device" is found at
// start-up and explained (backends/cuda/preflight.h), not at the first request.
#include "kernels/common.cuh"

namespace sx::kernels {
namespace {
__global__ void probe_kernel(int* out) { *out = 0x5e7a47; }
}  // namespace

cudaError_t launch_probe(cudaStream_t s, int* out) {
  probe_kernel<<<1, 1, 0, s>>>(out);
  return cudaGetLastError();
}

}  // namespace sx::kernels
