// The CUDA module's entry point and backend (module_abi.h): the preflight's facts gathered from
// libcuda (opened here, so a missing or old driver is named, not hit), the CUDA runtime and NVML
// (optional), judged by preflight.h before any device is handed out; devices listed in PCI bus
// order (device_order.h).
#include <cuda_runtime.h>
#include <dlfcn.h>
#include <unistd.h>

#include <algorithm>
#include <fstream>
#include <mutex>
#include <sstream>

#include <fmt/format.h>

#include "backends/cuda/cuda_device.h"
#include "backends/cuda/cuda_topology.h"
#include "backends/cuda/device_order.h"
#include "backends/cuda/module_abi.h"
#include "backends/cuda/nccl_api.h"
#include "backends/cuda/preflight.h"
#include "runtime/base/log.h"
#include "runtime/hal/registry.h"

#ifndef SX_CUDA_ARCHS
#define SX_CUDA_ARCHS "unknown"
#endif

// ---- logging: forwarded to the binary's sink (module_abi.h) ------------------------------------
namespace {
const SxCudaHostHooks* g_hooks = nullptr;
}

namespace sx {
void set_log_level(LogLevel) {}
LogLevel log_level() { return g_hooks != nullptr ? static_cast<LogLevel>(g_hooks->log_level()) : LogLevel::kWarn; }
void set_log_json(bool) {}
void log_line(LogLevel level, std::string_view message) {
  if (g_hooks != nullptr) g_hooks->log_line(static_cast<int>(level), message.data(), message.size());
}
}  // namespace sx

