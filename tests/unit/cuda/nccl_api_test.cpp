// backends/cuda/nccl_api.h: NCCL opened at run time; a missing or foreign library is UNAVAILABLE
// with the reason and what to do (TP over several GPUs needs it; one GPU does not).
#include "backends/cuda/nccl_api.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

namespace sx::cuda {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;
using ::testing::StartsWith;

TEST(NcclApi, VersionStrings) {
  EXPECT_EQ(nccl_version_string(22809), "2.28.9");
  EXPECT_EQ(nccl_version_string(21903), "2.19.3");
  EXPECT_EQ(nccl_version_string(2708), "2.7.8");
}

TEST(NcclApi, AMissingLibraryIsUnavailableNamingItAndTheFix) {
  auto r = open_nccl("/nonexistent/libnccl.so.2");
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kUnavailable);
  EXPECT_THAT(r.status().message(),
              AllOf(StartsWith("NCCL unavailable: /nonexistent/libnccl.so.2: cannot open shared object file"),
                    HasSubstr("tensor parallelism over several CUDA GPUs needs NCCL 2.12"),
                    HasSubstr("SEXTANT_NCCL_LIBRARY"), HasSubstr("one GPU")));
}

TEST(NcclApi, ALibraryThatIsNotNcclIsUnavailable) {
  auto r = open_nccl("libm.so.6");
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kUnavailable);
  EXPECT_THAT(r.status().message(), HasSubstr("libm.so.6 has no ncclGetVersion"));
}

TEST(NcclApi, TheInstalledNcclOpensWithEveryFunction) {
  auto r = open_nccl("libnccl.so.2");
  if (!r.ok()) GTEST_SKIP() << "no NCCL on this machine: " << r.status().to_string();
  EXPECT_GE(r->version, 21200);
  EXPECT_THAT(nccl_version_string(r->version), StartsWith("2."));
  EXPECT_NE(r->comm_init_all, nullptr);
  EXPECT_NE(r->comm_abort, nullptr);
  EXPECT_STREQ(r->get_error_string(kNcclSuccess), "no error");
  std::printf("NCCL %s from %s\n", nccl_version_string(r->version).c_str(), r->path.c_str());
}

TEST(NcclApi, ReserveForTheMemoryPlanOnlyWhenTheGroupUsesNccl) {
  EXPECT_EQ(nccl_reserve_bytes(6, "nccl", nullptr), std::uint64_t{576} << 20);
  EXPECT_EQ(nccl_reserve_bytes(6, "nccl", "8388608"), (std::uint64_t{8} << 20) * 128 + (std::uint64_t{64} << 20));
  EXPECT_EQ(nccl_reserve_bytes(2, "nccl", "0x200000"), (std::uint64_t{2} << 20) * 128 + (std::uint64_t{64} << 20));
  EXPECT_EQ(nccl_reserve_bytes(6, "nccl", "lots"), std::uint64_t{576} << 20);  // NCCL's default then
  EXPECT_EQ(nccl_reserve_bytes(1, "nccl", nullptr), 0u);  // a group of one has no communicator
  for (const char* other : {"staged", "loopback", "auto"}) EXPECT_EQ(nccl_reserve_bytes(6, other, nullptr), 0u);
  EXPECT_EQ(nccl_reserve_bytes(6, nullptr, nullptr), 0u);
}

TEST(NcclApi, ChannelChoice) {
  const Status ok = ok_status(), missing = unavailable_error("NCCL unavailable: libnccl.so.2: cannot open");
  EXPECT_EQ(*choose_cuda_channel({0, 1, 2}, "nccl", ok), CudaChannelKind::kNccl);
  // Unvalidated on GPUs, NCCL is opt-in: auto stages through host memory for now.
  EXPECT_EQ(*choose_cuda_channel({0, 1}, "auto", ok), CudaChannelKind::kStaged);
  EXPECT_EQ(*choose_cuda_channel({0, 1}, nullptr, missing), CudaChannelKind::kStaged);
  // Several devices of one GPU: NCCL refuses them, the host-staged channel serves.
  EXPECT_EQ(*choose_cuda_channel({0, 0, 0}, nullptr, missing), CudaChannelKind::kStaged);
  EXPECT_EQ(*choose_cuda_channel({0, 1}, "staged", missing), CudaChannelKind::kStaged);
  // Distinct GPUs without NCCL: unavailable, naming the library and the way out.
  auto no = choose_cuda_channel({0, 1}, "nccl", missing);
  ASSERT_FALSE(no.ok());
  EXPECT_EQ(no.status().code(), StatusCode::kUnavailable);
  EXPECT_THAT(no.status().message(), AllOf(HasSubstr("libnccl.so.2"), HasSubstr("SEXTANT_CUDA_CHANNEL=staged")));
  auto forced = choose_cuda_channel({0, 0}, "nccl", ok);
  ASSERT_FALSE(forced.ok());
  EXPECT_THAT(forced.status().message(), HasSubstr("several devices on one GPU"));
  EXPECT_EQ(choose_cuda_channel({0, 1}, "nvlink", ok).status().code(), StatusCode::kInvalidArgument);
  // The loopback channel: asked for, and only for devices of one GPU (NCCL not needed).
  EXPECT_EQ(*choose_cuda_channel({2, 2, 2, 2, 2, 2}, "loopback", missing), CudaChannelKind::kLoopback);
  EXPECT_EQ(*choose_cuda_channel({0, 0, 0}, "auto", ok), CudaChannelKind::kStaged);
  auto spans = choose_cuda_channel({0, 0, 1}, "loopback", ok);
  ASSERT_FALSE(spans.ok());
  EXPECT_EQ(spans.status().code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(spans.status().message(), AllOf(HasSubstr("several GPUs"), HasSubstr("nccl or staged")));
  EXPECT_THAT(forced.status().message(), HasSubstr("SEXTANT_CUDA_CHANNEL=loopback"));
}

}  // namespace
}  // namespace sx::cuda
