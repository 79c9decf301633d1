// Loading the Vulkan loader and its entry points (vk_api.h).
#include "backends/vulkan/vk_api.h"

#include <dlfcn.h>

#include <cstdlib>
#include <mutex>

#include "runtime/base/regular_file.h"

namespace sx::vk {

Result<const GlobalApi*> global_api() {
  static std::once_flag once;
  static GlobalApi api;
  static Status failure;
  std::call_once(once, [] {
    const char* env = std::getenv("SEXTANT_VULKAN_LOADER");
    const std::string lib = env != nullptr && env[0] != '\0' ? env : "libvulkan.so.1";
    // dlopen() would block on a FIFO ($SEXTANT_VULKAN_LOADER is the user's): a regular file only.
    if (Status regular = check_library_path(lib, "SEXTANT_VULKAN_LOADER " + lib); !regular.ok()) {
      failure = unavailable_error("no Vulkan loader ({}); install libvulkan1 (Debian) and a driver", regular.message());
      return;
    }
    void* handle = dlopen(lib.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (handle == nullptr) {
      const char* why = dlerror();
      failure = unavailable_error("no Vulkan loader ({}: {}); install libvulkan1 (Debian) and a driver", lib,
                                  why != nullptr ? why : "dlopen failed");
      return;
    }
    api.vkGetInstanceProcAddr = reinterpret_cast<PFN_vkGetInstanceProcAddr>(dlsym(handle, "vkGetInstanceProcAddr"));
    if (api.vkGetInstanceProcAddr == nullptr) {
      failure = unavailable_error("{} has no vkGetInstanceProcAddr: not a Vulkan loader", lib);
      return;
    }
#define SX_VK_LOAD(name)                                                                        \
  api.name = reinterpret_cast<PFN_##name>(api.vkGetInstanceProcAddr(VK_NULL_HANDLE, #name));    \
  if (api.name == nullptr) {                                                                    \
    failure = unavailable_error("the Vulkan loader {} lacks {} (Vulkan 1.1 or later needed)", lib, #name); \
    return;                                                                                     \
  }
    SX_VK_GLOBAL_FUNCTIONS(SX_VK_LOAD)
#undef SX_VK_LOAD
  });
  if (!failure.ok()) return failure;
  return &api;
}

Result<InstanceApi> load_instance_api(const GlobalApi& g, VkInstance instance) {
  InstanceApi api;
#define SX_VK_LOAD(name)                                                                              \
  api.name = reinterpret_cast<PFN_##name>(g.vkGetInstanceProcAddr(instance, #name));                  \
  if (api.name == nullptr) return not_found_error("the Vulkan instance has no entry point {}", #name);
  SX_VK_INSTANCE_FUNCTIONS(SX_VK_LOAD)
#undef SX_VK_LOAD
  return api;
}

Result<DeviceApi> load_device_api(const InstanceApi& i, VkDevice device) {
  DeviceApi api;
#define SX_VK_LOAD(name)                                                                    \
  api.name = reinterpret_cast<PFN_##name>(i.vkGetDeviceProcAddr(device, #name));             \
  if (api.name == nullptr) return not_found_error("the Vulkan device has no entry point {}", #name);
  SX_VK_DEVICE_FUNCTIONS(SX_VK_LOAD)
#undef SX_VK_LOAD
  return api;
}

const char* result_name(VkResult r) {
  switch (r) {
#define SX_VK_CASE(x) \
  case x:             \
    return #x;
    SX_VK_CASE(VK_SUCCESS)
    SX_VK_CASE(VK_NOT_READY)
    SX_VK_CASE(VK_TIMEOUT)
    SX_VK_CASE(VK_INCOMPLETE)
    SX_VK_CASE(VK_ERROR_OUT_OF_HOST_MEMORY)
    SX_VK_CASE(VK_ERROR_OUT_OF_DEVICE_MEMORY)
    SX_VK_CASE(VK_ERROR_INITIALIZATION_FAILED)
    SX_VK_CASE(VK_ERROR_DEVICE_LOST)
    SX_VK_CASE(VK_ERROR_MEMORY_MAP_FAILED)
    SX_VK_CASE(VK_ERROR_LAYER_NOT_PRESENT)
    SX_VK_CASE(VK_ERROR_EXTENSION_NOT_PRESENT)
    SX_VK_CASE(VK_ERROR_FEATURE_NOT_PRESENT)
    SX_VK_CASE(VK_ERROR_INCOMPATIBLE_DRIVER)
    SX_VK_CASE(VK_ERROR_TOO_MANY_OBJECTS)
    SX_VK_CASE(VK_ERROR_FORMAT_NOT_SUPPORTED)
    SX_VK_CASE(VK_ERROR_FRAGMENTED_POOL)
    SX_VK_CASE(VK_ERROR_OUT_OF_POOL_MEMORY)
    SX_VK_CASE(VK_ERROR_UNKNOWN)
#undef SX_VK_CASE
    default:
      return "VkResult (unknown)";
  }
}

Status check(VkResult r, std::string_view what) {
  if (r == VK_SUCCESS) return ok_status();
  switch (r) {
    case VK_ERROR_OUT_OF_HOST_MEMORY:
    case VK_ERROR_OUT_OF_DEVICE_MEMORY:
    case VK_ERROR_OUT_OF_POOL_MEMORY:
    case VK_ERROR_TOO_MANY_OBJECTS:
      return resource_exhausted_error("{}: {}", what, result_name(r));
    case VK_ERROR_DEVICE_LOST:
      return unavailable_error("{}: {} (the GPU reset or the driver failed; restart the daemon)", what,
                               result_name(r));
    default:
      return internal_error("{}: {} ({})", what, result_name(r), static_cast<int>(r));
  }
}

}  // namespace sx::vk
