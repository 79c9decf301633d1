// Engine: inbox -> scheduler -> one batched forward -> per-request sampling -> events.
#include "runtime/engine/engine.h"
#include "runtime/base/log.h"

#include <chrono>

#include <algorithm>
#include <future>
#include <limits>
#include <cmath>

#include "runtime/engine/generator.h"
#include "runtime/engine/stop_matcher.h"

namespace sx::engine {

std::string_view request_finish_name(RequestFinish f) {
  switch (f) {
    case RequestFinish::kStop: return "stop";
    case RequestFinish::kLength: return "length";
    case RequestFinish::kCancelled: return "cancelled";
    case RequestFinish::kError: return "error";
    default: return "none";
  }
}

// Engine-side state of a request: its sampler and text stream.
struct Engine::Live {
  RequestOptions options;
  EventCallback on_event;
  Sampler sampler;
  tokenizer::StreamDecoder decoder;
  StopMatcher matcher;
  std::int64_t prompt_tokens = 0;
  std::vector<std::int32_t> stop_ids;  // the effective ones (with the tokenizer's EOS ids)
  bool stopped_by_string = false;
  std::size_t scripted = 0;  // tokens of options.script taken
  Live(RequestOptions o, EventCallback cb, std::span<const std::int32_t> prompt, const tokenizer::Tokenizer& tok)
      : options(std::move(o)),
        on_event(std::move(cb)),
        sampler(options.sampling, prompt),
        decoder(tok, /*skip_special=*/true),
        matcher(options.stop_strings),
        prompt_tokens(static_cast<std::int64_t>(prompt.size())) {}
};

struct Engine::Pending {
  std::unique_ptr<sched::Request> request;
  std::unique_ptr<Live> live;
};

Engine::Engine(Model& model, const tokenizer::Tokenizer& tok, const EngineConfig& config)
    : model_(model),
      tok_(tok),
      config_(config),
      default_stops_(default_stop_ids(tok, config.eos_ids)),
      kv_(kv::KvCacheConfig{model.options().kv.num_blocks, model.options().kv.block_size, config.prefix_caching,
                            config.cache_salt, config.watermark, model.config().is_hybrid(),
                            model.options().state_snapshots}),
      scheduler_(config.scheduler, kv_) {
  if (model.config().is_hybrid()) {
    for (std::int64_t i = model.options().state_slots(); i-- > 0;) free_state_slots_.push_back(static_cast<std::int32_t>(i));
  }
}

Engine::~Engine() = default;

Result<std::unique_ptr<Engine>> Engine::create(Model& model, const tokenizer::Tokenizer& tok,
                                               const EngineConfig& config) {
  const ModelOptions& mo = model.options();
  const sched::SchedulerConfig& sc = config.scheduler;
  if (sc.max_num_batched_tokens < 1 || sc.max_num_batched_tokens > mo.max_batch_tokens) {
    return invalid_argument_error("max_num_batched_tokens {} must be in [1, {}] (the model's step size)",
                                  sc.max_num_batched_tokens, mo.max_batch_tokens);
  }
  if (sc.max_num_seqs < 1 || sc.max_num_seqs > mo.max_logit_rows) {
    return invalid_argument_error("max_num_seqs {} must be in [1, {}] (the model's logit rows)", sc.max_num_seqs,
                                  mo.max_logit_rows);
  }
  if (sc.max_model_len < 2 || sc.max_model_len > model.config().context_length) {
    return invalid_argument_error("max_model_len {} must be in [2, {}] (the model's context length)", sc.max_model_len,
                                  model.config().context_length);
  }
  if (mo.kv.num_blocks < 2) return invalid_argument_error("the KV cache needs at least 2 blocks (one is the null block)");
  // A request holds at most max_model_len tokens, and no more than the pool.
  if (std::min(sc.max_model_len, mo.kv.usable_tokens()) > mo.blocks_per_seq() * mo.kv.block_size) {
    return invalid_argument_error("max_model_len {} needs more than the {} blocks per sequence the model holds",
                                  sc.max_model_len, mo.blocks_per_seq());
  }
  if (config.watermark < 0 || config.watermark >= 1) {
    return invalid_argument_error("watermark {} must be in [0, 1)", config.watermark);
  }
  EngineConfig ec = config;
  if (model.config().is_hybrid()) {
    if (sc.max_num_seqs > mo.state_slots()) {
      return invalid_argument_error("max_num_seqs {} exceeds the model's {} DeltaNet state slots", sc.max_num_seqs,
                                    mo.state_slots());
    }
    if (ec.prefix_caching && mo.state_snapshots < 1) {
      // A cached prefix would restore its KV but not the DeltaNet states after it: never reuse one.
      log_info("engine: prefix caching is off for {} (no state snapshots: engine.prefix_snapshots is 0)",
               model.config().architecture);
      ec.prefix_caching = false;
    }
    if (config.snapshot_interval < 0) {
      return invalid_argument_error("snapshot_interval {} must be 0 (none) or a number of tokens", config.snapshot_interval);
    }
  }
  auto engine = std::unique_ptr<Engine>(new Engine(model, tok, ec));
  if (!ec.prefix_cache_dir.empty() && ec.prefix_caching) {
    // The weights' identity (cache_salt) and the layout's: another model's or layout's files are
    // never read.
    const std::uint64_t salt = (config.cache_salt ^ model.layout_salt()) * 0x9e3779b97f4a7c15ull;
    SX_ASSIGN_OR_RETURN(engine->store_, PrefixStore::open({ec.prefix_cache_dir, ec.prefix_cache_bytes, salt}));
  }
  engine->publish_state();  // stats() is meaningful before the first step
  return engine;
}

Result<std::uint64_t> Engine::submit(std::vector<std::int32_t> prompt, RequestOptions options, EventCallback on_event) {
  SX_RETURN_IF_ERROR(options.sampling.validate());
  if (options.max_tokens < 1) return invalid_argument_error("max_tokens must be at least 1, got {}", options.max_tokens);
  if (options.top_logprobs < -1 || options.top_logprobs > 20) {
    return invalid_argument_error("top_logprobs must be in [0, 20], got {}", options.top_logprobs);
  }
  if (prompt.empty()) return invalid_argument_error("the prompt is empty (no tokens)");
  for (std::int32_t t : prompt) {
    if (t < 0 || t >= model_.config().vocab) {
      return invalid_argument_error("prompt token {} is outside the vocabulary of {}", t, model_.config().vocab);
    }
  }
  const std::int64_t cap = scheduler_.max_request_tokens();
  if (static_cast<std::int64_t>(prompt.size()) + 1 > cap) {
    return invalid_argument_error("the prompt has {} tokens but a request may hold at most {} (max_model_len {}), "
                                  "with at least one token left for the answer",
                                  prompt.size(), cap, config_.scheduler.max_model_len);
  }
  auto p = std::make_unique<Pending>();
  p->live = std::make_unique<Live>(std::move(options), std::move(on_event), prompt, tok_);
  p->request = std::make_unique<sched::Request>();
  sched::Request& r = *p->request;
  r.prompt = std::move(prompt);
  r.max_tokens = p->live->options.max_tokens;
  r.stop_ids = p->live->options.stop_ids;
  if (!p->live->options.ignore_eos) r.stop_ids.insert(r.stop_ids.end(), default_stops_.begin(), default_stops_.end());
  p->live->stop_ids = r.stop_ids;
  if (snapshots_on()) {
    // Where this request's prefill chunks end so that its states can be kept: at or below each
    // hinted position, the end of the prompt, and every snapshot_interval tokens.
    const std::int64_t bs = kv_.block_size(), P = static_cast<std::int64_t>(r.prompt.size());
    std::vector<std::int64_t>& at = r.snapshot_at;
    for (std::int64_t h : p->live->options.snapshot_hints) {
      if (h > 0 && h <= P) at.push_back(h / bs * bs);
    }
    at.push_back(P / bs * bs);
    const std::int64_t every = config_.snapshot_interval / bs * bs;
    for (std::int64_t x = every; every > 0 && x < P; x += every) at.push_back(x);
    std::sort(at.begin(), at.end());
    at.erase(std::unique(at.begin(), at.end()), at.end());
    at.erase(std::remove(at.begin(), at.end(), 0), at.end());
  }
  std::lock_guard<std::mutex> lock(mu_);
  r.id = next_id_++;
  const std::uint64_t id = r.id;
  inbox_.push_back(std::move(p));
  return id;
}

void Engine::cancel(std::uint64_t id) {
  std::lock_guard<std::mutex> lock(mu_);
  cancels_.push_back(id);
}

bool Engine::has_work() {
  std::lock_guard<std::mutex> lock(mu_);
  return !inbox_.empty() || !cancels_.empty() || scheduler_busy_;
}

EngineStats Engine::stats() {
  std::lock_guard<std::mutex> lock(mu_);
  return stats_;
}

void Engine::drain_inbox() {
  std::vector<std::unique_ptr<Pending>> inbox;
  std::vector<std::uint64_t> cancels;
  {
    std::lock_guard<std::mutex> lock(mu_);
    inbox.swap(inbox_);
    cancels.swap(cancels_);
    if (!inbox.empty()) scheduler_busy_ = true;  // until publish_state() says otherwise
  }
  for (auto& p : inbox) {
    const std::uint64_t id = p->request->id;
    if (store_) restore_from_store(p->request->prompt);
    live_.emplace(id, std::move(p->live));
    const Status st = scheduler_.add(std::move(p->request));
    if (!st.ok()) {  // checked in submit(); kept for safety
      RequestEvent e;
      e.id = id;
      e.finished = true;
      e.finish = RequestFinish::kError;
      e.error = st;
      if (live_[id]->on_event) live_[id]->on_event(e);
      live_.erase(id);
    }
  }
  for (std::uint64_t id : cancels) scheduler_.cancel(id);
}

namespace {

// log-softmax of the chosen token and the k most likely tokens, from the raw logits.
TokenLogprob logprobs_of(std::span<const float> logits, std::int32_t token, std::int32_t k) {
  const float mx = *std::max_element(logits.begin(), logits.end());
  double sum = 0;
  for (float v : logits) sum += std::exp(static_cast<double>(v - mx));
  const float lse = mx + static_cast<float>(std::log(sum));
  TokenLogprob lp;
  lp.token = token;
  lp.logprob = logits[static_cast<std::size_t>(token)] - lse;
  if (k > 0) {
    std::vector<std::int32_t> idx(logits.size());
    for (std::size_t i = 0; i < idx.size(); ++i) idx[i] = static_cast<std::int32_t>(i);
    const auto kk = std::min<std::size_t>(static_cast<std::size_t>(k), idx.size());
    std::partial_sort(idx.begin(), idx.begin() + static_cast<std::ptrdiff_t>(kk), idx.end(), [&](std::int32_t a, std::int32_t b) {
      const float la = logits[static_cast<std::size_t>(a)], lb = logits[static_cast<std::size_t>(b)];
      return la > lb || (la == lb && a < b);
    });
    for (std::size_t i = 0; i < kk; ++i) lp.top.emplace_back(idx[i], logits[static_cast<std::size_t>(idx[i])] - lse);
  }
  return lp;
}

RequestFinish to_finish(sched::FinishReason r) {
  switch (r) {
    case sched::FinishReason::kStop: return RequestFinish::kStop;
    case sched::FinishReason::kLength: return RequestFinish::kLength;
    case sched::FinishReason::kCancelled: return RequestFinish::kCancelled;
    default: return RequestFinish::kNone;
  }
}

}  // namespace

void Engine::emit_finished(const Status& error) {
  for (auto& r : scheduler_.take_finished()) {
    auto it = live_.find(r->id);
    if (it == live_.end()) continue;
    Live& l = *it->second;
    RequestEvent e;
    e.id = r->id;
    e.finished = true;
    e.finish = !error.ok() ? RequestFinish::kError : l.stopped_by_string ? RequestFinish::kStop : to_finish(r->finish);
    e.error = error;
    if (error.ok() && !l.stopped_by_string && r->finish != sched::FinishReason::kCancelled) {
      e.text = l.matcher.push(l.decoder.flush());
      e.text += l.matcher.flush();
    }
    e.prompt_tokens = l.prompt_tokens;
    e.completion_tokens = static_cast<std::int64_t>(r->output.size());
    e.cached_prompt_tokens = r->num_cached_prompt;
    e.preemptions = r->num_preemptions;
    if (l.on_event) l.on_event(e);
    live_.erase(it);
    if (auto slot = state_slot_of_.find(r->id); slot != state_slot_of_.end()) {
      free_state_slots_.push_back(slot->second);
      state_slot_of_.erase(slot);
    }
    if (store_ && error.ok() && r->finish != sched::FinishReason::kCancelled) {
      // What the next turn will most likely start with: for a hybrid, up to its answer's last
      // snapshot; else every full block it computed.
      const auto a = answer_snapshot_.find(r->id);
      if (a != answer_snapshot_.end() || !model_.config().is_hybrid()) {
        std::vector<std::int32_t> tokens = r->all_tokens();
        tokens.resize(static_cast<std::size_t>(a != answer_snapshot_.end()
                                                   ? a->second.length
                                                   : r->num_computed / kv_.block_size() * kv_.block_size()));
        persist(tokens);
      }
    }
    answer_snapshot_.erase(r->id);  // its last one stays in the cache
  }
}

void Engine::persist(std::span<const std::int32_t> tokens) {
  const std::int64_t bs = kv_.block_size(), n = static_cast<std::int64_t>(tokens.size()) / bs;
  std::vector<std::int32_t> blocks;
  std::vector<std::int64_t> index;  // of each block to write
  std::vector<std::uint64_t> hashes;
  std::uint64_t h = 0;
  for (std::int64_t i = 0; i < n; ++i) {
    h = kv::block_hash(h, tokens.subspan(static_cast<std::size_t>(i * bs), static_cast<std::size_t>(bs)), kv_.config().salt);
    const std::optional<kv::BlockId> b = kv_.pool().cached_block(h);
    if (!b) return;  // evicted meanwhile: the chain cannot be read back whole
    if (store_->has_block(h)) continue;
    blocks.push_back(*b);
    index.push_back(i);
    hashes.push_back(h);
  }
  if (!blocks.empty()) {
    std::vector<std::byte> kv;
    if (Status st = model_.save_blocks(blocks, kv); !st.ok()) {
      log_warn("prefix cache: the KV of {} blocks could not be read: {}", blocks.size(), st.to_string());
      return;
    }
    const std::size_t per = model_.kv_block_bytes();
    for (std::size_t j = 0; j < blocks.size(); ++j) {
      store_->put_block(hashes[j], tokens.subspan(static_cast<std::size_t>(index[j] * bs), static_cast<std::size_t>(bs)),
                        std::vector<std::byte>(kv.begin() + static_cast<std::ptrdiff_t>(j * per),
                                               kv.begin() + static_cast<std::ptrdiff_t>((j + 1) * per)));
    }
  }
  if (!model_.config().is_hybrid() || n == 0 || store_->has_snapshot(h)) return;
  if (const std::optional<std::int32_t> s = kv_.snapshot_at_hash(h)) {
    std::vector<std::byte> states;
    if (Status st = model_.save_state(static_cast<std::int32_t>(model_.options().state_slots() + *s), states); !st.ok()) {
      log_warn("prefix cache: a state snapshot could not be read: {}", st.to_string());
      return;
    }
    store_->put_snapshot(h, std::move(states));
  }
}

void Engine::restore_from_store(std::span<const std::int32_t> prompt) {
  const std::int64_t bs = kv_.block_size(), max_blocks = (static_cast<std::int64_t>(prompt.size()) - 1) / bs;
  const bool hybrid = model_.config().is_hybrid();
  kv::BlockPool& pool = kv_.pool();
  auto chunk = [&](std::size_t i) { return prompt.subspan(i * static_cast<std::size_t>(bs), static_cast<std::size_t>(bs)); };
  // The chain of the prompt's blocks held on the device or in the store.
  std::vector<std::uint64_t> hashes;
  std::vector<bool> on_device;
  std::uint64_t h = 0;
  for (std::int64_t i = 0; i < max_blocks; ++i) {
    h = kv::block_hash(h, chunk(static_cast<std::size_t>(i)), kv_.config().salt);
    const bool dev = pool.is_cached(h);
    if (!dev && !store_->has_block(h)) break;
    hashes.push_back(h);
    on_device.push_back(dev);
  }
  // How deep it can go: every block, or for a hybrid its deepest snapshot.
  std::size_t target = hashes.size();
  if (hybrid) {
    target = 0;
    for (std::size_t i = 0; i < hashes.size(); ++i) {
      if (kv_.snapshot_at_hash(hashes[i]) || store_->has_snapshot(hashes[i])) target = i + 1;
    }
  }
  if (target == 0) return;
  const bool snapshot_on_device = !hybrid || kv_.snapshot_at_hash(hashes[target - 1]).has_value();
  if (snapshot_on_device && std::all_of(on_device.begin(), on_device.begin() + static_cast<std::ptrdiff_t>(target),
                                        [](bool b) { return b; })) {
    return;  // the device cache serves it
  }
  // Hold the blocks on the device, read the others into new ones.
  std::vector<kv::BlockId> held;
  std::vector<std::size_t> missing;
  for (std::size_t i = 0; i < target; ++i) {
    std::optional<kv::BlockId> b = on_device[i] ? pool.acquire_cached(hashes[i], chunk(i)) : std::nullopt;
    if (b) {
      held.push_back(*b);
    } else {
      missing.push_back(i);
    }
  }
  auto release = [&] {
    std::reverse(held.begin(), held.end());
    pool.release(held);
  };
  const std::size_t per = model_.kv_block_bytes();
  std::vector<std::byte> kv(missing.size() * per);
  for (std::size_t j = 0; j < missing.size(); ++j) {
    auto got = store_->get_block(hashes[missing[j]], chunk(missing[j]), per);
    if (!got) return release();
    std::copy(got->begin(), got->end(), kv.begin() + static_cast<std::ptrdiff_t>(j * per));
  }
  std::optional<std::vector<std::byte>> states;
  if (!snapshot_on_device) {
    states = store_->get_snapshot(hashes[target - 1], model_.state_slot_bytes());
    if (!states) return release();
  }
  auto fresh = pool.allocate(static_cast<std::int64_t>(missing.size()));
  if (!fresh) return release();  // no room now: computed instead
  if (Status st = model_.load_blocks(*fresh, kv); !st.ok()) {
    log_warn("prefix cache: {} blocks could not be written to the device: {}", fresh->size(), st.to_string());
    pool.release(*fresh);
    return release();
  }
  for (std::size_t j = 0; j < missing.size(); ++j) pool.cache((*fresh)[j], hashes[missing[j]], chunk(missing[j]));
  held.insert(held.end(), fresh->begin(), fresh->end());
  if (states) {
    const std::optional<std::int32_t> snap = kv_.reserve_snapshot();
    if (snap) {
      const Status st = model_.load_state(static_cast<std::int32_t>(model_.options().state_slots() + *snap), *states);
      if (!st.ok() || !kv_.register_snapshot(*snap, prompt, static_cast<std::int64_t>(target) * bs)) kv_.drop_snapshot(*snap);
    }
  }
  log_debug("prefix cache: {} blocks{} read back from {}", missing.size(), states ? " and a state snapshot" : "",
            store_->dir());
  release();
}

Result<std::int32_t> Engine::state_slot(const sched::Request& r, std::int64_t start, ForwardBatch& batch) {
  // A request starting after a cached prefix: that prefix's snapshot goes into its slot first.
  const std::optional<std::int32_t> restore = kv_.take_restore(r.id);
  auto held = state_slot_of_.find(r.id);
  std::int32_t slot = -1;
  if (held != state_slot_of_.end()) {
    slot = held->second;
  } else {
    if (free_state_slots_.empty()) {
      // Slots of requests that wait after a preemption go back to the pool (they start again
      // from 0 or from a snapshot).
      for (auto it = state_slot_of_.begin(); it != state_slot_of_.end();) {
        const sched::Request* holder = scheduler_.find(it->first);
        if (holder == nullptr || holder->status != sched::RequestStatus::kRunning) {
          free_state_slots_.push_back(it->second);
          it = state_slot_of_.erase(it);
        } else {
          ++it;
        }
      }
    }
    if (free_state_slots_.empty()) {
      return internal_error("request {}: no DeltaNet state slot is free ({} held)", r.id, state_slot_of_.size());
    }
    if (start != 0 && !restore) {
      // Its state would be lost: never compute on from another sequence's.
      return internal_error("request {} has no DeltaNet state for its {} computed tokens", r.id, start);
    }
    slot = free_state_slots_.back();
    free_state_slots_.pop_back();
    state_slot_of_[r.id] = slot;
  }
  if (restore) {
    batch.restores.emplace_back(static_cast<std::int32_t>(model_.options().state_slots() + *restore), slot);
  }
  return slot;
}

void Engine::plan_snapshots(const sched::SchedulerOutput& out, ForwardBatch& batch, std::vector<TakenSnapshot>& taken) {
  if (!snapshots_on()) return;
  const std::int64_t bs = kv_.block_size();
  for (std::size_t i = 0; i < out.scheduled.size(); ++i) {
    const sched::ScheduledRequest& s = out.scheduled[i];
    const sched::Request& r = *s.request;
    const std::int64_t end = s.start + s.num_tokens, P = static_cast<std::int64_t>(r.prompt.size());
    // Where a chunk was made to end, and each block boundary of the answer (the latest kept).
    const bool in_answer = end > P && end % bs == 0;
    if (!in_answer && !std::binary_search(r.snapshot_at.begin(), r.snapshot_at.end(), end)) continue;
    const std::uint64_t hash = chain_hash(r, end / bs);
    if (kv_.snapshot_at_hash(hash)) continue;
    const std::optional<std::int32_t> snap = kv_.reserve_snapshot();
    if (!snap) continue;
    batch.snapshots.emplace_back(batch.seq_state_slot[i], static_cast<std::int32_t>(model_.options().state_slots() + *snap));
    TakenSnapshot t{*snap, r.id, end, hash, in_answer, {}};
    if (store_ && !in_answer) {
      t.tokens = r.all_tokens();
      t.tokens.resize(static_cast<std::size_t>(end));
    }
    taken.push_back(std::move(t));
  }
}

std::uint64_t Engine::chain_hash(const sched::Request& r, std::int64_t blocks) const {
  const std::int64_t bs = kv_.block_size();
  const std::vector<std::uint64_t>& done = kv_.block_hashes(r.id);
  std::int64_t i = std::min(blocks, static_cast<std::int64_t>(done.size()));
  std::uint64_t h = i > 0 ? done[static_cast<std::size_t>(i - 1)] : 0;
  std::vector<std::int32_t> chunk(static_cast<std::size_t>(bs));
  for (; i < blocks; ++i) {
    for (std::int64_t j = 0; j < bs; ++j) chunk[static_cast<std::size_t>(j)] = r.token_at(i * bs + j);
    h = kv::block_hash(h, chunk, kv_.config().salt);
  }
  return h;
}

void Engine::register_snapshots(std::vector<TakenSnapshot>& taken, bool ran) {
  for (TakenSnapshot& t : taken) {
    if (!ran || !kv_.register_snapshot_at_hash(t.snapshot, t.hash)) {
      kv_.drop_snapshot(t.snapshot);
      continue;
    }
    if (!t.in_answer) {
      if (store_) persist(t.tokens);
      continue;
    }
    // Inside the answer: it replaces the request's previous one there.
    auto [it, fresh] = answer_snapshot_.try_emplace(t.request);
    if (!fresh) {
      if (const std::optional<std::int32_t> old = kv_.snapshot_at_hash(it->second.hash)) kv_.drop_snapshot(*old);
    }
    it->second = {t.length, t.hash};
  }
  taken.clear();
}

Status Engine::step() {
  drain_inbox();
  sched::SchedulerOutput out = scheduler_.schedule();
  if (out.scheduled.empty()) {
    emit_finished();
    publish_state();
    return ok_status();
  }
  // One batch for every scheduled request.
  const std::int64_t bs = kv_.block_size();
  ForwardBatch b;
  std::size_t max_blocks = 1;
  for (const auto& s : out.scheduled) max_blocks = std::max(max_blocks, kv_.block_table(s.request->id).size());
  b.max_blocks_per_seq = block_table_width(max_blocks, model_.options().blocks_per_seq());
  max_blocks = static_cast<std::size_t>(b.max_blocks_per_seq);
  b.seq_token_start.push_back(0);
  for (const auto& s : out.scheduled) {
    const sched::Request& r = *s.request;
    const auto& table = kv_.block_table(r.id);
    for (std::int64_t i = s.start; i < s.start + s.num_tokens; ++i) {
      b.tokens.push_back(r.token_at(i));
      b.positions.push_back(static_cast<std::int32_t>(i));
      b.slot_mapping.push_back(static_cast<std::int32_t>(table[static_cast<std::size_t>(i / bs)] * bs + i % bs));
    }
    b.seq_token_start.push_back(static_cast<std::int32_t>(b.tokens.size()));
    b.seq_context_len.push_back(static_cast<std::int32_t>(s.start + s.num_tokens));
    if (model_.config().is_hybrid()) {
      auto slot = state_slot(r, s.start, b);
      if (!slot.ok()) {
        emit_finished();
        for (const auto& f : out.scheduled) scheduler_.finish(f.request->id, sched::FinishReason::kCancelled);
        emit_finished(slot.status());
        publish_state();
        return slot.status();
      }
      b.seq_state_slot.push_back(*slot);
    }
    for (std::size_t j = 0; j < max_blocks; ++j) b.block_table.push_back(j < table.size() ? table[j] : kv::kNullBlock);
    if (s.sample) b.logit_rows.push_back(static_cast<std::int32_t>(b.tokens.size() - 1));
  }
  // When every choice of the step can be made from a few candidates (greedy, small top-k, no
  // penalties or logprobs), the devices select them and only those come back, not the logits.
  int top_k = 1;
  bool on_device = true;
  // Structured output: the masks of the constrained rows are made beside the forward, on a thread
  // of their own (each depends only on the tokens its request accepted so far).
  const std::int64_t V = model_.config().vocab;
  const std::size_t mask_words = static_cast<std::size_t>((V + 31) / 32);
  std::vector<std::pair<std::size_t, TokenConstraint*>> constrained;  // (sampled row, constraint)
  std::size_t sampled_rows = 0;
  for (const auto& s : out.scheduled) {
    if (!s.sample) continue;
    const Live& l = *live_.at(s.request->id);
    int k = 0;
    on_device = on_device && l.options.top_logprobs < 0 && !l.options.constraint &&
                l.sampler.on_device_candidates(model_.top_k_limit(), &k);
    top_k = std::max(top_k, k);
    if (l.options.constraint) constrained.emplace_back(sampled_rows, l.options.constraint.get());
    ++sampled_rows;
  }
  std::future<void> masks_made;
  if (!constrained.empty()) {
    masks_.assign(constrained.size() * mask_words, 0u);
    masks_made = std::async(std::launch::async, [&constrained, mask_words, this] {
      for (std::size_t i = 0; i < constrained.size(); ++i) {
        constrained[i].second->fill_mask(std::span<std::uint32_t>(masks_.data() + i * mask_words, mask_words));
      }
    });
  }
  std::vector<TakenSnapshot> taken;
  plan_snapshots(out, b, taken);
  const auto t0 = std::chrono::steady_clock::now();
  const Status st = on_device ? model_.forward_top_k(b, top_k, top_values_, top_ids_) : model_.forward(b, logits_);
  if (masks_made.valid()) masks_made.get();
  if (!st.ok()) {
    // The step is lost: fail its requests (their KV is unknown) and report the error. Requests
    // that finished before the step (cancelled) are reported as they were.
    register_snapshots(taken, false);
    emit_finished();
    for (const auto& s : out.scheduled) scheduler_.finish(s.request->id, sched::FinishReason::kCancelled);
    emit_finished(st);
    publish_state();
    return st;
  }
  // Sample every request that reached the end of its tokens.
  std::vector<std::int32_t> sampled;
  std::size_t next_constrained = 0;
  std::vector<RequestEvent> events;
  std::size_t row = 0;
  std::uint64_t prompt_tokens = 0;
  for (const auto& s : out.scheduled) {
    const sched::Request& r = *s.request;
    if (s.start < static_cast<std::int64_t>(r.prompt.size())) {
      prompt_tokens += static_cast<std::uint64_t>(std::min<std::int64_t>(s.start + s.num_tokens, r.prompt.size()) - s.start);
    }
    if (!s.sample) continue;
    Live& l = *live_.at(r.id);
    RequestEvent e;
    e.id = r.id;
    if (on_device) {
      const auto at = static_cast<std::size_t>(row++) * static_cast<std::size_t>(top_k);
      sampled.push_back(l.sampler.sample_top(std::span<const float>(top_values_).subspan(at, top_k),
                                             std::span<const std::int32_t>(top_ids_).subspan(at, top_k)));
      if (l.scripted < l.options.script.size()) sampled.back() = l.options.script[l.scripted++];
      e.tokens.push_back(sampled.back());
      events.push_back(std::move(e));
      continue;
    }
    std::span<float> lg(logits_.data() + static_cast<std::ptrdiff_t>(row * V), static_cast<std::size_t>(V));
    // Logprobs are the model's, before a constraint's mask (as vLLM reports them).
    std::vector<float> raw;
    if (l.options.top_logprobs >= 0) raw.assign(lg.begin(), lg.end());
    if (next_constrained < constrained.size() && constrained[next_constrained].first == row) {
      const std::uint32_t* mask = masks_.data() + next_constrained++ * mask_words;
      for (std::int64_t t = 0; t < V; ++t) {
        if (((mask[t / 32] >> (t % 32)) & 1u) == 0) lg[static_cast<std::size_t>(t)] = -std::numeric_limits<float>::infinity();
      }
    }
    ++row;
    if (l.options.top_logprobs >= 0) {
      const std::int32_t tok = l.sampler.sample(lg);
      e.logprobs.push_back(logprobs_of(raw, tok, l.options.top_logprobs));
      sampled.push_back(tok);
    } else {
      sampled.push_back(l.sampler.sample(lg));
    }
    if (l.scripted < l.options.script.size()) sampled.back() = l.options.script[l.scripted++];
    if (l.options.constraint) l.options.constraint->accept(sampled.back());
    e.tokens.push_back(sampled.back());
    events.push_back(std::move(e));
  }
  scheduler_.update(out, sampled);
  register_snapshots(taken, true);
  // The step's time (forward and sampling) teaches the scheduler's cost model.
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  scheduler_.observe_step(out, seconds);
  log_debug("engine: step of {} decode + {} prefill tokens (budget {}) in {:.1f} ms", out.num_decode_tokens,
            out.num_prefill_tokens, out.prefill_budget, seconds * 1000.0);
  // Text: a stop id ended the request in the scheduler (its text is not shown); otherwise decode and
  // look for stop strings.
  for (RequestEvent& e : events) {
    Live& l = *live_.at(e.id);
    const bool is_stop_id = std::find(l.stop_ids.begin(), l.stop_ids.end(), e.tokens[0]) != l.stop_ids.end();
    if (!is_stop_id) {
      e.text = l.matcher.push(l.decoder.push(e.tokens[0]));
      if (l.matcher.stopped()) {
        l.stopped_by_string = true;
        if (scheduler_.find(e.id) != nullptr) scheduler_.finish(e.id, sched::FinishReason::kStop);
      }
    }
    if ((!e.text.empty() || !e.tokens.empty()) && l.on_event) l.on_event(e);
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    ++stats_.steps;
    stats_.prompt_tokens += prompt_tokens;
    stats_.generation_tokens += sampled.size();
    const auto tokens = static_cast<double>(out.num_batched_tokens);
    ++stats_.step_tokens_counts[static_cast<std::size_t>(
        std::lower_bound(std::begin(kStepTokenBounds), std::end(kStepTokenBounds), tokens) - std::begin(kStepTokenBounds))];
    ++stats_.step_seconds_counts[static_cast<std::size_t>(
        std::lower_bound(std::begin(kStepSecondsBounds), std::end(kStepSecondsBounds), seconds) -
        std::begin(kStepSecondsBounds))];
    stats_.step_tokens_sum += tokens;
    stats_.step_seconds_sum += seconds;
  }
  emit_finished();
  publish_state();
  return ok_status();
}

void Engine::publish_state() {
  const sched::SchedulerStats ss = scheduler_.stats();
  const kv::KvCacheStats ks = kv_.stats();
  std::lock_guard<std::mutex> lock(mu_);
  stats_.running = ss.running;
  stats_.waiting = ss.waiting + static_cast<std::int64_t>(inbox_.size());
  stats_.kv_usage = ss.kv_usage;
  stats_.kv_free_blocks = kv_.num_free_blocks();
  stats_.kv_total_blocks = kv_.config().num_blocks - 1;
  stats_.preemptions = ss.preemptions;
  stats_.prefix_queries = ks.prefix_queries;
  stats_.prefix_hits = ks.prefix_hits;
  stats_.prefix_caching = config_.prefix_caching;
  stats_.snapshots_held = ks.snapshots_held;
  stats_.snapshots_total = ks.snapshots_total;
  stats_.snapshot_bytes = model_.state_slot_bytes();
  stats_.snapshots_taken = ks.snapshots_taken;
  stats_.snapshots_restored = ks.snapshots_restored;
  stats_.snapshots_evicted = ks.snapshots_evicted;
  if (store_) {
    const PrefixStoreStats ps = store_->stats();
    stats_.prefix_store = true;
    stats_.store_blocks = ps.blocks;
    stats_.store_snapshots = ps.snapshots;
    stats_.store_bytes = ps.bytes;
    stats_.store_written = ps.written;
    stats_.store_read = ps.read;
  }
  stats_.state_slots_free = static_cast<std::int64_t>(free_state_slots_.size());
  stats_.state_slots_total = static_cast<std::int64_t>(free_state_slots_.size() + state_slot_of_.size());
  stats_.max_step_ms = ss.max_step_ms;
  stats_.cost_ready = ss.cost.ready;
  stats_.cost_fixed_ms = ss.cost.fixed * 1000.0;
  stats_.cost_per_decode_ms = ss.cost.per_decode * 1000.0;
  stats_.cost_per_prefill_ms = ss.cost.per_prefill * 1000.0;
  stats_.cost_per_context_row_us = ss.cost.per_context * 1e6;
  stats_.last_decode_tokens = ss.last_decode_tokens;
  stats_.last_prefill_tokens = ss.last_prefill_tokens;
  stats_.last_step_ms = ss.last_step_ms;
  scheduler_busy_ = scheduler_.has_work();
}

Status Engine::run_until_idle() {
  while (has_work()) SX_RETURN_IF_ERROR(step());
  return ok_status();
}

}  // namespace sx::engine
