// The CPU backend's Channel (hal/channel.h): collectives between the rank threads of one process
// through shared host memory: backends/common/host_group.h, called from each rank's stream with
// the device buffers' own memory (the CPU's device memory is the host's).
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
