// One rank's weights, KV cache, workspace and per-step op sequence (see qwen2_shard.h).
#include "runtime/engine/qwen2_shard.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <optional>
#include <string>
#include <vector>

#include "runtime/model/tensor_names.h"

namespace sx::engine {

namespace {

struct DeviceTensor {
  std::unique_ptr<hal::Buffer> buffer;
  hal::DType type = hal::DType::kF32;
  hal::BufView view() const { return {buffer.get(), 0}; }
  explicit operator bool() const { return buffer != nullptr; }
};

struct Layer {
  DeviceTensor attn_norm, q_w, q_b, k_w, k_b, v_w, v_b, o_w, ffn_norm, gate_w, up_w, down_w;
  DeviceTensor q_norm, k_norm;  // qwen3: every query / key head RMS-normalised before rope
  // A mixture of experts: the router (whole on every rank) and the rank's experts, stacked.
  DeviceTensor router, gate_exps, up_exps, down_exps;
  // A hybrid (qwen35*): ffn_norm holds post_attention_norm. Attention layers: q_gate, the gate half
  // of attn_q ([query | gate] per head), scales the attention output by its sigmoid. DeltaNet
  // layers (recurrent): their projections, conv, decay and norm; state_index names their states.
  bool recurrent = false;
  std::int64_t kv_index = -1, state_index = -1;
  DeviceTensor q_gate;
  DeviceTensor qkv_w, z_w, alpha_w, beta_w, ssm_out_w, conv_w, ssm_a, dt_bias, ssm_norm;
  // A shared expert (qwen35moe) and its gate's row.
  DeviceTensor sh_router, sh_gate, sh_up, sh_down;
};

std::size_t f32_bytes(std::int64_t n) { return static_cast<std::size_t>(n) * sizeof(float); }
std::size_t i32_bytes(std::int64_t n) { return static_cast<std::size_t>(n) * sizeof(std::int32_t); }

// Uploads rows [row0, row0 + rows) x columns [col0, col0 + cols) of a 2-D tensor (ne[0] = columns)
// or elements [row0, row0 + rows) of a 1-D one. Whole rows are one contiguous upload; a column
// slice is gathered on the host first (and synced before the gather buffer goes away). A matrix
// asked for `as` another format (the plan's re-quantised o / down: ShardPlan::types) is
// dequantised block by block over the slice's columns and quantised to it on the host.
class Uploader {
 public:
  Uploader(const model::TensorSource& file, hal::Device& device, hal::Stream& stream)
      : file_(file), device_(device), stream_(stream) {}

  std::uint64_t bytes() const { return bytes_; }

  // A 2-D tensor of the file in a format the loader reads.
  Result<const model::TensorInfo*> matrix(std::string_view name) const {
    const model::TensorInfo* info = file_.find_tensor(name);
    if (info == nullptr) return not_found_error("{}: tensor '{}' is missing", file_.path(), name);
    SX_RETURN_IF_ERROR(model::require_supported(*info));
    if (info->dims.size() != 2) return internal_error("{}: '{}' is not a matrix", file_.path(), name);
    return info;
  }

  // The rows of a matrix given as [row0, row0 + rows) ranges, one after another, as one weight
  // (every format: rows are whole).
  Result<DeviceTensor> rows_of(std::string_view name, const std::vector<std::pair<std::int64_t, std::int64_t>>& ranges) {
    SX_ASSIGN_OR_RETURN(const model::TensorInfo* info, matrix(name));
    DeviceTensor t;
    t.type = *info->dtype;
    const std::int64_t width = info->dims[0], height = info->dims[1];
    const std::size_t row = hal::row_bytes(t.type, width);
    std::vector<std::byte> gathered;
    std::int64_t total = 0;
    const std::byte* base = reinterpret_cast<const std::byte*>(info->data.data());
    for (const auto& [row0, rows] : ranges) {
      if (row0 < 0 || rows < 0 || row0 + rows > height) {
        return internal_error("{}: rows [{}, {}) are outside '{}' ({} rows)", file_.path(), row0, row0 + rows, name,
                              height);
      }
      gathered.insert(gathered.end(), base + row * static_cast<std::size_t>(row0),
                      base + row * static_cast<std::size_t>(row0 + rows));
      total += rows;
    }
    SX_ASSIGN_OR_RETURN(t.buffer, device_.upload_weight(stream_, hal::WeightDesc{t.type, total, width},
                                                        {gathered.data(), gathered.size()}));
    SX_RETURN_IF_ERROR(stream_.sync());  // the upload reads `gathered`
    bytes_ += t.buffer->size();
    return t;
  }

  // The columns of a matrix given as [col0, col0 + cols) ranges, side by side in each row, as one
  // weight: each range whole blocks of the format.
  Result<DeviceTensor> cols_of(std::string_view name, const std::vector<std::pair<std::int64_t, std::int64_t>>& ranges) {
    SX_ASSIGN_OR_RETURN(const model::TensorInfo* info, matrix(name));
    DeviceTensor t;
    t.type = *info->dtype;
    const std::int64_t width = info->dims[0], height = info->dims[1], block = hal::dtype_info(t.type).block_elems;
    std::int64_t total = 0;
    for (const auto& [col0, cols] : ranges) {
      if (col0 < 0 || cols < 0 || col0 + cols > width || col0 % block != 0 || cols % block != 0) {
        return invalid_argument_error("{}: columns [{}, {}) of '{}' ({} wide) do not fall on {} block boundaries",
                                      file_.path(), col0, col0 + cols, name, width, hal::dtype_name(t.type));
      }
      total += cols;
    }
    const std::size_t full_row = hal::row_bytes(t.type, width);
    const std::byte* base = reinterpret_cast<const std::byte*>(info->data.data());
    std::vector<std::byte> gathered;
    gathered.reserve(hal::tensor_bytes(t.type, height, total));
    for (std::int64_t r = 0; r < height; ++r) {
      const std::byte* row = base + full_row * static_cast<std::size_t>(r);
      for (const auto& [col0, cols] : ranges) {
        const std::byte* from = row + hal::row_bytes(t.type, col0);
        gathered.insert(gathered.end(), from, from + hal::row_bytes(t.type, cols));
      }
    }
    SX_ASSIGN_OR_RETURN(t.buffer, device_.upload_weight(stream_, hal::WeightDesc{t.type, height, total},
                                                        {gathered.data(), gathered.size()}));
    SX_RETURN_IF_ERROR(stream_.sync());  // the upload reads `gathered`
    bytes_ += t.buffer->size();
    return t;
  }

