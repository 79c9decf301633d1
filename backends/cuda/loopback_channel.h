// The loopback Channel of the CUDA module (issue 21 item 4): a group whose ranks are several
// Sextant devices on one GPU (SEXTANT_CUDA_DEVICES=0x6: six devices, each with its own streams and
// memory share), so that TP 6 or TP 3 x PP 2 runs on a single card and is compared with TP 1.
// NCCL 2.28 refuses several ranks on one GPU; the host-staged channel works but copies every
// operand through host memory. Here the collectives stay on the device:
//
// - each rank's collective records an event on its stream (after its deferred ops) and meets the
//   other ranks on the host (a HostGroup all_gather of the ranks' device addresses: the group's
//   deadline, abort and error messages, host_group.h);
// - rank 0's stream waits for every rank's event and does the work: all_reduce sums the ranks'
//   buffers element by element in rank order in F32 (kernels/collective.cu: the CPU channel's
//   order, so the same bits), writing the sum into every rank's buffer; all_gather and broadcast
//   are device-to-device copies; then it records a "done" event;
// - after a second host meeting, every other rank's stream waits for "done".
// Nothing on the device ever waits for an event that was not recorded, so a failed or missing
// rank shows as a host-side deadline or abort, never as a hung GPU. send / recv are buffered
// (device_mail.h).
//
// Chosen with SEXTANT_CUDA_CHANNEL=loopback for a group whose devices are all on one GPU (until
// a device session has validated it; the default there is the staged channel).
// Threading: hal/channel.h's.
#pragma once

#include <memory>
#include <span>
#include <vector>

#include "runtime/base/status.h"
#include "runtime/hal/channel.h"
#include "runtime/hal/device.h"

namespace sx::cuda {

// `devices`: CUDA devices on one GPU, at most kernels::kMaxLoopbackRanks of them.
Result<std::vector<std::unique_ptr<hal::Channel>>> create_loopback_channels(std::span<hal::Device* const> devices,
                                                                             const hal::ChannelOptions& options);

}  // namespace sx::cuda
