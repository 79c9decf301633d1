// Per-request block tables over a BlockPool, with prefix caching (DESIGN.md §7.7). Pure host
// code: block ids only.
//
// A request's table covers its tokens in order (token i lives in table[i / block_size] at offset
// i % block_size). With prefix caching on, every full block whose KV has been computed is
// registered under block_hash(parent, tokens, salt); a new request first takes the longest chain
// of cached blocks matching its tokens (at most its length minus one token, so the last token is
// always computed and yields logits).
//
// A hybrid model (Gated DeltaNet layers beside attention) also needs each layer's state after a
// cached prefix: with `snapshots` > 0 the manager keeps a registry of state snapshots (slots of
// the model's snapshot pool, ids 0..snapshots-1), each registered under the hash of the block that
// ends where it was taken. A lookup then takes the chain of cached blocks only up to its deepest
// snapshot, and hands that snapshot to the engine to restore (take_restore). Snapshots are reused
// least recently used first (a hit uses every snapshot on its chain), the unreachable ones (the
// block they are registered under was evicted) before any.
//
// Threading: not thread-safe (the engine thread). Errors: allocation failure is a `false` value
// (wait or preempt), never an error.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <unordered_map>
#include <vector>

#include "runtime/kv/block_pool.h"

namespace sx::kv {

struct KvCacheConfig {
  std::int64_t num_blocks = 0;  // including the null block
  std::int64_t block_size = 16;
  bool prefix_caching = true;
  std::uint64_t salt = 0;       // hash of what else determines the KV (model revision, KV format)
  double watermark = 0.01;      // fraction of usable blocks (rounded down) an admission must leave free
  // A hybrid's state snapshots (see above); with prefix caching, a hybrid without any caches nothing.
  bool needs_state = false;
  std::int64_t snapshots = 0;
};

struct KvCacheStats {
  std::uint64_t prefix_queries = 0;  // tokens looked up
  std::uint64_t prefix_hits = 0;     // tokens found cached
  std::uint64_t evictions = 0;
  // A hybrid's state snapshots: held now, and taken / restored / evicted (reused for another
  // position while still reachable, or found unreachable) since start.
  std::int64_t snapshots_held = 0, snapshots_total = 0;
  std::uint64_t snapshots_taken = 0, snapshots_restored = 0, snapshots_evicted = 0;
};

// The hash of the chain of the first `blocks` full blocks of `tokens` (block_hash chained from 0).
std::uint64_t prefix_chain_hash(std::span<const std::int32_t> tokens, std::int64_t blocks, std::int64_t block_size,
                                std::uint64_t salt);

// Blocks a pool needs so that one request can hold `tokens` tokens: whole blocks plus the null block.
inline std::int64_t blocks_for_tokens(std::int64_t tokens, std::int64_t block_size) {
  return (tokens + block_size - 1) / block_size + 1;
}

class KvCacheManager {
 public:
  explicit KvCacheManager(const KvCacheConfig& config);

  const KvCacheConfig& config() const { return config_; }
  std::int64_t block_size() const { return config_.block_size; }
  BlockPool& pool() { return pool_; }
  const BlockPool& pool() const { return pool_; }
  std::int64_t num_free_blocks() const { return pool_.num_free(); }
  // Fraction of usable blocks in use by requests (cached free blocks count as free).
  double usage() const;
  KvCacheStats stats() const;

  // For a request without blocks: takes the longest cached prefix of `tokens` and returns how many
  // tokens it covers (a multiple of block_size, at most tokens.size() - 1). Counts the query.
  std::int64_t acquire_cached_prefix(std::uint64_t request, std::span<const std::int32_t> tokens);

  // Grows the request's table to cover `total_tokens`. false (nothing allocated) when the pool
  // cannot; `admission` also keeps the watermark free (new requests must leave room for running
  // ones).
  bool allocate(std::uint64_t request, std::int64_t total_tokens, bool admission);

  // The first `computed` of `tokens` now have KV: registers the request's newly full blocks.
  void commit(std::uint64_t request, std::span<const std::int32_t> tokens, std::int64_t computed);

  // Releases every block of the request (last blocks first into the LRU list, so a prefix's
  // tail is evicted before its head).
  void free(std::uint64_t request);

  // A hybrid's snapshot to restore into the request's state slot before its first computed token
  // (set by acquire_cached_prefix when it found cached tokens); cleared by this call and by free().
  std::optional<std::int32_t> take_restore(std::uint64_t request);
  // A snapshot id to copy a state into, reused from the least recently used one when none is free;
  // nullopt when snapshots are off. Until register_snapshot() or drop_snapshot() it is nobody's.
  std::optional<std::int32_t> reserve_snapshot();
  // Registers a reserved snapshot: the state after the first `tokens` (a multiple of block_size) of
  // `sequence`, whose blocks are now cached. false (the snapshot freed) when the position already
  // has one or its last block is not cached.
  bool register_snapshot(std::int32_t snapshot, std::span<const std::int32_t> sequence, std::int64_t tokens);
  // The same under the chain hash of those tokens' blocks (prefix_chain_hash).
  bool register_snapshot_at_hash(std::int32_t snapshot, std::uint64_t hash);
  // Frees a reserved or registered snapshot.
  void drop_snapshot(std::int32_t snapshot);
  // The snapshot registered under a block hash, if any.
  std::optional<std::int32_t> snapshot_at_hash(std::uint64_t hash) const {
    auto it = snapshot_of_.find(hash);
    return it == snapshot_of_.end() ? std::nullopt : std::optional<std::int32_t>(it->second);
  }

  const std::vector<BlockId>& block_table(std::uint64_t request) const;
  // The chain hashes of the request's committed (or cached) full blocks, in order.
  const std::vector<std::uint64_t>& block_hashes(std::uint64_t request) const;
  bool has(std::uint64_t request) const { return tables_.count(request) != 0; }

 private:
  struct Table {
    std::vector<BlockId> blocks;
    std::vector<std::uint64_t> hashes;  // of the committed (cached or matched) full blocks, in order
    std::optional<std::int32_t> restore;  // a hybrid's snapshot of its cached prefix, until taken
  };
  struct Snapshot {
    std::optional<std::uint64_t> hash;  // registered under; none: free or reserved
    std::uint64_t used = 0;             // LRU tick
    bool reserved = false;
  };
  std::uint64_t tick() { return ++tick_; }
  KvCacheConfig config_;
  BlockPool pool_;
  std::unordered_map<std::uint64_t, Table> tables_;
  std::uint64_t queries_ = 0, hits_ = 0;
  std::vector<Snapshot> snapshots_;
  std::unordered_map<std::uint64_t, std::int32_t> snapshot_of_;  // block hash -> snapshot
  std::uint64_t tick_ = 0, snapshots_taken_ = 0, snapshots_restored_ = 0, snapshots_evicted_ = 0;
  static const std::vector<BlockId> kEmpty;
  static const std::vector<std::uint64_t> kNoHashes;
};

}  // namespace sx::kv