  // A small tensor the ops read as plain F32 (a conv's taps, decay rates, norms): converted from
  // F16 / BF16 on the host; `rows`, when given, the [row0, row0 + n) ranges of its rows (elements
  // of a vector) to take, one after another; `as_row` uploads a vector as a one-row matrix (for
  // matmul).
  Result<DeviceTensor> f32(std::string_view name, bool as_row = false,
                           const std::vector<std::pair<std::int64_t, std::int64_t>>& rows = {}) {
    const model::TensorInfo* info = file_.find_tensor(name);
    if (info == nullptr) return not_found_error("{}: tensor '{}' is missing", file_.path(), name);
    SX_RETURN_IF_ERROR(model::require_supported(*info));
    const hal::DType from = *info->dtype;
    if (from != hal::DType::kF32 && from != hal::DType::kF16 && from != hal::DType::kBF16) {
      return invalid_argument_error("{}: '{}' is {}; it must be f32, f16 or bf16", file_.path(), name,
                                    hal::dtype_name(from));
    }
    const std::int64_t all = info->n_elements, width = info->dims.size() >= 2 ? info->dims[0] : 1;
    std::vector<float> whole(static_cast<std::size_t>(all));
    const std::byte* base = reinterpret_cast<const std::byte*>(info->data.data());
    const std::int64_t row_len = info->dims[0];
    for (std::int64_t r = 0; r < all / row_len; ++r) {
      hal::dequantize_row(from, base + hal::row_bytes(from, row_len) * static_cast<std::size_t>(r),
                          whole.data() + r * row_len, row_len);
    }
    std::vector<float> values;
    if (rows.empty()) {
      values = std::move(whole);
    } else {
      for (const auto& [row0, n_rows] : rows) {
        if (row0 < 0 || n_rows < 0 || (row0 + n_rows) * width > all) {
          return internal_error("{}: rows [{}, {}) are outside '{}'", file_.path(), row0, row0 + n_rows, name);
        }
        values.insert(values.end(), whole.begin() + row0 * width, whole.begin() + (row0 + n_rows) * width);
      }
    }
    const auto n = static_cast<std::int64_t>(values.size());
    const std::span<const std::byte> bytes = std::as_bytes(std::span<const float>(values));
    DeviceTensor t;
    if (as_row) {
      SX_ASSIGN_OR_RETURN(t.buffer, device_.upload_weight(stream_, hal::WeightDesc{hal::DType::kF32, 1, n}, bytes));
    } else {
      SX_ASSIGN_OR_RETURN(t.buffer, device_.alloc(bytes.size()));
      SX_RETURN_IF_ERROR(stream_.upload(*t.buffer, 0, bytes));
    }
    SX_RETURN_IF_ERROR(stream_.sync());  // the upload reads `values`
    bytes_ += t.buffer->size();
    return t;
  }

  Result<DeviceTensor> tensor(std::string_view name, bool required, std::int64_t row0 = 0, std::int64_t rows = -1,
                              std::int64_t col0 = 0, std::int64_t cols = -1,
                              std::optional<hal::DType> as = std::nullopt) {
    const model::TensorInfo* info = file_.find_tensor(name);
    if (info == nullptr) {
      if (!required) return DeviceTensor{};
      return not_found_error("{}: tensor '{}' is missing", file_.path(), name);
    }
    SX_RETURN_IF_ERROR(model::require_supported(*info));
    DeviceTensor t;
    t.type = *info->dtype;
    // A 3-D tensor (stacked experts) is its experts' matrices one after another: rows of all.
    const std::int64_t width = info->dims.size() >= 2 ? info->dims[0] : 1;
    std::int64_t height = info->dims.size() >= 2 ? info->dims[1] : info->dims[0];
    for (std::size_t d = 2; d < info->dims.size(); ++d) height *= info->dims[d];
    if (rows < 0) rows = height;
    if (cols < 0) cols = width;
    if (row0 < 0 || row0 + rows > height || col0 < 0 || col0 + cols > width) {
      return internal_error("{}: slice rows [{}, {}) x cols [{}, {}) is outside '{}' ({} x {})", file_.path(), row0,
                            row0 + rows, col0, col0 + cols, name, height, width);
    }
    if (as && *as != t.type) return requantized(*info, name, *as, row0, rows, col0, cols, width);
    const int block = hal::dtype_info(t.type).block_elems;
    if (col0 % block != 0 || cols % block != 0) {
      return invalid_argument_error("{}: columns [{}, {}) of '{}' do not fall on {} block boundaries", file_.path(),
                                    col0, col0 + cols, name, hal::dtype_name(t.type));
    }
    const std::size_t full_row = hal::row_bytes(t.type, width);
    const std::size_t slice_row = hal::row_bytes(t.type, cols);
    const std::byte* base = reinterpret_cast<const std::byte*>(info->data.data());
    // The slice's rows, contiguous: in the file itself when whole rows are taken, else gathered.
    std::vector<std::byte> gathered;
    const std::byte* rows_data = base + full_row * static_cast<std::size_t>(row0);
    if (cols != width) {
      gathered.resize(slice_row * static_cast<std::size_t>(rows));
      const std::size_t col_off = hal::row_bytes(t.type, col0);
      for (std::int64_t r = 0; r < rows; ++r) {
        std::memcpy(gathered.data() + slice_row * static_cast<std::size_t>(r),
                    base + full_row * static_cast<std::size_t>(row0 + r) + col_off, slice_row);
      }
      rows_data = gathered.data();
    }
    const std::size_t bytes = hal::tensor_bytes(t.type, rows, cols);
    if (info->dims.size() >= 2) {
      // A matrix: the device keeps it in its own layout (hal::Device::upload_weight); stacked experts
      // are taken one at a time.
      const hal::WeightDesc desc{t.type, rows, cols, info->dims.size() >= 3 ? info->dims[1] : 0};
      SX_ASSIGN_OR_RETURN(t.buffer, device_.upload_weight(stream_, desc, {rows_data, bytes}));
    } else {
      SX_ASSIGN_OR_RETURN(t.buffer, device_.alloc(bytes));
      SX_RETURN_IF_ERROR(stream_.upload(*t.buffer, 0, {rows_data, bytes}));
    }
    // The upload reads host memory of this scope until then (the file's mapping needs no wait).
    if (rows_data != base + full_row * static_cast<std::size_t>(row0)) SX_RETURN_IF_ERROR(stream_.sync());
    bytes_ += t.buffer->size();
    return t;
  }

 private:
  Result<DeviceTensor> requantized(const model::TensorInfo& info, std::string_view name, hal::DType as,
                                   std::int64_t row0, std::int64_t rows, std::int64_t col0, std::int64_t cols,
                                   std::int64_t width) {
    const hal::DType from = *info.dtype;
    const std::int64_t in_block = hal::dtype_info(from).block_elems, out_block = hal::dtype_info(as).block_elems;
    if (info.dims.size() < 2 || !hal::can_dequantize(from) || !hal::can_quantize(as) || col0 % out_block != 0 ||
        cols % out_block != 0) {
      return invalid_argument_error("{}: '{}' ({}) cannot be re-quantised to {} over columns [{}, {})", file_.path(),
                                    name, hal::dtype_name(from), hal::dtype_name(as), col0, col0 + cols);
    }
    // The file's blocks that cover the slice, dequantised a row at a time, the slice quantised.
    const std::int64_t b0 = col0 / in_block * in_block;
    const std::int64_t b1 = std::min(width, (col0 + cols + in_block - 1) / in_block * in_block);
    const std::size_t full_row = hal::row_bytes(from, width), out_row = hal::row_bytes(as, cols);
    const std::byte* base = reinterpret_cast<const std::byte*>(info.data.data());
    std::vector<float> wide(static_cast<std::size_t>(b1 - b0));
    std::vector<std::byte> out(out_row * static_cast<std::size_t>(rows));
    for (std::int64_t r = 0; r < rows; ++r) {
      const std::byte* src = base + full_row * static_cast<std::size_t>(row0 + r) + hal::row_bytes(from, b0);
      hal::dequantize_row(from, src, wide.data(), b1 - b0);
      hal::quantize_row(as, wide.data() + (col0 - b0), out.data() + out_row * static_cast<std::size_t>(r), cols);
    }
    DeviceTensor t;
    t.type = as;
    SX_ASSIGN_OR_RETURN(t.buffer, device_.upload_weight(stream_, hal::WeightDesc{as, rows, cols}, {out.data(), out.size()}));
    SX_RETURN_IF_ERROR(stream_.sync());  // the upload reads `out`
    bytes_ += t.buffer->size();
    return t;
  }

