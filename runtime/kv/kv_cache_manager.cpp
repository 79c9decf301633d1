// KvCacheManager: block tables, prefix matching and commits over the BlockPool.
#include "runtime/kv/kv_cache_manager.h"

#include <algorithm>

namespace sx::kv {

const std::vector<BlockId> KvCacheManager::kEmpty;

KvCacheManager::KvCacheManager(const KvCacheConfig& config) : config_(config), pool_(config.num_blocks) {}

double KvCacheManager::usage() const {
  const auto usable = static_cast<double>(pool_.usable_blocks());
  return usable > 0 ? 1.0 - static_cast<double>(pool_.num_free()) / usable : 0.0;
}

KvCacheStats KvCacheManager::stats() const { return {queries_, hits_, pool_.evictions()}; }

std::int64_t KvCacheManager::acquire_cached_prefix(std::uint64_t request, std::span<const std::int32_t> tokens) {
  Table& t = tables_[request];
  if (!t.blocks.empty()) return 0;
  queries_ += tokens.size();
  if (!config_.prefix_caching || tokens.empty()) return 0;
  const std::int64_t bs = config_.block_size;
  const std::int64_t max_blocks = (static_cast<std::int64_t>(tokens.size()) - 1) / bs;
  std::uint64_t parent = 0;
  for (std::int64_t i = 0; i < max_blocks; ++i) {
    const auto chunk = tokens.subspan(static_cast<std::size_t>(i * bs), static_cast<std::size_t>(bs));
    const std::uint64_t h = block_hash(parent, chunk, config_.salt);
    auto b = pool_.acquire_cached(h, chunk);
    if (!b) break;
    t.blocks.push_back(*b);
    t.hashes.push_back(h);
    parent = h;
  }
  const std::int64_t cached = static_cast<std::int64_t>(t.blocks.size()) * bs;
  hits_ += static_cast<std::uint64_t>(cached);
  return cached;
}

bool KvCacheManager::allocate(std::uint64_t request, std::int64_t total_tokens, bool admission) {
  Table& t = tables_[request];
  const std::int64_t need_blocks = (total_tokens + config_.block_size - 1) / config_.block_size;
  const std::int64_t extra = need_blocks - static_cast<std::int64_t>(t.blocks.size());
  if (extra <= 0) return true;
  const auto reserve =
      admission ? static_cast<std::int64_t>(config_.watermark * static_cast<double>(pool_.usable_blocks())) : 0;
  if (pool_.num_free() - extra < reserve) return false;
  auto got = pool_.allocate(extra);
  if (!got) return false;
  t.blocks.insert(t.blocks.end(), got->begin(), got->end());
  return true;
}

void KvCacheManager::commit(std::uint64_t request, std::span<const std::int32_t> tokens, std::int64_t computed) {
  if (!config_.prefix_caching) return;
  auto it = tables_.find(request);
  if (it == tables_.end()) return;
  Table& t = it->second;
  const std::int64_t bs = config_.block_size;
  const std::int64_t full = std::min<std::int64_t>(computed / bs, static_cast<std::int64_t>(t.blocks.size()));
  for (auto i = static_cast<std::int64_t>(t.hashes.size()); i < full; ++i) {
    const auto chunk = tokens.subspan(static_cast<std::size_t>(i * bs), static_cast<std::size_t>(bs));
    const std::uint64_t h = block_hash(t.hashes.empty() ? 0 : t.hashes.back(), chunk, config_.salt);
    pool_.cache(t.blocks[static_cast<std::size_t>(i)], h, chunk);
    t.hashes.push_back(h);
  }
}

void KvCacheManager::free(std::uint64_t request) {
  auto it = tables_.find(request);
  if (it == tables_.end()) return;
  std::vector<BlockId> reversed(it->second.blocks.rbegin(), it->second.blocks.rend());
  pool_.release(reversed);
  tables_.erase(it);
}

const std::vector<BlockId>& KvCacheManager::block_table(std::uint64_t request) const {
  auto it = tables_.find(request);
  return it == tables_.end() ? kEmpty : it->second.blocks;
}

}  // namespace sx::kv
