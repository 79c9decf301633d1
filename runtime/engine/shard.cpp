// One rank's weights, KV cache, states, workspace and per-step op sequence (see shard.h): what
// every architecture shares. The layers' own work is in the blocks (blocks/), chosen per layer by
// the model's architecture (models/).
#include "runtime/engine/shard.h"

#include <algorithm>
#include <cstring>
#include <optional>
#include <string>
#include <vector>

#include "runtime/engine/blocks/attention.h"
#include "runtime/engine/blocks/ffn.h"
#include "runtime/engine/blocks/gated_deltanet.h"
#include "runtime/engine/blocks/head.h"
#include "runtime/engine/blocks/step.h"
#include "runtime/engine/models/architecture.h"
#include "runtime/engine/weights.h"

namespace sx::engine {

namespace {

// A layer as its architecture composed it: the norm before the mixer and the one before the FFN,
// one mixer, and the FFN (routed experts with, on a rank that holds it, the shared expert).
struct Layer {
  DeviceTensor attn_norm, ffn_norm;
  std::optional<Attention> attention;
  std::optional<GatedDeltaNet> deltanet;
  std::optional<DenseFfn> dense;
  std::optional<RoutedExperts> experts;
  std::optional<SharedExpert> shared;
};

Result<std::unique_ptr<hal::Buffer>> alloc_zeroed(hal::Device& device, hal::Stream& stream, std::size_t bytes) {
  SX_ASSIGN_OR_RETURN(std::unique_ptr<hal::Buffer> b, device.alloc(bytes));
  SX_RETURN_IF_ERROR(stream.fill(*b, 0, bytes, 0));
  return b;
}

Result<const Architecture*> architecture_of(const model::ModelConfig& c) {
  const Architecture* a = find_architecture(c.architecture);
  if (a == nullptr) {
    return unimplemented_error("the engine has no layers for architecture '{}' (it runs {})", c.architecture,
                               model::supported_architectures());
  }
  return a;
}

// Where the per-step integer inputs live in the staging buffer and in their device copy: each
// array at a 256-byte boundary (the largest storage-buffer offset alignment GPUs ask for), sized
// for the largest step (max_batch_tokens tokens, max_logit_rows sequences of blocks_per_seq()
// blocks).
struct StepInputs {
  std::size_t ids = 0, positions = 0, slots = 0, seq_start = 0, seq_ctx = 0, block_table = 0, state_slot = 0,
              bytes = 0;
  StepInputs() = default;
  // `states`: a hybrid's rank, whose steps also name each sequence's state slot.
  StepInputs(const ModelOptions& o, bool states) {
    auto take = [this](std::int64_t n) {
      const std::size_t at = bytes;
      bytes += (i32_bytes(n) + 255) / 256 * 256;
      return at;
    };
    const std::int64_t T = o.max_batch_tokens, S = o.max_logit_rows;
    ids = take(T);
    positions = take(T);
    slots = take(T);
    seq_start = take(S + 1);
    seq_ctx = take(S);
    block_table = take(S * o.blocks_per_seq());
    if (states) state_slot = take(S);
  }
};

}  // namespace

Status require_f32(const model::TensorSource& file, std::initializer_list<const DeviceTensor*> tensors) {
  for (const DeviceTensor* t : tensors) {
    if (t->buffer && t->type != hal::DType::kF32) {
      return invalid_argument_error("{}: norm and bias tensors must be f32, found {}", file.path(),
                                    hal::dtype_name(t->type));
    }
  }
  return ok_status();
}

std::size_t Shard::top_k_ids_offset(std::int64_t rows, std::int64_t k) {
  return (f32_bytes(rows * k) + 255) / 256 * 256;
}
std::size_t Shard::top_k_bytes(std::int64_t rows, std::int64_t k) {
  return top_k_ids_offset(rows, k) + i32_bytes(rows * k);
}

namespace {

// The readback buffer of the last stage's tp rank 0: every rank's logit rows, or every rank's
// top-k candidates, whichever is larger.
std::size_t readback_bytes(std::int64_t rows, std::int64_t max_vocab_shard, int tp) {
  return std::max(f32_bytes(rows * max_vocab_shard), Shard::top_k_bytes(rows, hal::kMaxTopK)) *
         static_cast<std::size_t>(tp);
}

}  // namespace

std::uint64_t Shard::step_io_bytes(const ModelOptions& o, const parallel::RankPlan& rp, int tp,
                                        std::int64_t max_vocab_shard) {
  std::uint64_t bytes = 2 * StepInputs(o, rp.ssm_k_heads.size() > 0).bytes;  // device buffer + upload staging
  if (rp.has_lm_head) {
    const std::size_t top = top_k_bytes(o.max_logit_rows, hal::kMaxTopK);
    bytes += top * (tp > 1 ? 1 + static_cast<std::size_t>(tp) : 1);
    if (rp.tp_rank == 0) bytes += readback_bytes(o.max_logit_rows, max_vocab_shard, tp);
  }
  return bytes;
}

std::vector<hal::Op> Shard::step_ops(const model::ModelConfig& c, const parallel::RankPlan& rp,
                                     const parallel::WeightTypes& types, const ModelOptions& o, int tp) {
  std::vector<hal::Op> ops;
  const OpsSite site{c, rp, o, tp};
  if (rp.has_embedding) TokenEmbedding::ops(site, types, ops);
  const Architecture* arch = find_architecture(c.architecture);
  if (rp.layers.size() > 0 && arch != nullptr) {
    ops.emplace_back(hal::RmsNormArgs{{}, {}, {}, {}, site.T(), c.hidden, static_cast<float>(c.rms_eps)});
    // Each kind of layer once (the same blocks in the same formats ask the same).
    std::vector<std::pair<LayerSpec, parallel::LayerWeightTypes>> listed;
    for (std::int64_t l = rp.layers.begin; l < rp.layers.end; ++l) {
      const LayerSpec spec = arch->layer(c, l);
      const parallel::LayerWeightTypes& held = types.layers[static_cast<std::size_t>(l)];
      if (std::find(listed.begin(), listed.end(), std::pair{spec, held}) != listed.end()) continue;
      listed.emplace_back(spec, held);
      if (spec.mixer == Mixer::kGatedDeltaNet) {
        GatedDeltaNet::ops(site, held, ops);
      } else {
        Attention::ops(site, spec.attention, held, ops);
      }
      if (spec.ffn == Ffn::kRoutedExperts) {
        RoutedExperts::ops(site, held, ops);
      } else {
        DenseFfn::ops(site, held, ops);
      }
      if (spec.shared_expert && rp.has_shared_expert) SharedExpert::ops(site, held, ops);
    }
  }
  if (rp.has_lm_head) {
    LogitsHead::ops(site, types, ops);
  } else if (rp.layers.size() > 0) {
    ops.emplace_back(hal::AddArgs{{}, {}, {}, site.T() * c.hidden});
  }
  return ops;
}

struct Shard::Impl {
  ShardContext ctx;
  parallel::RankPlan rp;
  model::ModelConfig config;
  ModelOptions options;
  hal::Device* device = nullptr;
  std::unique_ptr<hal::Stream> stream;
  std::optional<TokenEmbedding> embedding;  // the first stage's, or the last's when the head is tied
  std::optional<LogitsHead> head;           // the last stage's
  std::vector<Layer> layers;                // the stage's layers
  std::vector<std::unique_ptr<hal::Buffer>> k_cache, v_cache;  // each attention layer's
  // Each DeltaNet layer's states: conv [slots][kernel - 1][channels], recurrent [slots][v heads][d][d]
  // (the running slots, then the snapshots).
  std::vector<std::unique_ptr<hal::Buffer>> conv_state, delta_state;
  std::size_t conv_slot_bytes = 0, delta_slot_bytes = 0;
  // Copies slot from -> to of every DeltaNet layer's states (ForwardBatch::restores / snapshots).
  Status copy_states(std::span<const std::pair<std::int32_t, std::int32_t>> copies) {
    for (const auto& [from, to] : copies) {
      const auto f = static_cast<std::size_t>(from), t = static_cast<std::size_t>(to);
      for (std::size_t l = 0; l < conv_state.size(); ++l) {
        SX_RETURN_IF_ERROR(stream->copy(*conv_state[l], t * conv_slot_bytes, *conv_state[l], f * conv_slot_bytes,
                                        conv_slot_bytes));
        SX_RETURN_IF_ERROR(stream->copy(*delta_state[l], t * delta_slot_bytes, *delta_state[l], f * delta_slot_bytes,
                                        delta_slot_bytes));
      }
    }
    return ok_status();
  }
  Workspace ws;
  std::unique_ptr<hal::Buffer> gathered;           // every tp rank's logits (tp > 1)
  std::unique_ptr<hal::Buffer> top, top_gathered;  // candidates of a step that selects on the device
  // The per-step integer inputs: written by the host into `staging`, copied into `inputs`.
  StepInputs in;
  std::unique_ptr<hal::Buffer> staging, inputs;
  // What tp rank 0 of the last stage hands back: logits or candidates of every tp rank.
  std::unique_ptr<hal::Buffer> readback;
  std::size_t result_bytes = 0;  // of readback, after the last step
  hal::BufView input(std::size_t offset) const { return {inputs.get(), offset}; }

