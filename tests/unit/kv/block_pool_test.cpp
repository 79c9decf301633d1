// BlockPool: the null block, reference counts, LRU order of reuse, and cached-block eviction.
#include <gtest/gtest.h>

#include <vector>

#include "runtime/kv/block_pool.h"

namespace sx::kv {
namespace {

TEST(BlockPool, NeverHandsOutTheNullBlockAndRefusesWhatItDoesNotHave) {
  BlockPool pool(5);
  EXPECT_EQ(pool.usable_blocks(), 4);
  EXPECT_EQ(pool.num_free(), 4);
  auto a = pool.allocate(4);
  ASSERT_TRUE(a.has_value());
  for (BlockId b : *a) EXPECT_NE(b, kNullBlock);
  EXPECT_FALSE(pool.allocate(1).has_value());
  EXPECT_EQ(pool.num_free(), 0);
  pool.release(*a);
  EXPECT_EQ(pool.num_free(), 4);
  EXPECT_FALSE(pool.allocate(5).has_value());
  EXPECT_EQ(pool.num_free(), 4);  // a refused allocation takes nothing
}

TEST(BlockPool, ReleasedBlocksAreReusedLeastRecentlyFreedFirst) {
  BlockPool pool(4);
  auto a = *pool.allocate(3);  // 1 2 3
  pool.release(std::vector<BlockId>{a[2]});
  pool.release(std::vector<BlockId>{a[0]});
  pool.release(std::vector<BlockId>{a[1]});
  auto b = *pool.allocate(3);
  EXPECT_EQ(b, (std::vector<BlockId>{a[2], a[0], a[1]}));
}

TEST(BlockPool, SharedBlocksAreFreedByTheirLastUser) {
  BlockPool pool(3);
  auto a = *pool.allocate(1);
  const std::vector<std::int32_t> toks = {1, 2, 3, 4};
  const std::uint64_t h = block_hash(0, toks, 7);
  pool.cache(a[0], h, toks);
  auto again = pool.acquire_cached(h, toks);
  ASSERT_TRUE(again.has_value());
  EXPECT_EQ(*again, a[0]);
  EXPECT_EQ(pool.ref_count(a[0]), 2);
  pool.release(a);
  EXPECT_EQ(pool.num_free(), 1);  // the other block only
  pool.release(a);
  EXPECT_EQ(pool.num_free(), 2);
}

TEST(BlockPool, AFreeCachedBlockCanBeRevivedUntilItIsEvicted) {
  BlockPool pool(3);
  const std::vector<std::int32_t> toks = {5, 6};
  const std::uint64_t h = block_hash(0, toks, 0);
  auto a = *pool.allocate(1);
  pool.cache(a[0], h, toks);
  pool.release(a);
  EXPECT_EQ(pool.num_cached(), 1);
  auto revived = pool.acquire_cached(h, toks);
  ASSERT_TRUE(revived.has_value());
  EXPECT_EQ(pool.num_free(), 1);
  pool.release(std::vector<BlockId>{*revived});
  // Allocating every block evicts the cached one (it is at the LRU tail, taken last).
  auto all = *pool.allocate(2);
  EXPECT_EQ(pool.num_cached(), 0);
  EXPECT_EQ(pool.evictions(), 1u);
  EXPECT_FALSE(pool.acquire_cached(h, toks).has_value());
  pool.release(all);
}

TEST(BlockPool, AHashCollisionIsAMiss) {
  BlockPool pool(3);
  auto a = *pool.allocate(1);
  const std::vector<std::int32_t> toks = {1, 2};
  pool.cache(a[0], 42, toks);
  const std::vector<std::int32_t> other = {1, 3};
  EXPECT_FALSE(pool.acquire_cached(42, other).has_value());
  EXPECT_TRUE(pool.acquire_cached(42, toks).has_value());
}

TEST(BlockHash, DependsOnParentTokensAndSalt) {
  const std::vector<std::int32_t> t = {1, 2, 3};
  const std::vector<std::int32_t> u = {1, 2, 4};
  EXPECT_NE(block_hash(0, t, 0), block_hash(1, t, 0));
  EXPECT_NE(block_hash(0, t, 0), block_hash(0, u, 0));
  EXPECT_NE(block_hash(0, t, 0), block_hash(0, t, 1));
  EXPECT_EQ(block_hash(9, t, 3), block_hash(9, t, 3));
}

}  // namespace
}  // namespace sx::kv
