// The CUDA preflight (issue 20 item 5; the seed's §2.3 and §4.4 as code): everything that can be
// known about the driver, the runtime, the compiled architectures, device visibility and device
// memory before a weight is read, each turned into a verdict with a message naming the cause and
// the fix. The CUDA module gathers PreflightInput (cudart, libcuda, NVML); this file only judges,
// so every message is unit-tested here from injected values (tests/unit/cuda).
//
// Pure host code without CUDA headers. Pure functions; thread-safe.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "backends/cuda/device_order.h"
#include "runtime/base/status.h"

namespace sx::cuda {

// One architecture compiled into the kernels: SASS for sm_XY (runs on devices of the same major
// version and a minor version >= Y; an "a" variant such as sm_90a only on exactly X.Y), or PTX
// for compute_XY (the driver compiles it at start-up for any device >= X.Y).
struct Arch {
  int major = 0, minor = 0;
  bool ptx = false;
  bool arch_specific = false;  // sm_90a
  auto operator<=>(const Arch&) const = default;
};
// The meson option's form: "90", "80;86;89;90", "90a", "90+PTX" (SASS and PTX of 9.0), entries
// separated by ';' or ','; "sm_90" / "compute_90" are accepted too. INVALID_ARGUMENT naming the
// entry otherwise.
Result<std::vector<Arch>> parse_arch_list(std::string_view text);
// "sm_80, sm_86, sm_90 + PTX compute_90"
std::string describe_archs(std::span<const Arch> archs);
// Whether some compiled arch runs on a device of compute capability major.minor without PTX JIT
// (sass), and whether PTX JIT can (ptx_jit).
struct ArchMatch {
  bool sass = false;
  bool ptx_jit = false;
};
ArchMatch match_arch(std::span<const Arch> archs, int cc_major, int cc_minor);

// 13000 -> "13.0", 12040 -> "12.4" (cudaDriverGetVersion / CUDART_VERSION encoding).
std::string cuda_version_string(int version);

struct GpuProcess {
  int device = -1;  // index into PreflightInput::devices
  std::uint32_t pid = 0;
  std::string command;      // "python3 -m vllm.entrypoints.openai.api_server ..." ("" when unknown)
  std::uint64_t bytes = 0;  // device memory it holds (0 when NVML does not say)
};

struct PreflightInput {
  // The driver library (libcuda.so.1): empty when it loaded, else the loader's error.
  std::string driver_error;
  int driver_version = 0;   // cuDriverGetVersion (the newest CUDA the driver supports); 0 unknown
  int runtime_version = 0;  // CUDART_VERSION this module was built with
  std::vector<Arch> archs;  // compiled into the kernels
  // cudaGetDeviceCount's error when it failed ("" otherwise), e.g. "cudaErrorNoDevice: no
  // CUDA-capable device is detected".
  std::string device_count_error;
  std::vector<GpuIdentity> devices;  // in PCI order (in_pci_order)
  const char* visible_devices = nullptr;  // CUDA_VISIBLE_DEVICES as set, null when unset
  const char* device_order = nullptr;     // CUDA_DEVICE_ORDER as set, null when unset
  // NVML (libnvidia-ml.so.1): empty when it loaded and answered, else why not (a warning only).
  std::string nvml_error;
  std::vector<GpuProcess> processes;  // other processes holding device memory (NVML)
};

enum class Verdict { kOk, kWarn, kFail };
std::string_view verdict_name(Verdict v);  // "ok", "warn", "fail"

struct Finding {
  Verdict verdict = Verdict::kOk;
  std::string check;    // "driver", "architecture", "visible devices", "device order", "memory", "nvml", "devices"
  std::string message;  // the cause and the fix, one line
  int device = -1;      // index into PreflightInput::devices, -1 for the whole machine
};

// Every check, in the order above; a failed driver check stops there (nothing after it can be
// known). See preflight.cpp for each message.
std::vector<Finding> run_preflight(const PreflightInput& in);
// OK when no finding failed; otherwise UNAVAILABLE with the failures' messages joined by "; ".
Status preflight_status(std::span<const Finding> findings);

}  // namespace sx::cuda
