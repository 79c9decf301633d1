// Which GPUs the CUDA backend sees and in what order (DESIGN.md §4, issue 20 item 2): Sextant
// numbers CUDA devices in PCI bus order, nvidia-smi's, and shows each one's CUDA ordinal beside
// it, because the CUDA runtime's own order (CUDA_DEVICE_ORDER=FASTEST_FIRST, its default) is not
// nvidia-smi's; and what CUDA_VISIBLE_DEVICES / CUDA_DEVICE_ORDER mean for that order.
//
// Pure host code without CUDA headers (unit-tested on machines without a GPU); the CUDA module
// fills GpuIdentity from cudaGetDeviceProperties / cudaMemGetInfo / cudaDeviceGetPCIBusId.
// Pure functions; thread-safe.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "runtime/base/status.h"

namespace sx::cuda {

struct GpuIdentity {
  int cuda_ordinal = -1;     // the CUDA runtime's device number (after CUDA_VISIBLE_DEVICES)
  std::string name;          // "NVIDIA H200"
  std::string uuid;          // "GPU-0a1b2c3d-...." (nvidia-smi -L's form); empty when unknown
  std::string pci_bus_id;    // "0000:1b:00.0" as cudaDeviceGetPCIBusId prints it (any case)
  int cc_major = 0, cc_minor = 0;
  std::uint64_t total_bytes = 0, free_bytes = 0;
};

struct PciAddress {
  std::uint32_t domain = 0, bus = 0, device = 0, function = 0;
  auto operator<=>(const PciAddress&) const = default;
};
// "0000:1b:00.0", "00000000:1B:00.0" (nvidia-smi's 8-digit domain), "1b:00.0" (domain 0); hex
// fields; nullopt for anything else.
std::optional<PciAddress> parse_pci_bus_id(std::string_view text);

// `devices` sorted by PCI address (ascending); devices whose address does not parse go last in
// CUDA ordinal order. Sextant's device index i is the position in this order.
std::vector<GpuIdentity> in_pci_order(std::vector<GpuIdentity> devices);

// One line per device, index = position in `devices`, e.g.
// "cuda:0  NVIDIA H200  sm_90  139.8 GiB (139.2 GiB free)  PCI 0000:1b:00.0  CUDA ordinal 1  GPU-0a1b..."
std::vector<std::string> describe_devices(std::span<const GpuIdentity> devices);

// CUDA_VISIBLE_DEVICES as the CUDA runtime reads it: a comma-separated list of device numbers
// (in CUDA_DEVICE_ORDER's order) or UUIDs ("GPU-..." or a unique prefix, "MIG-..."); CUDA stops
// at the first entry that is not one of these (and ignores the rest), "-1" or an empty value
// hides every device. Spaces around entries are allowed.
struct VisibleDevices {
  bool set = false;                  // the variable is set (possibly empty)
  std::vector<std::string> entries;  // the entries CUDA takes, in order
  std::string ignored;               // from the first entry CUDA does not take to the end ("" if none)
  bool hides_all = false;            // set, and no entry is taken
  bool by_index = false;             // some taken entry is a device number (so CUDA_DEVICE_ORDER matters)
  std::vector<std::string> duplicates;  // entries listed more than once (CUDA fails to initialise)
};
// `value` is the variable's value, null when it is not set.
VisibleDevices parse_visible_devices(const char* value);

// Sextant's CUDA devices when $SEXTANT_CUDA_DEVICES is set: a comma-separated list of GPU indices
// (PCI order, as listed by describe_devices), one entry per Sextant device; a GPU may be named
// several times ("0,0,0,0,0,0", or "0x6": six devices on GPU 0, for testing tensor parallelism on
// one card; "0x3,1x3": three on each of two).
// Null or empty `value`: every GPU once. INVALID_ARGUMENT naming the entry and the GPU count
// otherwise.
Result<std::vector<int>> select_gpus(const char* value, int gpus);

// CUDA_DEVICE_ORDER: unset or "FASTEST_FIRST" (CUDA's default), "PCI_BUS_ID"; any other value
// CUDA ignores (nullopt: say so).
enum class DeviceOrder { kFastestFirst, kPciBusId };
std::optional<DeviceOrder> parse_device_order(const char* value);

}  // namespace sx::cuda
