// create_device_group.
#include "runtime/engine/device_group.h"

#include <algorithm>

#include "runtime/base/thread_pool.h"

namespace sx::engine {

Result<DeviceGroup> create_device_group(hal::Backend& backend, int count, hal::DeviceOptions options) {
  if (count < 1) return invalid_argument_error("a device group needs at least one device, got {}", count);
  SX_ASSIGN_OR_RETURN(std::vector<hal::DeviceInfo> available, backend.devices());
  if (static_cast<std::size_t>(count) > available.size()) {
    return invalid_argument_error("{} devices are needed but backend '{}' has {}", count, backend.name(),
                                  available.size());
  }
  const int total = options.threads > 0 ? options.threads : hardware_threads();
  options.threads = std::max(1, total / count);
  DeviceGroup g;
  for (int i = 0; i < count; ++i) {
    SX_ASSIGN_OR_RETURN(std::unique_ptr<hal::Device> d, backend.create_device(i, options));
    g.devices.push_back(d.get());
    g.owned.push_back(std::move(d));
  }
  return g;
}

}  // namespace sx::engine
