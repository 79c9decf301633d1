// A request as the scheduler sees it: token ids, limits and progress. Pure host data.
#pragma once

#include <algorithm>
#include <cstdint>
#include <vector>

namespace sx::sched {

enum class RequestStatus { kWaiting, kRunning, kFinished };
enum class FinishReason { kNone, kStop, kLength, kCancelled };

struct Request {
  std::uint64_t id = 0;
  std::vector<std::int32_t> prompt;
  std::vector<std::int32_t> output;     // generated so far; kept when the request is preempted
  std::int64_t max_tokens = 16;         // new tokens at most
  std::vector<std::int32_t> stop_ids;   // a generated stop id ends the request (and is kept in output)
  // Positions (ascending) where a prefill chunk ends, so that the states there can be kept (a
  // hybrid's prefix-cache snapshots): a chunk never runs past the next one.
  std::vector<std::int64_t> snapshot_at;

  RequestStatus status = RequestStatus::kWaiting;
  FinishReason finish = FinishReason::kNone;
  std::int64_t num_computed = 0;        // tokens (prompt then output) whose KV is in the cache
  std::int64_t num_cached_prompt = 0;   // of the prompt, taken from the prefix cache at admission
  std::int64_t num_preemptions = 0;
  std::uint64_t arrival = 0;            // admission order (set by the scheduler)
  std::int64_t prefill_skips = 0;       // steps in a row its prefill was passed over (paced scheduling)
  bool cancel_requested = false;

  std::int64_t num_tokens() const { return static_cast<std::int64_t>(prompt.size() + output.size()); }
  // Prompt followed by output.
  std::vector<std::int32_t> all_tokens() const {
    std::vector<std::int32_t> t(prompt);
    t.insert(t.end(), output.begin(), output.end());
    return t;
  }
  // The tokens of the next step of a prefill at most `budget` long: up to the next snapshot position.
  std::int64_t next_chunk(std::int64_t budget) const {
    std::int64_t n = std::min(num_tokens() - num_computed, budget);
    for (std::int64_t p : snapshot_at) {
      if (p > num_computed) {
        n = std::min(n, p - num_computed);
        break;
      }
    }
    return n;
  }
  std::int32_t token_at(std::int64_t i) const {
    const auto p = static_cast<std::int64_t>(prompt.size());
    return i < p ? prompt[static_cast<std::size_t>(i)] : output[static_cast<std::size_t>(i - p)];
  }
};

}  // namespace sx::sched