  const model::TensorSource& file_;
  hal::Device& device_;
  hal::Stream& stream_;
  std::uint64_t bytes_ = 0;
};

Result<std::unique_ptr<hal::Buffer>> alloc_zeroed(hal::Device& device, hal::Stream& stream, std::size_t bytes) {
  SX_ASSIGN_OR_RETURN(std::unique_ptr<hal::Buffer> b, device.alloc(bytes));
  SX_RETURN_IF_ERROR(stream.fill(*b, 0, bytes, 0));
  return b;
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

// The KV write and the attention of a step of T tokens in n_seqs sequences (buffers unset): the
// same for the step and for step_ops.
hal::KvWriteArgs kv_write_args(const ModelOptions& o, const parallel::RankPlan& rp, std::int64_t head_dim,
                               std::int64_t T) {
  hal::KvWriteArgs kw;
  kw.cache_type = o.kv.dtype;
  kw.n_tokens = T;
  kw.n_kv_heads = rp.kv_heads.size();
  kw.head_dim = head_dim;
  kw.n_slots = o.kv.num_blocks * o.kv.block_size;
  return kw;
}

hal::AttentionArgs attention_args(const model::ModelConfig& c, const ModelOptions& o, const parallel::RankPlan& rp,
                                  std::int64_t T, std::int64_t n_seqs, std::int64_t max_blocks_per_seq) {
  hal::AttentionArgs at;
  at.cache_type = o.kv.dtype;
  at.n_seqs = n_seqs;
  at.n_tokens = T;
  at.n_heads = rp.q_heads.size();
  at.n_kv_heads = rp.kv_heads.size();
  at.head_dim = c.head_dim;
  at.block_size = o.kv.block_size;
  at.max_blocks_per_seq = max_blocks_per_seq;
  at.n_slots = o.kv.num_blocks * o.kv.block_size;
  at.q_head_offset = rp.q_heads.begin;
  at.kv_head_offset = rp.kv_heads.begin;
  at.heads_per_kv = c.n_heads / c.n_kv_heads;
  at.scale = 1.0f / std::sqrt(static_cast<float>(c.head_dim));
  return at;
}

// The experts' FFN of a step of T tokens on rank `rp` (buffers unset): the same for the step and
// for step_ops.
hal::MoeFfnArgs moe_ffn_args(const model::ModelConfig& c, const parallel::RankPlan& rp,
                             const parallel::LayerWeightTypes& w, std::int64_t T) {
  hal::MoeFfnArgs m;
  m.gate_type = w.gate;
  m.up_type = w.up;
  m.down_type = w.down;
  m.n_tokens = T;
  m.dim = c.hidden;
  m.ffn = c.expert_ffn;
  m.k = c.n_experts_used;
  m.expert_begin = rp.experts.begin;
  m.n_local = rp.experts.size();
  return m;
}

// The rotated dims of an attention head (Qwen3.5 rotates a quarter).
std::int64_t rot_dim_of(const model::ModelConfig& c) { return c.rot_dim > 0 ? c.rot_dim : c.head_dim; }

// A rank's share of a hybrid's DeltaNet layers: K heads [k0, k0 + nk) of nk_all with the V heads
// that read them, all of d dims. Tiled files (GGUF; V head j reads K head j % nk_all): in each of
// the `groups` groups of nk_all V heads, the nk with them; locally they stay tiled (group-major),
// so local V head j reads local K head j % nk. Grouped files (Hugging Face; V head j reads K head
// j / groups): the one run of V heads [k0 * groups, (k0 + nk) * groups), still grouped locally.
struct SsmShare {
  std::int64_t k0 = 0, nk = 0, nk_all = 0, groups = 1, d = 0;
  bool grouped = false;
  std::int64_t nv() const { return nk * groups; }
  std::int64_t channels() const { return (2 * nk + nv()) * d; }
  std::int64_t inner() const { return nv() * d; }
  using Ranges = std::vector<std::pair<std::int64_t, std::int64_t>>;
  // The held V heads' [first, count) in units of `per_head` (d for rows of v / z / ssm_out's
  // columns, 1 for alpha / beta / a / dt), after `offset` units.
  Ranges v(std::int64_t per_head, std::int64_t offset = 0) const {
    if (grouped) return {{offset + k0 * groups * per_head, nk * groups * per_head}};
    Ranges r;
    for (std::int64_t m = 0; m < groups; ++m) r.emplace_back(offset + (m * nk_all + k0) * per_head, nk * per_head);
    return r;
  }
  // The q|k|v channels held (rows of attn_qkv and ssm_conv1d).
  Ranges channel_ranges() const {
    Ranges r = {{k0 * d, nk * d}, {(nk_all + k0) * d, nk * d}};
    for (const auto& range : v(d, 2 * nk_all * d)) r.push_back(range);
    return r;
  }
};

SsmShare ssm_share(const model::ModelConfig& c, const parallel::RankPlan& rp) {
  SsmShare s;
  if (!c.is_hybrid()) return s;
  s.k0 = rp.ssm_k_heads.begin;
  s.nk = rp.ssm_k_heads.size();
  s.nk_all = c.ssm_k_heads;
  s.groups = c.ssm_v_heads / c.ssm_k_heads;
  s.d = c.ssm_head_dim;
  s.grouped = c.ssm_v_grouped;
  return s;
}

// Every step runs the delta rule in its recurrent form, a token at a time: a sequence's state after
// position p is then the same bits however its tokens were split into steps (prefill chunks of any
// size, decodes batched beside a prefill or alone, a preempted sequence computed again), which the
// chunked form cannot give when a step boundary falls inside one of its chunks (issue 53: greedy
// answers of a hybrid changed under load). The work is the same in both forms (3 d_k d_v
// multiply-adds per token and V head); the chunked one only reads the state once per chunk.
constexpr std::int64_t kDeltaChunk = 0;

// A DeltaNet layer's conv and delta rule over a step of T tokens in n_seqs sequences (buffers
// unset; the whole layer on one rank): the same for the step and for step_ops.
hal::ConvStateArgs conv_state_args(const model::ModelConfig& c, const SsmShare& share, const ModelOptions& o,
                                   std::int64_t T, std::int64_t n_seqs) {
  hal::ConvStateArgs a;
  a.n_seqs = n_seqs;
  a.n_tokens = T;
  a.channels = share.channels();
  a.kernel = c.ssm_conv_kernel;
  a.n_slots = o.state_slots();
  return a;
}

hal::DeltaRuleArgs delta_rule_args(const model::ModelConfig& c, const SsmShare& share, const ModelOptions& o,
                                   std::int64_t T, std::int64_t n_seqs, std::int64_t chunk) {
  hal::DeltaRuleArgs a;
  a.n_seqs = n_seqs;
  a.n_tokens = T;
  a.n_k_heads = share.nk;
  a.n_v_heads = share.nv();
  a.d_k = a.d_v = c.ssm_head_dim;
  a.n_slots = o.state_slots();
  a.chunk = chunk;
  a.tiled = !c.ssm_v_grouped;  // llama.cpp's GGUF order of V heads, or Hugging Face's
  a.eps = static_cast<float>(c.rms_eps);
  a.scale = 1.0f / std::sqrt(static_cast<float>(c.ssm_head_dim));
  return a;
}

}  // namespace

std::size_t Qwen2Shard::top_k_ids_offset(std::int64_t rows, std::int64_t k) {
  return (f32_bytes(rows * k) + 255) / 256 * 256;
}
std::size_t Qwen2Shard::top_k_bytes(std::int64_t rows, std::int64_t k) {
  return top_k_ids_offset(rows, k) + i32_bytes(rows * k);
}

namespace {

// The readback buffer of the last stage's tp rank 0: every rank's logit rows, or every rank's
// top-k candidates, whichever is larger.
std::size_t readback_bytes(std::int64_t rows, std::int64_t max_vocab_shard, int tp) {
  return std::max(f32_bytes(rows * max_vocab_shard), Qwen2Shard::top_k_bytes(rows, hal::kMaxTopK)) *
         static_cast<std::size_t>(tp);
}

}  // namespace

std::uint64_t Qwen2Shard::step_io_bytes(const ModelOptions& o, const parallel::RankPlan& rp, int tp,
                                        std::int64_t max_vocab_shard) {
  std::uint64_t bytes = 2 * StepInputs(o, rp.ssm_k_heads.size() > 0).bytes;  // device buffer + upload staging
  if (rp.has_lm_head) {
    const std::size_t top = top_k_bytes(o.max_logit_rows, hal::kMaxTopK);
    bytes += top * (tp > 1 ? 1 + static_cast<std::size_t>(tp) : 1);
    if (rp.tp_rank == 0) bytes += readback_bytes(o.max_logit_rows, max_vocab_shard, tp);
  }
  return bytes;
}

std::vector<hal::Op> Qwen2Shard::step_ops(const model::ModelConfig& c, const parallel::RankPlan& rp,
                                          const parallel::WeightTypes& types, const ModelOptions& o, int tp) {
  const std::int64_t T = o.max_batch_tokens, R = o.max_logit_rows, H = c.hidden, hd = c.head_dim;
  const std::int64_t nq = rp.q_heads.size(), nkv = rp.kv_heads.size(), nf = rp.ffn.size(), vn = rp.vocab.size();
  std::vector<hal::Op> ops;
  auto matmul = [&](hal::DType w, std::int64_t m, std::int64_t n, std::int64_t k) {
    hal::MatmulArgs a;
    a.w_type = w;
    a.m = m;
    a.n = n;
    a.k = k;
    ops.emplace_back(a);
  };
  if (rp.has_embedding) {
    hal::EmbeddingArgs e;
    e.table_type = types.token_embd;
    e.n_tokens = T;
    e.dim = H;
    e.vocab = vn;
    e.shard = tp > 1;
    e.vocab_offset = rp.vocab.begin;
    ops.emplace_back(e);
  }
  if (rp.layers.size() > 0) {
    ops.emplace_back(hal::RmsNormArgs{{}, {}, {}, {}, T, H, static_cast<float>(c.rms_eps)});
    if (model::has_qk_norm(c)) {  // one row per head
      ops.emplace_back(hal::RmsNormArgs{{}, {}, {}, {}, T * nq, hd, static_cast<float>(c.rms_eps)});
      ops.emplace_back(hal::RmsNormArgs{{}, {}, {}, {}, T * nkv, hd, static_cast<float>(c.rms_eps)});
    }
    const std::int64_t rot = rot_dim_of(c);
    ops.emplace_back(hal::RopeArgs{{}, {}, T, nq, hd, rot, static_cast<float>(c.rope_theta)});
    ops.emplace_back(hal::RopeArgs{{}, {}, T, nkv, hd, rot, static_cast<float>(c.rope_theta)});
    ops.emplace_back(kv_write_args(o, rp, hd, T));
    ops.emplace_back(attention_args(c, o, rp, T, std::min(T, R), o.blocks_per_seq()));
    ops.emplace_back(hal::SiluMulArgs{{}, {}, {}, T, nf, 0, 0, 0});
    if (c.is_hybrid()) {
      const SsmShare share = ssm_share(c, rp);
      ops.emplace_back(hal::SigmoidMulArgs{{}, {}, {}, T * nq, hd, 0, 0, 0, false});  // the attention's gate
      ops.emplace_back(conv_state_args(c, share, o, T, std::min(T, R)));
      ops.emplace_back(delta_rule_args(c, share, o, T, std::min(T, R), kDeltaChunk));
      ops.emplace_back(hal::GatedNormArgs{{}, {}, {}, {}, T * share.nv(), share.d, static_cast<float>(c.rms_eps)});
      if (rp.has_shared_expert) {
        ops.emplace_back(hal::SiluMulArgs{{}, {}, {}, T, c.shared_expert_ffn, 0, 0, 0});
        ops.emplace_back(hal::SigmoidMulArgs{{}, {}, {}, T, H, 0, 0, 0, true});
        ops.emplace_back(hal::AddArgs{{}, {}, {}, T * H});
      }
    }
  }
  for (std::int64_t l = rp.layers.begin; l < rp.layers.end; ++l) {
    const parallel::LayerWeightTypes& w = types.layers[static_cast<std::size_t>(l)];
    if (c.is_recurrent(l)) {
      const SsmShare share = ssm_share(c, rp);
      matmul(w.qkv, T, share.channels(), H);
      matmul(w.z, T, share.inner(), H);
      matmul(w.alpha, T, share.nv(), H);
      matmul(w.beta, T, share.nv(), H);
      matmul(w.ssm_out, T, H, share.inner());
    } else {
      matmul(w.q, T, nq * hd, H);  // a hybrid's gate rows are a second matmul of the same shape
      matmul(w.k, T, nkv * hd, H);
      matmul(w.v, T, nkv * hd, H);
      matmul(w.o, T, H, nq * hd);
    }
    if (rp.has_shared_expert) {
      matmul(w.sh_gate, T, c.shared_expert_ffn, H);
      matmul(w.sh_up, T, c.shared_expert_ffn, H);
      matmul(w.sh_down, T, H, c.shared_expert_ffn);
      matmul(hal::DType::kF32, T, 1, H);  // the shared expert's gate (read as f32)
    }
    if (c.is_moe()) {
      matmul(w.router, T, c.n_experts, H);
      hal::MoeRouterArgs r;
      r.n_tokens = T;
      r.n_experts = c.n_experts;
      r.k = c.n_experts_used;
      r.normalize = c.norm_topk_prob;
      ops.emplace_back(r);
      ops.emplace_back(moe_ffn_args(c, rp, w, T));
      continue;
    }
    matmul(w.gate, T, nf, H);
    matmul(w.up, T, nf, H);
    matmul(w.down, T, H, nf);
  }
  if (rp.has_lm_head) {
    ops.emplace_back(hal::RmsNormArgs{{}, {}, {}, {}, R, H, static_cast<float>(c.rms_eps)});
    matmul(c.tied_embeddings ? types.token_embd : types.output, R, vn, H);
    hal::TopKArgs top;
    top.n_rows = R;
    top.n_cols = vn;
    top.k = std::min<std::int64_t>(hal::kMaxTopK, vn);
    top.id_offset = rp.vocab.begin;
    ops.emplace_back(top);
  } else if (rp.layers.size() > 0) {
    ops.emplace_back(hal::AddArgs{{}, {}, {}, T * H});
  }
  return ops;
}

struct Qwen2Shard::Impl {
  ShardContext ctx;
  parallel::RankPlan rp;
  model::ModelConfig config;
  ModelOptions options;
  hal::Device* device = nullptr;
  std::unique_ptr<hal::Stream> stream;
  DeviceTensor token_embd, output_norm, lm_head;  // lm_head empty when it is token_embd's buffer
  std::vector<Layer> layers;                      // the stage's layers
  std::vector<std::unique_ptr<hal::Buffer>> k_cache, v_cache;
  std::int64_t n_slots = 0;
  std::unique_ptr<hal::Buffer> h, xn, q, k, v, attn, delta, gate, up, sel, sel_delta, sel_norm, logits, gathered;
  std::unique_ptr<hal::Buffer> q_raw, k_raw;  // qwen3: q and k before their head norms (q, k after)
  std::unique_ptr<hal::Buffer> router_logits, expert_ids, expert_weights;  // a mixture of experts' routing
  // A hybrid's workspace: the attention's gate; a DeltaNet layer's q|k|v before and after its conv,
  // z, alpha, beta and output; a shared expert's FFN, output and gate.
  std::unique_ptr<hal::Buffer> attn_gate, qkv, conv_out, z, alpha, beta, ssm_o;
  std::unique_ptr<hal::Buffer> sh_gate, sh_up, sh_out, sh_logit;
  // Each DeltaNet layer's states: conv [slots][kernel - 1][channels], recurrent [slots][v heads][d][d].
  std::vector<std::unique_ptr<hal::Buffer>> conv_state, delta_state;
  std::unique_ptr<hal::Buffer> top, top_gathered;  // candidates of a step that selects on the device
  // The per-step integer inputs: written by the host into `staging`, copied into `inputs`.
  StepInputs in;
  std::unique_ptr<hal::Buffer> staging, inputs;
  // What tp rank 0 of the last stage hands back: logits or candidates of every tp rank.
  std::unique_ptr<hal::Buffer> readback;
  std::size_t result_bytes = 0;  // of readback, after the last step
  hal::BufView input(std::size_t offset) const { return {inputs.get(), offset}; }

