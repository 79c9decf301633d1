// create_device_group.
#include "runtime/engine/device_group.h"

namespace sx::engine {

Result<DeviceGroup> create_device_group(hal::Backend& backend, int count, const hal::DeviceOptions& options) {
  if (count < 1) return invalid_argument_error("a device group needs at least one device, got {}", count);
  SX_ASSIGN_OR_RETURN(std::vector<hal::DeviceInfo> available, hal::list_devices(backend));
  if (static_cast<std::size_t>(count) > available.size()) {
    return invalid_argument_error("{} devices are needed but backend '{}' has {}", count, backend.name(),
                                  available.size());
  }
  SX_ASSIGN_OR_RETURN(std::vector<std::unique_ptr<hal::Device>> made, backend.create_devices(count, options));
  DeviceGroup g;
  for (auto& d : made) {
    g.devices.push_back(d.get());
    g.owned.push_back(std::move(d));
  }
  return g;
}

}  // namespace sx::engine
