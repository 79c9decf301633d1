// create_device_group.
#include "runtime/engine/device_group.h"

namespace sx::engine {

Result<DeviceGroup> create_device_group(hal::Backend& backend, int count, const hal::DeviceOptions& options) {
  if (count < 1) return invalid_argument_error("a device group needs at least one device, got {}", count);
  std::vector<int> indices;
  for (int i = 0; i < count; ++i) indices.push_back(i);
  return create_device_group(backend, indices, options);
}

Result<DeviceGroup> create_device_group(hal::Backend& backend, std::span<const int> indices,
                                        const hal::DeviceOptions& options) {
  if (indices.empty()) return invalid_argument_error("a device group needs at least one device");
  SX_ASSIGN_OR_RETURN(std::vector<hal::DeviceInfo> available, hal::list_devices(backend));
  const auto count = static_cast<int>(indices.size());
  if (static_cast<std::size_t>(count) > available.size()) {
    return invalid_argument_error("{} devices are needed but backend '{}' has {}", count, backend.name(),
                                  available.size());
  }
  for (std::size_t i = 0; i < indices.size(); ++i) {
    if (indices[i] < 0 || static_cast<std::size_t>(indices[i]) >= available.size()) {
      return invalid_argument_error("device {} is not one of backend '{}''s {} devices (0 .. {})", indices[i],
                                    backend.name(), available.size(), available.size() - 1);
    }
    for (std::size_t j = 0; j < i; ++j) {
      if (indices[j] == indices[i]) return invalid_argument_error("device {} is named twice in one group", indices[i]);
    }
  }
  SX_ASSIGN_OR_RETURN(std::vector<std::unique_ptr<hal::Device>> made, backend.create_devices_at(indices, options));
  DeviceGroup g;
  for (auto& d : made) {
    g.devices.push_back(d.get());
    g.owned.push_back(std::move(d));
  }
  return g;
}

}  // namespace sx::engine
