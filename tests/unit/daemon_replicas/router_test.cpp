// The replica router: the prefix index (block-aligned matches, eviction) and the choice (least
// outstanding work, prefix affinity unless the replica is busier than the prefill it saves, free
// KV then rotation as tie-breaks, only ready replicas).
#include <gtest/gtest.h>

#include <numeric>
#include <vector>

#include "daemon/replicas/router.h"

namespace sx::daemon::replicas {
namespace {

std::vector<std::int32_t> tokens(int n, int first = 0) {
  std::vector<std::int32_t> v(static_cast<std::size_t>(n));
  std::iota(v.begin(), v.end(), first);
  return v;
}

TEST(PrefixIndex, MatchesWholeBlocksOfRecordedPrompts) {
  PrefixIndex index(4, 100);
  EXPECT_EQ(index.match(tokens(10)), 0);
  index.record(tokens(10));  // blocks [0..3], [4..7]; the tail of 2 is not a block
  EXPECT_EQ(index.size(), 2u);
  EXPECT_EQ(index.match(tokens(10)), 8);
  EXPECT_EQ(index.match(tokens(6)), 4);
  EXPECT_EQ(index.match(tokens(40)), 8);
  EXPECT_EQ(index.match(tokens(3)), 0);
  // A prompt that differs in its first block matches nothing, even if later blocks agree.
  std::vector<std::int32_t> other = tokens(10);
  other[1] = 99;
  EXPECT_EQ(index.match(other), 0);
  // The chain: the second block only counts after the first.
  std::vector<std::int32_t> second_differs = tokens(10);
  second_differs[5] = 99;
  EXPECT_EQ(index.match(second_differs), 4);
}

TEST(PrefixIndex, ForgetsTheOldestBeyondItsCapacity) {
  PrefixIndex index(2, 3);
  index.record(tokens(6, 0));    // 3 blocks
  index.record(tokens(4, 100));  // 2 more: the first two of the first prompt go
  EXPECT_EQ(index.size(), 3u);
  EXPECT_EQ(index.match(tokens(4, 100)), 4);
  EXPECT_EQ(index.match(tokens(6, 0)), 0);
}

ReplicaLoad load(std::int64_t pending, std::int64_t running, std::int64_t match = 0, std::int64_t free = 100,
                 bool ready = true) {
  return ReplicaLoad{ready, pending, running, free, match};
}

TEST(Router, LeastOutstandingWorkAmongReadyReplicas) {
  const RouterOptions on;
  EXPECT_EQ(choose_replica(std::vector<ReplicaLoad>{load(500, 2), load(100, 1), load(300, 0)}, 50, on), 1);
  EXPECT_EQ(choose_replica(std::vector<ReplicaLoad>{load(500, 2), load(0, 0, 0, 100, false)}, 50, on), 0);
  EXPECT_EQ(choose_replica(std::vector<ReplicaLoad>{load(0, 0, 0, 100, false)}, 50, on), -1);
  EXPECT_EQ(choose_replica(std::vector<ReplicaLoad>{}, 50, on), -1);
}

TEST(Router, PrefixAffinityUnlessBusierThanThePrefillItSaves) {
  const RouterOptions on;
  // Replica 1 holds 400 of the prompt's 500 tokens: 120 tokens of work there beat 600 elsewhere.
  EXPECT_EQ(choose_replica(std::vector<ReplicaLoad>{load(0, 0), load(100, 20, 400)}, 500, on), 1);
  // ... but not when its queue is longer than the 400 tokens it saves.
  EXPECT_EQ(choose_replica(std::vector<ReplicaLoad>{load(0, 0), load(390, 20, 400)}, 500, on), 0);
  RouterOptions off;
  off.prefix_affinity = false;
  EXPECT_EQ(choose_replica(std::vector<ReplicaLoad>{load(0, 0), load(100, 20, 400)}, 500, off), 0);
}

TEST(Router, TiesGoToMoreFreeKvThenTakeTurns) {
  const RouterOptions on;
  EXPECT_EQ(choose_replica(std::vector<ReplicaLoad>{load(0, 1, 0, 10), load(0, 1, 0, 90)}, 5, on), 1);
  const std::vector<ReplicaLoad> idle{load(0, 0), load(0, 0), load(0, 0)};
  std::vector<int> picked;
  for (std::size_t turn = 0; turn < 6; ++turn) picked.push_back(choose_replica(idle, 5, on, turn));
  EXPECT_EQ(picked, (std::vector<int>{0, 1, 2, 0, 1, 2}));
  // The rotation starts the scan, but a cheaper replica still wins.
  EXPECT_EQ(choose_replica(std::vector<ReplicaLoad>{load(0, 0), load(0, 3), load(0, 3)}, 5, on, 1), 0);
}

}  // namespace
}  // namespace sx::daemon::replicas
