// Qwen2 forward on the HAL: weights upload, KV cache, workspace and the per-layer op sequence.
#include "runtime/engine/qwen2_model.h"

#include <algorithm>
#include <cmath>
#include <string>

#include "runtime/model/tensor_names.h"

namespace sx::engine {

namespace {

struct DeviceTensor {
  std::unique_ptr<hal::Buffer> buffer;
  hal::DType type = hal::DType::kF32;
  std::vector<std::int64_t> dims;
  hal::BufView view() const { return {buffer.get(), 0}; }
};

struct Layer {
  DeviceTensor attn_norm, q_w, q_b, k_w, k_b, v_w, v_b, o_w, ffn_norm, gate_w, up_w, down_w;
};

std::size_t f32_bytes(std::int64_t n) { return static_cast<std::size_t>(n) * sizeof(float); }
std::size_t i32_bytes(std::int64_t n) { return static_cast<std::size_t>(n) * sizeof(std::int32_t); }

}  // namespace

struct Qwen2Model::Impl {
  hal::Device* device = nullptr;
  std::unique_ptr<hal::Stream> stream;
  DeviceTensor token_embd, output_norm, output;  // output absent when tied
  std::vector<Layer> layers;
  std::vector<std::unique_ptr<hal::Buffer>> k_cache, v_cache;
  std::int64_t n_slots = 0;
  // Workspace.
  std::unique_ptr<hal::Buffer> h, xn, q, k, v, attn, delta, gate, up, sel, sel_delta, sel_norm, logits;
  std::unique_ptr<hal::Buffer> ids, positions, slots, seq_start, seq_ctx, block_table;
  std::int64_t block_table_capacity = 0;

