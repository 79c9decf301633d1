// The backend registry: backends register explicitly (DESIGN.md §7.3). Enumerating devices is
// cheap; devices are created on demand. A backend whose runtime is missing (no ICD, no libcuda)
// reports UNAVAILABLE from devices() instead of failing the process.
//
// Threading: fill the registry at start-up, then read it from any thread.
#pragma once

#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "runtime/base/status.h"
#include "runtime/hal/channel.h"
#include "runtime/hal/device.h"

namespace sx::hal {

struct DeviceOptions {
  int threads = 0;                  // CPU: worker threads (0 = all hardware threads)
  std::uint64_t memory_budget = 0;  // CPU: bytes this device may allocate (0 = system memory)
  // Strict mode (tests): device memory is unreachable from host code outside the device's own
  // execution, and streams run their work only at sync(), so engine code that bypasses the HAL
  // (reads a buffer, reads a download before sync, reuses an upload source early) fails.
  bool strict = false;
  // Fault injection (tests): the n-th op run on this device (1-based) fails with INTERNAL.
  std::uint64_t fail_at_op = 0;
};

class Backend {
 public:
  virtual ~Backend() = default;
  virtual std::string_view name() const = 0;
  virtual Result<std::vector<DeviceInfo>> devices() const = 0;
  virtual Result<std::unique_ptr<Device>> create_device(int index, const DeviceOptions& options) = 0;
  // One Channel per device, rank i for devices[i] (all created by this backend). UNIMPLEMENTED by
  // default: a backend without collectives can still serve a group of one.
  virtual Result<std::vector<std::unique_ptr<Channel>>> create_channels(std::span<Device* const> devices,
                                                                         const ChannelOptions& options);
};

class Registry {
 public:
  void add(std::unique_ptr<Backend> backend);
  // NOT_FOUND naming the compiled-in backends when `name` is not one of them.
  Result<Backend*> find(std::string_view name) const;
  std::vector<std::string> names() const;

 private:
  std::vector<std::unique_ptr<Backend>> backends_;
};

}  // namespace sx::hal
