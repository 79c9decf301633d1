// A Channel (hal/channel.h) for backends whose device memory the host cannot reach, built only on
// the HAL: each operand is copied into a host-visible buffer of the rank's device (kReadback: the
// host reads it and streams copy from it), the collective runs over a HostGroup
// (host_group.h) inside a Stream::host_call, and what it produced is copied back, all in stream
// order. The Vulkan backend's channel; any backend with host_call can use it.
//
// The staging buffer of a rank grows to the largest collective seen (allocated at its first
// occurrence: the engine's first step); a replaced one is freed at the rank's next host call, when
// the work that used it has completed. Streams must be synced before the channels are destroyed.
#pragma once

#include <memory>
#include <span>
#include <vector>

#include "runtime/base/status.h"
#include "runtime/hal/channel.h"
#include "runtime/hal/device.h"

namespace sx::backends {

// One Channel per device (rank i for devices[i], each at most once).
Result<std::vector<std::unique_ptr<hal::Channel>>> create_staged_channels(std::span<hal::Device* const> devices,
                                                                          const hal::ChannelOptions& options);

}  // namespace sx::backends
