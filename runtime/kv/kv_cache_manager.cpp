// KvCacheManager: block tables, prefix matching and commits over the BlockPool.
#include "runtime/kv/kv_cache_manager.h"

#include <algorithm>

namespace sx::kv {

const std::vector<BlockId> KvCacheManager::kEmpty;
const std::vector<std::uint64_t> KvCacheManager::kNoHashes;

KvCacheManager::KvCacheManager(const KvCacheConfig& config)
    : config_(config),
      pool_(config.num_blocks),
      snapshots_(static_cast<std::size_t>(config.needs_state && config.prefix_caching ? std::max<std::int64_t>(config.snapshots, 0) : 0)) {}

std::uint64_t prefix_chain_hash(std::span<const std::int32_t> tokens, std::int64_t blocks, std::int64_t block_size,
                                std::uint64_t salt) {
  std::uint64_t h = 0;
  for (std::int64_t i = 0; i < blocks; ++i) {
    h = block_hash(h, tokens.subspan(static_cast<std::size_t>(i * block_size), static_cast<std::size_t>(block_size)),
                   salt);
  }
  return h;
}

double KvCacheManager::usage() const {
  const auto usable = static_cast<double>(pool_.usable_blocks());
  return usable > 0 ? 1.0 - static_cast<double>(pool_.num_free()) / usable : 0.0;
}

KvCacheStats KvCacheManager::stats() const {
  KvCacheStats st{queries_, hits_, pool_.evictions()};
  st.snapshots_total = static_cast<std::int64_t>(snapshots_.size());
  for (const Snapshot& s : snapshots_) st.snapshots_held += s.hash ? 1 : 0;
  st.snapshots_taken = snapshots_taken_;
  st.snapshots_restored = snapshots_restored_;
  st.snapshots_evicted = snapshots_evicted_;
  return st;
}

std::int64_t KvCacheManager::acquire_cached_prefix(std::uint64_t request, std::span<const std::int32_t> tokens) {
  Table& t = tables_[request];
  if (!t.blocks.empty()) return 0;
  queries_ += tokens.size();
  if (!config_.prefix_caching || tokens.empty()) return 0;
  const std::int64_t bs = config_.block_size;
  const std::int64_t max_blocks = (static_cast<std::int64_t>(tokens.size()) - 1) / bs;
  std::uint64_t parent = 0;
  std::size_t keep = 0;  // a hybrid's blocks up to its deepest snapshot
  std::optional<std::int32_t> snapshot;
  for (std::int64_t i = 0; i < max_blocks; ++i) {
    const auto chunk = tokens.subspan(static_cast<std::size_t>(i * bs), static_cast<std::size_t>(bs));
    const std::uint64_t h = block_hash(parent, chunk, config_.salt);
    auto b = pool_.acquire_cached(h, chunk);
    if (!b) break;
    t.blocks.push_back(*b);
    t.hashes.push_back(h);
    parent = h;
    if (auto s = snapshot_of_.find(h); s != snapshot_of_.end()) {
      keep = t.blocks.size();
      snapshot = s->second;
      // Every snapshot on a hit's chain counts as used: a conversation's early ones are where
      // its branches part.
      snapshots_[static_cast<std::size_t>(s->second)].used = tick();
    }
  }
  if (config_.needs_state) {
    // Blocks past the deepest snapshot are of no use without the states after them.
    std::vector<BlockId> extra(t.blocks.rbegin(), t.blocks.rend() - static_cast<std::ptrdiff_t>(keep));
    pool_.release(extra);
    t.blocks.resize(keep);
    t.hashes.resize(keep);
    t.restore = snapshot;
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

std::optional<std::int32_t> KvCacheManager::take_restore(std::uint64_t request) {
  auto it = tables_.find(request);
  if (it == tables_.end() || !it->second.restore) return std::nullopt;
  const std::int32_t s = *it->second.restore;
  it->second.restore.reset();
  ++snapshots_restored_;
  return s;
}

std::optional<std::int32_t> KvCacheManager::reserve_snapshot() {
  if (snapshots_.empty()) return std::nullopt;
  // A free one; else one no lookup can reach (a block of its chain is gone); else the least
  // recently used.
  std::optional<std::size_t> pick;
  for (std::size_t i = 0; i < snapshots_.size() && !pick; ++i) {
    if (!snapshots_[i].hash && !snapshots_[i].reserved) pick = i;
  }
  for (std::size_t i = 0; i < snapshots_.size() && !pick; ++i) {
    if (snapshots_[i].hash && !pool_.is_cached(*snapshots_[i].hash)) pick = i;
  }
  if (!pick) {
    for (std::size_t i = 0; i < snapshots_.size(); ++i) {
      if (snapshots_[i].hash && (!pick || snapshots_[i].used < snapshots_[*pick].used)) pick = i;
    }
  }
  if (!pick) return std::nullopt;  // every one is reserved (more than the pool in one step)
  Snapshot& s = snapshots_[*pick];
  if (s.hash) {
    snapshot_of_.erase(*s.hash);
    s.hash.reset();
    ++snapshots_evicted_;
  }
  s.reserved = true;
  s.used = tick();
  return static_cast<std::int32_t>(*pick);
}

bool KvCacheManager::register_snapshot(std::int32_t snapshot, std::span<const std::int32_t> sequence,
                                       std::int64_t tokens) {
  const std::int64_t bs = config_.block_size;
  if (tokens <= 0 || tokens % bs != 0 || tokens > static_cast<std::int64_t>(sequence.size())) {
    snapshots_.at(static_cast<std::size_t>(snapshot)).reserved = false;
    return false;
  }
  return register_snapshot_at_hash(snapshot, prefix_chain_hash(sequence, tokens / bs, bs, config_.salt));
}

bool KvCacheManager::register_snapshot_at_hash(std::int32_t snapshot, std::uint64_t h) {
  Snapshot& s = snapshots_.at(static_cast<std::size_t>(snapshot));
  s.reserved = false;
  if (!pool_.is_cached(h) || snapshot_of_.count(h) != 0) return false;
  s.hash = h;
  s.used = tick();
  snapshot_of_[h] = snapshot;
  ++snapshots_taken_;
  return true;
}

void KvCacheManager::drop_snapshot(std::int32_t snapshot) {
  Snapshot& s = snapshots_.at(static_cast<std::size_t>(snapshot));
  if (s.hash) snapshot_of_.erase(*s.hash);
  s = Snapshot{};
}

const std::vector<std::uint64_t>& KvCacheManager::block_hashes(std::uint64_t request) const {
  auto it = tables_.find(request);
  return it == tables_.end() ? kNoHashes : it->second.hashes;
}

const std::vector<BlockId>& KvCacheManager::block_table(std::uint64_t request) const {
  auto it = tables_.find(request);
  return it == tables_.end() ? kEmpty : it->second.blocks;
}

}  // namespace sx::kv