  const DeviceTensor& lm_head() const { return output.buffer ? output : token_embd; }
};

Qwen2Model::Qwen2Model(model::ModelConfig config, ModelOptions options)
    : config_(std::move(config)), options_(options), impl_(std::make_unique<Impl>()) {}

Qwen2Model::~Qwen2Model() = default;

std::uint64_t Qwen2Model::kv_bytes_per_token() const {
  return static_cast<std::uint64_t>(config_.n_layers) * 2u * static_cast<std::uint64_t>(config_.n_kv_heads) *
         static_cast<std::uint64_t>(config_.head_dim) * hal::dtype_info(options_.kv.dtype).block_bytes;
}

namespace {

Result<DeviceTensor> upload_tensor(const model::GgufFile& file, std::string_view name, hal::Device& device,
                                   hal::Stream& stream, bool required) {
  const model::TensorInfo* info = file.find_tensor(name);
  if (info == nullptr) {
    if (!required) return DeviceTensor{};
    return not_found_error("{}: tensor '{}' is missing", file.path(), name);
  }
  SX_RETURN_IF_ERROR(model::require_supported(*info));
  DeviceTensor t;
  t.type = *info->dtype;
  t.dims = info->dims;
  SX_ASSIGN_OR_RETURN(t.buffer, device.alloc(info->data.size()));
  SX_RETURN_IF_ERROR(stream.upload(*t.buffer, 0, std::as_bytes(info->data)));
  return t;
}

Result<std::unique_ptr<hal::Buffer>> alloc_zeroed(hal::Device& device, hal::Stream& stream, std::size_t bytes) {
  SX_ASSIGN_OR_RETURN(std::unique_ptr<hal::Buffer> b, device.alloc(bytes));
  std::vector<std::byte> zeros(std::min<std::size_t>(bytes, 1 << 20));
  for (std::size_t off = 0; off < bytes; off += zeros.size()) {
    const std::size_t n = std::min(zeros.size(), bytes - off);
    SX_RETURN_IF_ERROR(stream.upload(*b, off, std::span<const std::byte>(zeros.data(), n)));
  }
  return b;
}

}  // namespace

Result<std::unique_ptr<Qwen2Model>> Qwen2Model::load(const model::GgufFile& file, const model::ModelConfig& config,
                                                     hal::Device& device, const ModelOptions& options) {
  if (options.max_batch_tokens <= 0 || options.max_logit_rows <= 0) {
    return invalid_argument_error("model options: max_batch_tokens and max_logit_rows must be positive");
  }
  if (options.kv.block_size <= 0 || options.kv.num_blocks <= 0) {
    return invalid_argument_error("model options: KV cache needs a positive block size and block count");
  }
  SX_RETURN_IF_ERROR(model::check_qwen2_tensors(file, config));
  auto m = std::unique_ptr<Qwen2Model>(new Qwen2Model(config, options));
  Impl& im = *m->impl_;
  im.device = &device;
  SX_ASSIGN_OR_RETURN(im.stream, device.create_stream());
  hal::Stream& s = *im.stream;
  using model::LayerTensor;

  SX_ASSIGN_OR_RETURN(im.token_embd, upload_tensor(file, model::kTokenEmbdName, device, s, true));
  SX_ASSIGN_OR_RETURN(im.output_norm, upload_tensor(file, model::kOutputNormName, device, s, true));
  SX_ASSIGN_OR_RETURN(im.output, upload_tensor(file, model::kOutputName, device, s, !config.tied_embeddings));
  std::uint64_t per_token = hal::row_bytes(im.token_embd.type, config.hidden);
  std::uint64_t total = im.token_embd.buffer->size() + im.output_norm.buffer->size();
  if (im.output.buffer) total += im.output.buffer->size();
  per_token += im.lm_head().buffer->size();
  im.layers.resize(static_cast<std::size_t>(config.n_layers));
  for (std::int64_t l = 0; l < config.n_layers; ++l) {
    Layer& L = im.layers[static_cast<std::size_t>(l)];
    auto name = [&](LayerTensor t) { return model::layer_tensor_name(l, t); };
    SX_ASSIGN_OR_RETURN(L.attn_norm, upload_tensor(file, name(LayerTensor::kAttnNorm), device, s, true));
    SX_ASSIGN_OR_RETURN(L.q_w, upload_tensor(file, name(LayerTensor::kAttnQ), device, s, true));
    SX_ASSIGN_OR_RETURN(L.k_w, upload_tensor(file, name(LayerTensor::kAttnK), device, s, true));
    SX_ASSIGN_OR_RETURN(L.v_w, upload_tensor(file, name(LayerTensor::kAttnV), device, s, true));
    SX_ASSIGN_OR_RETURN(L.q_b, upload_tensor(file, name(LayerTensor::kAttnQBias), device, s, config.qkv_bias));
    SX_ASSIGN_OR_RETURN(L.k_b, upload_tensor(file, name(LayerTensor::kAttnKBias), device, s, config.qkv_bias));
    SX_ASSIGN_OR_RETURN(L.v_b, upload_tensor(file, name(LayerTensor::kAttnVBias), device, s, config.qkv_bias));
    SX_ASSIGN_OR_RETURN(L.o_w, upload_tensor(file, name(LayerTensor::kAttnOutput), device, s, true));
    SX_ASSIGN_OR_RETURN(L.ffn_norm, upload_tensor(file, name(LayerTensor::kFfnNorm), device, s, true));
    SX_ASSIGN_OR_RETURN(L.gate_w, upload_tensor(file, name(LayerTensor::kFfnGate), device, s, true));
    SX_ASSIGN_OR_RETURN(L.up_w, upload_tensor(file, name(LayerTensor::kFfnUp), device, s, true));
    SX_ASSIGN_OR_RETURN(L.down_w, upload_tensor(file, name(LayerTensor::kFfnDown), device, s, true));
    for (const DeviceTensor* t : {&L.attn_norm, &L.q_w, &L.q_b, &L.k_w, &L.k_b, &L.v_w, &L.v_b, &L.o_w, &L.ffn_norm,
                                  &L.gate_w, &L.up_w, &L.down_w}) {
      if (!t->buffer) continue;
      total += t->buffer->size();
      per_token += t->buffer->size();
    }
  }
  m->weight_bytes_ = total;
  m->weight_bytes_per_token_ = per_token;
  for (const DeviceTensor* t : {&im.token_embd, &im.output_norm}) {
    if (t->type == hal::DType::kI32) return invalid_argument_error("{}: integer weights are not valid", file.path());
  }
  for (const Layer& L : im.layers) {
    for (const DeviceTensor* t : {&L.attn_norm, &L.ffn_norm, &L.q_b, &L.k_b, &L.v_b}) {
      if (t->buffer && t->type != hal::DType::kF32) {
        return invalid_argument_error("{}: norm and bias tensors must be f32, found {}", file.path(),
                                      hal::dtype_name(t->type));
      }
    }
  }
  if (im.output_norm.type != hal::DType::kF32) {
    return invalid_argument_error("{}: {} must be f32", file.path(), model::kOutputNormName);
  }

  // KV cache.
  const std::int64_t kv_row = config.n_kv_heads * config.head_dim;
  im.n_slots = options.kv.num_blocks * options.kv.block_size;
  const std::size_t cache_bytes =
      static_cast<std::size_t>(im.n_slots * kv_row) * hal::dtype_info(options.kv.dtype).block_bytes;
  for (std::int64_t l = 0; l < config.n_layers; ++l) {
    SX_ASSIGN_OR_RETURN(auto kc, alloc_zeroed(device, s, cache_bytes));
    SX_ASSIGN_OR_RETURN(auto vc, alloc_zeroed(device, s, cache_bytes));
    im.k_cache.push_back(std::move(kc));
    im.v_cache.push_back(std::move(vc));
  }

  // Workspace for max_batch_tokens.
  const std::int64_t T = options.max_batch_tokens;
  const std::int64_t R = options.max_logit_rows;
  const std::int64_t q_dim = config.n_heads * config.head_dim;
  SX_ASSIGN_OR_RETURN(im.h, device.alloc(f32_bytes(T * config.hidden)));
  SX_ASSIGN_OR_RETURN(im.xn, device.alloc(f32_bytes(T * config.hidden)));
  SX_ASSIGN_OR_RETURN(im.q, device.alloc(f32_bytes(T * q_dim)));
  SX_ASSIGN_OR_RETURN(im.k, device.alloc(f32_bytes(T * kv_row)));
  SX_ASSIGN_OR_RETURN(im.v, device.alloc(f32_bytes(T * kv_row)));
  SX_ASSIGN_OR_RETURN(im.attn, device.alloc(f32_bytes(T * q_dim)));
  SX_ASSIGN_OR_RETURN(im.delta, device.alloc(f32_bytes(T * config.hidden)));
  SX_ASSIGN_OR_RETURN(im.gate, device.alloc(f32_bytes(T * config.ffn)));
  SX_ASSIGN_OR_RETURN(im.up, device.alloc(f32_bytes(T * config.ffn)));
  SX_ASSIGN_OR_RETURN(im.sel, device.alloc(f32_bytes(R * config.hidden)));
  SX_ASSIGN_OR_RETURN(im.sel_delta, device.alloc(f32_bytes(R * config.hidden)));
  SX_ASSIGN_OR_RETURN(im.sel_norm, device.alloc(f32_bytes(R * config.hidden)));
  SX_ASSIGN_OR_RETURN(im.logits, device.alloc(f32_bytes(R * config.vocab)));
  SX_ASSIGN_OR_RETURN(im.ids, device.alloc(i32_bytes(T)));
  SX_ASSIGN_OR_RETURN(im.positions, device.alloc(i32_bytes(T)));
  SX_ASSIGN_OR_RETURN(im.slots, device.alloc(i32_bytes(T)));
  SX_ASSIGN_OR_RETURN(im.seq_start, device.alloc(i32_bytes(T + 1)));
  SX_ASSIGN_OR_RETURN(im.seq_ctx, device.alloc(i32_bytes(T)));
  SX_RETURN_IF_ERROR(s.sync());
  return m;
}

Status Qwen2Model::forward(const ForwardBatch& batch, std::vector<float>& logits) {
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
  for (std::int32_t slot : batch.slot_mapping) {
    if (slot >= impl_->n_slots) {
      return out_of_range_error("forward: KV slot {} is outside the cache of {} slots", slot, impl_->n_slots);
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
  Status st = run_step(batch, logits);
  Status synced = impl_->stream->sync();
  if (!st.ok()) return st;
  return synced;
}

Status Qwen2Model::run_step(const ForwardBatch& batch, std::vector<float>& logits) {
  Impl& im = *impl_;
  hal::Stream& s = *im.stream;
  const model::ModelConfig& c = config_;
  const auto T = static_cast<std::int64_t>(batch.tokens.size());
  const auto n_seqs = static_cast<std::int64_t>(batch.seq_context_len.size());
  const std::int64_t H = c.hidden, hd = c.head_dim, q_dim = c.n_heads * hd, kv_dim = c.n_kv_heads * hd;
  const float eps = static_cast<float>(c.rms_eps);

  // Per-step integer inputs.
  const std::size_t bt_bytes = i32_bytes(static_cast<std::int64_t>(batch.block_table.size()));
  if (!im.block_table || im.block_table->size() < bt_bytes) {
    SX_ASSIGN_OR_RETURN(im.block_table, im.device->alloc(std::max<std::size_t>(bt_bytes, 64)));
  }
  SX_RETURN_IF_ERROR(hal::upload_span<std::int32_t>(s, *im.ids, 0, batch.tokens));
  SX_RETURN_IF_ERROR(hal::upload_span<std::int32_t>(s, *im.positions, 0, batch.positions));
  SX_RETURN_IF_ERROR(hal::upload_span<std::int32_t>(s, *im.slots, 0, batch.slot_mapping));
  SX_RETURN_IF_ERROR(hal::upload_span<std::int32_t>(s, *im.seq_start, 0, batch.seq_token_start));
  SX_RETURN_IF_ERROR(hal::upload_span<std::int32_t>(s, *im.seq_ctx, 0, batch.seq_context_len));
  SX_RETURN_IF_ERROR(hal::upload_span<std::int32_t>(s, *im.block_table, 0, batch.block_table));

  auto V = [](const std::unique_ptr<hal::Buffer>& b) { return hal::BufView{b.get(), 0}; };
  auto matmul = [&](const DeviceTensor& w, const DeviceTensor* bias, hal::BufView x, hal::BufView y, std::int64_t m,
                    std::int64_t n, std::int64_t k) {
    hal::MatmulArgs a;
    a.w = w.view();
    a.w_type = w.type;
    a.x = x;
    if (bias != nullptr && bias->buffer) a.bias = bias->view();
    a.y = y;
    a.m = m;
    a.n = n;
    a.k = k;
    return s.run(a);
  };

  SX_RETURN_IF_ERROR(s.run(hal::EmbeddingArgs{im.token_embd.view(), im.token_embd.type, V(im.ids), V(im.h), T, H, c.vocab}));

  for (std::int64_t l = 0; l < c.n_layers; ++l) {
    const Layer& L = im.layers[static_cast<std::size_t>(l)];
    // h += delta (the previous layer's MLP output); xn = norm(h).
    hal::RmsNormArgs n1{V(im.h), l == 0 ? hal::BufView{} : V(im.delta), L.attn_norm.view(), V(im.xn), T, H, eps};
    SX_RETURN_IF_ERROR(s.run(n1));
    SX_RETURN_IF_ERROR(matmul(L.q_w, &L.q_b, V(im.xn), V(im.q), T, q_dim, H));
    SX_RETURN_IF_ERROR(matmul(L.k_w, &L.k_b, V(im.xn), V(im.k), T, kv_dim, H));
    SX_RETURN_IF_ERROR(matmul(L.v_w, &L.v_b, V(im.xn), V(im.v), T, kv_dim, H));
    const auto theta = static_cast<float>(c.rope_theta);
    SX_RETURN_IF_ERROR(s.run(hal::RopeArgs{V(im.q), V(im.positions), T, c.n_heads, hd, hd, theta}));
    SX_RETURN_IF_ERROR(s.run(hal::RopeArgs{V(im.k), V(im.positions), T, c.n_kv_heads, hd, hd, theta}));
    hal::KvWriteArgs kw;
    kw.k = V(im.k);
    kw.v = V(im.v);
    kw.k_cache = V(im.k_cache[static_cast<std::size_t>(l)]);
    kw.v_cache = V(im.v_cache[static_cast<std::size_t>(l)]);
    kw.cache_type = options_.kv.dtype;
    kw.slot_mapping = V(im.slots);
    kw.n_tokens = T;
    kw.n_kv_heads = c.n_kv_heads;
    kw.head_dim = hd;
    kw.n_slots = im.n_slots;
    SX_RETURN_IF_ERROR(s.run(kw));
    hal::AttentionArgs at;
    at.q = V(im.q);
    at.k_cache = kw.k_cache;
    at.v_cache = kw.v_cache;
    at.cache_type = options_.kv.dtype;
    at.out = V(im.attn);
    at.seq_token_start = V(im.seq_start);
    at.seq_context_len = V(im.seq_ctx);
    at.block_table = V(im.block_table);
    at.n_seqs = n_seqs;
    at.n_tokens = T;
    at.n_heads = c.n_heads;
    at.n_kv_heads = c.n_kv_heads;
    at.head_dim = hd;
    at.block_size = options_.kv.block_size;
    at.max_blocks_per_seq = batch.max_blocks_per_seq;
    at.n_slots = im.n_slots;
    at.heads_per_kv = c.n_heads / c.n_kv_heads;
    at.scale = 1.0f / std::sqrt(static_cast<float>(hd));
    SX_RETURN_IF_ERROR(s.run(at));
    SX_RETURN_IF_ERROR(matmul(L.o_w, nullptr, V(im.attn), V(im.delta), T, H, q_dim));
    // h += attention output; xn = norm(h).
    SX_RETURN_IF_ERROR(s.run(hal::RmsNormArgs{V(im.h), V(im.delta), L.ffn_norm.view(), V(im.xn), T, H, eps}));
    SX_RETURN_IF_ERROR(matmul(L.gate_w, nullptr, V(im.xn), V(im.gate), T, c.ffn, H));
    SX_RETURN_IF_ERROR(matmul(L.up_w, nullptr, V(im.xn), V(im.up), T, c.ffn, H));
    SX_RETURN_IF_ERROR(s.run(hal::SiluMulArgs{V(im.gate), V(im.up), V(im.gate), T, c.ffn, 0, 0, 0}));
    SX_RETURN_IF_ERROR(matmul(L.down_w, nullptr, V(im.gate), V(im.delta), T, H, c.ffn));
  }

  // Gather the rows that need logits, then final norm (with the last residual add) and LM head.
  const auto R = static_cast<std::int64_t>(batch.logit_rows.size());
  logits.assign(static_cast<std::size_t>(R * c.vocab), 0.0f);
  if (R == 0) return ok_status();
  for (std::int64_t i = 0; i < R; ++i) {
    const auto row = static_cast<std::size_t>(batch.logit_rows[static_cast<std::size_t>(i)]);
    SX_RETURN_IF_ERROR(s.copy(*im.sel, f32_bytes(i * H), *im.h, row * f32_bytes(H), f32_bytes(H)));
    SX_RETURN_IF_ERROR(s.copy(*im.sel_delta, f32_bytes(i * H), *im.delta, row * f32_bytes(H), f32_bytes(H)));
  }
  // sel += last delta; sel_norm = norm(sel).
  SX_RETURN_IF_ERROR(s.run(hal::RmsNormArgs{V(im.sel), V(im.sel_delta), im.output_norm.view(), V(im.sel_norm), R, H, eps}));
  SX_RETURN_IF_ERROR(matmul(im.lm_head(), nullptr, V(im.sel_norm), V(im.logits), R, c.vocab, H));
  return hal::download_span<float>(s, std::span<float>(logits), *im.logits, 0);
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