  int tp() const { return ctx.plan->tp; }
};

Shard::Shard() : impl_(std::make_unique<Impl>()) {}
Shard::~Shard() = default;

void Shard::abort_channels(const Status& why) {
  if (impl_->ctx.tp != nullptr) impl_->ctx.tp->abort(why);
  if (impl_->ctx.world != nullptr) impl_->ctx.world->abort(why);
}

Result<std::unique_ptr<Shard>> Shard::load(const model::TensorSource& file, const model::ModelConfig& config,
                                           const ShardContext& ctx, const ModelOptions& options) {
  auto shard = std::unique_ptr<Shard>(new Shard());
  Impl& im = *shard->impl_;
  im.ctx = ctx;
  im.rp = ctx.plan->ranks[static_cast<std::size_t>(ctx.rank)];
  im.config = config;
  im.options = options;
  im.device = ctx.device;
  hal::Device& device = *ctx.device;
  SX_ASSIGN_OR_RETURN(const Architecture* arch, architecture_of(config));
  SX_ASSIGN_OR_RETURN(im.stream, device.create_stream());
  hal::Stream& s = *im.stream;
  const parallel::RankPlan& rp = im.rp;
  const std::int64_t hd = config.head_dim, H = config.hidden;

  // Everything a step will ask of the device, asked before anything is uploaded.
  // The formats the rank holds: the file's, or the plan's where it re-quantises (requantize_unaligned).
  SX_ASSIGN_OR_RETURN(parallel::WeightTypes types, parallel::weight_types_from_source(file, config));
  if (ctx.plan->types.layers.size() == types.layers.size()) types = ctx.plan->types;
  for (const hal::Op& op : step_ops(config, rp, types, options, ctx.plan->tp)) {
    if (Status st = device.supports(op); !st.ok()) {
      return Status(st.code(), fmt::format("{} is not supported by this backend{}{}", hal::describe_op(op),
                                           st.message().empty() ? "" : ": ", st.message()));
    }
  }

  for (const parallel::RankPlan& r : ctx.plan->ranks) {
    if (r.has_lm_head) shard->max_vocab_shard_ = std::max(shard->max_vocab_shard_, r.vocab.size());
  }
  Uploader up(file, device, s);
  if (rp.has_embedding || (rp.has_lm_head && config.tied_embeddings)) {
    SX_ASSIGN_OR_RETURN(im.embedding, TokenEmbedding::load(up, rp));
    if (!(rp.has_lm_head && config.tied_embeddings)) shard->embedding_only_bytes_ = im.embedding->table().buffer->size();
  }
  if (rp.has_lm_head) {
    SX_ASSIGN_OR_RETURN(im.head, LogitsHead::load(up, config, rp));
  }
  std::int64_t n_attention = 0, n_recurrent = 0;  // the stage's layers of each kind
  for (std::int64_t l = rp.layers.begin; l < rp.layers.end; ++l) {
    if (options.cancel != nullptr && options.cancel->load(std::memory_order_relaxed)) {
      return cancelled_error("loading {} was cancelled at layer {}", file.path(), l);
    }
    const LayerSpec spec = arch->layer(config, l);
    const BlockSite site{up, config, rp, l, types.layers[static_cast<std::size_t>(l)]};
    Layer L;
    SX_ASSIGN_OR_RETURN(L.attn_norm, up.tensor(model::layer_tensor_name(l, model::LayerTensor::kAttnNorm), true));
    if (spec.mixer == Mixer::kGatedDeltaNet) {
      SX_ASSIGN_OR_RETURN(L.deltanet, GatedDeltaNet::load(site, n_recurrent++));
    } else {
      SX_ASSIGN_OR_RETURN(L.attention, Attention::load(site, spec.attention, n_attention++));
    }
    SX_ASSIGN_OR_RETURN(L.ffn_norm, up.tensor(model::layer_tensor_name(l, spec.ffn_norm), true));
    if (spec.ffn == Ffn::kRoutedExperts) {
      SX_ASSIGN_OR_RETURN(L.experts, RoutedExperts::load(site));
    } else {
      SX_ASSIGN_OR_RETURN(L.dense, DenseFfn::load(site));
    }
    if (spec.shared_expert && rp.has_shared_expert) {
      SX_ASSIGN_OR_RETURN(L.shared, SharedExpert::load(site));
    }
    SX_RETURN_IF_ERROR(require_f32(file, {&L.attn_norm, &L.ffn_norm}));
    im.layers.push_back(std::move(L));
  }
  shard->weight_bytes_ = up.bytes();

  // KV cache for the stage's attention layers and this rank's KV heads.
  const std::int64_t qn = rp.q_heads.size() * hd, kvn = rp.kv_heads.size() * hd;
  const std::int64_t n_slots = options.kv.num_blocks * options.kv.block_size;
  const std::size_t cache_bytes =
      static_cast<std::size_t>(n_slots * kvn) * hal::dtype_info(options.kv.dtype).block_bytes;
  for (std::int64_t l = 0; l < n_attention; ++l) {
    SX_ASSIGN_OR_RETURN(auto kc, alloc_zeroed(device, s, cache_bytes));
    SX_ASSIGN_OR_RETURN(auto vc, alloc_zeroed(device, s, cache_bytes));
    im.k_cache.push_back(std::move(kc));
    im.v_cache.push_back(std::move(vc));
  }
  // The DeltaNet layers' fixed-size states instead, a slot per running sequence.
  const SsmShare share = ssm_share(config, rp);
  const std::int64_t slots = options.total_state_slots(), channels = share.channels();
  im.conv_slot_bytes = f32_bytes((config.ssm_conv_kernel - 1) * channels);
  im.delta_slot_bytes = f32_bytes(share.nv() * share.d * share.d);
  for (std::int64_t l = 0; l < n_recurrent; ++l) {
    SX_ASSIGN_OR_RETURN(auto cs, alloc_zeroed(device, s, static_cast<std::size_t>(slots) * im.conv_slot_bytes));
    SX_ASSIGN_OR_RETURN(auto ds, alloc_zeroed(device, s, static_cast<std::size_t>(slots) * im.delta_slot_bytes));
    im.conv_state.push_back(std::move(cs));
    im.delta_state.push_back(std::move(ds));
  }

  // Workspace for max_batch_tokens.
  Workspace& ws = im.ws;
  const std::int64_t T = options.max_batch_tokens, R = options.max_logit_rows, fn = rp.ffn.size();
  SX_ASSIGN_OR_RETURN(ws.h, device.alloc(f32_bytes(T * H)));
  SX_ASSIGN_OR_RETURN(ws.xn, device.alloc(f32_bytes(T * H)));
  SX_ASSIGN_OR_RETURN(ws.q, device.alloc(f32_bytes(T * std::max<std::int64_t>(qn, 1))));
  SX_ASSIGN_OR_RETURN(ws.k, device.alloc(f32_bytes(T * kvn)));
  SX_ASSIGN_OR_RETURN(ws.v, device.alloc(f32_bytes(T * kvn)));
  SX_ASSIGN_OR_RETURN(ws.attn, device.alloc(f32_bytes(T * std::max<std::int64_t>(qn, 1))));
  if (model::has_qk_norm(config)) {
    SX_ASSIGN_OR_RETURN(ws.q_raw, device.alloc(f32_bytes(T * std::max<std::int64_t>(qn, 1))));
    SX_ASSIGN_OR_RETURN(ws.k_raw, device.alloc(f32_bytes(T * std::max<std::int64_t>(kvn, 1))));
  }
  SX_ASSIGN_OR_RETURN(ws.delta, device.alloc(f32_bytes(T * H)));
  if (config.is_hybrid()) {
    const std::int64_t inner = std::max<std::int64_t>(share.inner(), 1), nv = std::max<std::int64_t>(share.nv(), 1);
    SX_ASSIGN_OR_RETURN(ws.attn_gate, device.alloc(f32_bytes(T * std::max<std::int64_t>(qn, 1))));
    SX_ASSIGN_OR_RETURN(ws.qkv, device.alloc(f32_bytes(T * channels)));
    SX_ASSIGN_OR_RETURN(ws.conv_out, device.alloc(f32_bytes(T * channels)));
    SX_ASSIGN_OR_RETURN(ws.z, device.alloc(f32_bytes(T * inner)));
    SX_ASSIGN_OR_RETURN(ws.alpha, device.alloc(f32_bytes(T * nv)));
    SX_ASSIGN_OR_RETURN(ws.beta, device.alloc(f32_bytes(T * nv)));
    SX_ASSIGN_OR_RETURN(ws.ssm_o, device.alloc(f32_bytes(T * inner)));
  }
  if (rp.has_shared_expert) {
    SX_ASSIGN_OR_RETURN(ws.sh_gate, device.alloc(f32_bytes(T * config.shared_expert_ffn)));
    SX_ASSIGN_OR_RETURN(ws.sh_up, device.alloc(f32_bytes(T * config.shared_expert_ffn)));
    SX_ASSIGN_OR_RETURN(ws.sh_out, device.alloc(f32_bytes(T * H)));
    SX_ASSIGN_OR_RETURN(ws.sh_logit, device.alloc(f32_bytes(T)));
  }
  if (config.is_moe()) {
    SX_ASSIGN_OR_RETURN(ws.router_logits, device.alloc(f32_bytes(T * config.n_experts)));
    SX_ASSIGN_OR_RETURN(ws.expert_ids, device.alloc(i32_bytes(T * config.n_experts_used)));
    SX_ASSIGN_OR_RETURN(ws.expert_weights, device.alloc(f32_bytes(T * config.n_experts_used)));
  } else {
    SX_ASSIGN_OR_RETURN(ws.gate, device.alloc(f32_bytes(T * fn)));
    SX_ASSIGN_OR_RETURN(ws.up, device.alloc(f32_bytes(T * fn)));
  }
  if (rp.has_lm_head) {
    const std::int64_t chunk = R * shard->max_vocab_shard_;
    SX_ASSIGN_OR_RETURN(ws.sel, device.alloc(f32_bytes(R * H)));
    SX_ASSIGN_OR_RETURN(ws.sel_delta, device.alloc(f32_bytes(R * H)));
    SX_ASSIGN_OR_RETURN(ws.sel_norm, device.alloc(f32_bytes(R * H)));
    SX_ASSIGN_OR_RETURN(ws.logits, alloc_zeroed(device, s, f32_bytes(chunk)));  // padding stays zero
    const std::size_t top = top_k_bytes(R, hal::kMaxTopK);  // the largest a step can ask
    SX_ASSIGN_OR_RETURN(im.top, device.alloc(top));
    if (im.tp() > 1) {
      SX_ASSIGN_OR_RETURN(im.gathered, device.alloc(f32_bytes(chunk * im.tp())));
      SX_ASSIGN_OR_RETURN(im.top_gathered, device.alloc(top * static_cast<std::size_t>(im.tp())));
    }
    if (rp.tp_rank == 0) {
      SX_ASSIGN_OR_RETURN(im.readback, device.alloc(readback_bytes(R, shard->max_vocab_shard_, im.tp()),
                                                    hal::BufferUsage::kReadback));
    }
  }
  im.in = StepInputs(options, config.is_hybrid());
  SX_ASSIGN_OR_RETURN(im.staging, device.alloc(im.in.bytes, hal::BufferUsage::kUpload));
  SX_ASSIGN_OR_RETURN(im.inputs, device.alloc(im.in.bytes));
  SX_RETURN_IF_ERROR(s.sync());
  return shard;
}

std::uint64_t Shard::state_slot_bytes() const {
  return impl_->conv_state.size() * (impl_->conv_slot_bytes + impl_->delta_slot_bytes);
}

std::uint64_t Shard::kv_block_bytes() const {
  const Impl& im = *impl_;
  if (im.k_cache.empty()) return 0;
  const std::uint64_t slot = im.k_cache[0]->size() / static_cast<std::uint64_t>(im.options.kv.num_blocks * im.options.kv.block_size);
  return 2 * im.k_cache.size() * slot * static_cast<std::uint64_t>(im.options.kv.block_size);
}

Status Shard::save_blocks(std::span<const std::int32_t> blocks, std::span<std::byte> out) {
  Impl& im = *impl_;
  const std::size_t per = kv_block_bytes() / 2 / std::max<std::size_t>(im.k_cache.size(), 1);  // one layer's K of a block
  std::size_t at = 0;
  for (const std::int32_t b : blocks) {
    for (std::size_t l = 0; l < im.k_cache.size(); ++l) {
      for (const auto* cache : {&im.k_cache, &im.v_cache}) {
        SX_RETURN_IF_ERROR(im.stream->download(out.subspan(at, per), *(*cache)[l], static_cast<std::size_t>(b) * per));
        at += per;
      }
    }
  }
  return im.stream->sync();
}

Status Shard::load_blocks(std::span<const std::int32_t> blocks, std::span<const std::byte> in) {
  Impl& im = *impl_;
  const std::size_t per = kv_block_bytes() / 2 / std::max<std::size_t>(im.k_cache.size(), 1);
  std::size_t at = 0;
  for (const std::int32_t b : blocks) {
    for (std::size_t l = 0; l < im.k_cache.size(); ++l) {
      for (const auto* cache : {&im.k_cache, &im.v_cache}) {
        SX_RETURN_IF_ERROR(im.stream->upload(*(*cache)[l], static_cast<std::size_t>(b) * per, in.subspan(at, per)));
        at += per;
      }
    }
  }
  return im.stream->sync();
}

Status Shard::save_state(std::int32_t slot, std::span<std::byte> out) {
  Impl& im = *impl_;
  const auto s = static_cast<std::size_t>(slot);
  std::size_t at = 0;
  for (std::size_t l = 0; l < im.conv_state.size(); ++l) {
    SX_RETURN_IF_ERROR(im.stream->download(out.subspan(at, im.conv_slot_bytes), *im.conv_state[l], s * im.conv_slot_bytes));
    at += im.conv_slot_bytes;
    SX_RETURN_IF_ERROR(im.stream->download(out.subspan(at, im.delta_slot_bytes), *im.delta_state[l], s * im.delta_slot_bytes));
    at += im.delta_slot_bytes;
  }
  return im.stream->sync();
}

Status Shard::load_state(std::int32_t slot, std::span<const std::byte> in) {
  Impl& im = *impl_;
  const auto s = static_cast<std::size_t>(slot);
  std::size_t at = 0;
  for (std::size_t l = 0; l < im.conv_state.size(); ++l) {
    SX_RETURN_IF_ERROR(im.stream->upload(*im.conv_state[l], s * im.conv_slot_bytes, in.subspan(at, im.conv_slot_bytes)));
    at += im.conv_slot_bytes;
    SX_RETURN_IF_ERROR(im.stream->upload(*im.delta_state[l], s * im.delta_slot_bytes, in.subspan(at, im.delta_slot_bytes)));
    at += im.delta_slot_bytes;
  }
  return im.stream->sync();
}

Status Shard::run(const ForwardBatch& batch, int top_k) {
  impl_->result_bytes = 0;
  Status st = run_step(batch, top_k);
  Status synced = impl_->stream->sync();
  if (!st.ok()) return st;
  return synced;
}

std::span<const std::byte> Shard::result() const {
  if (!impl_->readback) return {};
  return impl_->readback->host().first(impl_->result_bytes);
}

Status Shard::run_step(const ForwardBatch& batch, int top_k) {
  Impl& im = *impl_;
  hal::Stream& s = *im.stream;
  const model::ModelConfig& c = im.config;
  const parallel::RankPlan& rp = im.rp;
  const auto T = static_cast<std::int64_t>(batch.tokens.size());
  const auto n_seqs = static_cast<std::int64_t>(batch.seq_context_len.size());
  const std::int64_t H = c.hidden;
  const float eps = static_cast<float>(c.rms_eps);
  const int tp = im.tp();
  const Workspace& ws = im.ws;
  const auto V = view_of;

  // Per-step integer inputs (every rank gets the batch from the driver: rank 0's choice of tokens),
  // through the staging buffer: the previous step's copies out of it ended at its sync().
  const std::span<std::byte> staging = im.staging->host();
  for (const auto& [offset, values] : {std::pair{im.in.ids, std::span<const std::int32_t>(batch.tokens)},
                                       std::pair{im.in.positions, std::span<const std::int32_t>(batch.positions)},
                                       std::pair{im.in.slots, std::span<const std::int32_t>(batch.slot_mapping)},
                                       std::pair{im.in.seq_start, std::span<const std::int32_t>(batch.seq_token_start)},
                                       std::pair{im.in.seq_ctx, std::span<const std::int32_t>(batch.seq_context_len)},
                                       std::pair{im.in.block_table, std::span<const std::int32_t>(batch.block_table)}}) {
    if (values.empty()) continue;
    std::memcpy(staging.data() + offset, values.data(), values.size_bytes());
    SX_RETURN_IF_ERROR(s.copy(*im.inputs, offset, *im.staging, offset, values.size_bytes()));
  }
  if (c.is_hybrid()) {
    // Each sequence's state slot (sequence s in slot s when the batch names none).
    std::vector<std::int32_t> slots = batch.seq_state_slot;
    if (slots.empty()) {
      for (std::int64_t q = 0; q < n_seqs; ++q) slots.push_back(static_cast<std::int32_t>(q));
    }
    std::memcpy(staging.data() + im.in.state_slot, slots.data(), i32_bytes(n_seqs));
    SX_RETURN_IF_ERROR(s.copy(*im.inputs, im.in.state_slot, *im.staging, im.in.state_slot, i32_bytes(n_seqs)));
  }
  const Step step{s,
                  c,
                  rp,
                  im.options,
                  T,
                  n_seqs,
                  batch.max_blocks_per_seq,
                  {im.input(im.in.ids), im.input(im.in.positions), im.input(im.in.slots), im.input(im.in.seq_start),
                   im.input(im.in.seq_ctx), im.input(im.in.block_table), im.input(im.in.state_slot)}};

  // Sums the row-parallel partial outputs of the stage's ranks.
  auto all_reduce = [&](const std::unique_ptr<hal::Buffer>& b, std::int64_t count) {
    if (tp == 1) return ok_status();
    return im.ctx.tp->all_reduce(s, V(b), count, hal::DType::kF32);
  };

  if (rp.has_embedding) {
    SX_RETURN_IF_ERROR(im.embedding->run(step, ws, tp));
    SX_RETURN_IF_ERROR(all_reduce(ws.h, T * H));
  } else {
    // The previous stage's hidden state, from the rank with the same tp rank.
    SX_RETURN_IF_ERROR(im.ctx.world->recv(s, V(ws.h), f32_bytes(T * H), im.ctx.rank - tp));
  }

  SX_RETURN_IF_ERROR(im.copy_states(batch.restores));
  bool pending_delta = false;  // delta holds an output not yet added to h
  for (const Layer& L : im.layers) {
    // h += delta (the previous layer's FFN output); xn = norm(h).
    SX_RETURN_IF_ERROR(s.run(hal::RmsNormArgs{V(ws.h), pending_delta ? V(ws.delta) : hal::BufView{},
                                              L.attn_norm.view(), V(ws.xn), T, H, eps}));
    if (L.deltanet) {
      const auto st = static_cast<std::size_t>(L.deltanet->state_index());
      SX_RETURN_IF_ERROR(L.deltanet->run(step, ws, V(im.conv_state[st]), V(im.delta_state[st])));
    } else {
      const auto kv = static_cast<std::size_t>(L.attention->kv_index());
      SX_RETURN_IF_ERROR(L.attention->run(step, ws, V(im.k_cache[kv]), V(im.v_cache[kv])));
    }
    SX_RETURN_IF_ERROR(all_reduce(ws.delta, T * H));
    // h += the mixer's output; xn = norm(h).
    SX_RETURN_IF_ERROR(s.run(hal::RmsNormArgs{V(ws.h), V(ws.delta), L.ffn_norm.view(), V(ws.xn), T, H, eps}));
    if (L.experts) {
      SX_RETURN_IF_ERROR(L.experts->run(step, ws));
      if (L.shared) SX_RETURN_IF_ERROR(L.shared->run(step, ws));
    } else {
      SX_RETURN_IF_ERROR(L.dense->run(step, ws));
    }
    SX_RETURN_IF_ERROR(all_reduce(ws.delta, T * H));
    pending_delta = true;
  }
  SX_RETURN_IF_ERROR(im.copy_states(batch.snapshots));

  if (!rp.has_lm_head) {
    // Hand h (with the last delta added) to the next stage.
    if (pending_delta) SX_RETURN_IF_ERROR(s.run(hal::AddArgs{V(ws.h), V(ws.delta), V(ws.h), T * H}));
    return im.ctx.world->send(s, V(ws.h), f32_bytes(T * H), im.ctx.rank + tp);
  }

  // The logits of the rows asked for: this rank's vocab shard.
  const auto R = static_cast<std::int64_t>(batch.logit_rows.size());
  if (R == 0) return ok_status();
  SX_RETURN_IF_ERROR(im.head->run(step, ws, batch.logit_rows, pending_delta,
                                   im.embedding ? &im.embedding->table() : nullptr));
  const std::int64_t vn = rp.vocab.size();
  // This rank's part (its logits, or the candidates of its vocab shard), then every rank's.
  hal::Buffer* part = ws.logits.get();
  hal::Buffer* all = im.gathered.get();
  std::size_t part_bytes = f32_bytes(R * max_vocab_shard_);
  if (top_k > 0) {
    hal::TopKArgs top{V(ws.logits), V(im.top), {im.top.get(), top_k_ids_offset(R, top_k)}, R, vn, top_k, rp.vocab.begin};
    SX_RETURN_IF_ERROR(s.run(top));
    part = im.top.get();
    all = im.top_gathered.get();
    part_bytes = top_k_bytes(R, top_k);
  }
  if (tp > 1) {
    SX_RETURN_IF_ERROR(im.ctx.tp->all_gather(s, {part, 0}, {all, 0}, part_bytes));
    part = all;
  }
  if (rp.tp_rank != 0) return ok_status();
  im.result_bytes = part_bytes * static_cast<std::size_t>(tp);
  return s.copy(*im.readback, 0, *part, 0, im.result_bytes);
}

}  // namespace sx::engine
