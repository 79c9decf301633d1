// The CUDA preflight (preflight.h): judges injected driver/runtime/architecture/visibility/memory
// facts and words each verdict as "cause: fix" in one line. Checks run in this order:
//   driver          libcuda missing (fail, stop), driver older than the runtime's major (fail,
//                   stop), older minor (warn: minor-version compatibility, no PTX JIT), else ok
//   visible devices CUDA_VISIBLE_DEVICES hiding every GPU (fail), entries CUDA ignores (warn),
//                   repeated entries (fail)
//   device order    an invalid CUDA_DEVICE_ORDER (warn), indices counted in FASTEST_FIRST order
//                   (warn), CUDA ordinals that differ from Sextant's PCI-order numbers (warn)
//   devices         no device (fail)
//   architecture    per device: GPU too old for CUDA 13, no SASS or PTX for it (fail), PTX only
//                   (warn: JIT at first start)
//   nvml            NVML unavailable (warn only)
//   memory          per device: other processes holding memory, or under half free (warn)
#include "backends/cuda/preflight.h"

#include <algorithm>
#include <cstddef>
#include <utility>

#include <fmt/format.h>

namespace sx::cuda {
namespace {

constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;

std::string gib(std::uint64_t bytes) {
  return fmt::format("{:.1f} GiB", static_cast<double>(bytes) / kGiB);
}

std::string_view trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t')) s.remove_suffix(1);
  return s;
}

// "sm_90", "sm_90a", "compute_90", "sm_100"
std::string arch_name(const Arch& a) {
  return fmt::format("{}_{}{}{}", a.ptx ? "compute" : "sm", a.major, a.minor,
                     a.arch_specific ? "a" : "");
}
std::string cc_name(const GpuIdentity& d) { return fmt::format("{}{}", d.cc_major, d.cc_minor); }

// "GPU 0 (NVIDIA H200, PCI 0000:1b:00.0)"
std::string gpu_label(std::size_t i, const GpuIdentity& d) {
  return fmt::format("GPU {} ({}, PCI {})", i, d.name.empty() ? "unknown GPU" : d.name,
                     d.pci_bus_id.empty() ? "unknown" : d.pci_bus_id);
}

// One entry of the arch list: [sm_|compute_](XY|XYZ)[a][+PTX], e.g. "90", "sm_100a", "90+PTX".
std::optional<std::vector<Arch>> parse_arch(std::string_view e) {
  bool ptx_only = false, with_ptx = false;
  if (e.ends_with("+PTX") || e.ends_with("+ptx")) {
    with_ptx = true;
    e.remove_suffix(4);
  }
  if (e.starts_with("sm_")) {
    e.remove_prefix(3);
  } else if (e.starts_with("compute_")) {
    e.remove_prefix(8);
    ptx_only = true;
  }
  Arch a;
  if (!e.empty() && e.back() == 'a') {
    a.arch_specific = true;
    e.remove_suffix(1);
  }
  std::string digits(e);
  if (digits.size() < 2 || digits.size() > 3 || digits[0] == '0' ||
      !std::all_of(digits.begin(), digits.end(), [](char c) { return c >= '0' && c <= '9'; }))
    return std::nullopt;
  int number = std::stoi(digits);
  a.major = number / 10;
  a.minor = number % 10;
  std::vector<Arch> out;
  if (!ptx_only) out.push_back(a);
  if (ptx_only || with_ptx) {
    a.ptx = true;
    out.push_back(a);
  }
  return out;
}

bool version_known(int v) { return v > 0; }
int version_major(int v) { return v / 1000; }

void add(std::vector<Finding>& out, Verdict v, std::string check, std::string message,
         int device = -1) {
  out.push_back(Finding{v, std::move(check), std::move(message), device});
}

// Returns false when nothing after it can be known (the driver is missing or too old).
bool check_driver(const PreflightInput& in, std::vector<Finding>& out) {
  if (!in.driver_error.empty()) {
    add(out, Verdict::kFail, "driver",
        fmt::format("no NVIDIA driver: libcuda.so.1 cannot be loaded ({}); install the NVIDIA "
                    "driver (nvidia-smi must work) or run with --backend cpu/vulkan",
                    in.driver_error));
    return false;
  }
  std::string runtime = cuda_version_string(in.runtime_version);
  if (!version_known(in.driver_version) || !version_known(in.runtime_version)) {
    add(out, Verdict::kWarn, "driver",
        fmt::format("the driver's or runtime's CUDA version is unknown (driver {}, runtime {}): "
                    "cannot check that the driver is new enough; if CUDA fails to initialise, "
                    "update the NVIDIA driver",
                    in.driver_version, in.runtime_version));
    return true;
  }
  std::string driver = cuda_version_string(in.driver_version);
  if (version_major(in.driver_version) < version_major(in.runtime_version)) {
    add(out, Verdict::kFail, "driver",
        fmt::format("the NVIDIA driver supports CUDA {}, this build needs {}: update the driver "
                    "(CUDA 13.x needs driver 580 or newer; CUDA 12.x: 525 or newer) or use a "
                    "build made with an older CUDA toolkit",
                    driver, runtime));
    return false;
  }
  if (version_major(in.driver_version) == version_major(in.runtime_version) &&
      in.driver_version < in.runtime_version) {
    add(out, Verdict::kWarn, "driver",
        fmt::format("the NVIDIA driver supports CUDA {}, this build uses {}: it runs under CUDA "
                    "minor-version compatibility, but the driver cannot JIT-compile this build's "
                    "PTX; update the driver to one supporting CUDA {} or newer",
                    driver, runtime, runtime));
    return true;
  }
  add(out, Verdict::kOk, "driver",
      fmt::format("driver supports CUDA {}, runtime {}", driver, runtime));
  return true;
}

void check_visible_devices(const PreflightInput& in, const VisibleDevices& vd,
                           std::vector<Finding>& out) {
  if (!vd.set) {
    add(out, Verdict::kOk, "visible devices", "CUDA_VISIBLE_DEVICES is not set: every GPU is visible");
    return;
  }
  std::string value = in.visible_devices;
  std::size_t before = out.size();
  if (vd.hides_all) {
    add(out, Verdict::kFail, "visible devices",
        fmt::format("CUDA_VISIBLE_DEVICES={} hides every GPU: unset it or list the GPUs to use, "
                    "e.g. CUDA_VISIBLE_DEVICES=0,1",
                    value));
    return;  // what is ignored is all of it; the failure says so
  }
  if (!vd.ignored.empty()) {
    add(out, Verdict::kWarn, "visible devices",
        fmt::format("CUDA_VISIBLE_DEVICES={}: CUDA ignores \"{}\" and everything after (it stops "
                    "at the first entry that is not a device number, GPU-<uuid> or MIG-<uuid>) "
                    "and uses {} only: correct or remove that entry",
                    value, vd.ignored, fmt::join(vd.entries, ",")));
  }
  if (!vd.duplicates.empty()) {
    add(out, Verdict::kFail, "visible devices",
        fmt::format("CUDA_VISIBLE_DEVICES={} lists {} more than once, and CUDA fails to "
                    "initialise with a repeated device: list each GPU once",
                    value, fmt::join(vd.duplicates, ", ")));
  }
  if (out.size() == before)
    add(out, Verdict::kOk, "visible devices", fmt::format("CUDA_VISIBLE_DEVICES={}", value));
}

void check_device_order(const PreflightInput& in, const VisibleDevices& vd,
                        std::vector<Finding>& out) {
  std::size_t before = out.size();
  std::optional<DeviceOrder> order = parse_device_order(in.device_order);
  if (!order) {
    add(out, Verdict::kWarn, "device order",
        fmt::format("CUDA_DEVICE_ORDER={} is neither FASTEST_FIRST nor PCI_BUS_ID, so CUDA "
                    "ignores it and uses FASTEST_FIRST: set CUDA_DEVICE_ORDER=PCI_BUS_ID or unset it",
                    in.device_order));
  }
  // A device number other than 0 means the machine has several GPUs even when one is visible.
  bool numbers_matter = in.devices.size() > 1 ||
                        std::any_of(vd.entries.begin(), vd.entries.end(), [](const std::string& e) {
                          return !e.empty() && e.find_first_not_of('0') != std::string::npos &&
                                 e.find_first_not_of("0123456789") == std::string::npos;
                        });
  if (vd.set && vd.by_index && numbers_matter && order != DeviceOrder::kPciBusId) {
    add(out, Verdict::kWarn, "device order",
        fmt::format("CUDA_VISIBLE_DEVICES={} counts GPUs in CUDA's FASTEST_FIRST order, which may "
                    "differ from nvidia-smi's; set CUDA_DEVICE_ORDER=PCI_BUS_ID",
                    in.visible_devices));
  }
  bool increasing = true;
  for (std::size_t i = 1; i < in.devices.size(); ++i)
    if (in.devices[i].cuda_ordinal <= in.devices[i - 1].cuda_ordinal) increasing = false;
  if (!increasing) {
    std::vector<std::string> differ;
    for (std::size_t i = 0; i < in.devices.size(); ++i)
      if (in.devices[i].cuda_ordinal != static_cast<int>(i))
        differ.push_back(fmt::format("cuda:{} is CUDA ordinal {}", i, in.devices[i].cuda_ordinal));
    add(out, Verdict::kWarn, "device order",
        fmt::format("Sextant numbers GPUs in PCI bus order (nvidia-smi's) and CUDA's order differs: "
                    "{}; tools that use CUDA's numbers will name other GPUs: set "
                    "CUDA_DEVICE_ORDER=PCI_BUS_ID so that both agree",
                    fmt::join(differ, ", ")));
  }
  if (out.size() == before && !in.devices.empty())
    add(out, Verdict::kOk, "device order", "CUDA ordinals follow PCI bus order");
}

void check_devices(const PreflightInput& in, std::vector<Finding>& out) {
  if (in.device_count_error.empty() && !in.devices.empty()) {
    add(out, Verdict::kOk, "devices", fmt::format("{} CUDA device(s)", in.devices.size()));
    return;
  }
  std::string message = fmt::format(
      "no CUDA device: {}",
      in.device_count_error.empty() ? "the CUDA runtime reports none" : in.device_count_error);
  if (in.visible_devices != nullptr) {
    message += fmt::format("; CUDA_VISIBLE_DEVICES={} is set: check that it names GPUs that "
                           "exist (nvidia-smi -L) or unset it",
                           in.visible_devices);
  } else {
    message += "; check that nvidia-smi lists a GPU, or run with --backend cpu/vulkan";
  }
  add(out, Verdict::kFail, "devices", std::move(message));
}

void check_architecture(const PreflightInput& in, std::vector<Finding>& out) {
  bool minor_compat = version_known(in.driver_version) && version_known(in.runtime_version) &&
                      in.driver_version < in.runtime_version;
  std::string have = in.archs.empty() ? std::string("no kernels") : describe_archs(in.archs) + " only";
  for (std::size_t i = 0; i < in.devices.size(); ++i) {
    const GpuIdentity& d = in.devices[i];
    int dev = static_cast<int>(i);
    std::string cc = cc_name(d);
    if (version_major(in.runtime_version) >= 13 && (d.cc_major < 7 || (d.cc_major == 7 && d.cc_minor < 5))) {
      add(out, Verdict::kFail, "architecture",
          fmt::format("{} is sm_{}; CUDA 13 no longer supports sm_{} GPUs (sm_75 is the oldest it "
                      "runs on): use a build made with CUDA 12.x or run with --backend vulkan/cpu",
                      gpu_label(i, d), cc, cc),
          dev);
      continue;
    }
    ArchMatch m = match_arch(in.archs, d.cc_major, d.cc_minor);
    if (m.sass) {
      add(out, Verdict::kOk, "architecture",
          fmt::format("{} is sm_{}; this build has {}", gpu_label(i, d), cc, describe_archs(in.archs)),
          dev);
    } else if (m.ptx_jit && minor_compat) {
      add(out, Verdict::kFail, "architecture",
          fmt::format("{} is sm_{} and this build has {}, so it needs PTX JIT, which a driver "
                      "older than the runtime (CUDA {} < {}) cannot do: rebuild with "
                      "-Dnvcc_archs={} or update the driver",
                      gpu_label(i, d), cc, have, cuda_version_string(in.driver_version),
                      cuda_version_string(in.runtime_version), cc),
          dev);
    } else if (m.ptx_jit) {
      add(out, Verdict::kWarn, "architecture",
          fmt::format("{} is sm_{} and this build has {}: the driver JIT-compiles the PTX at the "
                      "first start, which is slow; rebuild with -Dnvcc_archs={} (or add it to the list)",
                      gpu_label(i, d), cc, have, cc),
          dev);
    } else {
      add(out, Verdict::kFail, "architecture",
          fmt::format("{} is sm_{}; this build has {}; rebuild with -Dnvcc_archs={} (or add it "
                      "to the list)",
                      gpu_label(i, d), cc, have, cc),
          dev);
    }
  }
}

void check_memory(const PreflightInput& in, std::vector<Finding>& out) {
  for (std::size_t i = 0; i < in.devices.size(); ++i) {
    const GpuIdentity& d = in.devices[i];
    int dev = static_cast<int>(i);
    std::string amounts = fmt::format("GPU {}: {} free of {}", i, gib(d.free_bytes), gib(d.total_bytes));
    std::vector<std::string> others;
    for (const GpuProcess& p : in.processes) {
      if (p.device != dev) continue;
      std::string line = fmt::format("pid {} ({})", p.pid, p.command.empty() ? "command unknown" : p.command);
      if (p.bytes > 0) line += fmt::format(" {}", gib(p.bytes));
      others.push_back(std::move(line));
    }
    if (!others.empty()) {
      add(out, Verdict::kWarn, "memory",
          fmt::format("{}; other processes hold memory on it: {}: stop them (nvidia-smi "
                      "--query-compute-apps=pid,used_memory,name --format=csv) or lower the memory "
                      "plan; Sextant plans against the free memory",
                      amounts, fmt::join(others, ", ")),
          dev);
    } else if (d.total_bytes > 0 && d.free_bytes < d.total_bytes / 2) {
      add(out, Verdict::kWarn, "memory",
          fmt::format("{}; more than half of it is in use by something{} (another process, "
                      "container or a MIG/vGPU limit): check nvidia-smi and free it, or lower the "
                      "memory plan; Sextant plans against the free memory",
                      amounts, in.nvml_error.empty() ? " NVML does not list" : ""),
          dev);
    } else {
      add(out, Verdict::kOk, "memory", std::move(amounts), dev);
    }
  }
}

}  // namespace

