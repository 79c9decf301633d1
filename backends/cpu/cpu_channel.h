// The CPU backend's Channel (hal/channel.h): collectives between the rank threads of one process
// through shared host memory.
//
// Each collective stages every rank's contribution in group-owned host memory (device buffers of
// one rank are never touched by another rank's thread), meets at a barrier, and each rank then
// computes or copies what it needs. all_reduce: rank r sums elements [r*n/N, (r+1)*n/N) of all
// contributions in rank order into a shared result, a second barrier, then every rank copies the
// whole result; so every element is added in the same order on every rank and run. Staging is
// double-buffered by the collective's sequence number, so no trailing barrier is needed. Waiting
// uses a condition variable with the group's deadline; abort() wakes every waiter at once.
#pragma once

#include <memory>
#include <span>
#include <vector>

#include "runtime/base/status.h"
#include "runtime/hal/channel.h"
#include "runtime/hal/device.h"

namespace sx::cpu {

// One Channel per device (rank i for devices[i]); every device must be a CpuDevice, each at most once.
Result<std::vector<std::unique_ptr<hal::Channel>>> create_cpu_channels(std::span<hal::Device* const> devices,
                                                                       const hal::ChannelOptions& options);

}  // namespace sx::cpu
