// The only place that knows which backends were compiled in (DESIGN.md §2, §7.3).
#include "backends/registry.h"

#include "backends/cpu/cpu_device.h"
#include "backends/cuda_loader.h"
#ifdef SX_HAVE_VULKAN
#include "backends/vulkan/vk_device.h"
#endif

namespace sx::backends {

// Registration order is `--backend auto`'s order of preference: CUDA, then Vulkan, taken only
// when it reports a device (Vulkan leaves CPU implementations such as lavapipe out unless they are
// named), then the CPU.
void register_compiled_backends(hal::Registry& registry) {
  registry.add(make_cuda_backend());  // a proxy: UNAVAILABLE with the reason where the module cannot run
#ifdef SX_HAVE_VULKAN
  registry.add(vk::make_vulkan_backend());
#endif
  registry.add(cpu::make_cpu_backend());
}

hal::Registry& default_registry() {
  static hal::Registry registry = [] {
    hal::Registry r;
    register_compiled_backends(r);
    return r;
  }();
  return registry;
}

}  // namespace sx::backends
