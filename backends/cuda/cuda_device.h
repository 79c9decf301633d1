// The CUDA device of the loadable module (cuda_device.cpp): a hal::Device on one CUDA ordinal,
// created after the preflight (cuda_module.cpp) judged the machine able to run it.
//
// Device options ("cuda"): graphs (true: decode steps replay as CUDA graphs; SEXTANT_CUDA_GRAPHS=0
// turns them off too), pool_chunk_mib (512: the size of the device memory chunks buffers are
// carved from), workspace_mib (64: a stream's dequantisation workspace for prefill matmuls).
// Threading: as hal::Device / hal::Stream.
#pragma once

#include <cstddef>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "runtime/base/status.h"
#include "runtime/hal/channel.h"
#include "runtime/hal/device.h"
#include "runtime/hal/device_options.h"

namespace sx::cuda {

// `info` as the backend enumerated it. Runs the probe kernel: a build without code for the GPU
// fails here with FAILED_PRECONDITION naming the architectures it has.
Result<std::unique_ptr<hal::Device>> create_cuda_device(const hal::DeviceInfo& info, int ordinal,
                                                        const hal::DeviceOptions& options);
// Collectives for a group of CUDA devices (staged through host memory for now).
Result<std::vector<std::unique_ptr<hal::Channel>>> create_cuda_channels(std::span<hal::Device* const> devices,
                                                                         const hal::ChannelOptions& options);
// The architectures the kernels were compiled for, as the build's -Dnvcc_archs gave them ("90").
const char* compiled_archs_text();

// For the module's channels, which enqueue on a rank's CUDA stream directly (cudaStream_t as a
// pointer, this header having no CUDA types): the stream behind `stream` after its deferred ops
// were launched (so that what is enqueued next follows them), its error if it has one latched;
// the device address of `bytes` at `view` on `device`; the CUDA ordinal of a device.
Result<void*> native_stream(hal::Stream& stream);
Result<std::byte*> device_address(const hal::BufView& view, std::size_t bytes, const hal::Device& device);
int cuda_ordinal(const hal::Device& device);
// Adds a check that `stream`'s sync() runs after its work completed, latching a failure it
// returns (a channel whose collectives were aborted on the device without a CUDA error).
void add_sync_check(hal::Stream& stream, std::function<Status()> check);

}  // namespace sx::cuda
