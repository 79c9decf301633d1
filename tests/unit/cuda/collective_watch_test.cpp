// backends/cuda/collective_watch.h with fake communicators and completions: the watchdog and error
// paths of the CUDA channel (issue 21) without a device.
#include "backends/cuda/collective_watch.h"

#include <atomic>
#include <thread>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

namespace sx::cuda {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;
using namespace std::chrono_literals;

struct FakeComm : RankComm {
  Status error;
  std::atomic<int> aborts{0};
  Status async_error() override { return error; }
  void abort() override { ++aborts; }
};

struct Group {
  FakeComm comms[3];
  std::vector<RankComm*> ptrs() { return {&comms[0], &comms[1], &comms[2]}; }
  WatchedGroup info(std::chrono::milliseconds timeout = 100ms) {
    return {"tp group of stage 0", {"cuda:0 (H200)", "cuda:1 (H200)", "cuda:2 (H200)"}, "NCCL 2.28.3", timeout};
  }
};

TEST(CollectiveWatch, CompletedCollectivesAreNeverLate) {
  Group g;
  CollectiveWatch w(g.info(), g.ptrs(), 0ms);
  const auto t0 = CollectiveWatch::Clock::now();
  bool done = false;
  EXPECT_EQ(w.watch(0, "all_reduce", 4096, [&] { return done; }, t0), 1u);
  EXPECT_EQ(w.watch(0, "all_reduce", 4096, [] { return true; }, t0), 2u);
  w.poll(t0 + 10ms);
  EXPECT_EQ(w.in_flight(), 1u);
  done = true;
  w.poll(t0 + 10s);  // long past the deadline, but complete: nothing fails
  EXPECT_EQ(w.in_flight(), 0u);
  EXPECT_TRUE(w.status().ok());
  for (FakeComm& c : g.comms) EXPECT_EQ(c.aborts, 0);
}

TEST(CollectiveWatch, ACollectivePastItsDeadlineAbortsTheGroupNamingWhoWaitsForWhom) {
  Group g;
  CollectiveWatch w(g.info(), g.ptrs(), 0ms);
  const auto t0 = CollectiveWatch::Clock::now();
  // Ranks 0 and 2 issued their 3rd all_reduce; rank 1 only two: the third never completes.
  for (int r : {0, 1, 2}) {
    w.watch(r, "all_reduce", 100, [] { return true; }, t0);
    w.watch(r, "all_reduce", 100, [] { return true; }, t0);
  }
  w.watch(0, "all_reduce", 1 << 20, [] { return false; }, t0);
  w.watch(2, "all_reduce", 1 << 20, [] { return false; }, t0);
  w.poll(t0 + 99ms);
  EXPECT_TRUE(w.status().ok());
  w.poll(t0 + 150ms);
  const Status s = w.status();
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.code(), StatusCode::kDeadlineExceeded);
  EXPECT_THAT(s.message(), AllOf(HasSubstr("tp group of stage 0"), HasSubstr("rank 0 on cuda:0 (H200)"),
                                 HasSubstr("all_reduce #3 (1048576 bytes) 150 ms ago"), HasSubstr("timeout 100 ms"),
                                 HasSubstr("not yet issued by rank 1 on cuda:1 (H200)"), HasSubstr("NCCL 2.28.3"),
                                 HasSubstr("NCCL_P2P_DISABLE=1")));
  for (FakeComm& c : g.comms) EXPECT_EQ(c.aborts, 1);  // every communicator, once
  w.poll(t0 + 1s);
  w.fail(1, internal_error("later"));
  EXPECT_EQ(w.status().message(), s.message());  // the first failure stays
  for (FakeComm& c : g.comms) EXPECT_EQ(c.aborts, 1);
}

TEST(CollectiveWatch, AnAsynchronousErrorFailsTheGroupNamingTheRank) {
  Group g;
  CollectiveWatch w(g.info(), g.ptrs(), 0ms);
  w.watch(1, "all_gather", 64, [] { return false; });
  g.comms[1].error = internal_error("ncclRemoteError: a call failed possibly due to a network error");
  w.poll();
  const Status s = w.status();
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.code(), StatusCode::kInternal);
  EXPECT_THAT(s.message(), AllOf(HasSubstr("the communicator of rank 1 on cuda:1 (H200) reported"),
                                 HasSubstr("ncclRemoteError"), HasSubstr("aborted")));
  EXPECT_EQ(w.in_flight(), 0u);
  for (FakeComm& c : g.comms) EXPECT_EQ(c.aborts, 1);
}

TEST(CollectiveWatch, ARankThatAbortsFailsItsPeers) {
  Group g;
  CollectiveWatch w(g.info(), g.ptrs(), 0ms);
  w.fail(2, internal_error("cuda:2: the stream's work: cudaErrorIllegalAddress"));
  const Status s = w.status();
  EXPECT_EQ(s.code(), StatusCode::kAborted);
  EXPECT_THAT(s.message(), AllOf(HasSubstr("tp group of stage 0: rank 2 on cuda:2 (H200) failed"),
                                 HasSubstr("cudaErrorIllegalAddress")));
  for (FakeComm& c : g.comms) EXPECT_EQ(c.aborts, 1);
}

TEST(CollectiveWatch, TheThreadAbortsAHungCollectivePromptly) {
  Group g;
  const auto t0 = std::chrono::steady_clock::now();
  CollectiveWatch w(g.info(30ms), g.ptrs(), 2ms);
  w.watch(0, "barrier", 4, [] { return false; });
  while (w.status().ok() && std::chrono::steady_clock::now() - t0 < 5s) std::this_thread::sleep_for(1ms);
  EXPECT_EQ(w.status().code(), StatusCode::kDeadlineExceeded);
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 1s);
  EXPECT_EQ(g.comms[0].aborts, 1);
}

TEST(CollectiveWatch, AForgottenRankIsNeitherPolledNorLate) {
  Group g;
  CollectiveWatch w(g.info(), g.ptrs(), 0ms);
  const auto t0 = CollectiveWatch::Clock::now();
  int calls = 0;
  w.watch(1, "all_reduce", 4, [&] { ++calls; return false; }, t0);
  w.watch(2, "all_reduce", 4, [] { return false; }, t0 + 1s);
  EXPECT_EQ(w.forget(1), 1u);
  w.poll(t0 + 500ms);
  EXPECT_EQ(calls, 0);
  EXPECT_TRUE(w.status().ok());
  EXPECT_EQ(w.in_flight(), 1u);
}

}  // namespace
}  // namespace sx::cuda
