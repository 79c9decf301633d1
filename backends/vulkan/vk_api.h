// The Vulkan entry points the backend uses, loaded at run time from the loader library
// (libvulkan.so.1) rather than linked: a machine without a Vulkan loader still runs the binary,
// and the backend reports `UNAVAILABLE: no Vulkan loader (...)` instead (DESIGN.md §4, issue 18
// item 5). Only the headers are needed at build time.
//
// Threading: load() once (it is idempotent and thread-safe); the tables are then read-only.
#pragma once

#define VK_NO_PROTOTYPES
#include <vulkan/vulkan_core.h>

#include <string>

#include "runtime/base/status.h"

namespace sx::vk {

// Entry points that need no instance.
#define SX_VK_GLOBAL_FUNCTIONS(X) \
  X(vkCreateInstance)             \
  X(vkEnumerateInstanceVersion)   \
  X(vkEnumerateInstanceExtensionProperties)

#define SX_VK_INSTANCE_FUNCTIONS(X)          \
  X(vkDestroyInstance)                       \
  X(vkEnumeratePhysicalDevices)              \
  X(vkGetPhysicalDeviceProperties)           \
  X(vkGetPhysicalDeviceProperties2)          \
  X(vkGetPhysicalDeviceMemoryProperties)     \
  X(vkGetPhysicalDeviceQueueFamilyProperties) \
  X(vkGetPhysicalDeviceFeatures2)            \
  X(vkEnumerateDeviceExtensionProperties)    \
  X(vkCreateDevice)                          \
  X(vkGetDeviceProcAddr)

#define SX_VK_DEVICE_FUNCTIONS(X)     \
  X(vkDestroyDevice)                  \
  X(vkGetDeviceQueue)                 \
  X(vkDeviceWaitIdle)                 \
  X(vkCreateBuffer)                   \
  X(vkDestroyBuffer)                  \
  X(vkGetBufferMemoryRequirements)    \
  X(vkAllocateMemory)                 \
  X(vkFreeMemory)                     \
  X(vkBindBufferMemory)               \
  X(vkMapMemory)                      \
  X(vkUnmapMemory)                    \
  X(vkCreateCommandPool)              \
  X(vkDestroyCommandPool)             \
  X(vkAllocateCommandBuffers)         \
  X(vkFreeCommandBuffers)             \
  X(vkBeginCommandBuffer)             \
  X(vkEndCommandBuffer)               \
  X(vkResetCommandPool)               \
  X(vkCmdCopyBuffer)                  \
  X(vkCmdFillBuffer)                  \
  X(vkCmdPipelineBarrier)             \
  X(vkCmdBindPipeline)                \
  X(vkCmdPushConstants)               \
  X(vkCmdDispatch)                    \
  X(vkCmdPushDescriptorSetKHR)        \
  X(vkQueueSubmit)                    \
  X(vkCreateFence)                    \
  X(vkDestroyFence)                   \
  X(vkWaitForFences)                  \
  X(vkResetFences)                    \
  X(vkCreateSemaphore)                \
  X(vkDestroySemaphore)               \
  X(vkWaitSemaphores)                 \
  X(vkGetSemaphoreCounterValue)       \
  X(vkCreateShaderModule)             \
  X(vkDestroyShaderModule)            \
  X(vkCreateDescriptorSetLayout)      \
  X(vkDestroyDescriptorSetLayout)     \
  X(vkCreatePipelineLayout)           \
  X(vkDestroyPipelineLayout)          \
  X(vkCreateComputePipelines)         \
  X(vkDestroyPipeline)

#define SX_VK_DECLARE(name) PFN_##name name = nullptr;

struct GlobalApi {
  PFN_vkGetInstanceProcAddr vkGetInstanceProcAddr = nullptr;
  SX_VK_GLOBAL_FUNCTIONS(SX_VK_DECLARE)
};
struct InstanceApi {
  SX_VK_INSTANCE_FUNCTIONS(SX_VK_DECLARE)
};
struct DeviceApi {
  SX_VK_DEVICE_FUNCTIONS(SX_VK_DECLARE)
};

#undef SX_VK_DECLARE

// The loader's global entry points, loading the library on first use. UNAVAILABLE naming the
// library and dlopen's reason when there is none ($SEXTANT_VULKAN_LOADER overrides the name).
Result<const GlobalApi*> global_api();

// The instance-level table of `instance`; NOT_FOUND naming the first entry point missing.
Result<InstanceApi> load_instance_api(const GlobalApi& g, VkInstance instance);
// The device-level table of `device` (VK_KHR_push_descriptor must have been enabled).
Result<DeviceApi> load_device_api(const InstanceApi& i, VkDevice device);

// "VK_ERROR_OUT_OF_DEVICE_MEMORY" etc.
const char* result_name(VkResult r);
// OK, or INTERNAL (RESOURCE_EXHAUSTED for the out-of-memory results, UNAVAILABLE for a lost
// device) "<what>: <result name>".
Status check(VkResult r, std::string_view what);

}  // namespace sx::vk
