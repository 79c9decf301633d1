// KvCacheManager: block tables, the watermark, prefix reuse (at most length - 1 tokens) and the
// hit counters.
#include <gtest/gtest.h>

#include <numeric>
#include <vector>

#include "runtime/kv/kv_cache_manager.h"

namespace sx::kv {
namespace {

std::vector<std::int32_t> seq(int n, int start = 100) {
  std::vector<std::int32_t> v(static_cast<std::size_t>(n));
  std::iota(v.begin(), v.end(), start);
  return v;
}

TEST(KvCacheManager, TablesGrowByWholeBlocks) {
  KvCacheManager m({11, 4, true, 0, 0.0});
  EXPECT_TRUE(m.allocate(1, 5, true));
  EXPECT_EQ(m.block_table(1).size(), 2u);
  EXPECT_TRUE(m.allocate(1, 8, false));
  EXPECT_EQ(m.block_table(1).size(), 2u);
  EXPECT_TRUE(m.allocate(1, 9, false));
  EXPECT_EQ(m.block_table(1).size(), 3u);
  EXPECT_EQ(m.num_free_blocks(), 7);
  m.free(1);
  EXPECT_EQ(m.num_free_blocks(), 10);
  EXPECT_TRUE(m.block_table(1).empty());
}

TEST(KvCacheManager, AdmissionLeavesTheWatermarkFree) {
  KvCacheManager m({11, 4, true, 0, 0.2});  // 10 usable, 2 reserved for admissions
  EXPECT_FALSE(m.allocate(1, 36, true));  // 9 blocks would leave 1
  EXPECT_TRUE(m.block_table(1).empty());
  EXPECT_TRUE(m.allocate(1, 32, true));   // 8 leaves 2
  EXPECT_TRUE(m.allocate(1, 40, false));  // a running request may use the reserve
}

TEST(KvCacheManager, ASecondRequestReusesTheCommittedPrefix) {
  KvCacheManager m({21, 4, true, 99, 0.0});
  const auto a = seq(10);
  EXPECT_EQ(m.acquire_cached_prefix(1, a), 0);
  ASSERT_TRUE(m.allocate(1, 10, true));
  m.commit(1, a, 10);  // blocks 0 and 1 are full
  // Same first 9 tokens: two full blocks shared.
  auto b = seq(9);
  b.push_back(7);
  EXPECT_EQ(m.acquire_cached_prefix(2, b), 8);
  EXPECT_EQ(m.block_table(2)[0], m.block_table(1)[0]);
  EXPECT_EQ(m.block_table(2)[1], m.block_table(1)[1]);
  EXPECT_EQ(m.pool().ref_count(m.block_table(1)[0]), 2);
  // A request equal to the cached prefix reuses at most length - 1 tokens.
  const auto c = seq(8);
  EXPECT_EQ(m.acquire_cached_prefix(3, c), 4);
  const KvCacheStats s = m.stats();
  EXPECT_EQ(s.prefix_queries, 10u + 10u + 8u);
  EXPECT_EQ(s.prefix_hits, 8u + 4u);
  m.free(1);
  m.free(2);
  m.free(3);
  EXPECT_EQ(m.num_free_blocks(), 20);
  // After everyone left, the prefix is still cached (free but not evicted).
  EXPECT_EQ(m.acquire_cached_prefix(4, a), 8);
  m.free(4);
}

TEST(KvCacheManager, NothingIsReusedWithPrefixCachingOff) {
  KvCacheManager off({9, 4, false, 0, 0.0});
  const auto a = seq(9);
  ASSERT_TRUE(off.allocate(1, 9, true));
  off.commit(1, a, 9);
  EXPECT_EQ(off.acquire_cached_prefix(2, a), 0);
  KvCacheManager m({9, 4, true, 1, 0.0});
  ASSERT_TRUE(m.allocate(1, 9, true));
  m.commit(1, a, 9);
  EXPECT_EQ(m.acquire_cached_prefix(2, a), 8);
}

// A hybrid's manager: `snapshots` state snapshots, blocks of 4 tokens.
KvCacheConfig hybrid(std::int64_t snapshots, std::int64_t blocks = 33) {
  KvCacheConfig c{blocks, 4, true, 0, 0.0};
  c.needs_state = true;
  c.snapshots = snapshots;
  return c;
}

// Whether the state after the first `tokens` of `sequence` has a snapshot (blocks of 4, salt 0).
bool has_snapshot(const KvCacheManager& m, std::span<const std::int32_t> sequence, std::int64_t tokens) {
  return m.snapshot_at_hash(prefix_chain_hash(sequence, tokens / 4, 4, 0)).has_value();
}

// Request `id` computes all of `tokens` (its blocks committed) and is freed.
void compute(KvCacheManager& m, std::uint64_t id, const std::vector<std::int32_t>& tokens) {
  ASSERT_TRUE(m.allocate(id, static_cast<std::int64_t>(tokens.size()), false));
  m.commit(id, tokens, static_cast<std::int64_t>(tokens.size()));
}

TEST(KvCacheManager, AHybridReusesBlocksOnlyUpToItsDeepestSnapshot) {
  KvCacheManager m(hybrid(4));
  const auto a = seq(30);
  compute(m, 1, a);
  // Cached blocks but no snapshot: nothing is reusable (the states after them are gone).
  EXPECT_EQ(m.acquire_cached_prefix(2, a), 0);
  EXPECT_FALSE(m.take_restore(2));
  m.free(2);
  // Snapshots after 8 and 20 tokens: a request sharing 26 tokens takes 20 and snapshot of 20.
  auto s8 = m.reserve_snapshot(), s20 = m.reserve_snapshot();
  ASSERT_TRUE(s8 && s20);
  EXPECT_NE(*s8, *s20);
  EXPECT_TRUE(m.register_snapshot(*s8, a, 8));
  EXPECT_TRUE(m.register_snapshot(*s20, a, 20));
  EXPECT_TRUE(has_snapshot(m, a, 20));
  EXPECT_FALSE(has_snapshot(m, a, 24));
  // A second snapshot of one position is refused (and freed); so is one whose block is not cached.
  auto dup = m.reserve_snapshot();
  ASSERT_TRUE(dup);
  EXPECT_FALSE(m.register_snapshot(*dup, a, 20));
  auto uncached = m.reserve_snapshot();
  ASSERT_TRUE(uncached);
  EXPECT_FALSE(m.register_snapshot(*uncached, seq(30, 5000), 8));
  EXPECT_EQ(m.stats().snapshots_held, 2);
  auto b = a;
  b.resize(26);
  b.push_back(1);  // parts from a at 26
  EXPECT_EQ(m.acquire_cached_prefix(3, b), 20);
  EXPECT_EQ(m.block_table(3).size(), 5u);
  EXPECT_EQ(m.take_restore(3), s20);
  EXPECT_FALSE(m.take_restore(3));  // once
  m.free(3);
  // Parting at 12: the snapshot of 8.
  auto c = a;
  c.resize(12);
  c.push_back(1);
  EXPECT_EQ(m.acquire_cached_prefix(4, c), 8);
  EXPECT_EQ(m.take_restore(4), s8);
  m.free(4);
  const KvCacheStats st = m.stats();
  EXPECT_EQ(st.snapshots_taken, 2u);
  EXPECT_EQ(st.snapshots_restored, 2u);
  EXPECT_EQ(st.prefix_hits, 28u);
  // Dropping the snapshot of 20 leaves 8 as the deepest.
  m.drop_snapshot(*m.snapshot_at_hash(prefix_chain_hash(a, 5, 4, 0)));
  EXPECT_EQ(m.acquire_cached_prefix(5, b), 8);
}

TEST(KvCacheManager, AFullSnapshotPoolReusesTheUnreachableThenTheLeastRecentlyUsed) {
  // 8 usable blocks of 4 tokens and 2 snapshots.
  KvCacheManager m(hybrid(2, 9));
  const auto a = seq(8, 100), b = seq(8, 200);
  compute(m, 1, a);
  compute(m, 2, b);
  m.free(1);
  m.free(2);
  auto sa = m.reserve_snapshot(), sb = m.reserve_snapshot();
  ASSERT_TRUE(sa && sb);
  ASSERT_TRUE(m.register_snapshot(*sa, a, 8));
  ASSERT_TRUE(m.register_snapshot(*sb, b, 8));
  // a's snapshot is used again (a hit), so b's is the least recently used.
  auto a1 = a;
  a1.push_back(1);
  EXPECT_EQ(m.acquire_cached_prefix(3, a1), 8);
  m.free(3);
  auto next = m.reserve_snapshot();
  ASSERT_TRUE(next);
  EXPECT_EQ(*next, *sb);
  EXPECT_FALSE(has_snapshot(m, b, 8));
  EXPECT_EQ(m.stats().snapshots_evicted, 1u);
  m.drop_snapshot(*next);
  // Evicting a's blocks (a pool of new requests takes every block) makes its snapshot unreachable:
  // it is reused before the reachable one of c.
  const auto c = seq(4, 300);
  compute(m, 4, c);
  auto sc = m.reserve_snapshot();
  ASSERT_TRUE(sc);
  ASSERT_TRUE(m.register_snapshot(*sc, c, 4));
  ASSERT_TRUE(m.allocate(5, 28, false));  // the 7 other blocks: a's and b's are evicted
  auto reuse = m.reserve_snapshot();
  ASSERT_TRUE(reuse);
  EXPECT_EQ(*reuse, *sa);
  EXPECT_TRUE(has_snapshot(m, c, 4));
}

TEST(KvCacheManager, AHybridWithoutSnapshotsCachesNothing) {
  KvCacheManager m(hybrid(0));
  const auto a = seq(30);
  compute(m, 1, a);
  m.free(1);
  EXPECT_FALSE(m.reserve_snapshot());
  EXPECT_EQ(m.acquire_cached_prefix(2, a), 0);
}

}  // namespace
}  // namespace sx::kv
