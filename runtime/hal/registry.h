// The backend registry: backends register explicitly (DESIGN.md §7.3). Enumerating devices is
// cheap; devices are created on demand. A backend whose runtime is missing (no ICD, no libcuda)
// reports UNAVAILABLE from devices() instead of failing the process.
//
// Threading: fill the registry at start-up, then read it from any thread.
#pragma once

#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "runtime/base/status.h"
#include "runtime/hal/channel.h"
#include "runtime/hal/device.h"
#include "runtime/hal/device_options.h"
#include "runtime/hal/topology.h"

namespace sx::hal {

// A fact a backend checked about the machine, for `sextant doctor`: the CUDA preflight's findings
// (driver, runtime, architectures, visible devices, memory and the processes holding it), PCIe
// links against their maximum.
struct MachineCheck {
  enum class Verdict { kOk, kWarn, kFail };
  Verdict verdict = Verdict::kOk;
  std::string check;    // "driver", "architecture", "pcie", ...
  std::string message;  // the evidence, and the fix where one is needed
};

// Which kernels a backend's devices run, when the backend chooses them at start-up (the CPU's
// instruction-set level, SEXTANT_CPU_ISA), for `sextant bench` and `sextant doctor`, which name no
// backend (DESIGN.md §2) and print what the backend says.
struct KernelReport {
  Status status;         // OK, or why no kernels can run (its devices will not open), e.g. a bad SEXTANT_CPU_ISA
  std::string line;      // one line naming the backend, e.g. "cpu: using avx2 kernels" (on failure: the error)
  std::string evidence;  // the choice and the alternatives this machine has (on failure: status's message)
  std::string fix;       // on failure, what to do
};

class Backend {
 public:
  virtual ~Backend() = default;
  virtual std::string_view name() const = 0;
  virtual Result<std::vector<DeviceInfo>> devices() const = 0;
  // `options` are this backend's own (device_options.h; an unknown name is INVALID_ARGUMENT).
  virtual Result<std::unique_ptr<Device>> create_device(int index, const DeviceOptions& options) = 0;
  // The devices at `indices` (distinct) for the ranks of one group, rank i on indices[i]. The
  // default creates each with `options`; a backend whose devices share resources divides them here
  // (the CPU splits its threads).
  virtual Result<std::vector<std::unique_ptr<Device>>> create_devices_at(std::span<const int> indices,
                                                                         const DeviceOptions& options);
  // Devices 0 .. count-1: create_devices_at({0, ..., count-1}).
  Result<std::vector<std::unique_ptr<Device>>> create_devices(int count, const DeviceOptions& options);
  // The host threads this backend's devices compute with, one pool shared by all of them (0: its
  // devices do not compute on the host's cores). A backend answering > 0 takes the device option
  // "threads" (its share for one group), which is how replicas divide the cores between them.
  virtual int host_threads() const { return 0; }
  // One Channel per device, rank i for devices[i] (all created by this backend). UNIMPLEMENTED by
  // default: a backend without collectives can still serve a group of one.
  virtual Result<std::vector<std::unique_ptr<Channel>>> create_channels(std::span<Device* const> devices,
                                                                         const ChannelOptions& options);
  // The links between the machine's GPUs (topology.h), in the backend's GPU order (for CUDA: PCI
  // order, as its devices are numbered when each GPU is one device). UNIMPLEMENTED by default (the
  // CPU's devices share one memory; Vulkan does not say).
  virtual Result<Topology> topology() const;
  // What the backend checks about the machine before serving (empty by default: nothing beyond its
  // device list). Cheap enough for `sextant doctor`; never creates a device.
  virtual std::vector<MachineCheck> machine_checks() const { return {}; }
  // The kernels this backend chose for this machine (KernelReport above); nullopt (the default)
  // when it has no choice to report. Cheap, never creates a device.
  virtual std::optional<KernelReport> kernel_report() const { return std::nullopt; }
  // Device memory a channel of `group_size` ranks of this backend takes on each of its devices
  // beyond what the channel's user allocates (NCCL's buffers), for the memory plan. 0 by default.
  virtual std::uint64_t channel_reserve_bytes(int group_size) const {
    (void)group_size;
    return 0;
  }
};

// backend.devices(), its error (a missing driver, no device) as "backend NAME unavailable:
// REASON" with the code kept: what every command that opens devices reports.
Result<std::vector<DeviceInfo>> list_devices(const Backend& backend);

class Registry {
 public:
  void add(std::unique_ptr<Backend> backend);
  // NOT_FOUND naming the compiled-in backends when `name` is not one of them.
  Result<Backend*> find(std::string_view name) const;
  // find(name), or for "auto" the first backend in registration order that reports a device; `why`
  // (when given) receives the choice and what each backend before it answered, e.g. "auto: cuda:
  // UNAVAILABLE: no driver; using cpu (8 devices)". NOT_FOUND when no backend has a device.
  Result<Backend*> pick(std::string_view name, std::string* why = nullptr) const;
  std::vector<std::string> names() const;

 private:
  std::vector<std::unique_ptr<Backend>> backends_;
};

}  // namespace sx::hal
