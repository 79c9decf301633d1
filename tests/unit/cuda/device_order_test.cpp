// backends/cuda/device_order.h: PCI bus ids, Sextant's PCI-order device numbering, the device
// lines, and CUDA_VISIBLE_DEVICES / CUDA_DEVICE_ORDER as the CUDA runtime reads them.
#include "backends/cuda/device_order.h"

#include <string>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

namespace sx::cuda {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;

constexpr std::uint64_t kGiB = 1024ull * 1024 * 1024;

TEST(ParsePciBusId, AcceptsCudaAndNvidiaSmiForms) {
  EXPECT_EQ(parse_pci_bus_id("0000:1b:00.0"), (PciAddress{0, 0x1b, 0, 0}));
  EXPECT_EQ(parse_pci_bus_id("00000000:1B:00.0"), (PciAddress{0, 0x1b, 0, 0}));
  EXPECT_EQ(parse_pci_bus_id("1b:00.0"), (PciAddress{0, 0x1b, 0, 0}));
  EXPECT_EQ(parse_pci_bus_id("000A:Cd:1F.7"), (PciAddress{0xa, 0xcd, 0x1f, 7}));
  EXPECT_EQ(parse_pci_bus_id("0001000f:ff:0e.3"), (PciAddress{0x1000f, 0xff, 0x0e, 3}));
}

TEST(ParsePciBusId, RejectsEverythingElse) {
  for (const char* bad : {"", "0000:1b:00.0 ", " 0000:1b:00.0", "0000:1b:00.0x", "0000:1b:00.00",
                          "000:1b:00.0", "00000:1b:00.0", "0000:1b:00", "0000:1g:00.0",
                          "0000:1b:20.0", "0000:1b:00.8", "0000:0000:1b:00.0", "1b.00.0",
                          "1b:0.0", "1:00.0", "0000-1b:00.0", "GPU-0a1b2c3d"}) {
    EXPECT_EQ(parse_pci_bus_id(bad), std::nullopt) << '"' << bad << '"';
  }
}

GpuIdentity gpu(int ordinal, std::string name, std::string bus_id) {
  GpuIdentity g;
  g.cuda_ordinal = ordinal;
  g.name = std::move(name);
  g.pci_bus_id = std::move(bus_id);
  return g;
}

std::vector<std::string> names(const std::vector<GpuIdentity>& devices) {
  std::vector<std::string> out;
  for (const auto& d : devices) out.push_back(d.name);
  return out;
}

TEST(InPciOrder, SortsShuffledBusIdsAscending) {
  // CUDA's FASTEST_FIRST order on an 8-GPU box, ids in mixed case and both domain widths.
  std::vector<GpuIdentity> devices = {
      gpu(0, "g4", "0000:9D:00.0"), gpu(1, "g0", "00000000:18:00.0"), gpu(2, "g7", "0000:db:00.0"),
      gpu(3, "g2", "0000:3a:00.0"), gpu(4, "g5", "0000:bb:00.0"),     gpu(5, "g1", "2a:00.0"),
      gpu(6, "g6", "0000:CB:00.0"), gpu(7, "g3", "0000:5d:00.0")};
  EXPECT_THAT(names(in_pci_order(devices)),
              ElementsAre("g0", "g1", "g2", "g3", "g4", "g5", "g6", "g7"));
}

TEST(InPciOrder, DomainAndFunctionOrderTheAddress) {
  std::vector<GpuIdentity> devices = {gpu(0, "d1", "0001:00:00.0"), gpu(1, "f1", "0000:3a:00.1"),
                                      gpu(2, "f0", "0000:3a:00.0")};
  EXPECT_THAT(names(in_pci_order(devices)), ElementsAre("f0", "f1", "d1"));
}

TEST(InPciOrder, UnparseableGoLastByOrdinalAndEqualAddressesKeepTheirOrder) {
  std::vector<GpuIdentity> devices = {gpu(5, "bad5", "?"), gpu(1, "b", "0000:3b:00.0"),
                                      gpu(2, "bad2", ""),  gpu(3, "a", "0000:1b:00.0"),
                                      gpu(0, "b-again", "3B:00.0"), gpu(4, "bad4", "0000:zz:00.0")};
  EXPECT_THAT(names(in_pci_order(devices)),
              ElementsAre("a", "b", "b-again", "bad2", "bad4", "bad5"));
  EXPECT_THAT(in_pci_order({}), IsEmpty());
}

TEST(DescribeDevices, OneLinePerDeviceInTheGivenOrder) {
  GpuIdentity h200 = gpu(1, "NVIDIA H200", "0000:1b:00.0");
  h200.uuid = "GPU-0a1b2c3d-1111-2222-3333-444455556666";
  h200.cc_major = 9;
  h200.total_bytes = 1398 * kGiB / 10;
  h200.free_bytes = 1392 * kGiB / 10;
  GpuIdentity l4 = gpu(0, "NVIDIA L4", "");
  l4.cc_major = 8;
  l4.cc_minor = 9;
  l4.total_bytes = 22 * kGiB + kGiB / 2;
  l4.free_bytes = 22 * kGiB;
  std::vector<GpuIdentity> devices = {h200, l4};
  EXPECT_THAT(describe_devices(devices),
              ElementsAre("cuda:0  NVIDIA H200  sm_90  139.8 GiB (139.2 GiB free)  PCI 0000:1b:00.0"
                          "  CUDA ordinal 1  GPU-0a1b2c3d-1111-2222-3333-444455556666",
                          "cuda:1  NVIDIA L4  sm_89  22.5 GiB (22.0 GiB free)  CUDA ordinal 0"));
}

TEST(ParseVisibleDevices, UnsetMeansEverythingVisible) {
  VisibleDevices v = parse_visible_devices(nullptr);
  EXPECT_FALSE(v.set);
  EXPECT_FALSE(v.hides_all);
  EXPECT_FALSE(v.by_index);
  EXPECT_THAT(v.entries, IsEmpty());
  EXPECT_EQ(v.ignored, "");
}

TEST(ParseVisibleDevices, EmptyAndMinusOneHideAll) {
  VisibleDevices empty = parse_visible_devices("");
  EXPECT_TRUE(empty.set);
  EXPECT_TRUE(empty.hides_all);
  EXPECT_THAT(empty.entries, IsEmpty());

  VisibleDevices minus_one = parse_visible_devices("-1");
  EXPECT_TRUE(minus_one.set);
  EXPECT_TRUE(minus_one.hides_all);
  EXPECT_THAT(minus_one.entries, IsEmpty());
  EXPECT_EQ(minus_one.ignored, "-1");
  EXPECT_FALSE(minus_one.by_index);

  EXPECT_TRUE(parse_visible_devices("x,0").hides_all);
  EXPECT_TRUE(parse_visible_devices("  ").hides_all);
}

TEST(ParseVisibleDevices, IndicesWithSpaces) {
  VisibleDevices v = parse_visible_devices(" 1 , 0,3 ");
  EXPECT_THAT(v.entries, ElementsAre("1", "0", "3"));
  EXPECT_EQ(v.ignored, "");
  EXPECT_TRUE(v.by_index);
  EXPECT_FALSE(v.hides_all);
  EXPECT_THAT(v.duplicates, IsEmpty());
}

TEST(ParseVisibleDevices, StopsAtTheFirstInvalidEntry) {
  VisibleDevices v = parse_visible_devices("0,2,x,3");
  EXPECT_THAT(v.entries, ElementsAre("0", "2"));
  EXPECT_EQ(v.ignored, "x,3");
  EXPECT_FALSE(v.hides_all);

  VisibleDevices neg = parse_visible_devices("0,-1,1");
  EXPECT_THAT(neg.entries, ElementsAre("0"));
  EXPECT_EQ(neg.ignored, "-1,1");

  VisibleDevices hole = parse_visible_devices("0,,1");
  EXPECT_THAT(hole.entries, ElementsAre("0"));
  EXPECT_EQ(hole.ignored, ",1");

  VisibleDevices lower = parse_visible_devices("GPU-aa,gpu-bb");  // prefixes are case-sensitive
  EXPECT_THAT(lower.entries, ElementsAre("GPU-aa"));
  EXPECT_EQ(lower.ignored, "gpu-bb");

  VisibleDevices trailing = parse_visible_devices("0,1,");  // the empty tail ignores nothing
  EXPECT_THAT(trailing.entries, ElementsAre("0", "1"));
  EXPECT_EQ(trailing.ignored, "");
}

TEST(ParseVisibleDevices, UuidsAreNotIndices) {
  VisibleDevices v = parse_visible_devices("GPU-0a1b2c3d,MIG-5e6f7a8b-1234");
  EXPECT_THAT(v.entries, ElementsAre("GPU-0a1b2c3d", "MIG-5e6f7a8b-1234"));
  EXPECT_FALSE(v.by_index);
  EXPECT_TRUE(parse_visible_devices("GPU-0a1b2c3d,1").by_index);
}

TEST(ParseVisibleDevices, Duplicates) {
  EXPECT_THAT(parse_visible_devices("0,1,0,0").duplicates, ElementsAre("0"));
  EXPECT_THAT(parse_visible_devices("1,01").duplicates, ElementsAre("01"));  // the same device
  EXPECT_THAT(parse_visible_devices("GPU-a,1,GPU-a,1").duplicates, ElementsAre("GPU-a", "1"));
  EXPECT_THAT(parse_visible_devices("0,1,x,0").duplicates, IsEmpty());  // "0" after x is ignored
  EXPECT_THAT(parse_visible_devices("0,1,0").entries, ElementsAre("0", "1", "0"));
}

TEST(ParseDeviceOrder, KnownValuesOnly) {
  EXPECT_EQ(parse_device_order(nullptr), DeviceOrder::kFastestFirst);
  EXPECT_EQ(parse_device_order("FASTEST_FIRST"), DeviceOrder::kFastestFirst);
  EXPECT_EQ(parse_device_order("PCI_BUS_ID"), DeviceOrder::kPciBusId);
  EXPECT_EQ(parse_device_order("pci_bus_id"), std::nullopt);
  EXPECT_EQ(parse_device_order(""), std::nullopt);
  EXPECT_EQ(parse_device_order("PCI"), std::nullopt);
}

TEST(SelectGpus, EveryGpuOnceOrTheListedOnesWithRepeats) {
  auto all = select_gpus(nullptr, 3);
  ASSERT_TRUE(all.ok());
  EXPECT_THAT(*all, ElementsAre(0, 1, 2));
  EXPECT_THAT(*select_gpus("", 2), ElementsAre(0, 1));
  auto six = select_gpus("0,0,0,0,0,0", 1);
  ASSERT_TRUE(six.ok());
  EXPECT_THAT(*six, ElementsAre(0, 0, 0, 0, 0, 0));
  EXPECT_THAT(*select_gpus(" 1, 0", 2), ElementsAre(1, 0));
  // GPUxCOUNT.
  EXPECT_THAT(*select_gpus("0x6", 1), ElementsAre(0, 0, 0, 0, 0, 0));
  EXPECT_THAT(*select_gpus("0x3,1x3", 2), ElementsAre(0, 0, 0, 1, 1, 1));
  EXPECT_THAT(*select_gpus("1x1, 0", 2), ElementsAre(1, 0));
  for (const char* bad : {"2", "0,x", "-1", "0,,1", "GPU-0", "0x0", "0x", "x2", "0x65", "2x2", "0x2x2"}) {
    auto r = select_gpus(bad, 2);
    ASSERT_FALSE(r.ok()) << bad;
    EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
    EXPECT_THAT(r.status().message(), HasSubstr("SEXTANT_CUDA_DEVICES")) << bad;
    EXPECT_THAT(r.status().message(), HasSubstr("2 GPUs, 0 to 1")) << bad;
  }
}

}  // namespace
}  // namespace sx::cuda
