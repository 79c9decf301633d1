// Continuous batching (DESIGN.md §3 step 4, §7.7): which tokens of which requests go into the next
// forward step. Pure host code: token ids and block ids, no device.
//
// Paced steps (issue 24; max_step_ms > 0, serve's default): a step should end within a target
// time, so that streams keep their pace while long prompts are prefilled. Every running decode is
// in the step; the prefill tokens beside them (all of max_num_batched_tokens when no decode runs:
// nobody waits for a token then) are what a cost model of this device (step_cost.h:
// fixed + per decode token + per prefill token, fitted to the steps it measured, observe_step())
// (and the attention of a chunk as far into its prompt as the first in line) says fits in the
// target, never fewer than min_prefill_chunk (prefills always progress) nor more than
// max_num_batched_tokens allows. When more requests wait for prefill than streams decode (a burst of
// arrivals: 16 clients at once), the target is multiplied by their ratio, so the many waiting for a
// first token are not held back for the pace of the few already streaming (streams that generated
// fewer than kYoungStreamTokens count with those waiting: they are the burst's first part); one
// long prompt beside running streams changes nothing. That prefill share goes to the running
// prefills and the waiting requests in this order: first any that was passed over
// max_prefill_skips steps in a row or was preempted (oldest first), then shortest remaining prompt
// first (arrival order on ties), each chunked to what is left. So a short prompt behind a long one
// is served within a step or two instead of after all of the long one's chunks, several long
// prompts share the budget instead of one running alone to the end, and none waits more than
// max_prefill_skips steps while others go.
//
// Unpaced steps (max_step_ms == 0, the behaviour before): each step fills a token budget
// (max_num_batched_tokens) under a cap on running requests (max_num_seqs): first every running
// request's next tokens (one for a decode, the rest of the prompt, chunked to the budget, for a
// request still prefilling), then waiting requests in arrival order, each starting from its longest
// cached prefix and chunked to what is left of the budget.
// A request is admitted only if its blocks fit while leaving the watermark free. When a running
// request cannot get a block, the newest running request is preempted by recompute: its blocks are
// freed, its output so far is kept, and it goes back to the front of the queue to be prefilled
// again (prompt + output) later; preemptions are counted. A request asks for a sampled token when
// its scheduled tokens reach the end of what it knows. Cancellation is honoured at the next
// schedule(): the request finishes with kCancelled and its blocks are freed.
//
// Threading: not thread-safe (the engine thread). Errors: add() refuses a prompt that cannot be
// served (empty, longer than max_model_len - 1, or larger than the whole KV pool) with
// INVALID_ARGUMENT naming the lengths, never truncating.
#pragma once

#include <cstdint>
#include <deque>
#include <memory>
#include <span>
#include <unordered_map>
#include <vector>

#include "runtime/base/status.h"
#include "runtime/kv/kv_cache_manager.h"
#include "runtime/sched/request.h"
#include "runtime/sched/step_cost.h"