  int tp() const { return ctx.plan->tp; }
  int pp() const { return ctx.plan->pp; }
  const DeviceTensor& head() const { return lm_head ? lm_head : token_embd; }
};

Qwen2Shard::Qwen2Shard() : impl_(std::make_unique<Impl>()) {}
Qwen2Shard::~Qwen2Shard() = default;

void Qwen2Shard::abort_channels(const Status& why) {
  if (impl_->ctx.tp != nullptr) impl_->ctx.tp->abort(why);
  if (impl_->ctx.world != nullptr) impl_->ctx.world->abort(why);
}

Result<std::unique_ptr<Qwen2Shard>> Qwen2Shard::load(const model::TensorSource& file, const model::ModelConfig& config,
                                                     const ShardContext& ctx, const ModelOptions& options) {
  auto shard = std::unique_ptr<Qwen2Shard>(new Qwen2Shard());
  Impl& im = *shard->impl_;
  im.ctx = ctx;
  im.rp = ctx.plan->ranks[static_cast<std::size_t>(ctx.rank)];
  im.config = config;
  im.options = options;
  im.device = ctx.device;
  hal::Device& device = *ctx.device;
  SX_ASSIGN_OR_RETURN(im.stream, device.create_stream());
  hal::Stream& s = *im.stream;
  const parallel::RankPlan& rp = im.rp;
  const std::int64_t hd = config.head_dim, H = config.hidden;
  using model::LayerTensor;

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
  const std::int64_t vb = rp.vocab.begin, vn = rp.vocab.size();
  if (rp.has_embedding || (rp.has_lm_head && config.tied_embeddings)) {
    SX_ASSIGN_OR_RETURN(im.token_embd, up.tensor(model::kTokenEmbdName, true, vb, vn));
    if (!(rp.has_lm_head && config.tied_embeddings)) shard->embedding_only_bytes_ = im.token_embd.buffer->size();
  }
  if (rp.has_lm_head) {
    SX_ASSIGN_OR_RETURN(im.output_norm, up.tensor(model::kOutputNormName, true));
    if (!config.tied_embeddings) {
      SX_ASSIGN_OR_RETURN(im.lm_head, up.tensor(model::kOutputName, true, vb, vn));
    }
    if (im.output_norm.type != hal::DType::kF32) {
      return invalid_argument_error("{}: {} must be f32", file.path(), model::kOutputNormName);
    }
  }
  const std::int64_t q0 = rp.q_heads.begin * hd, qn = rp.q_heads.size() * hd;
  const std::int64_t kv0 = rp.kv_heads.begin * hd, kvn = rp.kv_heads.size() * hd;
  const std::int64_t f0 = rp.ffn.begin, fn = rp.ffn.size();
  std::int64_t n_attention = 0, n_recurrent = 0;  // the stage's layers of each kind
  const SsmShare share = ssm_share(config, rp);
  for (std::int64_t l = rp.layers.begin; l < rp.layers.end; ++l) {
    if (options.cancel != nullptr && options.cancel->load(std::memory_order_relaxed)) {
      return cancelled_error("loading {} was cancelled at layer {}", file.path(), l);
    }
    Layer L;
    auto name = [&](LayerTensor t) { return model::layer_tensor_name(l, t); };
    const bool bias = config.qkv_bias;
    const parallel::LayerWeightTypes& lt = types.layers[static_cast<std::size_t>(l)];
    L.recurrent = config.is_recurrent(l);
    SX_ASSIGN_OR_RETURN(L.attn_norm, up.tensor(name(LayerTensor::kAttnNorm), true));
    if (L.recurrent) {
      // A Gated DeltaNet layer: this rank's K heads with their V heads (column-parallel projections
      // and conv channels, row-parallel ssm_out), the norm whole.
      L.state_index = n_recurrent++;
      SX_ASSIGN_OR_RETURN(L.qkv_w, up.rows_of(name(LayerTensor::kAttnQkv), share.channel_ranges()));
      SX_ASSIGN_OR_RETURN(L.z_w, up.rows_of(name(LayerTensor::kAttnGate), share.v(share.d)));
      SX_ASSIGN_OR_RETURN(L.alpha_w, up.rows_of(name(LayerTensor::kSsmAlpha), share.v(1)));
      SX_ASSIGN_OR_RETURN(L.beta_w, up.rows_of(name(LayerTensor::kSsmBeta), share.v(1)));
      SX_ASSIGN_OR_RETURN(L.ssm_out_w, up.cols_of(name(LayerTensor::kSsmOut), share.v(share.d)));
      SX_ASSIGN_OR_RETURN(L.conv_w, up.f32(name(LayerTensor::kSsmConv1d), false, share.channel_ranges()));
      SX_ASSIGN_OR_RETURN(L.ssm_a, up.f32(name(LayerTensor::kSsmA), false, share.v(1)));
      SX_ASSIGN_OR_RETURN(L.dt_bias, up.f32(name(LayerTensor::kSsmDt), false, share.v(1)));
      SX_ASSIGN_OR_RETURN(L.ssm_norm, up.f32(name(LayerTensor::kSsmNorm)));
    } else {
      L.kv_index = n_attention++;
      if (config.is_hybrid()) {
        // attn_q holds [query | gate] per head: this rank's heads' query rows, then their gate rows.
        std::vector<std::pair<std::int64_t, std::int64_t>> query, gate;
        for (std::int64_t h = rp.q_heads.begin; h < rp.q_heads.end; ++h) {
          query.emplace_back(2 * h * hd, hd);
          gate.emplace_back(2 * h * hd + hd, hd);
        }
        SX_ASSIGN_OR_RETURN(L.q_w, up.rows_of(name(LayerTensor::kAttnQ), query));
        SX_ASSIGN_OR_RETURN(L.q_gate, up.rows_of(name(LayerTensor::kAttnQ), gate));
      } else {
        SX_ASSIGN_OR_RETURN(L.q_w, up.tensor(name(LayerTensor::kAttnQ), true, q0, qn));
      }
      SX_ASSIGN_OR_RETURN(L.k_w, up.tensor(name(LayerTensor::kAttnK), true, kv0, kvn));
      SX_ASSIGN_OR_RETURN(L.v_w, up.tensor(name(LayerTensor::kAttnV), true, kv0, kvn));
      SX_ASSIGN_OR_RETURN(L.q_b, up.tensor(name(LayerTensor::kAttnQBias), bias, q0, bias ? qn : -1));
      SX_ASSIGN_OR_RETURN(L.k_b, up.tensor(name(LayerTensor::kAttnKBias), bias, kv0, bias ? kvn : -1));
      SX_ASSIGN_OR_RETURN(L.v_b, up.tensor(name(LayerTensor::kAttnVBias), bias, kv0, bias ? kvn : -1));
      SX_ASSIGN_OR_RETURN(L.o_w, up.tensor(name(LayerTensor::kAttnOutput), true, 0, H, q0, qn, lt.o));
      if (model::has_qk_norm(config)) {  // head_dim wide, the same for every head: whole on every rank
        SX_ASSIGN_OR_RETURN(L.q_norm, up.tensor(name(LayerTensor::kAttnQNorm), true));
        SX_ASSIGN_OR_RETURN(L.k_norm, up.tensor(name(LayerTensor::kAttnKNorm), true));
      }
    }
    SX_ASSIGN_OR_RETURN(L.ffn_norm, up.tensor(name(config.is_hybrid() ? LayerTensor::kPostAttentionNorm
                                                                      : LayerTensor::kFfnNorm),
                                              true));
    if (config.is_moe()) {
      // The router whole; the rank's experts (expert parallelism), each whole, stacked.
      const std::int64_t e0 = rp.experts.begin, ne = rp.experts.size(), fe = config.expert_ffn;
      SX_ASSIGN_OR_RETURN(L.router, up.tensor(name(LayerTensor::kFfnGateInp), true));
      SX_ASSIGN_OR_RETURN(L.gate_exps, up.tensor(name(LayerTensor::kFfnGateExps), true, e0 * fe, ne * fe));
      SX_ASSIGN_OR_RETURN(L.up_exps, up.tensor(name(LayerTensor::kFfnUpExps), true, e0 * fe, ne * fe));
      SX_ASSIGN_OR_RETURN(L.down_exps, up.tensor(name(LayerTensor::kFfnDownExps), true, e0 * H, ne * H));
    } else {
      SX_ASSIGN_OR_RETURN(L.gate_w, up.tensor(name(LayerTensor::kFfnGate), true, f0, fn));
      SX_ASSIGN_OR_RETURN(L.up_w, up.tensor(name(LayerTensor::kFfnUp), true, f0, fn));
      SX_ASSIGN_OR_RETURN(L.down_w, up.tensor(name(LayerTensor::kFfnDown), true, 0, H, f0, fn, lt.down));
    }
    if (rp.has_shared_expert) {  // whole on the stage's tp rank 0
      SX_ASSIGN_OR_RETURN(L.sh_gate, up.tensor(name(LayerTensor::kFfnGateShexp), true));
      SX_ASSIGN_OR_RETURN(L.sh_up, up.tensor(name(LayerTensor::kFfnUpShexp), true));
      SX_ASSIGN_OR_RETURN(L.sh_down, up.tensor(name(LayerTensor::kFfnDownShexp), true));
      SX_ASSIGN_OR_RETURN(L.sh_router, up.f32(name(LayerTensor::kFfnGateInpShexp), /*as_row=*/true));
    }
    for (const DeviceTensor* t : {&L.attn_norm, &L.ffn_norm, &L.q_b, &L.k_b, &L.v_b, &L.q_norm, &L.k_norm}) {
      if (t->buffer && t->type != hal::DType::kF32) {
        return invalid_argument_error("{}: norm and bias tensors must be f32, found {}", file.path(),
                                      hal::dtype_name(t->type));
      }
    }
    im.layers.push_back(std::move(L));
  }
  shard->weight_bytes_ = up.bytes();

  // KV cache for the stage's layers and this rank's KV heads.
  im.n_slots = options.kv.num_blocks * options.kv.block_size;
  const std::size_t cache_bytes =
      static_cast<std::size_t>(im.n_slots * kvn) * hal::dtype_info(options.kv.dtype).block_bytes;
  for (std::int64_t l = 0; l < n_attention; ++l) {  // a hybrid's DeltaNet layers keep no KV
    SX_ASSIGN_OR_RETURN(auto kc, alloc_zeroed(device, s, cache_bytes));
    SX_ASSIGN_OR_RETURN(auto vc, alloc_zeroed(device, s, cache_bytes));
    im.k_cache.push_back(std::move(kc));
    im.v_cache.push_back(std::move(vc));
  }
  // Their fixed-size states instead, a slot per running sequence.
  const std::int64_t slots = options.state_slots(), channels = share.channels();
  for (std::int64_t l = 0; l < n_recurrent; ++l) {
    SX_ASSIGN_OR_RETURN(auto cs, alloc_zeroed(device, s, f32_bytes(slots * (config.ssm_conv_kernel - 1) * channels)));
    SX_ASSIGN_OR_RETURN(auto ds, alloc_zeroed(device, s, f32_bytes(slots * share.nv() * share.d * share.d)));
    im.conv_state.push_back(std::move(cs));
    im.delta_state.push_back(std::move(ds));
  }

  // Workspace for max_batch_tokens.
  const std::int64_t T = options.max_batch_tokens, R = options.max_logit_rows;
  SX_ASSIGN_OR_RETURN(im.h, device.alloc(f32_bytes(T * H)));
  SX_ASSIGN_OR_RETURN(im.xn, device.alloc(f32_bytes(T * H)));
  SX_ASSIGN_OR_RETURN(im.q, device.alloc(f32_bytes(T * std::max<std::int64_t>(qn, 1))));
  SX_ASSIGN_OR_RETURN(im.k, device.alloc(f32_bytes(T * kvn)));
  SX_ASSIGN_OR_RETURN(im.v, device.alloc(f32_bytes(T * kvn)));
  SX_ASSIGN_OR_RETURN(im.attn, device.alloc(f32_bytes(T * std::max<std::int64_t>(qn, 1))));
  if (model::has_qk_norm(config)) {
    SX_ASSIGN_OR_RETURN(im.q_raw, device.alloc(f32_bytes(T * std::max<std::int64_t>(qn, 1))));
    SX_ASSIGN_OR_RETURN(im.k_raw, device.alloc(f32_bytes(T * std::max<std::int64_t>(kvn, 1))));
  }
  SX_ASSIGN_OR_RETURN(im.delta, device.alloc(f32_bytes(T * H)));
  if (config.is_hybrid()) {
    const std::int64_t inner = std::max<std::int64_t>(share.inner(), 1), nv = std::max<std::int64_t>(share.nv(), 1);
    SX_ASSIGN_OR_RETURN(im.attn_gate, device.alloc(f32_bytes(T * std::max<std::int64_t>(qn, 1))));
    SX_ASSIGN_OR_RETURN(im.qkv, device.alloc(f32_bytes(T * channels)));
    SX_ASSIGN_OR_RETURN(im.conv_out, device.alloc(f32_bytes(T * channels)));
    SX_ASSIGN_OR_RETURN(im.z, device.alloc(f32_bytes(T * inner)));
    SX_ASSIGN_OR_RETURN(im.alpha, device.alloc(f32_bytes(T * nv)));
    SX_ASSIGN_OR_RETURN(im.beta, device.alloc(f32_bytes(T * nv)));
    SX_ASSIGN_OR_RETURN(im.ssm_o, device.alloc(f32_bytes(T * inner)));
  }
  if (rp.has_shared_expert) {
    SX_ASSIGN_OR_RETURN(im.sh_gate, device.alloc(f32_bytes(T * config.shared_expert_ffn)));
    SX_ASSIGN_OR_RETURN(im.sh_up, device.alloc(f32_bytes(T * config.shared_expert_ffn)));
    SX_ASSIGN_OR_RETURN(im.sh_out, device.alloc(f32_bytes(T * H)));
    SX_ASSIGN_OR_RETURN(im.sh_logit, device.alloc(f32_bytes(T)));
  }
  if (config.is_moe()) {
    SX_ASSIGN_OR_RETURN(im.router_logits, device.alloc(f32_bytes(T * config.n_experts)));
    SX_ASSIGN_OR_RETURN(im.expert_ids, device.alloc(i32_bytes(T * config.n_experts_used)));
    SX_ASSIGN_OR_RETURN(im.expert_weights, device.alloc(f32_bytes(T * config.n_experts_used)));
  } else {
    SX_ASSIGN_OR_RETURN(im.gate, device.alloc(f32_bytes(T * fn)));
    SX_ASSIGN_OR_RETURN(im.up, device.alloc(f32_bytes(T * fn)));
  }
  if (rp.has_lm_head) {
    const std::int64_t chunk = R * shard->max_vocab_shard_;
    SX_ASSIGN_OR_RETURN(im.sel, device.alloc(f32_bytes(R * H)));
    SX_ASSIGN_OR_RETURN(im.sel_delta, device.alloc(f32_bytes(R * H)));
    SX_ASSIGN_OR_RETURN(im.sel_norm, device.alloc(f32_bytes(R * H)));
    SX_ASSIGN_OR_RETURN(im.logits, alloc_zeroed(device, s, f32_bytes(chunk)));  // padding stays zero
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

Status Qwen2Shard::run(const ForwardBatch& batch, int top_k) {
  impl_->result_bytes = 0;
  Status st = run_step(batch, top_k);
  Status synced = impl_->stream->sync();
  if (!st.ok()) return st;
  return synced;
}

std::span<const std::byte> Qwen2Shard::result() const {
  if (!impl_->readback) return {};
  return impl_->readback->host().first(impl_->result_bytes);
}

Status Qwen2Shard::run_step(const ForwardBatch& batch, int top_k) {
  Impl& im = *impl_;
  hal::Stream& s = *im.stream;
  const model::ModelConfig& c = im.config;
  const parallel::RankPlan& rp = im.rp;
  const auto T = static_cast<std::int64_t>(batch.tokens.size());
  const auto n_seqs = static_cast<std::int64_t>(batch.seq_context_len.size());
  const std::int64_t H = c.hidden, hd = c.head_dim;
  const std::int64_t nq = rp.q_heads.size(), nkv = rp.kv_heads.size(), nf = rp.ffn.size();
  const float eps = static_cast<float>(c.rms_eps);
  const int tp = im.tp();

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
  // Sums the row-parallel partial outputs of the stage's ranks.
  auto all_reduce = [&](const std::unique_ptr<hal::Buffer>& b, std::int64_t count) {
    if (tp == 1) return ok_status();
    return im.ctx.tp->all_reduce(s, V(b), count, hal::DType::kF32);
  };

  if (rp.has_embedding) {
    hal::EmbeddingArgs e{im.token_embd.view(), im.token_embd.type, im.input(im.in.ids), V(im.h), T, H, rp.vocab.size()};
    e.shard = tp > 1;
    e.vocab_offset = rp.vocab.begin;
    SX_RETURN_IF_ERROR(s.run(e));
    SX_RETURN_IF_ERROR(all_reduce(im.h, T * H));
  } else {
    // The previous stage's hidden state, from the rank with the same tp rank.
    SX_RETURN_IF_ERROR(im.ctx.world->recv(s, V(im.h), f32_bytes(T * H), im.ctx.rank - tp));
  }

  // A layer's attention (of xn, into delta, before the all-reduce): q, k, v; qwen3 and the hybrids
  // normalise each head of q and k (q_raw, k_raw -> q, k); rope over the rotated dims; the KV write
  // and paged attention; a hybrid's sigmoid gate; the row-parallel o (this rank's heads' share).
  auto run_attention = [&](const Layer& L, std::int64_t T, std::int64_t n_seqs) -> Status {
    SX_RETURN_IF_ERROR(matmul(L.q_w, &L.q_b, V(im.xn), L.q_norm ? V(im.q_raw) : V(im.q), T, nq * hd, H));
    SX_RETURN_IF_ERROR(matmul(L.k_w, &L.k_b, V(im.xn), L.k_norm ? V(im.k_raw) : V(im.k), T, nkv * hd, H));
    if (L.q_norm) {
      SX_RETURN_IF_ERROR(s.run(hal::RmsNormArgs{V(im.q_raw), {}, L.q_norm.view(), V(im.q), T * nq, hd, eps}));
      SX_RETURN_IF_ERROR(s.run(hal::RmsNormArgs{V(im.k_raw), {}, L.k_norm.view(), V(im.k), T * nkv, hd, eps}));
    }
    SX_RETURN_IF_ERROR(matmul(L.v_w, &L.v_b, V(im.xn), V(im.v), T, nkv * hd, H));
    const auto theta = static_cast<float>(c.rope_theta);
    const std::int64_t rot = rot_dim_of(c);
    SX_RETURN_IF_ERROR(s.run(hal::RopeArgs{V(im.q), im.input(im.in.positions), T, nq, hd, rot, theta}));
    SX_RETURN_IF_ERROR(s.run(hal::RopeArgs{V(im.k), im.input(im.in.positions), T, nkv, hd, rot, theta}));
    const auto kv = static_cast<std::size_t>(L.kv_index);
    hal::KvWriteArgs kw = kv_write_args(im.options, rp, hd, T);
    kw.k = V(im.k);
    kw.v = V(im.v);
    kw.k_cache = V(im.k_cache[kv]);
    kw.v_cache = V(im.v_cache[kv]);
    kw.slot_mapping = im.input(im.in.slots);
    SX_RETURN_IF_ERROR(s.run(kw));
    hal::AttentionArgs at = attention_args(c, im.options, rp, T, n_seqs, batch.max_blocks_per_seq);
    at.q = V(im.q);
    at.k_cache = kw.k_cache;
    at.v_cache = kw.v_cache;
    at.out = V(im.attn);
    at.seq_token_start = im.input(im.in.seq_start);
    at.seq_context_len = im.input(im.in.seq_ctx);
    at.block_table = im.input(im.in.block_table);
    SX_RETURN_IF_ERROR(s.run(at));
    if (L.q_gate) {
      SX_RETURN_IF_ERROR(matmul(L.q_gate, nullptr, V(im.xn), V(im.attn_gate), T, nq * hd, H));
      SX_RETURN_IF_ERROR(s.run(hal::SigmoidMulArgs{V(im.attn), V(im.attn_gate), V(im.attn), T * nq, hd, 0, 0, 0, false}));
    }
    return matmul(L.o_w, nullptr, V(im.attn), V(im.delta), T, H, nq * hd);
  };
  // A Gated DeltaNet layer (of xn, into delta): q|k|v, z, alpha, beta; the causal conv with each
  // sequence's conv state; the delta rule on its recurrent state (token by token, kDeltaChunk);
  // the gated norm with z; ssm_out.
  auto run_deltanet = [&](const Layer& L, std::int64_t T, std::int64_t n_seqs) -> Status {
    const SsmShare share = ssm_share(c, rp);
    const std::int64_t C = share.channels(), inner = share.inner(), nv = share.nv(), d = share.d;
    SX_RETURN_IF_ERROR(matmul(L.qkv_w, nullptr, V(im.xn), V(im.qkv), T, C, H));
    SX_RETURN_IF_ERROR(matmul(L.z_w, nullptr, V(im.xn), V(im.z), T, inner, H));
    SX_RETURN_IF_ERROR(matmul(L.alpha_w, nullptr, V(im.xn), V(im.alpha), T, nv, H));
    SX_RETURN_IF_ERROR(matmul(L.beta_w, nullptr, V(im.xn), V(im.beta), T, nv, H));
    const auto st = static_cast<std::size_t>(L.state_index);
    hal::ConvStateArgs cs = conv_state_args(c, share, im.options, T, n_seqs);
    cs.x = V(im.qkv);
    cs.weight = L.conv_w.view();
    cs.state = V(im.conv_state[st]);
    cs.out = V(im.conv_out);
    cs.seq_token_start = im.input(im.in.seq_start);
    cs.seq_context_len = im.input(im.in.seq_ctx);
    cs.seq_slot = im.input(im.in.state_slot);
    SX_RETURN_IF_ERROR(s.run(cs));
    hal::DeltaRuleArgs dr = delta_rule_args(c, share, im.options, T, n_seqs, kDeltaChunk);
    dr.q = V(im.conv_out);
    dr.k = dr.q.at(f32_bytes(share.nk * d));
    dr.v = dr.q.at(f32_bytes(2 * share.nk * d));
    dr.alpha = V(im.alpha);
    dr.beta = V(im.beta);
    dr.a = L.ssm_a.view();
    dr.dt_bias = L.dt_bias.view();
    dr.state = V(im.delta_state[st]);
    dr.out = V(im.ssm_o);
    dr.seq_token_start = cs.seq_token_start;
    dr.seq_context_len = cs.seq_context_len;
    dr.seq_slot = cs.seq_slot;
    SX_RETURN_IF_ERROR(s.run(dr));
    SX_RETURN_IF_ERROR(s.run(hal::GatedNormArgs{V(im.ssm_o), V(im.z), L.ssm_norm.view(), V(im.ssm_o), T * nv, d, eps}));
    return matmul(L.ssm_out_w, nullptr, V(im.ssm_o), V(im.delta), T, H, inner);
  };

  bool pending_delta = false;  // delta holds an output not yet added to h
  for (std::size_t li = 0; li < im.layers.size(); ++li) {
    const Layer& L = im.layers[li];
    // h += delta (the previous layer's MLP output); xn = norm(h).
    SX_RETURN_IF_ERROR(s.run(hal::RmsNormArgs{V(im.h), pending_delta ? V(im.delta) : hal::BufView{},
                                              L.attn_norm.view(), V(im.xn), T, H, eps}));
    if (L.recurrent) {
      SX_RETURN_IF_ERROR(run_deltanet(L, T, n_seqs));
    } else {
      SX_RETURN_IF_ERROR(run_attention(L, T, n_seqs));
    }
    SX_RETURN_IF_ERROR(all_reduce(im.delta, T * H));
    // h += attention output; xn = norm(h).
    SX_RETURN_IF_ERROR(s.run(hal::RmsNormArgs{V(im.h), V(im.delta), L.ffn_norm.view(), V(im.xn), T, H, eps}));
    if (L.router) {
      // Every rank routes every token the same way (xn is the same on all); each computes its own
      // experts' share, and the all-reduce sums them (expert parallelism).
      const std::int64_t E = c.n_experts, k = c.n_experts_used;
      SX_RETURN_IF_ERROR(matmul(L.router, nullptr, V(im.xn), V(im.router_logits), T, E, H));
      SX_RETURN_IF_ERROR(s.run(hal::MoeRouterArgs{V(im.router_logits), V(im.expert_ids), V(im.expert_weights), T, E, k,
                                                  c.norm_topk_prob}));
      parallel::LayerWeightTypes held;  // the formats the rank holds its experts in
      held.gate = L.gate_exps.type;
      held.up = L.up_exps.type;
      held.down = L.down_exps.type;
      hal::MoeFfnArgs m = moe_ffn_args(c, rp, held, T);
      m.x = V(im.xn);
      m.ids = V(im.expert_ids);
      m.weights = V(im.expert_weights);
      m.gate = L.gate_exps.view();
      m.up = L.up_exps.view();
      m.down = L.down_exps.view();
      m.out = V(im.delta);
      SX_RETURN_IF_ERROR(s.run(m));
      if (L.sh_gate) {
        // The shared expert, scaled by the sigmoid of its gate, joins the routed experts' sum.
        const std::int64_t fs = c.shared_expert_ffn;
        SX_RETURN_IF_ERROR(matmul(L.sh_gate, nullptr, V(im.xn), V(im.sh_gate), T, fs, H));
        SX_RETURN_IF_ERROR(matmul(L.sh_up, nullptr, V(im.xn), V(im.sh_up), T, fs, H));
        SX_RETURN_IF_ERROR(s.run(hal::SiluMulArgs{V(im.sh_gate), V(im.sh_up), V(im.sh_gate), T, fs, 0, 0, 0}));
        SX_RETURN_IF_ERROR(matmul(L.sh_down, nullptr, V(im.sh_gate), V(im.sh_out), T, H, fs));
        SX_RETURN_IF_ERROR(matmul(L.sh_router, nullptr, V(im.xn), V(im.sh_logit), T, 1, H));
        SX_RETURN_IF_ERROR(s.run(hal::SigmoidMulArgs{V(im.sh_out), V(im.sh_logit), V(im.sh_out), T, H, 0, 0, 0, true}));
        SX_RETURN_IF_ERROR(s.run(hal::AddArgs{V(im.delta), V(im.sh_out), V(im.delta), T * H}));
      }
    } else {
      SX_RETURN_IF_ERROR(matmul(L.gate_w, nullptr, V(im.xn), V(im.gate), T, nf, H));
      SX_RETURN_IF_ERROR(matmul(L.up_w, nullptr, V(im.xn), V(im.up), T, nf, H));
      SX_RETURN_IF_ERROR(s.run(hal::SiluMulArgs{V(im.gate), V(im.up), V(im.gate), T, nf, 0, 0, 0}));
      SX_RETURN_IF_ERROR(matmul(L.down_w, nullptr, V(im.gate), V(im.delta), T, H, nf));
    }
    SX_RETURN_IF_ERROR(all_reduce(im.delta, T * H));
    pending_delta = true;
  }

  if (!rp.has_lm_head) {
    // Hand h (with the last delta added) to the next stage.
    if (pending_delta) SX_RETURN_IF_ERROR(s.run(hal::AddArgs{V(im.h), V(im.delta), V(im.h), T * H}));
    return im.ctx.world->send(s, V(im.h), f32_bytes(T * H), im.ctx.rank + tp);
  }

  // Gather the rows that need logits, then final norm (with the last residual add) and LM head.
  const auto R = static_cast<std::int64_t>(batch.logit_rows.size());
  if (R == 0) return ok_status();
  for (std::int64_t i = 0; i < R; ++i) {
    const auto row = static_cast<std::size_t>(batch.logit_rows[static_cast<std::size_t>(i)]);
    SX_RETURN_IF_ERROR(s.copy(*im.sel, f32_bytes(i * H), *im.h, row * f32_bytes(H), f32_bytes(H)));
  }
  hal::BufView add{};
  if (pending_delta) {
    for (std::int64_t i = 0; i < R; ++i) {
      const auto row = static_cast<std::size_t>(batch.logit_rows[static_cast<std::size_t>(i)]);
      SX_RETURN_IF_ERROR(s.copy(*im.sel_delta, f32_bytes(i * H), *im.delta, row * f32_bytes(H), f32_bytes(H)));
    }
    add = V(im.sel_delta);
  }
  SX_RETURN_IF_ERROR(s.run(hal::RmsNormArgs{V(im.sel), add, im.output_norm.view(), V(im.sel_norm), R, H, eps}));
  const std::int64_t vn = rp.vocab.size();
  SX_RETURN_IF_ERROR(matmul(im.head(), nullptr, V(im.sel_norm), V(im.logits), R, vn, H));
  // This rank's part (its logits, or the candidates of its vocab shard), then every rank's.
  hal::Buffer* part = im.logits.get();
  hal::Buffer* all = im.gathered.get();
  std::size_t part_bytes = f32_bytes(R * max_vocab_shard_);
  if (top_k > 0) {
    hal::TopKArgs top{V(im.logits), V(im.top), {im.top.get(), top_k_ids_offset(R, top_k)}, R, vn, top_k, rp.vocab.begin};
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
