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

}  // namespace
}  // namespace sx::kv
