// Devices for a TP x PP group: devices 0 .. count-1 of one backend, with the CPU threads split
// evenly between them (each rank of a CPU group is its own logical device with its own pool).
#pragma once

#include <memory>
#include <vector>

#include "runtime/base/status.h"
#include "runtime/hal/device.h"
#include "runtime/hal/registry.h"

namespace sx::engine {

struct DeviceGroup {
  std::vector<std::unique_ptr<hal::Device>> owned;
  std::vector<hal::Device*> devices;  // rank order
};

// options.threads is the total for the group (0 = all hardware threads); each device gets
// max(1, threads / count).
Result<DeviceGroup> create_device_group(hal::Backend& backend, int count, hal::DeviceOptions options);

}  // namespace sx::engine
