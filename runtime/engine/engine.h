// The engine (DESIGN.md §3 steps 4-6): requests in, text pieces / tokens / logprobs / finish
// reasons out, many requests batched into each forward step.
//
// submit() validates a request and queues it; step() moves queued requests and cancellations into
// the scheduler, runs one scheduled step through the model as one batch (prefill chunks and
// decodes together, so each weight is read once per step), samples every request that reached the
// end of its tokens with its own sampler, updates the scheduler and calls each request's callback
// with what is new. A request's last event has `finished` set, its finish reason and its usage.
// Stop ids end a request inside the scheduler; stop strings are matched on the streamed text here
// (the text before the stop string is emitted, the stop string is not).
//
// Threading: submit(), cancel(), has_work() and stats() may be called from any thread; step() and
// run_until_idle() from one engine thread; callbacks run on the engine thread.
// Lifetime: the model and tokenizer must outlive the engine.
// Errors: submit() returns INVALID_ARGUMENT for bad sampling parameters or a prompt that cannot fit;
// step() returns device errors (the requests of a failed step are finished with kError events).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "runtime/base/status.h"
#include "runtime/engine/constraint.h"
#include "runtime/engine/model.h"
#include "runtime/engine/prefix_store.h"
#include "runtime/engine/sampler.h"
#include "runtime/kv/kv_cache_manager.h"
#include "runtime/sched/scheduler.h"
#include "runtime/tokenizer/tokenizer.h"

namespace sx::engine {

struct EngineConfig {
  sched::SchedulerConfig scheduler;
  bool prefix_caching = true;
  std::uint64_t cache_salt = 0;  // e.g. a hash of the model file's identity
  double watermark = 0.01;
  // EOS ids beyond the tokenizer's (a Hugging Face model's generation_config.json eos_token_id):
  // they end every request that does not ask for ignore_eos.
  std::vector<std::int32_t> eos_ids;
  // A hybrid's prefix cache: besides the positions a request names (RequestOptions::
  // snapshot_hints), the end of its prompt and each block boundary of its answer, its states are
  // kept every this many tokens of a long prompt (rounded down to a block; 0: not). Needs the
  // model's state snapshots (ModelOptions::state_snapshots).
  std::int64_t snapshot_interval = 4096;
  // The prefix cache's persistent tier (prefix_store.h): a directory ("": none) and its bound.
  // Its entries' salt is cache_salt (the weights' identity) with the model's layout_salt().
  std::string prefix_cache_dir;
  std::uint64_t prefix_cache_bytes = std::uint64_t{16} << 30;
};

struct RequestOptions {
  SamplingParams sampling;
  std::int64_t max_tokens = 16;
  std::vector<std::int32_t> stop_ids;  // in addition to the tokenizer's EOS ids unless ignore_eos
  std::vector<std::string> stop_strings;
  bool ignore_eos = false;
  std::int32_t top_logprobs = -1;  // -1: no logprobs; 0..20: the chosen token's plus that many alternatives
  // A test hook (serve's SEXTANT_TEST_HOOKS): the answer's first tokens, taken in place of the ones
  // sampled (the forward still runs for each); sampling goes on after them.
  std::vector<std::int32_t> script;
  // Structured output: the grammar the answer follows (one per request: it keeps the request's
  // place in the grammar); null: free text.
  std::shared_ptr<TokenConstraint> constraint;
  // Positions of the prompt where a later request is likely to part from this one (the chat layer:
  // where its messages start): a hybrid keeps its states at the block boundary at or below each.
  std::vector<std::int64_t> snapshot_hints;
};

struct TokenLogprob {
  std::int32_t token = 0;
  float logprob = 0.0f;
  std::vector<std::pair<std::int32_t, float>> top;  // most likely first
};

enum class RequestFinish { kNone, kStop, kLength, kCancelled, kError };
std::string_view request_finish_name(RequestFinish f);

struct RequestEvent {
  std::uint64_t id = 0;
  std::string text;                    // new text
  std::vector<std::int32_t> tokens;    // new tokens
  std::vector<TokenLogprob> logprobs;  // one per new token when asked for
  bool finished = false;
  RequestFinish finish = RequestFinish::kNone;
  Status error;                        // with kError
  std::int64_t prompt_tokens = 0, completion_tokens = 0, cached_prompt_tokens = 0;
  std::int64_t preemptions = 0;
};

using EventCallback = std::function<void(const RequestEvent&)>;

// Bucket bounds of the per-step histograms (vLLM's for iteration tokens).
inline constexpr double kStepTokenBounds[] = {1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384};
inline constexpr double kStepSecondsBounds[] = {0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30};

struct EngineStats {
  std::int64_t running = 0, waiting = 0;
  double kv_usage = 0.0;
  std::int64_t kv_free_blocks = 0, kv_total_blocks = 0;  // usable blocks (the null block excluded)
  std::uint64_t prefix_queries = 0, prefix_hits = 0;  // tokens
  bool prefix_caching = true;  // off for a hybrid model without state snapshots
  std::int64_t state_slots_free = 0, state_slots_total = 0;  // a hybrid's DeltaNet state slots
  // A hybrid's state snapshots (its prefix cache): held of the pool, bytes of each (all ranks),
  // and taken / restored / evicted since start.
  std::int64_t snapshots_held = 0, snapshots_total = 0;
  std::uint64_t snapshot_bytes = 0;
  std::uint64_t snapshots_taken = 0, snapshots_restored = 0, snapshots_evicted = 0;
  // The persistent tier (engine.prefix_cache_dir): entries held (blocks, snapshots), bytes of its
  // directory, files written and read back since start.
  bool prefix_store = false;
  std::uint64_t store_blocks = 0, store_snapshots = 0, store_bytes = 0, store_written = 0, store_read = 0;
  std::uint64_t preemptions = 0, steps = 0;
  std::uint64_t prompt_tokens = 0, generation_tokens = 0;
  // Paced steps (issue 24): the scheduler's step-time target (0: unpaced), its cost model of this
  // engine's devices, and the last step's composition and time.
  double max_step_ms = 0;
  bool cost_ready = false;
  double cost_fixed_ms = 0, cost_per_decode_ms = 0, cost_per_prefill_ms = 0;
  double cost_per_context_row_us = 0;  // per row a prefill token attends to (microseconds)
  std::int64_t last_decode_tokens = 0, last_prefill_tokens = 0;
  double last_step_ms = 0;
  // Every step's tokens and seconds, as bucket counts over kStepTokenBounds / kStepSecondsBounds
  // (not cumulative; the last is +Inf) and sums.
  std::vector<std::uint64_t> step_tokens_counts = std::vector<std::uint64_t>(std::size(kStepTokenBounds) + 1, 0);
  std::vector<std::uint64_t> step_seconds_counts = std::vector<std::uint64_t>(std::size(kStepSecondsBounds) + 1, 0);
  double step_tokens_sum = 0, step_seconds_sum = 0;
};

class Engine {
 public:
  // The scheduler's token budget and sequence cap must fit the model's max_batch_tokens and
  // max_logit_rows; the KV pool is the model's cache (block 0 is the null block).
  static Result<std::unique_ptr<Engine>> create(Model& model, const tokenizer::Tokenizer& tok,
                                                const EngineConfig& config);
  ~Engine();

