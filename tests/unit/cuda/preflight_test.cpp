// backends/cuda/preflight.h: the arch list, and every preflight verdict and message from injected
// driver / runtime / architecture / visibility / memory values (no GPU needed).
#include "backends/cuda/preflight.h"

#include <string>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

namespace sx::cuda {
namespace {

using ::testing::AllOf;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;
using ::testing::Not;
using ::testing::SizeIs;

constexpr std::uint64_t kGiB = 1024ull * 1024 * 1024;

std::vector<Arch> archs(std::string_view text) {
  Result<std::vector<Arch>> r = parse_arch_list(text);
  EXPECT_TRUE(r.ok()) << r.status().to_string();
  return r.ok() ? *r : std::vector<Arch>{};
}

GpuIdentity gpu(int ordinal, std::string name, std::string bus_id, int major, int minor) {
  GpuIdentity g;
  g.cuda_ordinal = ordinal;
  g.name = std::move(name);
  g.pci_bus_id = std::move(bus_id);
  g.cc_major = major;
  g.cc_minor = minor;
  g.total_bytes = 1398 * kGiB / 10;
  g.free_bytes = 1392 * kGiB / 10;
  return g;
}

// A healthy one-H200 machine with a CUDA 13.0 build for sm_90.
PreflightInput healthy() {
  PreflightInput in;
  in.driver_version = 13000;
  in.runtime_version = 13000;
  in.archs = archs("90");
  in.devices = {gpu(0, "NVIDIA H200", "0000:1b:00.0", 9, 0)};
  return in;
}

std::vector<Finding> with(const std::vector<Finding>& all, std::string_view check, Verdict v) {
  std::vector<Finding> out;
  for (const Finding& f : all)
    if (f.check == check && f.verdict == v) out.push_back(f);
  return out;
}
std::vector<Finding> with(const std::vector<Finding>& all, Verdict v) {
  std::vector<Finding> out;
  for (const Finding& f : all)
    if (f.verdict == v) out.push_back(f);
  return out;
}

TEST(ParseArchList, MesonForms) {
  EXPECT_THAT(archs("90"), ElementsAre(Arch{9, 0, false, false}));
  EXPECT_THAT(archs("80;86;89;90"),
              ElementsAre(Arch{8, 0}, Arch{8, 6}, Arch{8, 9}, Arch{9, 0}));
  EXPECT_THAT(archs("90a"), ElementsAre(Arch{9, 0, false, true}));
  EXPECT_THAT(archs("90+PTX"), ElementsAre(Arch{9, 0, false, false}, Arch{9, 0, true, false}));
  EXPECT_THAT(archs("sm_90"), ElementsAre(Arch{9, 0}));
  EXPECT_THAT(archs("compute_90"), ElementsAre(Arch{9, 0, true, false}));
  EXPECT_THAT(archs("sm_80, sm_86,compute_90"),
              ElementsAre(Arch{8, 0}, Arch{8, 6}, Arch{9, 0, true, false}));
  EXPECT_THAT(archs("100;120"), ElementsAre(Arch{10, 0}, Arch{12, 0}));
  EXPECT_THAT(archs("90;80;90;"), ElementsAre(Arch{8, 0}, Arch{9, 0}));  // sorted, deduplicated
}

TEST(ParseArchList, NamesTheBadEntry) {
  for (std::string_view bad : {"80;9x;90", "80;sm90", "80,compute_", "80;7", "80;1000", "80;PTX"}) {
    Result<std::vector<Arch>> r = parse_arch_list(bad);
    ASSERT_FALSE(r.ok()) << bad;
    EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  }
  EXPECT_THAT(parse_arch_list("80;9x;90").status().message(), HasSubstr("\"9x\""));
  EXPECT_THAT(parse_arch_list("80;sm90").status().message(), HasSubstr("\"sm90\""));
  EXPECT_EQ(parse_arch_list("").status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(parse_arch_list(" ; ").status().code(), StatusCode::kInvalidArgument);
}

TEST(DescribeArchs, SassThenPtx) {
  EXPECT_EQ(describe_archs(archs("80;86;90+PTX")), "sm_80, sm_86, sm_90 + PTX compute_90");
  EXPECT_EQ(describe_archs(archs("90a")), "sm_90a");
  EXPECT_EQ(describe_archs(archs("compute_80")), "PTX compute_80");
  EXPECT_EQ(describe_archs({}), "no architecture");
}

TEST(MatchArch, SassSameMajorNotNewerMinorPtxAnyNewer) {
  auto m = [](std::string_view list, int major, int minor) {
    ArchMatch r = match_arch(archs(list), major, minor);
    return std::pair{r.sass, r.ptx_jit};
  };
  EXPECT_EQ(m("80", 8, 6), std::pair(true, false));
  EXPECT_EQ(m("86", 8, 0), std::pair(false, false));
  EXPECT_EQ(m("90", 10, 0), std::pair(false, false));
  EXPECT_EQ(m("90a", 9, 0), std::pair(true, false));
  EXPECT_EQ(m("80a", 8, 6), std::pair(false, false));  // "a" SASS runs on exactly 8.0 only
  EXPECT_EQ(m("compute_90", 10, 0), std::pair(false, true));
  EXPECT_EQ(m("compute_90", 9, 0), std::pair(false, true));
  EXPECT_EQ(m("compute_90", 8, 9), std::pair(false, false));
  EXPECT_EQ(m("80+PTX", 12, 0), std::pair(false, true));
  EXPECT_EQ(m("80;90+PTX", 8, 9), std::pair(true, false));
}

TEST(CudaVersionString, MajorDotMinor) {
  EXPECT_EQ(cuda_version_string(13000), "13.0");
  EXPECT_EQ(cuda_version_string(12040), "12.4");
  EXPECT_EQ(cuda_version_string(12080), "12.8");
  EXPECT_EQ(cuda_version_string(11080), "11.8");
}

TEST(VerdictName, Names) {
  EXPECT_EQ(verdict_name(Verdict::kOk), "ok");
  EXPECT_EQ(verdict_name(Verdict::kWarn), "warn");
  EXPECT_EQ(verdict_name(Verdict::kFail), "fail");
}

TEST(Preflight, HealthyMachinePasses) {
  std::vector<Finding> f = run_preflight(healthy());
  EXPECT_THAT(with(f, Verdict::kFail), IsEmpty());
  EXPECT_THAT(with(f, Verdict::kWarn), IsEmpty());
  ASSERT_THAT(with(f, "driver", Verdict::kOk), SizeIs(1));
  EXPECT_EQ(with(f, "driver", Verdict::kOk)[0].message, "driver supports CUDA 13.0, runtime 13.0");
  ASSERT_THAT(with(f, "memory", Verdict::kOk), SizeIs(1));
  EXPECT_EQ(with(f, "memory", Verdict::kOk)[0].message, "GPU 0: 139.2 GiB free of 139.8 GiB");
  EXPECT_EQ(with(f, "memory", Verdict::kOk)[0].device, 0);
  ASSERT_THAT(with(f, "architecture", Verdict::kOk), SizeIs(1));
  EXPECT_TRUE(preflight_status(f).ok());
}

TEST(Preflight, DriverMissingStopsEverything) {
  PreflightInput in = healthy();
  in.driver_error = "libcuda.so.1: cannot open shared object file: No such file or directory";
  in.visible_devices = "";  // would fail too, but nothing after the driver is judged
  std::vector<Finding> f = run_preflight(in);
  ASSERT_THAT(f, SizeIs(1));
  EXPECT_EQ(f[0].verdict, Verdict::kFail);
  EXPECT_EQ(f[0].check, "driver");
  EXPECT_EQ(f[0].message,
            "no NVIDIA driver: libcuda.so.1 cannot be loaded (libcuda.so.1: cannot open shared "
            "object file: No such file or directory); install the NVIDIA driver (nvidia-smi must "
            "work) or run with --backend cpu/vulkan");
  Status s = preflight_status(f);
  EXPECT_EQ(s.code(), StatusCode::kUnavailable);
  EXPECT_EQ(s.message(), f[0].message);
}

TEST(Preflight, DriverOlderMajorFailsAndStops) {
  PreflightInput in = healthy();
  in.driver_version = 12020;
  std::vector<Finding> f = run_preflight(in);
  ASSERT_THAT(f, SizeIs(1));
  EXPECT_EQ(f[0].verdict, Verdict::kFail);
  EXPECT_THAT(f[0].message,
              AllOf(HasSubstr("the NVIDIA driver supports CUDA 12.2"), HasSubstr("needs 13.0"),
                    HasSubstr("update the driver"), HasSubstr("580 or newer"),
                    HasSubstr("older CUDA toolkit")));
  EXPECT_EQ(preflight_status(f).code(), StatusCode::kUnavailable);
}

TEST(Preflight, DriverOlderMinorWarnsAndContinues) {
  PreflightInput in = healthy();
  in.driver_version = 12040;
  in.runtime_version = 12080;
  std::vector<Finding> f = run_preflight(in);
  ASSERT_THAT(with(f, "driver", Verdict::kWarn), SizeIs(1));
  EXPECT_THAT(with(f, "driver", Verdict::kWarn)[0].message,
              AllOf(HasSubstr("supports CUDA 12.4"), HasSubstr("12.8"),
                    HasSubstr("minor-version compatibility"), HasSubstr("PTX")));
  EXPECT_THAT(with(f, Verdict::kFail), IsEmpty());
  EXPECT_THAT(with(f, "memory", Verdict::kOk), SizeIs(1));  // later checks still ran
  EXPECT_TRUE(preflight_status(f).ok());
}

TEST(Preflight, NewerDriverIsFine) {
  PreflightInput in = healthy();
  in.driver_version = 13010;
  in.runtime_version = 12080;
  std::vector<Finding> f = run_preflight(in);
  ASSERT_THAT(with(f, "driver", Verdict::kOk), SizeIs(1));
  EXPECT_EQ(with(f, "driver", Verdict::kOk)[0].message, "driver supports CUDA 13.1, runtime 12.8");
}

TEST(Preflight, DeviceArchNotInBuildFails) {
  PreflightInput in = healthy();
  in.devices = {gpu(0, "NVIDIA RTX A6000", "0000:41:00.0", 8, 6)};
  std::vector<Finding> f = run_preflight(in);
  ASSERT_THAT(with(f, "architecture", Verdict::kFail), SizeIs(1));
  const Finding fail = with(f, "architecture", Verdict::kFail)[0];
  EXPECT_EQ(fail.device, 0);
  EXPECT_EQ(fail.message,
            "GPU 0 (NVIDIA RTX A6000, PCI 0000:41:00.0) is sm_86; this build has sm_90 only; "
            "rebuild with -Dnvcc_archs=86 (or add it to the list)");
  EXPECT_EQ(preflight_status(f).code(), StatusCode::kUnavailable);
}

TEST(Preflight, PtxOnlyWarnsAboutJit) {
  PreflightInput in = healthy();
  in.archs = archs("90+PTX");
  in.devices = {gpu(0, "NVIDIA B200", "0000:1b:00.0", 10, 0)};
  std::vector<Finding> f = run_preflight(in);
  ASSERT_THAT(with(f, "architecture", Verdict::kWarn), SizeIs(1));
  EXPECT_THAT(with(f, "architecture", Verdict::kWarn)[0].message,
              AllOf(HasSubstr("sm_100"), HasSubstr("PTX compute_90"), HasSubstr("JIT"),
                    HasSubstr("slow"), HasSubstr("-Dnvcc_archs=100")));
  EXPECT_THAT(with(f, Verdict::kFail), IsEmpty());
}

TEST(Preflight, PtxOnlyFailsUnderMinorVersionCompatibility) {
  PreflightInput in = healthy();
  in.driver_version = 12020;
  in.runtime_version = 12080;
  in.archs = archs("80+PTX");
  std::vector<Finding> f = run_preflight(in);  // sm_90 device: PTX JIT would be needed
  ASSERT_THAT(with(f, "architecture", Verdict::kFail), SizeIs(1));
  EXPECT_THAT(with(f, "architecture", Verdict::kFail)[0].message,
              AllOf(HasSubstr("PTX JIT"), HasSubstr("12.2 < 12.8"), HasSubstr("-Dnvcc_archs=90")));
}

TEST(Preflight, Cuda13DropsPreTuringGpus) {
  PreflightInput in = healthy();
  in.archs = archs("70;90");
  in.devices = {gpu(0, "Tesla V100-SXM2-32GB", "0000:06:00.0", 7, 0)};
  std::vector<Finding> f = run_preflight(in);
  ASSERT_THAT(with(f, "architecture", Verdict::kFail), SizeIs(1));
  EXPECT_THAT(with(f, "architecture", Verdict::kFail)[0].message,
              AllOf(HasSubstr("is sm_70"), HasSubstr("CUDA 13 no longer supports sm_70 GPUs"),
                    HasSubstr("CUDA 12.x")));

  in.driver_version = 12080;
  in.runtime_version = 12080;  // CUDA 12 still runs it
  EXPECT_THAT(with(run_preflight(in), Verdict::kFail), IsEmpty());
}

TEST(Preflight, VisibleDevicesEmptyOrMinusOneHideAll) {
  for (const char* value : {"", "-1"}) {
    PreflightInput in = healthy();
    in.visible_devices = value;
    in.devices.clear();
    in.device_count_error = "cudaErrorNoDevice: no CUDA-capable device is detected";
    std::vector<Finding> f = run_preflight(in);
    ASSERT_THAT(with(f, "visible devices", Verdict::kFail), SizeIs(1)) << value;
    EXPECT_EQ(with(f, "visible devices", Verdict::kFail)[0].message,
              "CUDA_VISIBLE_DEVICES=" + std::string(value) +
                  " hides every GPU: unset it or list the GPUs to use, e.g. CUDA_VISIBLE_DEVICES=0,1");
    EXPECT_THAT(with(f, "visible devices", Verdict::kWarn), IsEmpty()) << value;
    ASSERT_THAT(with(f, "devices", Verdict::kFail), SizeIs(1));
    EXPECT_THAT(with(f, "devices", Verdict::kFail)[0].message,
                AllOf(HasSubstr("no CUDA device: cudaErrorNoDevice: no CUDA-capable device is detected"),
                      HasSubstr("CUDA_VISIBLE_DEVICES=" + std::string(value) + " is set")));
    Status s = preflight_status(f);
    EXPECT_EQ(s.code(), StatusCode::kUnavailable);
    EXPECT_EQ(s.message(), with(f, "visible devices", Verdict::kFail)[0].message + "; " +
                               with(f, "devices", Verdict::kFail)[0].message);
  }
}

TEST(Preflight, VisibleDevicesInvalidEntryWarns) {
  PreflightInput in = healthy();
  in.visible_devices = "0,x,1";
  in.device_order = "PCI_BUS_ID";
  std::vector<Finding> f = run_preflight(in);
  ASSERT_THAT(with(f, "visible devices", Verdict::kWarn), SizeIs(1));
  EXPECT_THAT(with(f, "visible devices", Verdict::kWarn)[0].message,
              AllOf(HasSubstr("CUDA_VISIBLE_DEVICES=0,x,1"),
                    HasSubstr("CUDA ignores \"x,1\" and everything after"), HasSubstr("uses 0 only")));
  EXPECT_THAT(with(f, Verdict::kFail), IsEmpty());
}

TEST(Preflight, VisibleDevicesDuplicatesFail) {
  PreflightInput in = healthy();
  in.visible_devices = "0,1,0";
  std::vector<Finding> f = run_preflight(in);
  ASSERT_THAT(with(f, "visible devices", Verdict::kFail), SizeIs(1));
  EXPECT_THAT(with(f, "visible devices", Verdict::kFail)[0].message,
              AllOf(HasSubstr("CUDA_VISIBLE_DEVICES=0,1,0 lists 0 more than once"),
                    HasSubstr("list each GPU once")));
  EXPECT_EQ(preflight_status(f).code(), StatusCode::kUnavailable);
}

PreflightInput two_gpus() {
  PreflightInput in = healthy();
  in.devices = {gpu(0, "NVIDIA H200", "0000:1b:00.0", 9, 0), gpu(1, "NVIDIA H200", "0000:9d:00.0", 9, 0)};
  return in;
}

TEST(Preflight, IndicesInFastestFirstOrderWarn) {
  PreflightInput in = two_gpus();
  in.visible_devices = "1,0";
  std::vector<Finding> f = run_preflight(in);
  ASSERT_THAT(with(f, "device order", Verdict::kWarn), SizeIs(1));
  EXPECT_EQ(with(f, "device order", Verdict::kWarn)[0].message,
            "CUDA_VISIBLE_DEVICES=1,0 counts GPUs in CUDA's FASTEST_FIRST order, which may differ "
            "from nvidia-smi's; set CUDA_DEVICE_ORDER=PCI_BUS_ID");

  in.device_order = "FASTEST_FIRST";
  EXPECT_THAT(with(run_preflight(in), "device order", Verdict::kWarn), SizeIs(1));
  in.device_order = "PCI_BUS_ID";
  EXPECT_THAT(with(run_preflight(in), "device order", Verdict::kWarn), IsEmpty());

  PreflightInput uuids = two_gpus();
  uuids.visible_devices = "GPU-aaaa,GPU-bbbb";  // UUIDs do not depend on the order
  EXPECT_THAT(with(run_preflight(uuids), "device order", Verdict::kWarn), IsEmpty());

  PreflightInput one = healthy();
  one.visible_devices = "0";  // the only GPU
  EXPECT_THAT(with(run_preflight(one), "device order", Verdict::kWarn), IsEmpty());
  one.visible_devices = "1";  // one visible, but picked by number out of several
  EXPECT_THAT(with(run_preflight(one), "device order", Verdict::kWarn), SizeIs(1));
}

TEST(Preflight, CudaOrdinalsDifferingFromPciOrderWarn) {
  PreflightInput in = two_gpus();
  in.devices = {gpu(1, "NVIDIA H200", "0000:1b:00.0", 9, 0), gpu(0, "NVIDIA H200", "0000:9d:00.0", 9, 0)};
  std::vector<Finding> f = run_preflight(in);
  ASSERT_THAT(with(f, "device order", Verdict::kWarn), SizeIs(1));
  EXPECT_THAT(with(f, "device order", Verdict::kWarn)[0].message,
              AllOf(HasSubstr("cuda:0 is CUDA ordinal 1, cuda:1 is CUDA ordinal 0"),
                    HasSubstr("CUDA_DEVICE_ORDER=PCI_BUS_ID")));
  EXPECT_THAT(with(run_preflight(two_gpus()), "device order", Verdict::kWarn), IsEmpty());
}

TEST(Preflight, InvalidDeviceOrderWarns) {
  PreflightInput in = healthy();
  in.device_order = "pci_bus_id";
  std::vector<Finding> f = run_preflight(in);
  ASSERT_THAT(with(f, "device order", Verdict::kWarn), SizeIs(1));
  EXPECT_THAT(with(f, "device order", Verdict::kWarn)[0].message,
              AllOf(HasSubstr("CUDA_DEVICE_ORDER=pci_bus_id"), HasSubstr("CUDA ignores it"),
                    HasSubstr("set CUDA_DEVICE_ORDER=PCI_BUS_ID")));
}

TEST(Preflight, NoDeviceFails) {
  PreflightInput in = healthy();
  in.devices.clear();
  in.device_count_error = "cudaErrorNoDevice: no CUDA-capable device is detected";
  std::vector<Finding> f = run_preflight(in);
  ASSERT_THAT(with(f, "devices", Verdict::kFail), SizeIs(1));
  EXPECT_THAT(with(f, "devices", Verdict::kFail)[0].message,
              AllOf(HasSubstr("no CUDA device: cudaErrorNoDevice"),
                    Not(HasSubstr("CUDA_VISIBLE_DEVICES"))));
  in.visible_devices = "3";
  EXPECT_THAT(with(run_preflight(in), "devices", Verdict::kFail)[0].message,
              HasSubstr("CUDA_VISIBLE_DEVICES=3 is set"));
}

TEST(Preflight, NvmlMissingOnlyWarns) {
  PreflightInput in = healthy();
  in.nvml_error = "libnvidia-ml.so.1: cannot open shared object file";
  std::vector<Finding> f = run_preflight(in);
  ASSERT_THAT(with(f, "nvml", Verdict::kWarn), SizeIs(1));
  EXPECT_THAT(with(f, "nvml", Verdict::kWarn)[0].message,
              HasSubstr("NVML unavailable (libnvidia-ml.so.1: cannot open shared object file): "
                        "other processes' use of GPU memory cannot be listed"));
  EXPECT_THAT(with(f, Verdict::kFail), IsEmpty());
  EXPECT_TRUE(preflight_status(f).ok());
}

TEST(Preflight, OtherProcessesAreListedPerDevice) {
  PreflightInput in = two_gpus();
  in.devices[1].free_bytes = 60 * kGiB;
  in.processes = {{1, 4242, "python3 -m vllm.entrypoints.openai.api_server", 70 * kGiB},
                  {1, 77, "", 0}};
  std::vector<Finding> f = run_preflight(in);
  ASSERT_THAT(with(f, "memory", Verdict::kWarn), SizeIs(1));
  const Finding w = with(f, "memory", Verdict::kWarn)[0];
  EXPECT_EQ(w.device, 1);
  EXPECT_THAT(w.message,
              AllOf(HasSubstr("GPU 1: 60.0 GiB free of 139.8 GiB"),
                    HasSubstr("pid 4242 (python3 -m vllm.entrypoints.openai.api_server) 70.0 GiB"),
                    HasSubstr("pid 77 (command unknown)"),
                    HasSubstr("nvidia-smi --query-compute-apps=pid,used_memory,name --format=csv"),
                    HasSubstr("Sextant plans against the free memory")));
  ASSERT_THAT(with(f, "memory", Verdict::kOk), SizeIs(1));
  EXPECT_EQ(with(f, "memory", Verdict::kOk)[0].device, 0);
  EXPECT_TRUE(preflight_status(f).ok());
}

TEST(Preflight, LowFreeMemoryWithoutKnownProcessesWarns) {
  PreflightInput in = healthy();
  in.devices[0].free_bytes = 40 * kGiB;
  std::vector<Finding> f = run_preflight(in);
  ASSERT_THAT(with(f, "memory", Verdict::kWarn), SizeIs(1));
  EXPECT_THAT(with(f, "memory", Verdict::kWarn)[0].message,
              AllOf(HasSubstr("GPU 0: 40.0 GiB free of 139.8 GiB"), HasSubstr("in use by something")));
}

TEST(PreflightStatus, JoinsFailuresOnly) {
  std::vector<Finding> f = {{Verdict::kOk, "driver", "fine"},
                            {Verdict::kFail, "visible devices", "first"},
                            {Verdict::kWarn, "nvml", "just a warning"},
                            {Verdict::kFail, "architecture", "second", 0}};
  Status s = preflight_status(f);
  EXPECT_EQ(s.code(), StatusCode::kUnavailable);
  EXPECT_EQ(s.message(), "first; second");
  EXPECT_TRUE(preflight_status(std::vector<Finding>{}).ok());
  EXPECT_TRUE(preflight_status(std::vector<Finding>(1, Finding{Verdict::kWarn, "nvml", "w"})).ok());
}

}  // namespace
}  // namespace sx::cuda
