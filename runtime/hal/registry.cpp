// Registry lookups.
#include "runtime/hal/registry.h"

#include <fmt/ranges.h>

namespace sx::hal {

Result<std::vector<std::unique_ptr<Channel>>> Backend::create_channels(std::span<Device* const> devices,
                                                                       const ChannelOptions&) {
  return unimplemented_error("backend '{}' has no collectives: a group of {} devices cannot be joined", name(),
                             devices.size());
}

void Registry::add(std::unique_ptr<Backend> backend) { backends_.push_back(std::move(backend)); }

Result<Backend*> Registry::find(std::string_view name) const {
  for (const auto& b : backends_) {
    if (b->name() == name) return b.get();
  }
  return not_found_error("backend '{}' is not available in this build (compiled in: {})", name,
                         fmt::join(names(), ", "));
}

std::vector<std::string> Registry::names() const {
  std::vector<std::string> out;
  for (const auto& b : backends_) out.emplace_back(b->name());
  return out;
}

}  // namespace sx::hal
