// Scheduler: token budget, admission with the watermark, preemption by recompute, finishing.
#include "runtime/sched/scheduler.h"

#include <algorithm>

namespace sx::sched {

Scheduler::Scheduler(const SchedulerConfig& config, kv::KvCacheManager& kv) : config_(config), kv_(kv) {}
Scheduler::~Scheduler() = default;

std::int64_t Scheduler::max_request_tokens() const {
  return std::min(config_.max_model_len, kv_.pool().usable_blocks() * kv_.block_size());
}

Status Scheduler::add(std::unique_ptr<Request> r) {
  const auto n = static_cast<std::int64_t>(r->prompt.size());
  if (n == 0) return invalid_argument_error("request {}: the prompt is empty", r->id);
  const std::int64_t cap = max_request_tokens();
  if (n + 1 > cap) {
    return invalid_argument_error(
        "request {}: the prompt has {} tokens, but a request may hold at most {} (max_model_len {}, KV pool {} "
        "tokens), and at least one must be left for the answer",
        r->id, n, cap, config_.max_model_len, kv_.pool().usable_blocks() * kv_.block_size());
  }
  if (r->max_tokens < 1) return invalid_argument_error("request {}: max_tokens must be at least 1", r->id);
  if (requests_.count(r->id) != 0) return invalid_argument_error("request {}: the id is already in use", r->id);
  r->status = RequestStatus::kWaiting;
  r->arrival = next_arrival_++;
  Request* raw = r.get();
  requests_.emplace(r->id, std::move(r));
  waiting_.push_back(raw);
  return ok_status();
}

void Scheduler::cancel(std::uint64_t id) {
  auto it = requests_.find(id);
  if (it != requests_.end()) it->second->cancel_requested = true;
}

void Scheduler::finish(std::uint64_t id, FinishReason reason) {
  auto it = requests_.find(id);
  if (it != requests_.end()) finish_request(it->second.get(), reason);
}

const Request* Scheduler::find(std::uint64_t id) const {
  auto it = requests_.find(id);
  return it == requests_.end() ? nullptr : it->second.get();
}

void Scheduler::finish_request(Request* r, FinishReason reason) {
  kv_.free(r->id);
  running_.erase(std::remove(running_.begin(), running_.end(), r), running_.end());
  waiting_.erase(std::remove(waiting_.begin(), waiting_.end(), r), waiting_.end());
  r->status = RequestStatus::kFinished;
  r->finish = reason;
  auto it = requests_.find(r->id);
  finished_.push_back(std::move(it->second));
  requests_.erase(it);
}

void Scheduler::preempt(Request* r) {
  kv_.free(r->id);
  r->num_computed = 0;
  r->status = RequestStatus::kWaiting;
  ++r->num_preemptions;
  ++preemptions_;
  running_.erase(std::remove(running_.begin(), running_.end(), r), running_.end());
  waiting_.push_front(r);
}

SchedulerOutput Scheduler::schedule() {
  std::vector<Request*> cancelled;
  for (auto& [id, r] : requests_) {
    if (r->cancel_requested) cancelled.push_back(r.get());
  }
  for (Request* r : cancelled) finish_request(r, FinishReason::kCancelled);
  SchedulerOutput out = config_.max_step_ms > 0 ? schedule_paced() : schedule_unpaced();
  for (const ScheduledRequest& s : out.scheduled) {
    (s.num_tokens == 1 ? out.num_decode_tokens : out.num_prefill_tokens) += s.num_tokens;
    if (s.num_tokens > 1) out.prefill_context += prefill_context_rows(s.start, s.num_tokens);
  }
  return out;
}

void Scheduler::observe_step(const SchedulerOutput& out, double seconds) {
  cost_.observe(out.num_decode_tokens, out.num_prefill_tokens, seconds, out.prefill_context);
  last_decode_ = out.num_decode_tokens;
  last_prefill_ = out.num_prefill_tokens;
  last_seconds_ = seconds;
}

bool Scheduler::allocate_or_preempt(Request* r, std::int64_t n, SchedulerOutput& out) {
  bool ok = kv_.allocate(r->id, r->num_computed + n, false);
  while (!ok) {
    // The newest running request not already in this step (r itself included).
    Request* victim = nullptr;
    for (auto it = running_.rbegin(); it != running_.rend() && victim == nullptr; ++it) {
      const bool in_step = std::any_of(out.scheduled.begin(), out.scheduled.end(),
                                       [&](const ScheduledRequest& s) { return s.request == *it; });
      if (!in_step) victim = *it;
    }
    if (victim == nullptr) return false;  // everyone else is in the step: r waits for room
    preempt(victim);
    out.preempted.push_back(victim->id);
    if (victim == r) return false;
    ok = kv_.allocate(r->id, r->num_computed + n, false);
  }
  return true;
}

std::int64_t Scheduler::admit(Request* r, std::int64_t budget, SchedulerOutput& out) {
  if (!kv_.has(r->id)) {
    r->num_computed = kv_.acquire_cached_prefix(r->id, r->all_tokens());
    if (r->num_preemptions == 0) r->num_cached_prompt = r->num_computed;
  }
  const std::int64_t n = r->next_chunk(budget);
  // The watermark keeps room for running requests; with none running it only blocks progress
  // (a request alone always fits: add() checks it against the whole pool).
  if (!kv_.allocate(r->id, r->num_computed + n, /*admission=*/!running_.empty())) {
    kv_.free(r->id);  // do not hold cached blocks while waiting
    r->num_computed = 0;
    return 0;
  }
  waiting_.erase(std::find(waiting_.begin(), waiting_.end(), r));
  running_.push_back(r);
  r->status = RequestStatus::kRunning;
  out.scheduled.push_back({r, r->num_computed, n, r->num_computed + n == r->num_tokens()});
  return n;
}

SchedulerOutput Scheduler::schedule_unpaced() {
  SchedulerOutput out;
  std::int64_t budget = config_.max_num_batched_tokens;
  // Running requests first: decodes and unfinished prefills, in admission order.
  for (std::size_t i = 0; i < running_.size() && budget > 0;) {
    Request* r = running_[i];
    const std::int64_t n = r->next_chunk(budget);
    if (!allocate_or_preempt(r, n, out)) break;  // r itself was the newest and is preempted
    out.scheduled.push_back({r, r->num_computed, n, r->num_computed + n == r->num_tokens()});
    budget -= n;
    ++i;
  }
  // Then waiting requests, unless this step had to preempt (there is no room to admit).
  while (out.preempted.empty() && !waiting_.empty() && budget > 0 &&
         static_cast<std::int64_t>(running_.size()) < config_.max_num_seqs) {
    const std::int64_t n = admit(waiting_.front(), budget, out);
    if (n == 0) break;
    budget -= n;
  }
  out.num_batched_tokens = config_.max_num_batched_tokens - budget;
  return out;
}

double Scheduler::step_target(std::int64_t decodes) const {
  double target = config_.max_step_ms / 1000.0;
  const double pace = cost_.decode_step(decodes);
  if (config_.max_step_ratio > 0 && pace > 0) target = std::min(target, config_.max_step_ratio * pace);
  return target;
}

SchedulerOutput Scheduler::schedule_paced() {
  SchedulerOutput out;
  std::int64_t budget = config_.max_num_batched_tokens;
  // 1. Every running decode (one token left to compute: the last one sampled), admission order.
  std::vector<Request*> candidates;  // running prefills, then the waiting requests
  for (std::size_t i = 0; i < running_.size() && budget > 0;) {
    Request* r = running_[i];
    if (r->num_tokens() - r->num_computed > 1) {
      candidates.push_back(r);
      ++i;
      continue;
    }
    if (!allocate_or_preempt(r, 1, out)) break;  // r was the newest and is preempted
    out.scheduled.push_back({r, r->num_computed, 1, true});
    --budget;
    ++i;
  }
  // Preemption above may have taken prefilling requests back to the queue.
  candidates.erase(std::remove_if(candidates.begin(), candidates.end(),
                                  [](const Request* r) { return r->status != RequestStatus::kRunning; }),
                   candidates.end());
  // 2. The order of the prefills: the overdue (passed over too often, or preempted) oldest first,
  //    then the shortest remaining prompt first.
  if (out.preempted.empty()) candidates.insert(candidates.end(), waiting_.begin(), waiting_.end());
  const std::int64_t skips = config_.max_prefill_skips;
  auto overdue = [skips](const Request* r) {
    return r->prefill_skips >= skips || (r->status == RequestStatus::kWaiting && r->num_preemptions > 0);
  };
  std::stable_sort(candidates.begin(), candidates.end(), [&](const Request* a, const Request* b) {
    const bool oa = overdue(a), ob = overdue(b);
    if (oa != ob) return oa;
    if (oa) return a->arrival < b->arrival;
    const std::int64_t ra = a->num_tokens() - a->num_computed, rb = b->num_tokens() - b->num_computed;
    if (ra != rb) return ra < rb;
    return a->arrival < b->arrival;
  });
  // 3. Their share: what the cost model says fits in the target beside the decodes, for a chunk
  //    where the first in line is in its prompt (a late chunk of a long prompt attends to more
  //    rows); with no decode in the step, nobody is waiting for a token: the whole token budget.
  //    When more requests wait for their first token than streams decode (a burst of arrivals),
  //    the target grows by that ratio: each waiting user counts as much as each streaming one. A
  //    stream that has only just started (fewer than kYoungStreamTokens generated: the first of a
  //    burst, prefilled a step earlier) counts with the burst, not with the streams it would slow
  //    down: else the rest of a burst is paced by the start of its own first part, and its users
  //    get their first tokens, and finish, steps apart.
  const auto decodes = static_cast<std::int64_t>(out.scheduled.size());
  const auto young = static_cast<std::int64_t>(
      std::count_if(out.scheduled.begin(), out.scheduled.end(), [](const ScheduledRequest& s) {
        return static_cast<std::int64_t>(s.request->output.size()) < kYoungStreamTokens;
      }));
  const auto wanting = static_cast<double>(static_cast<std::int64_t>(candidates.size()) + young);
  const double target = step_target(decodes) *
                        std::max(1.0, wanting / static_cast<double>(std::max<std::int64_t>(decodes - young, 1)));
  const std::int64_t start = candidates.empty() ? 0 : candidates.front()->num_computed;
  std::int64_t left = budget <= 0 ? 0
                      : decodes == 0
                          ? budget
                          : cost_.prefill_budget(decodes, target, config_.min_prefill_chunk, budget,
                                                 /*cold_chunk=*/config_.min_prefill_chunk, start);
  out.prefill_budget = left;
  bool admitting = out.preempted.empty();
  for (Request* r : candidates) {
    if (left <= 0) break;
    if (r->status == RequestStatus::kRunning) {
      const std::int64_t n = r->next_chunk(left);
      if (!allocate_or_preempt(r, n, out)) {
        admitting = false;
        continue;
      }
      out.scheduled.push_back({r, r->num_computed, n, r->num_computed + n == r->num_tokens()});
      r->prefill_skips = 0;
      left -= n;
      continue;
    }
    if (!admitting || r->status != RequestStatus::kWaiting ||
        static_cast<std::int64_t>(running_.size()) >= config_.max_num_seqs) {
      continue;
    }
    const std::int64_t n = admit(r, left, out);
    if (n == 0) {
      admitting = false;  // no room: later arrivals wait too
      continue;
    }
    r->prefill_skips = 0;
    left -= n;
  }
  // Whoever wanted prefill and got none this step waited one more.
  for (Request* r : candidates) {
    const bool got = std::any_of(out.scheduled.begin(), out.scheduled.end(),
                                 [r](const ScheduledRequest& s) { return s.request == r; });
    if (!got && r->status != RequestStatus::kFinished) ++r->prefill_skips;
  }
  std::int64_t total = 0;
  for (const ScheduledRequest& s : out.scheduled) total += s.num_tokens;
  out.num_batched_tokens = total;
  return out;
}

void Scheduler::update(const SchedulerOutput& out, std::span<const std::int32_t> sampled) {
  std::size_t next_sample = 0;
  const std::int64_t cap = max_request_tokens();
  for (const ScheduledRequest& s : out.scheduled) {
    Request* r = s.request;
    const bool has_sample = s.sample && next_sample < sampled.size();
    const std::int32_t token = has_sample ? sampled[next_sample++] : 0;
    if (r->status != RequestStatus::kRunning) continue;  // finished meanwhile
    r->num_computed = s.start + s.num_tokens;
    kv_.commit(r->id, r->all_tokens(), r->num_computed);
    if (!has_sample) continue;
    r->output.push_back(token);
    if (std::find(r->stop_ids.begin(), r->stop_ids.end(), token) != r->stop_ids.end()) {
      finish_request(r, FinishReason::kStop);
    } else if (static_cast<std::int64_t>(r->output.size()) >= r->max_tokens || r->num_tokens() >= cap) {
      finish_request(r, FinishReason::kLength);
    }
  }
}

std::vector<std::unique_ptr<Request>> Scheduler::take_finished() {
  std::vector<std::unique_ptr<Request>> out;
  out.swap(finished_);
  return out;
}

SchedulerStats Scheduler::stats() const {
  SchedulerStats st;
  st.running = static_cast<std::int64_t>(running_.size());
  st.waiting = static_cast<std::int64_t>(waiting_.size());
  st.preemptions = preemptions_;
  st.kv_usage = kv_.usage();
  st.max_step_ms = config_.max_step_ms > 0 ? step_target(last_decode_) * 1000.0 : 0.0;
  st.cost = cost_.coefficients();
  st.last_decode_tokens = last_decode_;
  st.last_prefill_tokens = last_prefill_;
  st.last_step_ms = last_seconds_ * 1000.0;
  return st;
}

}  // namespace sx::sched
