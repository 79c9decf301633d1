// backends/cuda/arena.h with malloc standing in for cudaMalloc: few large chunks, alignment,
// first fit, chunks returned when their last buffer goes, and allocation failures passed on.
#include "backends/cuda/arena.h"

#include <cstdlib>
#include <cstdint>
#include <set>

#include <gtest/gtest.h>

namespace sx::cuda {
namespace {

struct Driver {
  int allocs = 0, frees = 0;
  std::size_t fail_above = SIZE_MAX;
  std::set<void*> live;
  Arena::AllocFn alloc() {
    return [this](std::size_t bytes) -> Result<void*> {
      if (bytes > fail_above) return resource_exhausted_error("out of device memory for {} bytes", bytes);
      ++allocs;
      void* p = std::aligned_alloc(256, (bytes + 255) / 256 * 256);
      live.insert(p);
      return p;
    };
  }
  Arena::FreeFn free() {
    return [this](void* p) {
      ++frees;
      live.erase(p);
      std::free(p);
    };
  }
};

TEST(Arena, ChunkSizeIsTheDefaultOrTheAlignedRequest) {
  EXPECT_EQ(arena_chunk_bytes(1, 512 << 20, 256), std::size_t{512} << 20);
  EXPECT_EQ(arena_chunk_bytes((std::size_t{1} << 30) + 1, 512 << 20, 256), (std::size_t{1} << 30) + 256);
  EXPECT_EQ(arena_chunk_bytes(0, 0, 256), 256u);
}

TEST(Arena, ManyBuffersComeFromFewAlignedChunks) {
  Driver drv;
  {
    Arena a(drv.alloc(), drv.free(), 1 << 20);
    std::vector<void*> ps;
    for (int i = 0; i < 300; ++i) {  // 300 tensors of 3000 bytes: under 1 MiB in all
      auto p = a.allocate(3000);
      ASSERT_TRUE(p.ok());
      EXPECT_EQ(reinterpret_cast<std::uintptr_t>(*p) % 256, 0u);
      ps.push_back(*p);
    }
    EXPECT_EQ(drv.allocs, 1);
    EXPECT_EQ(a.chunks(), 1u);
    EXPECT_EQ(a.live_bytes(), 300u * 3072);
    EXPECT_EQ(std::set<void*>(ps.begin(), ps.end()).size(), ps.size());
    // Larger than a chunk: a chunk of its own.
    auto big = a.allocate(3 << 20);
    ASSERT_TRUE(big.ok());
    EXPECT_EQ(drv.allocs, 2);
    EXPECT_EQ(a.reserved_bytes(), (std::size_t{1} << 20) + (std::size_t{3} << 20));
    // The first chunk's free tail still serves small requests.
    ASSERT_TRUE(a.allocate(1000).ok());
    EXPECT_EQ(drv.allocs, 2);
    a.release(*big);  // its chunk's only buffer: back to the driver
    EXPECT_EQ(drv.frees, 1);
    EXPECT_EQ(a.chunks(), 1u);
    for (void* p : ps) a.release(p);
    EXPECT_EQ(a.chunks(), 1u);  // one buffer of 1000 bytes is still live in it
  }
  EXPECT_EQ(drv.frees, 2);  // the arena returns the rest when it goes
  EXPECT_TRUE(drv.live.empty());
}

TEST(Arena, AFailedChunkAllocationIsReturnedAndNothingLeaks) {
  Driver drv;
  drv.fail_above = 2 << 20;
  Arena a(drv.alloc(), drv.free(), 1 << 20);
  auto p = a.allocate(5 << 20);
  ASSERT_FALSE(p.ok());
  EXPECT_EQ(p.status().code(), StatusCode::kResourceExhausted);
  EXPECT_EQ(a.chunks(), 0u);
  auto q = a.allocate(10);
  ASSERT_TRUE(q.ok());
  a.release(*q);
  EXPECT_EQ(a.chunks(), 0u);
  EXPECT_TRUE(drv.live.empty());
}

}  // namespace
}  // namespace sx::cuda
