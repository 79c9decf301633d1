// Devices for a TP x PP group: devices 0 .. count-1 of one backend, or the devices at given
// indexes (a replica's group), made by the backend for the whole group (Backend::create_devices_at:
// a backend whose devices share resources divides them, as
// the CPU splits its threads between its logical devices).
#pragma once

#include <memory>
#include <span>
#include <vector>

#include "runtime/base/status.h"
#include "runtime/hal/device.h"
#include "runtime/hal/registry.h"

namespace sx::engine {

struct DeviceGroup {
  std::vector<std::unique_ptr<hal::Device>> owned;
  std::vector<hal::Device*> devices;  // rank order
};

// INVALID_ARGUMENT when the backend reports fewer than `count` devices; the backend's errors for
// its options.
Result<DeviceGroup> create_device_group(hal::Backend& backend, int count, const hal::DeviceOptions& options);
// The devices at `indices` (a replica's group: e.g. {3, 4, 5}); INVALID_ARGUMENT for an index the
// backend does not list or one given twice.
Result<DeviceGroup> create_device_group(hal::Backend& backend, std::span<const int> indices,
                                        const hal::DeviceOptions& options);

}  // namespace sx::engine