  Result<std::uint64_t> submit(std::vector<std::int32_t> prompt, RequestOptions options, EventCallback on_event);
  void cancel(std::uint64_t id);
  bool has_work();
  EngineStats stats();

  Status step();
  Status run_until_idle();

 private:
  struct Live;
  struct Pending;
  Engine(Model& model, const tokenizer::Tokenizer& tok, const EngineConfig& config);
  void drain_inbox();
  // Final events of the requests the scheduler finished; a non-OK `error` reports them as kError.
  void emit_finished(const Status& error = Status());
  // Copies the scheduler's state for other threads (stats(), has_work()).
  void publish_state();

  Model& model_;
  const tokenizer::Tokenizer& tok_;
  EngineConfig config_;
  std::vector<std::int32_t> default_stops_;
  kv::KvCacheManager kv_;
  sched::Scheduler scheduler_;
  std::mutex mu_;  // guards the inbox, the id counter and the stats copy
  std::vector<std::unique_ptr<Pending>> inbox_;
  std::vector<std::uint64_t> cancels_;
  std::uint64_t next_id_ = 1;
  std::unordered_map<std::uint64_t, std::unique_ptr<Live>> live_;
  EngineStats stats_;
  bool scheduler_busy_ = false;  // the scheduler has requests (as of the last step)
  std::vector<float> logits_;
  std::vector<std::uint32_t> masks_;  // constrained rows' token masks, (vocab + 31) / 32 words a row
  // A hybrid model's DeltaNet state slots: the slot of each request that holds one, and the free
  // ones. A request takes one when it is first scheduled and keeps it until it finishes; a
  // request that starts at position 0 reads its slot's state as zeros, one that starts after a
  // cached prefix gets the prefix's snapshot copied into its slot first (batch.restores).
  std::unordered_map<std::uint64_t, std::int32_t> state_slot_of_;
  std::vector<std::int32_t> free_state_slots_;
  Result<std::int32_t> state_slot(const sched::Request& r, std::int64_t start, ForwardBatch& batch);
  // Snapshots a step takes (batch.snapshots), registered once it ran: the snapshot, its request,
  // the number of its tokens whose states it holds and their chain hash, and for the persistent
  // tier those tokens (a snapshot outside the answer).
  struct TakenSnapshot {
    std::int32_t snapshot;
    std::uint64_t request;
    std::int64_t length = 0;
    std::uint64_t hash = 0;
    bool in_answer = false;  // past its prompt
    std::vector<std::int32_t> tokens;
  };
  // The chain hash of request r's first `blocks` blocks: its committed blocks' from the KV manager,
  // the rest computed.
  std::uint64_t chain_hash(const sched::Request& r, std::int64_t blocks) const;
  void plan_snapshots(const sched::SchedulerOutput& out, ForwardBatch& batch, std::vector<TakenSnapshot>& taken);
  void register_snapshots(std::vector<TakenSnapshot>& taken, bool ran);
  bool snapshots_on() const { return config_.prefix_caching && model_.config().is_hybrid(); }
  // Each request's latest snapshot inside its answer (replaced by the next one): its length and hash.
  struct AnswerSnapshot {
    std::int64_t length = 0;
    std::uint64_t hash = 0;
  };
  std::unordered_map<std::uint64_t, AnswerSnapshot> answer_snapshot_;
  // The persistent tier: `tokens` (a multiple of the block size) into the store, its blocks and,
  // for a hybrid, the snapshot registered after them; and back, before a request is scheduled,
  // the longest prefix of `prompt` the store holds beyond what the device cache does.
  std::unique_ptr<PrefixStore> store_;
  void persist(std::span<const std::int32_t> tokens);
  void restore_from_store(std::span<const std::int32_t> prompt);
  std::vector<float> top_values_;  // a step whose choices the devices narrowed: k candidates a row
  std::vector<std::int32_t> top_ids_;
};

}  // namespace sx::engine
