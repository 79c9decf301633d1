// GPU links from NVML, the CUDA runtime and sysfs (cuda_topology.h).
#include "backends/cuda/cuda_topology.h"

#include <cuda_runtime.h>
#include <dlfcn.h>

#include <algorithm>
#include <cctype>
#include <fstream>
#include <string>

#include <fmt/format.h>

namespace sx::cuda {

namespace {

// nvmlPciInfo_t: char busIdLegacy[16]; unsigned domain, bus, device, pciDeviceId, pciSubSystemId;
// char busId[32] (with room to spare).
struct NvmlPci {
  char bus_id_legacy[16];
  unsigned domain, bus, device, device_id, subsystem_id;
  char bus_id[32];
  char spare[64];
};

struct NvmlLinks {
  int (*init)() = nullptr;
  int (*handle_by_pci)(const char*, void**) = nullptr;
  int (*common_ancestor)(void*, void*, int*) = nullptr;   // nvmlGpuTopologyLevel_t
  int (*nvlink_state)(void*, unsigned, int*) = nullptr;   // nvmlEnableState_t
  int (*nvlink_remote)(void*, unsigned, NvmlPci*) = nullptr;
};

constexpr unsigned kNvmlMaxLinks = 18;  // NVML_NVLINK_MAX_LINKS

hal::LinkKind kind_of_level(int level) {
  if (level <= 10) return hal::LinkKind::kPix;  // INTERNAL (one board), SINGLE
  if (level <= 20) return hal::LinkKind::kPxb;
  if (level <= 30) return hal::LinkKind::kPhb;
  if (level <= 40) return hal::LinkKind::kNode;
  return hal::LinkKind::kSys;
}

std::string sysfs_line(const std::string& bus_id, const char* file) {
  std::string id = bus_id;
  for (char& c : id) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  // cudaDeviceGetPCIBusId prints a 4- or 8-digit domain; sysfs names use 4.
  if (id.size() > 12 && id.find(':') == 8) id = id.substr(4);
  std::ifstream f("/sys/bus/pci/devices/" + id + "/" + file);
  std::string line;
  std::getline(f, line);
  return line;
}

// Fills the NVML facts; an error string when NVML cannot say.
std::string nvml_links(void* lib, const std::vector<GpuIdentity>& gpus, hal::Topology& t) {
  NvmlLinks n;
  n.init = reinterpret_cast<int (*)()>(dlsym(lib, "nvmlInit_v2"));
  n.handle_by_pci = reinterpret_cast<int (*)(const char*, void**)>(dlsym(lib, "nvmlDeviceGetHandleByPciBusId_v2"));
  n.common_ancestor = reinterpret_cast<int (*)(void*, void*, int*)>(dlsym(lib, "nvmlDeviceGetTopologyCommonAncestor"));
  n.nvlink_state = reinterpret_cast<int (*)(void*, unsigned, int*)>(dlsym(lib, "nvmlDeviceGetNvLinkState"));
  n.nvlink_remote = reinterpret_cast<int (*)(void*, unsigned, NvmlPci*)>(dlsym(lib, "nvmlDeviceGetNvLinkRemotePciInfo_v2"));
  if (n.init == nullptr || n.handle_by_pci == nullptr || n.common_ancestor == nullptr) {
    return "libnvidia-ml.so.1 lacks nvmlDeviceGetTopologyCommonAncestor";
  }
  if (const int r = n.init(); r != 0) return fmt::format("nvmlInit failed ({})", r);
  // nvmlInit counts: each init here is paired with a shutdown.
  struct Shutdown {
    int (*fn)();
    ~Shutdown() {
      if (fn != nullptr) (void)fn();
    }
  } shutdown{reinterpret_cast<int (*)()>(dlsym(lib, "nvmlShutdown"))};
  const std::size_t count = gpus.size();
  std::vector<void*> h(count, nullptr);
  for (std::size_t i = 0; i < count; ++i) {
    if (n.handle_by_pci(gpus[i].pci_bus_id.c_str(), &h[i]) != 0) h[i] = nullptr;
  }
  // NVLinks: to another GPU of the list, or to something else (NVSwitch).
  std::vector<int> to_switch(count, 0);
  std::vector<int> direct(count * count, 0);
  for (std::size_t i = 0; i < count && n.nvlink_state != nullptr && n.nvlink_remote != nullptr; ++i) {
    if (h[i] == nullptr) continue;
    for (unsigned l = 0; l < kNvmlMaxLinks; ++l) {
      int active = 0;
      NvmlPci remote{};
      if (n.nvlink_state(h[i], l, &active) != 0 || active == 0) continue;
      if (n.nvlink_remote(h[i], l, &remote) != 0) continue;
      bool gpu = false;
      for (std::size_t j = 0; j < count; ++j) {
        const auto a = parse_pci_bus_id(gpus[j].pci_bus_id);
        if (j != i && a && a->domain == remote.domain && a->bus == remote.bus && a->device == remote.device) {
          ++direct[i * count + j];
          gpu = true;
        }
      }
      // Not one of ours: NVSwitch, or a GPU this process does not see (CUDA_VISIBLE_DEVICES), which
      // NVML still knows by its PCI id.
      void* other = nullptr;
      remote.bus_id[sizeof remote.bus_id - 1] = '\0';
      if (!gpu && n.handle_by_pci(remote.bus_id, &other) != 0) ++to_switch[i];
    }
  }
  for (std::size_t i = 0; i < count; ++i) {
    for (std::size_t j = 0; j < count; ++j) {
      if (i == j || h[i] == nullptr || h[j] == nullptr) continue;
      hal::Link& link = t.link(static_cast<int>(i), static_cast<int>(j));
      const int nv = direct[i * count + j] > 0 ? direct[i * count + j] : std::min(to_switch[i], to_switch[j]);
      if (nv > 0) {
        link.kind = hal::LinkKind::kNvLink;
        link.nvlinks = nv;
        continue;
      }
      int level = 0;
      if (n.common_ancestor(h[i], h[j], &level) == 0) link.kind = kind_of_level(level);
    }
  }
  return "";
}

}  // namespace

std::vector<hal::MachineCheck> pcie_checks(const std::vector<GpuIdentity>& gpus) {
  std::vector<hal::MachineCheck> out;
  void* lib = dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
  if (lib == nullptr) return out;
  using Get = int (*)(void*, unsigned*);
  auto init = reinterpret_cast<int (*)()>(dlsym(lib, "nvmlInit_v2"));
  auto shutdown = reinterpret_cast<int (*)()>(dlsym(lib, "nvmlShutdown"));
  auto by_pci = reinterpret_cast<int (*)(const char*, void**)>(dlsym(lib, "nvmlDeviceGetHandleByPciBusId_v2"));
  auto gen = reinterpret_cast<Get>(dlsym(lib, "nvmlDeviceGetCurrPcieLinkGeneration"));
  auto max_gen = reinterpret_cast<Get>(dlsym(lib, "nvmlDeviceGetMaxPcieLinkGeneration"));
  auto width = reinterpret_cast<Get>(dlsym(lib, "nvmlDeviceGetCurrPcieLinkWidth"));
  auto max_width = reinterpret_cast<Get>(dlsym(lib, "nvmlDeviceGetMaxPcieLinkWidth"));
  if (init != nullptr && by_pci != nullptr && gen != nullptr && max_gen != nullptr && width != nullptr &&
      max_width != nullptr && init() == 0) {
    for (std::size_t i = 0; i < gpus.size(); ++i) {
      void* h = nullptr;
      unsigned g = 0, mg = 0, w = 0, mw = 0;
      if (by_pci(gpus[i].pci_bus_id.c_str(), &h) != 0 || gen(h, &g) != 0 || max_gen(h, &mg) != 0 || width(h, &w) != 0 ||
          max_width(h, &mw) != 0) {
        continue;
      }
      const std::string what = fmt::format("GPU {} ({}, PCI {}): PCIe Gen{} x{} (maximum Gen{} x{})", i, gpus[i].name,
                                           gpus[i].pci_bus_id, g, w, mg, mw);
      if (w < mw) {
        out.push_back({hal::MachineCheck::Verdict::kWarn, "pcie",
                       what + ": a narrower link than the card allows (a riser, a shared slot or a bad seat); "
                              "collectives over it are slow and may time out: reseat the card or move it to a "
                              "full-width slot"});
      } else {
        out.push_back({hal::MachineCheck::Verdict::kOk, "pcie",
                       g < mg ? what + " (a lower generation at idle is power saving; check under load)" : what});
      }
    }
    if (shutdown != nullptr) (void)shutdown();
  }
  dlclose(lib);
  return out;
}

hal::Topology gather_topology(const std::vector<GpuIdentity>& gpus) {
  const int n = static_cast<int>(gpus.size());
  hal::Topology t = hal::make_topology(n, "NVML and the CUDA runtime");
  for (int i = 0; i < n; ++i) {
    const std::string& bus = gpus[static_cast<std::size_t>(i)].pci_bus_id;
    t.cpu_affinity.push_back(sysfs_line(bus, "local_cpulist"));
    const std::string numa = sysfs_line(bus, "numa_node");
    t.numa_affinity.push_back(numa == "-1" ? "N/A" : numa);
  }
  for (int i = 0; i < n; ++i) {
    for (int j = 0; j < n; ++j) {
      if (i == j) continue;
      const int a = gpus[static_cast<std::size_t>(i)].cuda_ordinal, b = gpus[static_cast<std::size_t>(j)].cuda_ordinal;
      int access = 0, rank = -1;
      hal::Link& link = t.link(i, j);
      if (cudaDeviceCanAccessPeer(&access, a, b) == cudaSuccess) link.peer_access = access != 0 ? 1 : 0;
      if (cudaDeviceGetP2PAttribute(&rank, cudaDevP2PAttrPerformanceRank, a, b) == cudaSuccess) link.p2p_rank = rank;
      (void)cudaGetLastError();
    }
  }
  void* lib = dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
  const std::string why = lib == nullptr ? fmt::format("libnvidia-ml.so.1: {}", dlerror()) : nvml_links(lib, gpus, t);
  if (lib != nullptr) dlclose(lib);
  if (!why.empty()) {
    t.source += fmt::format(" (link kinds not known: {})", why);
  }
  return t;
}

}  // namespace sx::cuda
