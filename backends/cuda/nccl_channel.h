// The NCCL Channel of the CUDA module (issue 21 item 2): one communicator per group of CUDA
// devices on distinct GPUs (ncclCommInitAll in this one process), collectives enqueued on each
// rank's compute stream after its deferred ops, watched by a CollectiveWatch (collective_watch.h)
// that aborts the communicators of a collective past its deadline or of an asynchronous error.
// Before the group is handed out, a self-test all-reduces a few sizes on every rank, checks the
// sums and logs latency and bus bandwidth (issue 21 item 3); a group that fails it, or does not
// finish it within the channel timeout, is refused naming the devices and the NCCL settings.
// The NCCL_* variables (NCCL_P2P_DISABLE, NCCL_P2P_LEVEL, NCCL_IB_DISABLE, NCCL_SOCKET_IFNAME,
// NCCL_DEBUG) are NCCL's own; the ones set are logged with the group, and so is each pair's
// peer access (cudaDeviceCanAccessPeer) and P2P performance rank.
//
// Threading: hal/channel.h's (one thread per rank; abort() from any thread).
#pragma once

#include <memory>
#include <span>
#include <vector>

#include "backends/cuda/nccl_api.h"
#include "runtime/base/status.h"
#include "runtime/hal/channel.h"
#include "runtime/hal/device.h"

namespace sx::cuda {

// `devices` are CUDA devices on distinct GPUs (choose_cuda_channel said kNccl).
Result<std::vector<std::unique_ptr<hal::Channel>>> create_nccl_channels(const NcclApi& api,
                                                                         std::span<hal::Device* const> devices,
                                                                         const hal::ChannelOptions& options);

}  // namespace sx::cuda
