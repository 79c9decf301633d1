// The replica router: prefix index and choice.
#include "daemon/replicas/router.h"

#include <algorithm>

#include "runtime/base/fnv.h"

namespace sx::daemon::replicas {

namespace {

// The hash of a prefix extended by one block of tokens (FNV-1a over the previous hash and the
// tokens, then a final mix so nearby chains do not collide in the set's buckets).
std::uint64_t extend(std::uint64_t h, std::span<const std::int32_t> block) {
  h = Fnv1a{h}.add(block.data(), block.size_bytes()).value;  // the tokens' bytes (little-endian hosts)
  h ^= h >> 33;
  h *= 0xff51afd7ed558ccdull;
  h ^= h >> 33;
  return h;
}

constexpr std::uint64_t kSeed = kFnvOffset;

}  // namespace

PrefixIndex::PrefixIndex(std::size_t block_tokens, std::size_t capacity)
    : block_(std::max<std::size_t>(1, block_tokens)), capacity_(std::max<std::size_t>(1, capacity)) {}

std::int64_t PrefixIndex::match(std::span<const std::int32_t> prompt) const {
  std::uint64_t h = kSeed;
  std::int64_t matched = 0;
  for (std::size_t at = 0; at + block_ <= prompt.size(); at += block_) {
    h = extend(h, prompt.subspan(at, block_));
    if (!set_.contains(h)) break;
    matched = static_cast<std::int64_t>(at + block_);
  }
  return matched;
}

void PrefixIndex::record(std::span<const std::int32_t> prompt) {
  std::uint64_t h = kSeed;
  for (std::size_t at = 0; at + block_ <= prompt.size(); at += block_) {
    h = extend(h, prompt.subspan(at, block_));
    if (!set_.insert(h).second) continue;
    order_.push_back(h);
    if (order_.size() > capacity_) {
      set_.erase(order_.front());
      order_.pop_front();
    }
  }
}

int choose_replica(std::span<const ReplicaLoad> loads, std::int64_t prompt_tokens, const RouterOptions& options,
                   std::size_t rotation) {
  int best = -1;
  std::int64_t best_cost = 0;
  for (std::size_t k = 0; k < loads.size(); ++k) {
    const std::size_t i = (rotation + k) % loads.size();
    const ReplicaLoad& r = loads[i];
    if (!r.ready) continue;
    std::int64_t cost = r.pending_prompt_tokens + r.running;
    if (options.prefix_affinity) cost += std::max<std::int64_t>(0, prompt_tokens - r.prefix_match_tokens);
    const bool better = best < 0 || cost < best_cost ||
                        (cost == best_cost && r.free_kv_blocks > loads[static_cast<std::size_t>(best)].free_kv_blocks);
    if (better) {
      best = static_cast<int>(i);
      best_cost = cost;
    }
  }
  return best;
}

}  // namespace sx::daemon::replicas
