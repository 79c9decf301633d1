// Which physical devices become Sextant's Vulkan devices (pure logic, unit-tested without a GPU).
//
// Without a selection every GPU the loader reports becomes one device, in the loader's order;
// CPU implementations (Mesa's lavapipe, SwiftShader) are left out: they are correct but far slower
// than Sextant's own CPU backend. A selection ($SEXTANT_VULKAN_DEVICES; the config has no key of
// its own for it: set the variable in the daemon's environment, e.g. its unit file) is a
// comma-separated list with one entry per Sextant device, each naming a physical device by its
// loader index ("0"), its UUID (32 hex digits, dashes allowed) or a
// case-insensitive part of its name ("llvmpipe", "RTX 4090"); the same physical device may be named
// several times ("0,0,0": three devices on one GPU, each with its own VkDevice and queue), and CPU
// implementations are taken when named. An entry that matches nothing, or a name part that matches
// several devices, is INVALID_ARGUMENT listing what was found.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "runtime/base/status.h"

namespace sx::vk {

struct PhysicalDesc {
  std::string name;      // VkPhysicalDeviceProperties::deviceName
  bool cpu = false;      // VK_PHYSICAL_DEVICE_TYPE_CPU
  std::string uuid;      // pipelineCacheUUID's device UUID, 32 lowercase hex digits
  std::string type;      // "discrete gpu", "cpu", ... for messages
};

// Indices into `found`, one per Sextant device.
Result<std::vector<int>> select_devices(std::string_view selection, std::span<const PhysicalDesc> found);

// "0: llvmpipe (LLVM 15.0.6, 256 bits) [cpu], 1: ..." (or "none").
std::string describe_found(std::span<const PhysicalDesc> found);

// 16 bytes as 32 lowercase hex digits.
std::string uuid_hex(const std::uint8_t (&uuid)[16]);

}  // namespace sx::vk