namespace sx::sched {

struct SchedulerConfig {
  std::int64_t max_num_batched_tokens = 2048;
  std::int64_t max_num_seqs = 64;
  std::int64_t max_model_len = 4096;  // prompt + output tokens of one request
  double max_step_ms = 0;               // the step-time target (0: unpaced, fill to the token budget)
  // The target is also at most this many times a step of decodes alone (the streams' pace, as
  // measured): a long prompt then slows the streams by about this factor, whatever the device. 0:
  // max_step_ms alone.
  double max_step_ratio = 0;
  std::int64_t min_prefill_chunk = 4;   // prefill tokens a paced step takes at least (when any wait)
  std::int64_t max_prefill_skips = 8;   // a prefill passed over this many steps goes first
};

// A stream with fewer generated tokens than this counts with a burst of arrivals (schedule_paced).
inline constexpr std::int64_t kYoungStreamTokens = 4;

struct ScheduledRequest {
  Request* request = nullptr;
  std::int64_t start = 0;       // first token index computed this step (== num_computed before)
  std::int64_t num_tokens = 0;  // tokens computed this step
  bool sample = false;          // reaches the end of the known tokens: sample the next one
};

struct SchedulerOutput {
  std::vector<ScheduledRequest> scheduled;
  std::int64_t num_batched_tokens = 0;
  std::int64_t num_decode_tokens = 0;   // scheduled one token at a time (a decode)
  std::int64_t num_prefill_tokens = 0;  // in chunks of a prompt (or of a preempted request's recompute)
  std::int64_t prefill_budget = 0;      // the prefill tokens the step could take
  double prefill_context = 0;           // the rows its prefill tokens attend to (prefill_context_rows)
  std::vector<std::uint64_t> preempted;  // ids preempted while building this step
};

struct SchedulerStats {
  std::int64_t running = 0, waiting = 0;
  std::uint64_t preemptions = 0;
  double kv_usage = 0.0;
  double max_step_ms = 0;               // the target now (0: unpaced)
  StepCostModel::Coefficients cost;     // the cost model as fitted now
  std::int64_t last_decode_tokens = 0, last_prefill_tokens = 0;
  double last_step_ms = 0;
};

class Scheduler {
 public:
  Scheduler(const SchedulerConfig& config, kv::KvCacheManager& kv);
  ~Scheduler();

  Status add(std::unique_ptr<Request> request);
  void cancel(std::uint64_t id);
  // Ends a running or waiting request now (e.g. a stop string matched in its text).
  void finish(std::uint64_t id, FinishReason reason);

  SchedulerOutput schedule();
  // How long the step of `out` took (the forward and the sampling): the cost model learns from it.
  void observe_step(const SchedulerOutput& out, double seconds);
  // Applies a step: scheduled tokens are computed; sampled[i] is the token of the i-th scheduled
  // request with sample == true. Stop ids, max_tokens and max_model_len end requests.
  void update(const SchedulerOutput& out, std::span<const std::int32_t> sampled);
  // Requests that finished since the last call (with their outputs and finish reasons).
  std::vector<std::unique_ptr<Request>> take_finished();

  bool has_work() const { return !running_.empty() || !waiting_.empty(); }
  // The most tokens one request may reach: max_model_len, and never more than the whole pool (a
  // request alone always fits, so it never waits for room that cannot appear). Reads only the
  // configuration: safe from any thread.
  std::int64_t max_request_tokens() const;
  const Request* find(std::uint64_t id) const;
  SchedulerStats stats() const;
  const SchedulerConfig& config() const { return config_; }

 private:
  SchedulerOutput schedule_unpaced();
  // Admits waiting request r with up to `budget` tokens of its prefill (after its longest cached
  // prefix) into `out`: the tokens scheduled, or 0 when its blocks do not fit (r keeps waiting,
  // holding no blocks).
  std::int64_t admit(Request* r, std::int64_t budget, SchedulerOutput& out);
  // Seconds a paced step with `decodes` decodes should take: max_step_ms, or max_step_ratio x a step
  // of those decodes alone (StepCostModel::decode_step) if less.
  double step_target(std::int64_t decodes) const;
  SchedulerOutput schedule_paced();
  // Allocates blocks for r's next `n` tokens, preempting the newest running requests not already in
  // `out` while they do not fit (r itself among them); false when r was preempted or nothing else
  // can give room (r then waits, its blocks as they were).
  bool allocate_or_preempt(Request* r, std::int64_t n, SchedulerOutput& out);
  void preempt(Request* r);
  void finish_request(Request* r, FinishReason reason);

  SchedulerConfig config_;
  kv::KvCacheManager& kv_;
  std::unordered_map<std::uint64_t, std::unique_ptr<Request>> requests_;  // every live request
  std::vector<Request*> running_;   // admission order
  std::deque<Request*> waiting_;
  std::vector<std::unique_ptr<Request>> finished_;
  std::uint64_t next_arrival_ = 0;
  std::uint64_t preemptions_ = 0;
  StepCostModel cost_;
  std::int64_t last_decode_ = 0, last_prefill_ = 0;
  double last_seconds_ = 0;
};

}  // namespace sx::sched
