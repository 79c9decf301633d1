// The only place that knows which backends were compiled in (DESIGN.md §2, §7.3).
#include "backends/registry.h"

#include "backends/cpu/cpu_device.h"

namespace sx::backends {

void register_compiled_backends(hal::Registry& registry) { registry.add(cpu::make_cpu_backend()); }

hal::Registry& default_registry() {
  static hal::Registry registry = [] {
    hal::Registry r;
    register_compiled_backends(r);
    return r;
  }();
  return registry;
}

}  // namespace sx::backends
