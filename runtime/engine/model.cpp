// Model: loads the shards of a TP x PP group, drives their runner threads and assembles
// the logits (the per-rank forward is in shard.cpp).
#include "runtime/engine/model.h"

#include <algorithm>
#include <atomic>
#include <cstring>
#include <string>

#include "runtime/base/fnv.h"
#include "runtime/engine/shard.h"
#include "runtime/engine/rank_runner.h"
#include "runtime/parallel/shard_plan.h"

namespace sx::engine {

struct Model::Impl {
  parallel::ShardPlan plan;
  std::vector<std::unique_ptr<hal::Channel>> world;            // pp > 1
  std::vector<std::vector<std::unique_ptr<hal::Channel>>> tp;  // per stage, tp > 1
  std::vector<std::unique_ptr<Shard>> shards;             // rank order
  std::vector<std::string> device_names;
  std::vector<std::unique_ptr<RankRunner>> runners;  // one per rank when there are several
  std::atomic<int> first_failure{-1};
  Status failed;  // the group's failure; sticky
};

Model::Model(model::ModelConfig config, ModelOptions options, ParallelOptions parallel)
    : config_(std::move(config)), options_(options), parallel_(parallel), impl_(std::make_unique<Impl>()) {}

Model::~Model() {
  impl_->runners.clear();  // join the threads before the shards go away
}

Result<std::unique_ptr<Model>> Model::load(const model::TensorSource& file, const model::ModelConfig& config,
                                                     hal::Device& device, const ModelOptions& options) {
  hal::Device* devices[] = {&device};
  return load_group(file, config, nullptr, devices, ParallelOptions{}, options);  // one rank: no channels
}

Result<std::unique_ptr<Model>> Model::load(const model::TensorSource& file, const model::ModelConfig& config,
                                                     hal::Backend& backend, std::span<hal::Device* const> devices,
                                                     const ParallelOptions& parallel, const ModelOptions& options) {
  return load_group(file, config, &backend, devices, parallel, options);
}

Result<std::unique_ptr<Model>> Model::load_group(const model::TensorSource& file,
                                                           const model::ModelConfig& config, hal::Backend* backend,
                                                           std::span<hal::Device* const> devices,
                                                           const ParallelOptions& parallel,
                                                           const ModelOptions& options) {
  if (options.max_batch_tokens <= 0 || options.max_logit_rows <= 0) {
    return invalid_argument_error("model options: max_batch_tokens and max_logit_rows must be positive");
  }
  if (options.kv.block_size <= 0 || options.kv.num_blocks <= 0) {
    return invalid_argument_error("model options: KV cache needs a positive block size and block count");
  }
  if (options.max_blocks_per_seq < 0 || options.max_blocks_per_seq > options.kv.num_blocks) {
    return invalid_argument_error("model options: max_blocks_per_seq {} must be in [0, {}] (the KV blocks)",
                                  options.max_blocks_per_seq, options.kv.num_blocks);
  }
  if (parallel.tp < 1 || parallel.pp < 1 ||
      devices.size() != static_cast<std::size_t>(parallel.tp) * static_cast<std::size_t>(parallel.pp)) {
    return invalid_argument_error("tp {} x pp {} needs {} devices, got {}", parallel.tp, parallel.pp,
                                  parallel.tp * parallel.pp, devices.size());
  }
  if (backend == nullptr && devices.size() > 1) {
    return invalid_argument_error("a group of {} devices needs their backend for its channels", devices.size());
  }
  SX_RETURN_IF_ERROR(model::check_model_tensors(file, config));
  SX_ASSIGN_OR_RETURN(parallel::WeightTypes types, parallel::weight_types_from_source(file, config));
  SX_ASSIGN_OR_RETURN(parallel::ShardPlan plan,
                      parallel::plan_shards(config, types,
                                            {parallel.tp, parallel.pp, options.kv.dtype, parallel.requantize_unaligned}));
  auto m = std::unique_ptr<Model>(new Model(config, options, parallel));
  Impl& im = *m->impl_;
  im.plan = std::move(plan);
  const int tp = parallel.tp, pp = parallel.pp, n = tp * pp;
  // Each group is named for its errors (a deadline names the group, its waiting and missing ranks).
  if (pp > 1) {
    hal::ChannelOptions co = parallel.channel;
    co.name = fmt::format("pipeline group of {} stages (model ranks 0-{})", pp, n - 1);
    SX_ASSIGN_OR_RETURN(im.world, backend->create_channels(devices, co));
  }
  if (tp > 1) {
    for (int s = 0; s < pp; ++s) {
      hal::ChannelOptions co = parallel.channel;
      co.name = pp > 1 ? fmt::format("tp group of stage {} (model ranks {}-{})", s, s * tp, s * tp + tp - 1)
                       : fmt::format("tp group of {} ranks", tp);
      SX_ASSIGN_OR_RETURN(auto group, backend->create_channels(devices.subspan(static_cast<std::size_t>(s * tp),
                                                                              static_cast<std::size_t>(tp)),
                                                              co));
      im.tp.push_back(std::move(group));
    }
  }
  std::uint64_t per_token = 0;
  for (int r = 0; r < n; ++r) {
    ShardContext ctx;
    ctx.device = devices[static_cast<std::size_t>(r)];
    ctx.tp = tp > 1 ? im.tp[static_cast<std::size_t>(r / tp)][static_cast<std::size_t>(r % tp)].get() : nullptr;
    ctx.world = pp > 1 ? im.world[static_cast<std::size_t>(r)].get() : nullptr;
    ctx.plan = &im.plan;
    ctx.rank = r;
    auto shard = Shard::load(file, config, ctx, options);
    if (!shard.ok()) {
      return Status(shard.status().code(),
                    fmt::format("rank {} ({}): {}", r, ctx.device->info().name, shard.status().message()));
    }
    m->weight_bytes_ += (*shard)->weight_bytes();
    m->state_slot_bytes_ += (*shard)->state_slot_bytes();
    per_token += (*shard)->weight_bytes() - (*shard)->embedding_only_bytes();
    m->kv_bytes_per_token_ += im.plan.ranks[static_cast<std::size_t>(r)].kv_bytes_per_token;
    im.device_names.push_back(ctx.device->info().name);
    im.shards.push_back(std::move(*shard));
  }
  // A decode step reads every matrix once and one row of the embedding table.
  const hal::DType embd_type = types.token_embd;
  m->weight_bytes_per_token_ = per_token + hal::row_bytes(embd_type, config.hidden);
  // A token reads k of the n experts of each layer (the active bytes).
  m->weight_bytes_per_token_ -= std::min(m->weight_bytes_per_token_, parallel::idle_expert_bytes(config, types));
  m->top_k_limit_ = static_cast<int>(hal::kMaxTopK);
  for (const parallel::RankPlan& r : im.plan.ranks) {
    if (r.has_lm_head) m->top_k_limit_ = static_cast<int>(std::min<std::int64_t>(m->top_k_limit_, r.vocab.size()));
  }
  if (n > 1) {
    for (int r = 0; r < n; ++r) im.runners.push_back(std::make_unique<RankRunner>());
  }
  return m;
}

Status Model::run_shards(const ForwardBatch& batch, int top_k) {
  Impl& im = *impl_;
  if (!im.failed.ok()) {
    return Status(im.failed.code(), fmt::format("the device group failed earlier ({}); load the model again",
                                                im.failed.message()));
  }
  SX_RETURN_IF_ERROR(validate(batch));
  const int n = static_cast<int>(im.shards.size());
  if (n == 1) return im.shards[0]->run(batch, top_k);
  for (int r = 0; r < n; ++r) {
    im.runners[static_cast<std::size_t>(r)]->start([&im, &batch, r, top_k]() -> Status {
      Shard& shard = *im.shards[static_cast<std::size_t>(r)];
      Status st = shard.run(batch, top_k);
      if (!st.ok()) {
        int none = -1;
        im.first_failure.compare_exchange_strong(none, r);
        shard.abort_channels(st);  // release the peers now rather than at their timeout
      }
      return st;
    });
  }
  std::vector<Status> results;
  for (int r = 0; r < n; ++r) results.push_back(im.runners[static_cast<std::size_t>(r)]->wait());
  const int first = im.first_failure.load();
  if (first >= 0) {
    const Status& cause = results[static_cast<std::size_t>(first)];
    im.failed = Status(cause.code(), fmt::format("rank {} ({}) failed: {}", first,
                                                 im.device_names[static_cast<std::size_t>(first)], cause.message()));
    return im.failed;
  }
  return ok_status();
}

Status Model::forward(const ForwardBatch& batch, std::vector<float>& logits) {
  SX_RETURN_IF_ERROR(run_shards(batch, 0));
  Impl& im = *impl_;
  const int tp = parallel_.tp;
  // Assemble the vocab-split logits of the last stage: chunk j holds tp rank j's columns.
  const auto R = static_cast<std::int64_t>(batch.logit_rows.size());
  const std::int64_t V = config_.vocab;
  logits.assign(static_cast<std::size_t>(R * V), 0.0f);
  if (R == 0) return ok_status();
  const Shard& driver = *im.shards[static_cast<std::size_t>((parallel_.pp - 1) * tp)];
  const std::span<const std::byte> back = driver.result();
  const std::int64_t chunk = R * driver.max_vocab_shard();
  if (back.size() != static_cast<std::size_t>(chunk * tp) * sizeof(float)) {
    return internal_error("forward: the last stage returned {} bytes of logits, expected {}", back.size(),
                          static_cast<std::size_t>(chunk * tp) * sizeof(float));
  }
  for (int j = 0; j < tp; ++j) {
    const parallel::Range vr = im.plan.at(parallel_.pp - 1, j).vocab;
    for (std::int64_t r = 0; r < R; ++r) {
      std::memcpy(logits.data() + r * V + vr.begin, back.data() + (j * chunk + r * vr.size()) * sizeof(float),
                  static_cast<std::size_t>(vr.size()) * sizeof(float));
    }
  }
  return ok_status();
}

Status Model::forward_top_k(const ForwardBatch& batch, int k, std::vector<float>& values,
                                 std::vector<std::int32_t>& ids) {
  if (k < 1 || k > top_k_limit()) {
    return invalid_argument_error("forward: top-k of {} must be in [1, {}]", k, top_k_limit());
  }
  SX_RETURN_IF_ERROR(run_shards(batch, k));
  Impl& im = *impl_;
  const int tp = parallel_.tp;
  const auto R = static_cast<std::int64_t>(batch.logit_rows.size());
  values.assign(static_cast<std::size_t>(R * k), 0.0f);
  ids.assign(static_cast<std::size_t>(R * k), 0);
  if (R == 0) return ok_status();
  const std::span<const std::byte> back = im.shards[static_cast<std::size_t>((parallel_.pp - 1) * tp)]->result();
  const std::size_t part = Shard::top_k_bytes(R, k), ids_at = Shard::top_k_ids_offset(R, k);
  if (back.size() != part * static_cast<std::size_t>(tp)) {
    return internal_error("forward: the last stage returned {} bytes of candidates, expected {}", back.size(),
                          part * static_cast<std::size_t>(tp));
  }
  // Each tp rank's k best of its vocab shard, best first: the row's k best are the first k of
  // their merge in the same order.
  struct Candidate {
    float value;
    std::int32_t id;
  };
  std::vector<Candidate> merged;
  for (std::int64_t r = 0; r < R; ++r) {
    merged.clear();
    for (int j = 0; j < tp; ++j) {
      const std::byte* chunk = back.data() + part * static_cast<std::size_t>(j);
      for (std::int64_t i = 0; i < k; ++i) {
        Candidate c{};
        std::memcpy(&c.value, chunk + static_cast<std::size_t>(r * k + i) * sizeof(float), sizeof(float));
        std::memcpy(&c.id, chunk + ids_at + static_cast<std::size_t>(r * k + i) * sizeof(std::int32_t),
                    sizeof(std::int32_t));
        merged.push_back(c);
      }
    }
    std::stable_sort(merged.begin(), merged.end(), [](const Candidate& a, const Candidate& b) {
      return hal::top_k_before(a.value, a.id, b.value, b.id);
    });
    for (std::int64_t i = 0; i < k; ++i) {
      values[static_cast<std::size_t>(r * k + i)] = merged[static_cast<std::size_t>(i)].value;
      ids[static_cast<std::size_t>(r * k + i)] = merged[static_cast<std::size_t>(i)].id;
    }
  }
  return ok_status();
}

Status Model::validate(const ForwardBatch& batch) const {
  const auto n_tokens = static_cast<std::int64_t>(batch.tokens.size());
  const auto n_seqs = static_cast<std::int64_t>(batch.seq_context_len.size());
  if (n_tokens == 0) return invalid_argument_error("forward: empty batch");
  if (n_tokens > options_.max_batch_tokens) {
    return invalid_argument_error("forward: {} tokens exceed max_batch_tokens {}", n_tokens, options_.max_batch_tokens);
  }
  if (batch.positions.size() != batch.tokens.size() || batch.slot_mapping.size() != batch.tokens.size() ||
      batch.seq_token_start.size() != static_cast<std::size_t>(n_seqs + 1) ||
      batch.block_table.size() != static_cast<std::size_t>(n_seqs * batch.max_blocks_per_seq)) {
    return invalid_argument_error("forward: batch arrays have inconsistent sizes");
  }
  if (n_seqs > options_.max_logit_rows || batch.max_blocks_per_seq > options_.blocks_per_seq()) {
    return invalid_argument_error("forward: {} sequences of up to {} blocks exceed the {} of {} blocks a step holds",
                                  n_seqs, batch.max_blocks_per_seq, options_.max_logit_rows,
                                  options_.blocks_per_seq());
  }
  if (batch.logit_rows.size() > static_cast<std::size_t>(options_.max_logit_rows)) {
    return invalid_argument_error("forward: {} logit rows exceed max_logit_rows {}", batch.logit_rows.size(),
                                  options_.max_logit_rows);
  }
  for (std::int32_t r : batch.logit_rows) {
    if (r < 0 || r >= n_tokens) return invalid_argument_error("forward: logit row {} is not a batch token", r);
  }
  for (std::int32_t p : batch.positions) {
    if (p < 0 || p >= config_.context_length) {
      return out_of_range_error("forward: position {} is outside the model's context length {}", p,
                                config_.context_length);
    }
  }
  // Everything that could make a device op fail on bad input is checked here, so that the stream
  // only ever latches device errors and a rejected batch leaves the model usable.
  for (std::int32_t t : batch.tokens) {
    if (t < 0 || t >= config_.vocab) {
      return out_of_range_error("forward: token id {} is outside the vocabulary of {}", t, config_.vocab);
    }
  }
  if (!batch.seq_state_slot.empty()) {
    if (batch.seq_state_slot.size() != static_cast<std::size_t>(n_seqs)) {
      return invalid_argument_error("forward: {} state slots for {} sequences", batch.seq_state_slot.size(), n_seqs);
    }
    std::vector<bool> taken(static_cast<std::size_t>(options_.state_slots()), false);
    for (std::int32_t slot : batch.seq_state_slot) {
      if (slot < 0 || slot >= options_.state_slots()) {
        return out_of_range_error("forward: state slot {} is outside the pool of {}", slot, options_.state_slots());
      }
      if (taken[static_cast<std::size_t>(slot)]) {
        return invalid_argument_error("forward: state slot {} is given to two sequences", slot);
      }
      taken[static_cast<std::size_t>(slot)] = true;
    }
  } else if (config_.is_hybrid() && n_seqs > options_.state_slots()) {
    return invalid_argument_error("forward: {} sequences exceed the {} state slots", n_seqs, options_.state_slots());
  }
  for (const auto* copies : {&batch.restores, &batch.snapshots}) {
    for (const auto& [from, to] : *copies) {
      if (!config_.is_hybrid()) return invalid_argument_error("forward: state copies for a model without states");
      if (from < 0 || to < 0 || from >= options_.total_state_slots() || to >= options_.total_state_slots() || from == to) {
        return out_of_range_error("forward: state copy {} -> {} is outside the {} state slots or onto itself", from, to,
                                  options_.total_state_slots());
      }
    }
  }
  for (std::int32_t slot : batch.slot_mapping) {
    if (slot >= options_.kv.num_blocks * options_.kv.block_size) {
      return out_of_range_error("forward: KV slot {} is outside the cache of {} slots", slot, options_.kv.num_blocks * options_.kv.block_size);
    }
  }
  for (std::int32_t b : batch.block_table) {
    if (b < 0 || b >= options_.kv.num_blocks) {
      return out_of_range_error("forward: block id {} is outside the cache of {} blocks", b, options_.kv.num_blocks);
    }
  }
  for (std::int64_t q = 0; q < n_seqs; ++q) {
    const std::int64_t n_new = batch.seq_token_start[q + 1] - batch.seq_token_start[q];
    const std::int64_t ctx = batch.seq_context_len[q];
    if (n_new < 0 || ctx < n_new || ctx > static_cast<std::int64_t>(batch.max_blocks_per_seq) * options_.kv.block_size) {
      return invalid_argument_error("forward: sequence {} has {} new tokens and a context of {} (room for {})", q, n_new,
                                    ctx, static_cast<std::int64_t>(batch.max_blocks_per_seq) * options_.kv.block_size);
    }
  }
  if (batch.seq_token_start.front() != 0 || batch.seq_token_start.back() != n_tokens) {
    return invalid_argument_error("forward: seq_token_start must run from 0 to {}", n_tokens);
  }
  return ok_status();
}

std::uint64_t Model::kv_block_bytes() const {
  std::uint64_t n = 0;
  for (const auto& sh : impl_->shards) n += sh->kv_block_bytes();
  return n;
}

Status Model::save_blocks(std::span<const std::int32_t> blocks, std::vector<std::byte>& out) {
  out.assign(blocks.size() * kv_block_bytes(), std::byte{0});
  std::vector<std::byte> part;
  std::size_t offset = 0;  // of this rank's part in each block's record
  for (const auto& sh : impl_->shards) {
    const std::size_t per = sh->kv_block_bytes();
    part.resize(blocks.size() * per);
    SX_RETURN_IF_ERROR(sh->save_blocks(blocks, part));
    for (std::size_t b = 0; b < blocks.size(); ++b) {
      std::memcpy(out.data() + b * kv_block_bytes() + offset, part.data() + b * per, per);
    }
    offset += per;
  }
  return ok_status();
}

Status Model::load_blocks(std::span<const std::int32_t> blocks, std::span<const std::byte> in) {
  if (in.size() != blocks.size() * kv_block_bytes()) {
    return invalid_argument_error("load_blocks: {} bytes for {} blocks of {}", in.size(), blocks.size(), kv_block_bytes());
  }
  for (std::int32_t b : blocks) {
    if (b <= 0 || b >= options_.kv.num_blocks) return out_of_range_error("load_blocks: block {} is not usable", b);
  }
  std::vector<std::byte> part;
  std::size_t offset = 0;
  for (const auto& sh : impl_->shards) {
    const std::size_t per = sh->kv_block_bytes();
    part.resize(blocks.size() * per);
    for (std::size_t b = 0; b < blocks.size(); ++b) {
      std::memcpy(part.data() + b * per, in.data() + b * kv_block_bytes() + offset, per);
    }
    SX_RETURN_IF_ERROR(sh->load_blocks(blocks, part));
    offset += per;
  }
  return ok_status();
}

Status Model::save_state(std::int32_t slot, std::vector<std::byte>& out) {
  out.assign(state_slot_bytes(), std::byte{0});
  std::size_t at = 0;
  for (const auto& sh : impl_->shards) {
    SX_RETURN_IF_ERROR(sh->save_state(slot, std::span(out).subspan(at, sh->state_slot_bytes())));
    at += sh->state_slot_bytes();
  }
  return ok_status();
}

Status Model::load_state(std::int32_t slot, std::span<const std::byte> in) {
  if (in.size() != state_slot_bytes() || slot < 0 || slot >= options_.total_state_slots()) {
    return invalid_argument_error("load_state: {} bytes for slot {} (slots of {} bytes, {} of them)", in.size(), slot,
                                  state_slot_bytes(), options_.total_state_slots());
  }
  std::size_t at = 0;
  for (const auto& sh : impl_->shards) {
    SX_RETURN_IF_ERROR(sh->load_state(slot, in.subspan(at, sh->state_slot_bytes())));
    at += sh->state_slot_bytes();
  }
  return ok_status();
}

std::uint64_t Model::layout_salt() const {
  const model::ModelConfig& c = config_;
  const std::int64_t fields[] = {c.n_layers, c.hidden, c.n_heads, c.n_kv_heads, c.head_dim, c.vocab,
                                 c.ssm_head_dim, c.ssm_k_heads, c.ssm_v_heads, parallel_.tp, parallel_.pp,
                                 static_cast<std::int64_t>(options_.kv.dtype), options_.kv.block_size,
                                 static_cast<std::int64_t>(kv_block_bytes()), static_cast<std::int64_t>(state_slot_bytes())};
  return Fnv1a().add(c.architecture).add(fields, sizeof(fields)).value;
}

ForwardBatch single_sequence_batch(std::span<const std::int32_t> tokens, std::int32_t start_pos,
                                   std::int64_t num_blocks) {
  ForwardBatch b;
  b.tokens.assign(tokens.begin(), tokens.end());
  const auto n = static_cast<std::int32_t>(tokens.size());
  for (std::int32_t i = 0; i < n; ++i) {
    b.positions.push_back(start_pos + i);
    b.slot_mapping.push_back(start_pos + i);  // identity block table: slot == position
  }
  b.seq_token_start = {0, n};
  b.seq_context_len = {start_pos + n};
  b.max_blocks_per_seq = static_cast<std::int32_t>(num_blocks);
  for (std::int64_t i = 0; i < num_blocks; ++i) b.block_table.push_back(static_cast<std::int32_t>(i));
  b.logit_rows = {n - 1};
  return b;
}

}  // namespace sx::engine