Result<std::vector<Arch>> parse_arch_list(std::string_view text) {
  std::vector<Arch> archs;
  while (true) {
    std::size_t sep = text.find_first_of(";,");
    std::string_view entry = trim(text.substr(0, sep));
    if (!entry.empty()) {
      std::optional<std::vector<Arch>> parsed = parse_arch(entry);
      if (!parsed)
        return invalid_argument_error(
            "nvcc_archs entry \"{}\" is not an architecture: use e.g. 90, 90a, 90+PTX, sm_90 or "
            "compute_90, separated by ';' or ','",
            entry);
      archs.insert(archs.end(), parsed->begin(), parsed->end());
    }
    if (sep == std::string_view::npos) break;
    text.remove_prefix(sep + 1);
  }
  if (archs.empty())
    return invalid_argument_error("nvcc_archs lists no architecture: give e.g. 90 or 80;86;89;90");
  std::sort(archs.begin(), archs.end());
  archs.erase(std::unique(archs.begin(), archs.end()), archs.end());
  return archs;
}

std::string describe_archs(std::span<const Arch> archs) {
  std::vector<std::string> sass, ptx;
  for (const Arch& a : archs) (a.ptx ? ptx : sass).push_back(arch_name(a));
  std::string out = fmt::format("{}", fmt::join(sass, ", "));
  if (!ptx.empty()) out += fmt::format("{}PTX {}", out.empty() ? "" : " + ", fmt::join(ptx, ", "));
  return out.empty() ? "no architecture" : out;
}

