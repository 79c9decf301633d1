// Physical-device selection (backends/vulkan/vk_select.h): GPUs by default, CPU implementations
// only when named; entries by index, UUID or name part; each entry one device; errors list what
// was found.
#include <gtest/gtest.h>

#include <vector>

#include "backends/vulkan/vk_select.h"

namespace sx::vk {
namespace {

const std::vector<PhysicalDesc> kFound = {
    {"llvmpipe (LLVM 15.0.6, 256 bits)", true, "6c6c766d706970650000000000000000", "cpu"},
    {"NVIDIA H200", false, "0123456789abcdef0123456789abcdef", "discrete gpu"},
    {"NVIDIA RTX 4090", false, "fedcba9876543210fedcba9876543210", "discrete gpu"},
};

std::vector<int> pick(std::string_view selection) {
  auto r = select_devices(selection, kFound);
  EXPECT_TRUE(r.ok()) << r.status().to_string();
  return r.ok() ? *r : std::vector<int>{};
}

std::string error_of(std::string_view selection) {
  auto r = select_devices(selection, kFound);
  EXPECT_FALSE(r.ok()) << selection;
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  return r.status().message();
}

TEST(VulkanSelect, WithoutASelectionEveryGpuButNoCpuImplementation) {
  EXPECT_EQ(pick(""), (std::vector<int>{1, 2}));
  EXPECT_EQ(pick("  "), (std::vector<int>{1, 2}));
  EXPECT_TRUE(select_devices("", std::span<const PhysicalDesc>(kFound).first(1))->empty());
}

TEST(VulkanSelect, EntriesByIndexUuidOrNamePartOnePerDevice) {
  EXPECT_EQ(pick("0,0,0"), (std::vector<int>{0, 0, 0}));  // lavapipe, three times
  EXPECT_EQ(pick("2, 1"), (std::vector<int>{2, 1}));
  EXPECT_EQ(pick("llvmpipe"), (std::vector<int>{0}));
  EXPECT_EQ(pick("h200,rtx"), (std::vector<int>{1, 2}));  // case-insensitive
  EXPECT_EQ(pick("FEDCBA98-7654-3210-FEDC-BA9876543210"), (std::vector<int>{2}));
  EXPECT_EQ(pick("0123456789abcdef0123456789abcdef,0"), (std::vector<int>{1, 0}));
}

TEST(VulkanSelect, BadEntriesAreRefusedListingWhatWasFound) {
  const std::string found = "found: 0: llvmpipe (LLVM 15.0.6, 256 bits) [cpu], 1: NVIDIA H200 [discrete gpu], "
                            "2: NVIDIA RTX 4090 [discrete gpu]";
  EXPECT_EQ(error_of("3"), "Vulkan device selection '3': there is no device 3 (" + found + ")");
  EXPECT_EQ(error_of("99999999999999999999"),
            "Vulkan device selection '99999999999999999999': there is no device 99999999999999999999 (" + found + ")");
  EXPECT_EQ(error_of("radeon"), "Vulkan device selection 'radeon': no device name contains 'radeon' (" + found + ")");
  EXPECT_EQ(error_of("nvidia"),
            "Vulkan device selection 'nvidia': 'nvidia' names 2 devices; use an index or a UUID (" + found + ")");
  EXPECT_EQ(error_of("00000000000000000000000000000000"),
            "Vulkan device selection '00000000000000000000000000000000': no device has UUID "
            "00000000000000000000000000000000 (" + found + ")");
  EXPECT_NE(error_of("0,,1").find("an empty entry"), std::string::npos);
  EXPECT_NE(error_of("0,").find("an empty entry"), std::string::npos);
}

TEST(VulkanSelect, UuidHex) {
  const std::uint8_t id[16] = {0, 1, 2, 0xab, 0xff, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 0x10};
  EXPECT_EQ(uuid_hex(id), "000102abff05060708090a0b0c0d0e10");
}

}  // namespace
}  // namespace sx::vk
