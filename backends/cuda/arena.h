// Device memory in few, large allocations (issue 20 item 2): buffers are carved out of chunks of
// at least `chunk_bytes` taken from the driver (cudaMalloc through AllocFn), so a model's hundreds
// of tensors, its KV pool and the workspaces come from a handful of allocations made at start-up
// rather than one each; a chunk goes back to the driver (FreeFn) when its last buffer is released
// (a reload frees the old model's memory).
//
// Pure host code (the driver calls are injected): unit-tested with malloc (tests/unit/cuda).
// Threading: all members may be called from any thread (one mutex).
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <mutex>
#include <vector>

#include "runtime/base/status.h"

namespace sx::cuda {

// The bytes of a new chunk for a request of `bytes`: chunk_bytes, or the request rounded up to
// `alignment` when larger.
std::size_t arena_chunk_bytes(std::size_t bytes, std::size_t chunk_bytes, std::size_t alignment);

class Arena {
 public:
  using AllocFn = std::function<Result<void*>(std::size_t bytes)>;
  using FreeFn = std::function<void(void* chunk)>;
  Arena(AllocFn alloc, FreeFn free, std::size_t chunk_bytes, std::size_t alignment = 256)
      : alloc_(std::move(alloc)), free_(std::move(free)), chunk_bytes_(chunk_bytes), alignment_(alignment) {}
  ~Arena();
  Arena(const Arena&) = delete;
  Arena& operator=(const Arena&) = delete;

  // `bytes` (0 taken as 1) at an `alignment`-aligned address: first fit in the free tail of an
  // existing chunk, else a new chunk (AllocFn's error is returned as is).
  Result<void*> allocate(std::size_t bytes);
  // A pointer allocate() returned. The chunk is freed once none of its buffers is live.
  void release(void* p);

  std::size_t reserved_bytes() const;  // in chunks
  std::size_t live_bytes() const;      // in live buffers (rounded to the alignment)
  std::size_t chunks() const;

 private:
  struct Chunk {
    std::byte* base = nullptr;
    std::size_t size = 0, top = 0;  // bump pointer
    std::size_t live = 0;           // buffers not released
  };
  AllocFn alloc_;
  FreeFn free_;
  std::size_t chunk_bytes_, alignment_;
  mutable std::mutex mu_;
  std::vector<Chunk> chunks_;
  std::size_t live_bytes_ = 0;
  std::vector<std::pair<void*, std::size_t>> sizes_;  // live pointer -> rounded size (few hundred)
};

}  // namespace sx::cuda
