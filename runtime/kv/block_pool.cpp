// BlockPool: reference counts, the LRU free list and the prefix-cache map.
#include "runtime/kv/block_pool.h"

#include <algorithm>

namespace sx::kv {

BlockPool::BlockPool(std::int64_t num_blocks)
    : refs_(static_cast<std::size_t>(std::max<std::int64_t>(num_blocks, 2)), 0),
      prev_(refs_.size(), -1),
      next_(refs_.size(), -1),
      hash_of_(refs_.size()) {
  refs_[kNullBlock] = 1;  // never free
  for (BlockId b = 1; b < static_cast<BlockId>(refs_.size()); ++b) push_tail(b);
}

void BlockPool::unlink(BlockId b) {
  const BlockId p = prev_[static_cast<std::size_t>(b)], n = next_[static_cast<std::size_t>(b)];
  (p >= 0 ? next_[static_cast<std::size_t>(p)] : head_) = n;
  (n >= 0 ? prev_[static_cast<std::size_t>(n)] : tail_) = p;
  prev_[static_cast<std::size_t>(b)] = next_[static_cast<std::size_t>(b)] = -1;
  --free_count_;
}

void BlockPool::push_tail(BlockId b) {
  prev_[static_cast<std::size_t>(b)] = tail_;
  next_[static_cast<std::size_t>(b)] = -1;
  (tail_ >= 0 ? next_[static_cast<std::size_t>(tail_)] : head_) = b;
  tail_ = b;
  ++free_count_;
}

void BlockPool::evict(BlockId b) {
  auto& h = hash_of_[static_cast<std::size_t>(b)];
  if (!h) return;
  cached_.erase(*h);
  h.reset();
  ++evictions_;
}

std::optional<std::vector<BlockId>> BlockPool::allocate(std::int64_t n) {
  if (n < 0 || n > free_count_) return std::nullopt;
  std::vector<BlockId> out;
  out.reserve(static_cast<std::size_t>(n));
  for (std::int64_t i = 0; i < n; ++i) {
    const BlockId b = head_;
    unlink(b);
    evict(b);
    refs_[static_cast<std::size_t>(b)] = 1;
    out.push_back(b);
  }
  return out;
}

void BlockPool::release(std::span<const BlockId> blocks) {
  for (BlockId b : blocks) {
    if (b == kNullBlock) continue;
    int& r = refs_[static_cast<std::size_t>(b)];
    if (r <= 0) continue;  // programmer error guarded: never double-free into the list
    if (--r == 0) push_tail(b);
  }
}

std::optional<BlockId> BlockPool::acquire_cached(std::uint64_t hash, std::span<const std::int32_t> tokens) {
  auto it = cached_.find(hash);
  if (it == cached_.end() || !std::equal(tokens.begin(), tokens.end(), it->second.tokens.begin(), it->second.tokens.end())) {
    return std::nullopt;
  }
  const BlockId b = it->second.block;
  if (refs_[static_cast<std::size_t>(b)]++ == 0) unlink(b);
  return b;
}

void BlockPool::cache(BlockId block, std::uint64_t hash, std::span<const std::int32_t> tokens) {
  if (block == kNullBlock || hash_of_[static_cast<std::size_t>(block)] || cached_.count(hash) != 0) return;
  cached_.emplace(hash, Cached{block, std::vector<std::int32_t>(tokens.begin(), tokens.end())});
  hash_of_[static_cast<std::size_t>(block)] = hash;
}

namespace {

std::uint64_t mix(std::uint64_t h, std::uint64_t v) {
  // splitmix64 finaliser over the running state.
  h ^= v + 0x9E3779B97F4A7C15ull + (h << 6) + (h >> 2);
  h ^= h >> 30;
  h *= 0xBF58476D1CE4E5B9ull;
  h ^= h >> 27;
  h *= 0x94D049BB133111EBull;
  h ^= h >> 31;
  return h;
}

}  // namespace

std::uint64_t block_hash(std::uint64_t parent, std::span<const std::int32_t> tokens, std::uint64_t salt) {
  std::uint64_t h = mix(parent, salt);
  for (std::int32_t t : tokens) h = mix(h, static_cast<std::uint32_t>(t));
  return mix(h, tokens.size());
}

}  // namespace sx::kv