namespace sx::cuda {

const char* compiled_archs_text() { return SX_CUDA_ARCHS; }

namespace {

// ---- NVML, loaded at run time (its header is not part of the toolkit) --------------------------
struct NvmlProcessInfo {  // nvmlProcessInfo_t (v2 layout, used by ..._v3)
  unsigned int pid;
  unsigned long long used_gpu_memory;
  unsigned int gpu_instance_id, compute_instance_id;
};
struct Nvml {
  void* lib = nullptr;
  int (*init)() = nullptr;
  int (*handle_by_pci)(const char*, void**) = nullptr;
  int (*processes)(void*, unsigned int*, NvmlProcessInfo*) = nullptr;
  const char* (*error_string)(int) = nullptr;
};

std::string command_of(unsigned pid) {
  std::ifstream f(fmt::format("/proc/{}/cmdline", pid), std::ios::binary);
  std::string s((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  for (char& c : s) {
    if (c == '\0') c = ' ';
  }
  while (!s.empty() && s.back() == ' ') s.pop_back();
  return s.size() > 120 ? s.substr(0, 117) + "..." : s;
}

// Other processes' memory on each device; an error string when NVML cannot say.
std::string nvml_processes(const std::vector<GpuIdentity>& devices, std::vector<GpuProcess>& out) {
  Nvml n;
  n.lib = dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
  if (n.lib == nullptr) return fmt::format("libnvidia-ml.so.1: {}", dlerror());
  n.init = reinterpret_cast<int (*)()>(dlsym(n.lib, "nvmlInit_v2"));
  n.handle_by_pci = reinterpret_cast<int (*)(const char*, void**)>(dlsym(n.lib, "nvmlDeviceGetHandleByPciBusId_v2"));
  n.processes = reinterpret_cast<int (*)(void*, unsigned int*, NvmlProcessInfo*)>(
      dlsym(n.lib, "nvmlDeviceGetComputeRunningProcesses_v3"));
  n.error_string = reinterpret_cast<const char* (*)(int)>(dlsym(n.lib, "nvmlErrorString"));
  if (n.init == nullptr || n.handle_by_pci == nullptr || n.processes == nullptr) {
    return "libnvidia-ml.so.1 lacks nvmlDeviceGetComputeRunningProcesses_v3 (driver older than 510)";
  }
  if (int r = n.init(); r != 0) {
    return fmt::format("nvmlInit: {}", n.error_string != nullptr ? n.error_string(r) : std::to_string(r));
  }
  const unsigned self = static_cast<unsigned>(getpid());
  for (std::size_t i = 0; i < devices.size(); ++i) {
    void* h = nullptr;
    if (n.handle_by_pci(devices[i].pci_bus_id.c_str(), &h) != 0) continue;
    NvmlProcessInfo infos[64];
    unsigned count = 64;
    if (n.processes(h, &count, infos) != 0) continue;
    for (unsigned p = 0; p < count && p < 64; ++p) {
      if (infos[p].pid == self) continue;
      // NVML_VALUE_NOT_AVAILABLE (all ones) where the driver does not say (containers, WSL).
      const std::uint64_t bytes = infos[p].used_gpu_memory == ~0ULL ? 0 : infos[p].used_gpu_memory;
      out.push_back({static_cast<int>(i), infos[p].pid, command_of(infos[p].pid), bytes});
    }
  }
  return "";
}

std::string uuid_text(const cudaUUID_t& u) {
  const auto* b = reinterpret_cast<const unsigned char*>(u.bytes);
  std::string s = "GPU-";
  for (int i = 0; i < 16; ++i) {
    if (i == 4 || i == 6 || i == 8 || i == 10) s += '-';
    s += fmt::format("{:02x}", b[i]);
  }
  return s;
}

// Free and total memory of a GPU as the driver sees them now (it creates the GPU's context).
bool memory_of(int ordinal, std::uint64_t& free_bytes, std::uint64_t& total_bytes) {
  std::size_t f = 0, t = 0;
  if (cudaSetDevice(ordinal) != cudaSuccess || cudaMemGetInfo(&f, &t) != cudaSuccess) {
    (void)cudaGetLastError();
    return false;
  }
  free_bytes = f;
  total_bytes = t;
  return true;
}

PreflightInput gather() {
  PreflightInput in;
  in.runtime_version = CUDART_VERSION;
  in.visible_devices = std::getenv("CUDA_VISIBLE_DEVICES");
  in.device_order = std::getenv("CUDA_DEVICE_ORDER");
  if (auto archs = parse_arch_list(SX_CUDA_ARCHS); archs.ok()) in.archs = *archs;
  void* libcuda = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  if (libcuda == nullptr) {
    in.driver_error = dlerror();
    return in;
  }
  auto driver_version = reinterpret_cast<int (*)(int*)>(dlsym(libcuda, "cuDriverGetVersion"));
  if (driver_version == nullptr || driver_version(&in.driver_version) != 0) in.driver_version = 0;
  int count = 0;
  if (const cudaError_t e = cudaGetDeviceCount(&count); e != cudaSuccess) {
    in.device_count_error = fmt::format("{}: {}", cudaGetErrorName(e), cudaGetErrorString(e));
    (void)cudaGetLastError();
    return in;
  }
  for (int ordinal = 0; ordinal < count; ++ordinal) {
    cudaDeviceProp p{};
    if (cudaGetDeviceProperties(&p, ordinal) != cudaSuccess) {
      (void)cudaGetLastError();
      continue;
    }
    GpuIdentity g;
    g.cuda_ordinal = ordinal;
    g.name = p.name;
    g.uuid = uuid_text(p.uuid);
    char bus[32] = {};
    if (cudaDeviceGetPCIBusId(bus, sizeof bus, ordinal) == cudaSuccess) g.pci_bus_id = bus;
    g.cc_major = p.major;
    g.cc_minor = p.minor;
    g.total_bytes = p.totalGlobalMem;
    if (!memory_of(ordinal, g.free_bytes, g.total_bytes)) g.free_bytes = g.total_bytes;
    in.devices.push_back(std::move(g));
  }
  in.devices = in_pci_order(std::move(in.devices));
  in.nvml_error = nvml_processes(in.devices, in.processes);
  return in;
}

class CudaBackend final : public hal::Backend {
 public:
  std::string_view name() const override { return "cuda"; }

  // Free memory is read again on each call (a reload plans beside the replicas already loaded).
  Result<std::vector<hal::DeviceInfo>> devices() const override {
    const State& s = state();
    SX_RETURN_IF_ERROR(s.status);
    std::vector<hal::DeviceInfo> infos = s.infos;
    for (std::size_t i = 0; i < infos.size(); ++i) {
      std::uint64_t total = 0;
      (void)memory_of(s.ordinal[i], infos[i].free_bytes, total);
    }
    return infos;
  }

  Result<std::unique_ptr<hal::Device>> create_device(int index, const hal::DeviceOptions& options) override {
    const State& s = state();
    SX_RETURN_IF_ERROR(s.status);
    if (index < 0 || static_cast<std::size_t>(index) >= s.infos.size()) {
      return invalid_argument_error("cuda: there is no device {} ({} selected; the GPUs in PCI order: {})", index,
                                    s.infos.size(), fmt::join(describe_devices(s.gpus), "; "));
    }
    SX_ASSIGN_OR_RETURN(const std::vector<hal::DeviceInfo> now, devices());  // free memory as it is now
    return create_cuda_device(now[static_cast<std::size_t>(index)], s.ordinal[static_cast<std::size_t>(index)], options);
  }

  Result<std::vector<std::unique_ptr<hal::Channel>>> create_channels(std::span<hal::Device* const> devices,
                                                                     const hal::ChannelOptions& options) override {
    return create_cuda_channels(devices, options);
  }
  std::uint64_t channel_reserve_bytes(int group_size) const override {
    return nccl_reserve_bytes(group_size, std::getenv("SEXTANT_CUDA_CHANNEL"), std::getenv("NCCL_BUFFSIZE"));
  }
  // The preflight's findings (run again: memory and processes change), then each GPU's PCIe link.
  std::vector<hal::MachineCheck> machine_checks() const override {
    const PreflightInput in = gather();
    std::vector<hal::MachineCheck> out;
    for (const Finding& f : run_preflight(in)) {
      out.push_back({f.verdict == Verdict::kFail   ? hal::MachineCheck::Verdict::kFail
                     : f.verdict == Verdict::kWarn ? hal::MachineCheck::Verdict::kWarn
                                                   : hal::MachineCheck::Verdict::kOk,
                     f.check, f.message});
    }
    for (hal::MachineCheck& c : pcie_checks(in.devices)) out.push_back(std::move(c));
    return out;
  }
  // The GPUs' links in PCI order (read again on each call: cheap, and a planner may ask late).
  Result<hal::Topology> topology() const override {
    const State& s = state();
    SX_RETURN_IF_ERROR(s.status);
    return gather_topology(s.gpus);
  }

 private:
  struct State {
    Status status;
    std::vector<GpuIdentity> gpus;        // in PCI order
    std::vector<hal::DeviceInfo> infos;   // one per Sextant device (SEXTANT_CUDA_DEVICES)
    std::vector<int> ordinal;             // the CUDA ordinal of each
  };
  // The preflight, once: its warnings logged, its failures the backend's UNAVAILABLE status.
  const State& state() const {
    std::call_once(once_, [this] {
      const PreflightInput in = gather();
      const std::vector<Finding> findings = run_preflight(in);
      for (const Finding& f : findings) {
        if (f.verdict == Verdict::kWarn) log_warn("cuda preflight: {}: {}", f.check, f.message);
        if (f.verdict == Verdict::kOk) log_debug("cuda preflight: {}: {}", f.check, f.message);
      }
      state_.status = preflight_status(findings);
      if (!state_.status.ok()) return;
      state_.gpus = in.devices;
      for (const std::string& line : describe_devices(in.devices)) log_info("{}", line);
      if (in.devices.size() > 1) log_info("GPU links:\n{}", hal::format_topology(gather_topology(in.devices)));
      auto picked = select_gpus(std::getenv("SEXTANT_CUDA_DEVICES"), static_cast<int>(in.devices.size()));
      if (!picked.ok()) {
        state_.status = picked.status();
        return;
      }
      for (std::size_t i = 0; i < picked->size(); ++i) {
        const int gpu = (*picked)[i];
        const GpuIdentity& g = in.devices[static_cast<std::size_t>(gpu)];
        // Several Sextant devices on one GPU share its memory (the planner splits it).
        const bool shared = std::count(picked->begin(), picked->end(), gpu) > 1;
        hal::DeviceInfo info;
        info.backend = "cuda";
        info.index = static_cast<int>(i);
        info.name = shared ? fmt::format("cuda:{} ({}, sm_{}{}, PCI {}, on GPU {})", i, g.name, g.cc_major, g.cc_minor,
                                         g.pci_bus_id, gpu)
                           : fmt::format("cuda:{} ({}, sm_{}{}, PCI {})", i, g.name, g.cc_major, g.cc_minor, g.pci_bus_id);
        info.kind = hal::DeviceKind::kDiscreteGpu;
        info.memory_bytes = g.total_bytes;
        info.free_bytes = g.free_bytes;
        info.shared_memory = shared;
        state_.infos.push_back(std::move(info));
        state_.ordinal.push_back(g.cuda_ordinal);
      }
    });
    return state_;
  }
  mutable std::once_flag once_;
  mutable State state_;
};

}  // namespace
}  // namespace sx::cuda

extern "C" __attribute__((visibility("default"))) sx::hal::Backend* sx_cuda_module_create(const SxCudaHostHooks* hooks,
                                                                                         const char** why) {
  if (hooks == nullptr || hooks->abi != sx::cuda::kAbi || hooks->op_size != sizeof(sx::hal::Op) ||
      hooks->status_size != sizeof(sx::Status)) {
    if (why != nullptr) *why = "the CUDA module is from another build of Sextant (ABI mismatch); reinstall both together";
    return nullptr;
  }
  g_hooks = hooks;
  return new sx::cuda::CudaBackend();
}