ArchMatch match_arch(std::span<const Arch> archs, int cc_major, int cc_minor) {
  ArchMatch m;
  for (const Arch& a : archs) {
    bool exact = a.major == cc_major && a.minor == cc_minor;
    if (a.ptx) {
      // PTX JIT-compiles for any newer device; an "a" variant's PTX only for exactly its own.
      bool not_newer = a.major < cc_major || (a.major == cc_major && a.minor <= cc_minor);
      if (a.arch_specific ? exact : not_newer) m.ptx_jit = true;
    } else {
      bool same_major = a.major == cc_major && a.minor <= cc_minor;
      if (a.arch_specific ? exact : same_major) m.sass = true;
    }
  }
  return m;
}

std::string cuda_version_string(int version) {
  return fmt::format("{}.{}", version / 1000, (version % 1000) / 10);
}

std::string_view verdict_name(Verdict v) {
  switch (v) {
    case Verdict::kOk: return "ok";
    case Verdict::kWarn: return "warn";
    case Verdict::kFail: return "fail";
  }
  return "?";
}

std::vector<Finding> run_preflight(const PreflightInput& in) {
  std::vector<Finding> out;
  if (!check_driver(in, out)) return out;
  VisibleDevices vd = parse_visible_devices(in.visible_devices);
  check_visible_devices(in, vd, out);
  check_device_order(in, vd, out);
  check_devices(in, out);
  check_architecture(in, out);
  if (!in.nvml_error.empty())
    add(out, Verdict::kWarn, "nvml",
        fmt::format("NVML unavailable ({}): other processes' use of GPU memory cannot be listed; "
                    "install the driver's libnvidia-ml.so.1 to see them",
                    in.nvml_error));
  check_memory(in, out);
  return out;
}

Status preflight_status(std::span<const Finding> findings) {
  std::vector<std::string_view> failures;
  for (const Finding& f : findings)
    if (f.verdict == Verdict::kFail) failures.push_back(f.message);
  if (failures.empty()) return ok_status();
  return unavailable_error("{}", fmt::join(failures, "; "));
}

}  // namespace sx::cuda
