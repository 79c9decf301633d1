// The replica router (DESIGN.md §3 step 3, §5 "Replicas"): which ready replica takes a new request.
//
// Each replica's load is its outstanding work: the prompt tokens routed to it and not prefilled
// yet (minus what its prefix cache was expected to hold) plus its running requests. A new request
// costs a replica that work plus the prompt tokens it would have to prefill there: its prompt less
// the longest prefix the replica probably holds (PrefixIndex, a bounded mirror of the prompts
// routed to it). The cheapest ready replica wins, so a request follows its conversation's
// prefix unless that replica is busier than the prefill it saves; ties go to the replica with more
// free KV blocks, then to the first at or after `rotation` (the caller advances it per request, so
// idle replicas take turns). With prefix affinity off, only the outstanding work counts.
//
// Pure host code, deterministic, unit-tested (tests/unit/daemon_replicas). Threading: one thread
// (the loop thread) at a time.
#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>
#include <span>
#include <unordered_set>

namespace sx::daemon::replicas {

// Hashes of the block-aligned prefixes of prompts routed to one replica, the oldest forgotten
// beyond `capacity` (a replica's prefix cache evicts too).
class PrefixIndex {
 public:
  explicit PrefixIndex(std::size_t block_tokens = 16, std::size_t capacity = 16384);
  // Tokens of the longest block-aligned prefix of `prompt` recorded here (a multiple of the block).
  std::int64_t match(std::span<const std::int32_t> prompt) const;
  void record(std::span<const std::int32_t> prompt);
  std::size_t size() const { return set_.size(); }

 private:
  std::size_t block_, capacity_;
  std::unordered_set<std::uint64_t> set_;
  std::deque<std::uint64_t> order_;  // insertion order, for eviction
};

struct ReplicaLoad {
  bool ready = false;                     // in rotation (ready, not draining, stopped or failed)
  std::int64_t pending_prompt_tokens = 0;  // routed prompt tokens not prefilled yet
  std::int64_t running = 0;                // engine requests in flight
  std::int64_t free_kv_blocks = 0;         // tie-break
  std::int64_t prefix_match_tokens = 0;    // of this request's prompt (PrefixIndex::match)
};

struct RouterOptions {
  bool prefix_affinity = true;
};

// The index of the replica for a request of `prompt_tokens`, or -1 when none is ready.
int choose_replica(std::span<const ReplicaLoad> loads, std::int64_t prompt_tokens, const RouterOptions& options,
                   std::size_t rotation = 0);

}  // namespace sx::daemon::replicas
