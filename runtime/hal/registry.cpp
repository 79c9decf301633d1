// Registry lookups.
#include "runtime/hal/registry.h"

#include <fmt/ranges.h>

namespace sx::hal {

Result<std::vector<std::unique_ptr<Channel>>> Backend::create_channels(std::span<Device* const> devices,
                                                                       const ChannelOptions&) {
  return unimplemented_error("backend '{}' has no collectives: a group of {} devices cannot be joined", name(),
                             devices.size());
}

Result<Topology> Backend::topology() const {
  return unimplemented_error("backend '{}' does not report how its devices are linked", name());
}

Result<std::vector<std::unique_ptr<Device>>> Backend::create_devices_at(std::span<const int> indices,
                                                                      const DeviceOptions& options) {
  std::vector<std::unique_ptr<Device>> out;
  for (int i : indices) {
    SX_ASSIGN_OR_RETURN(std::unique_ptr<Device> d, create_device(i, options));
    out.push_back(std::move(d));
  }
  return out;
}

Result<std::vector<std::unique_ptr<Device>>> Backend::create_devices(int count, const DeviceOptions& options) {
  std::vector<int> indices;
  for (int i = 0; i < count; ++i) indices.push_back(i);
  return create_devices_at(indices, options);
}

void Registry::add(std::unique_ptr<Backend> backend) { backends_.push_back(std::move(backend)); }

Result<Backend*> Registry::find(std::string_view name) const {
  for (const auto& b : backends_) {
    if (b->name() == name) return b.get();
  }
  return not_found_error("backend '{}' is not available in this build (compiled in: {})", name,
                         fmt::join(names(), ", "));
}

Result<std::vector<DeviceInfo>> list_devices(const Backend& backend) {
  auto infos = backend.devices();
  if (!infos.ok()) {
    return Status(infos.status().code(),
                  fmt::format("backend {} unavailable: {}", backend.name(), infos.status().message()));
  }
  return infos;
}

Result<Backend*> Registry::pick(std::string_view name, std::string* why) const {
  if (name != "auto") {
    SX_ASSIGN_OR_RETURN(Backend * b, find(name));
    if (why != nullptr) *why = fmt::format("{} (as configured)", b->name());
    return b;
  }
  std::vector<std::string> passed;
  for (const auto& b : backends_) {
    auto devices = b->devices();
    if (devices.ok() && !devices->empty()) {
      if (why != nullptr) {
        passed.push_back(fmt::format("using {} ({} device{})", b->name(), devices->size(),
                                     devices->size() == 1 ? "" : "s"));
        *why = fmt::format("auto: {}", fmt::join(passed, "; "));
      }
      return b.get();
    }
    passed.push_back(fmt::format("{}: {}", b->name(), devices.ok() ? "no devices" : devices.status().to_string()));
  }
  return not_found_error("backend auto: no backend has a device ({})",
                         passed.empty() ? std::string("none compiled in") : fmt::format("{}", fmt::join(passed, "; ")));
}

std::vector<std::string> Registry::names() const {
  std::vector<std::string> out;
  for (const auto& b : backends_) out.emplace_back(b->name());
  return out;
}

}  // namespace sx::hal
