// The KV block pool (DESIGN.md §7.7): block ids only, never device memory. Every rank's device
// holds the same number of blocks, so one pool's ids address all of them.
//
// - Block 0 is the null block: never handed out, used to pad block tables.
// - Blocks are reference counted (a block shared by several requests through the prefix cache is
//   freed when its last user releases it).
// - Free blocks sit in an LRU list: allocate() takes from the head (least recently freed), and a
//   block that still holds a cached prefix is evicted (dropped from the cache) only then.
// - A full block can be registered in the cache under a hash of (parent hash, its tokens, salt);
//   lookup() verifies the tokens too, so a hash collision is a miss, never wrong KV.
//
// Threading: not thread-safe; the engine thread owns it. Errors: none (a request that cannot get
// blocks gets std::nullopt, a value that means wait or preempt).
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <unordered_map>
#include <vector>

namespace sx::kv {

using BlockId = std::int32_t;
inline constexpr BlockId kNullBlock = 0;

class BlockPool {
 public:
  // num_blocks includes the null block (so num_blocks - 1 are usable); at least 2.
  explicit BlockPool(std::int64_t num_blocks);

  std::int64_t num_blocks() const { return static_cast<std::int64_t>(refs_.size()); }
  std::int64_t usable_blocks() const { return num_blocks() - 1; }
  std::int64_t num_free() const { return free_count_; }  // reference count 0 (cached or not)
  std::int64_t num_cached() const { return static_cast<std::int64_t>(cached_.size()); }
  std::uint64_t evictions() const { return evictions_; }

  // n blocks with reference count 1, or nullopt (and nothing taken) when fewer than n are free.
  std::optional<std::vector<BlockId>> allocate(std::int64_t n);
  // Drops one reference from each; blocks reaching zero join the LRU tail in the order given.
  void release(std::span<const BlockId> blocks);

  // The cached block holding exactly these tokens under this hash, with a reference taken.
  std::optional<BlockId> acquire_cached(std::uint64_t hash, std::span<const std::int32_t> tokens);
  // Registers a full, computed block (held by the caller) under hash. No-op if the hash is cached.
  void cache(BlockId block, std::uint64_t hash, std::span<const std::int32_t> tokens);

  int ref_count(BlockId b) const { return refs_[static_cast<std::size_t>(b)]; }
  bool is_cached(std::uint64_t hash) const { return cached_.count(hash) != 0; }
  std::optional<BlockId> cached_block(std::uint64_t hash) const {
    auto it = cached_.find(hash);
    return it == cached_.end() ? std::nullopt : std::optional<BlockId>(it->second.block);
  }

 private:
  void unlink(BlockId b);
  void push_tail(BlockId b);
  void evict(BlockId b);

  std::vector<int> refs_;
  std::vector<BlockId> prev_, next_;  // LRU list of free blocks; -1 ends
  BlockId head_ = -1, tail_ = -1;
  std::int64_t free_count_ = 0;
  struct Cached {
    BlockId block;
    std::vector<std::int32_t> tokens;
  };
  std::unordered_map<std::uint64_t, Cached> cached_;  // hash -> block
  std::vector<std::optional<std::uint64_t>> hash_of_;  // block -> its hash when cached
  std::uint64_t evictions_ = 0;
};

// Hash of a full block: chains the parent's hash, the block's tokens and a salt (model revision,
// KV format: anything that changes what the KV of the same tokens is).
std::uint64_t block_hash(std::uint64_t parent, std::span<const std::int32_t> tokens, std::uint64_t salt);

}  // namespace sx::kv
