// write_hf_model(): a TensorSource as a (sharded) Hugging Face safetensors directory.
#include "runtime/model/hf_writer.h"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "runtime/base/half.h"
#include "runtime/model/hf_model.h"
#include "runtime/model/safetensors.h"
#include "runtime/model/safetensors_writer.h"

namespace sx::model {

namespace {

namespace fs = std::filesystem;
using nlohmann::ordered_json;

std::string_view torch_dtype(hal::DType t) {
  switch (t) {
    case hal::DType::kF16: return "float16";
    case hal::DType::kBF16: return "bfloat16";
    default: return "float32";
  }
}

Status write_text(const std::string& path, const std::string& text) {
  std::FILE* f = std::fopen(path.c_str(), "wb");
  if (f == nullptr) return invalid_argument_error("{}: cannot create: {}", path, std::strerror(errno));
  const bool ok = std::fwrite(text.data(), 1, text.size(), f) == text.size() && std::fflush(f) == 0;
  const int e = errno;
  if (std::fclose(f) != 0 || !ok) return internal_error("{}: write failed: {}", path, std::strerror(e));
  return ok_status();
}

// The tensor's bytes in `dtype`, via F32 row by row when the formats differ.
Result<std::vector<std::uint8_t>> convert(const TensorInfo& t, hal::DType dtype, std::string_view where) {
  if (t.dtype == dtype) return std::vector<std::uint8_t>(t.data.begin(), t.data.end());
  if (!t.dtype.has_value() || !hal::can_dequantize(*t.dtype)) {
    return invalid_argument_error("{}: tensor '{}' has type {}, which cannot be converted to {}", where, t.name,
                                  t.type_name, hal::dtype_name(dtype));
  }
  const std::int64_t cols = t.dims.empty() ? 1 : t.dims[0];
  const std::int64_t rows = cols == 0 ? 0 : t.n_elements / cols;
  std::vector<std::uint8_t> out(hal::row_bytes(dtype, cols) * static_cast<std::size_t>(rows));
  hal::convert_rows(*t.dtype, t.data.data(), dtype, out.data(), rows, cols);
  return out;
}

// AutoAWQ's packing of 8 nibbles per int32: nibble i holds column kOrder[i].
constexpr int kOrder[8] = {0, 2, 4, 6, 1, 3, 5, 7};

struct Int4Tensors {
  std::vector<std::uint8_t> qweight, qzeros, scales, g_idx;  // g_idx: GPTQ only
};

template <typename T>
std::vector<std::uint8_t> as_bytes(const std::vector<T>& v) {
  const auto* p = reinterpret_cast<const std::uint8_t*>(v.data());
  return std::vector<std::uint8_t>(p, p + v.size() * sizeof(T));
}

// W [out][in] (rows of t, via F32) -> AutoAWQ GEMM or AutoGPTQ tensors (HfWriteOptions::int4).
// AWQ: qweight [in][out / 8], column n of a word in nibble slot[n % 8]; GPTQ: qweight [in / 8][out],
// input i in nibble i % 8. Both: qzeros [in / 128][out / 8] (AWQ's nibble order, GPTQ's plain one),
// scales [in / 128][out].
Int4Tensors quantize_int4(const TensorInfo& t, Int4Checkpoint format) {
  constexpr std::int64_t kGroup = hal::kAwqInt4Group;
  const bool gptq = format == Int4Checkpoint::kGptq;
  const std::int64_t in = t.dims[0], out = t.dims[1], groups = in / kGroup;
  std::vector<std::uint32_t> qw(static_cast<std::size_t>(in * out / 8), 0), qz(static_cast<std::size_t>(groups * out / 8), 0);
  std::vector<std::uint16_t> sc(static_cast<std::size_t>(groups * out));
  std::vector<float> row(static_cast<std::size_t>(in));
  const std::size_t rb = hal::row_bytes(*t.dtype, in);
  int slot[8];
  for (int i = 0; i < 8; ++i) slot[gptq ? i : kOrder[i]] = i;
  for (std::int64_t n = 0; n < out; ++n) {
    hal::dequantize_row(*t.dtype, t.data.data() + static_cast<std::size_t>(n) * rb, row.data(), in);
    const int shift = 4 * slot[n % 8];
    for (std::int64_t g = 0; g < groups; ++g) {
      const float* w = row.data() + g * kGroup;
      float lo = w[0], hi = w[0];
      for (std::int64_t i = 1; i < kGroup; ++i) lo = std::min(lo, w[i]), hi = std::max(hi, w[i]);
      const float span = gptq ? 2.0f * std::max(std::fabs(lo), std::fabs(hi)) : hi - lo;
      const std::uint16_t sh = f32_to_f16(std::max(span, 1e-5f) / 15.0f);
      const float scale = f16_to_f32(sh);
      const float zero = gptq ? 8.0f : std::clamp(std::nearbyint(-lo / scale), 0.0f, 15.0f);
      sc[static_cast<std::size_t>(g * out + n)] = sh;
      const auto stored_zero = static_cast<std::uint32_t>(gptq ? zero - 1.0f : zero);  // GPTQ v1: minus one
      qz[static_cast<std::size_t>(g * out / 8 + n / 8)] |= stored_zero << shift;
      for (std::int64_t i = 0; i < kGroup; ++i) {
        const auto q = static_cast<std::uint32_t>(std::clamp(std::nearbyint(w[i] / scale) + zero, 0.0f, 15.0f));
        const std::int64_t k = g * kGroup + i;
        if (gptq) {
          qw[static_cast<std::size_t>((k / 8) * out + n)] |= q << (4 * (k % 8));
        } else {
          qw[static_cast<std::size_t>(k * out / 8 + n / 8)] |= q << shift;
        }
      }
    }
  }
  Int4Tensors r{as_bytes(qw), as_bytes(qz), as_bytes(sc), {}};
  if (gptq) {
    std::vector<std::int32_t> g_idx(static_cast<std::size_t>(in));
    for (std::int64_t i = 0; i < in; ++i) g_idx[static_cast<std::size_t>(i)] = static_cast<std::int32_t>(i / kGroup);
    r.g_idx = as_bytes(g_idx);
  }
  return r;
}

}  // namespace

namespace {

// Qwen3.5's config.json: the multimodal class with the language model's keys in text_config (no
// vision_config: the checkpoint holds no usable vision tower).
std::string hybrid_config_json(const ModelConfig& c, hal::DType dtype) {
  ordered_json t;
  t["attention_bias"] = false;
  t["attn_output_gate"] = true;
  t["dtype"] = torch_dtype(dtype);
  t["full_attention_interval"] = 4;
  t["head_dim"] = c.head_dim;
  t["hidden_act"] = "silu";
  t["hidden_size"] = c.hidden;
  if (!c.is_moe()) t["intermediate_size"] = c.ffn;
  ordered_json types = ordered_json::array();
  for (std::int64_t i = 0; i < c.n_layers; ++i) types.push_back(c.is_recurrent(i) ? "linear_attention" : "full_attention");
  t["layer_types"] = std::move(types);
  t["linear_conv_kernel_dim"] = c.ssm_conv_kernel;
  t["linear_key_head_dim"] = c.ssm_head_dim;
  t["linear_num_key_heads"] = c.ssm_k_heads;
  t["linear_num_value_heads"] = c.ssm_v_heads;
  t["linear_value_head_dim"] = c.ssm_head_dim;
  t["max_position_embeddings"] = c.context_length;
  t["model_type"] = c.is_moe() ? "qwen3_5_moe_text" : "qwen3_5_text";
  if (c.is_moe()) {
    t["moe_intermediate_size"] = c.expert_ffn;
    t["norm_topk_prob"] = c.norm_topk_prob;
    t["num_experts"] = c.n_experts;
    t["num_experts_per_tok"] = c.n_experts_used;
    t["shared_expert_intermediate_size"] = c.shared_expert_ffn;
  }
  t["num_attention_heads"] = c.n_heads;
  t["num_hidden_layers"] = c.n_layers;
  t["num_key_value_heads"] = c.n_kv_heads;
  t["rms_norm_eps"] = c.rms_eps;
  ordered_json sections = ordered_json::array();
  for (std::size_t i = 0; i < std::min<std::size_t>(3, c.rope_sections.size()); ++i) sections.push_back(c.rope_sections[i]);
  const std::int64_t rot = c.rot_dim > 0 ? c.rot_dim : c.head_dim;
  t["rope_parameters"] = {{"mrope_interleaved", true},
                          {"mrope_section", std::move(sections)},
                          {"partial_rotary_factor", static_cast<double>(rot) / static_cast<double>(c.head_dim)},
                          {"rope_theta", c.rope_theta},
                          {"rope_type", "default"}};
  t["tie_word_embeddings"] = c.tied_embeddings;
  t["vocab_size"] = c.vocab;
  ordered_json j;
  j["architectures"] = {c.is_moe() ? "Qwen3_5MoeForConditionalGeneration" : "Qwen3_5ForConditionalGeneration"};
  j["model_type"] = c.is_moe() ? "qwen3_5_moe" : "qwen3_5";
  if (!c.name.empty()) j["_name_or_path"] = c.name;
  j["text_config"] = std::move(t);
  j["tie_word_embeddings"] = c.tied_embeddings;
  j["torch_dtype"] = torch_dtype(dtype);
  return j.dump(2) + "\n";
}

// A Qwen3.5 tensor in the checkpoint's conventions (the inverse of HfModel's): V heads from
// llama.cpp's tiled order to Hugging Face's grouped one, norms as w - 1 of the (1 + w) RMSNorm,
// ssm_a as A_log = log(-a), conv1d [channels][1][kernel], the shared expert's gate [1][hidden].
// `t` is read through F32; the result is F32 in `values` with its row-major `shape`.
Status hybrid_tensor(const TensorInfo& t, const ModelConfig& c, std::vector<float>& values,
                     std::vector<std::int64_t>& shape, std::string_view where) {
  if (!t.dtype.has_value() || !hal::can_dequantize(*t.dtype)) {
    return invalid_argument_error("{}: tensor '{}' has type {}, which cannot be converted", where, t.name, t.type_name);
  }
  const std::int64_t cols = t.dims.empty() ? 1 : t.dims[0], rows = t.n_elements / cols;
  values.resize(static_cast<std::size_t>(t.n_elements));
  hal::convert_rows(*t.dtype, t.data.data(), hal::DType::kF32, reinterpret_cast<std::uint8_t*>(values.data()), rows,
                    cols);
  shape.assign(t.dims.rbegin(), t.dims.rend());
  const auto layer = parse_layer_tensor_name(t.name);
  auto is = [&](LayerTensor k) { return layer && layer->suffix == layer_tensor_suffix(k); };
  const std::int64_t nk = c.ssm_k_heads, groups = c.ssm_v_heads / std::max<std::int64_t>(1, c.ssm_k_heads);
  // Tiled V head m * nk + g (K head g) becomes grouped V head g * groups + m: runs of `unit` rows
  // (from row `first`) or, along_columns, of `unit` columns of every row.
  auto regroup = [&](std::int64_t first, std::int64_t unit, bool along_columns) {
    const std::vector<float> src = values;
    const std::size_t run = static_cast<std::size_t>(along_columns ? unit : unit * cols);
    for (std::int64_t r = 0; r < (along_columns ? rows : 1); ++r) {
      for (std::int64_t m = 0; m < groups; ++m) {
        for (std::int64_t g = 0; g < nk; ++g) {
          const std::int64_t from = m * nk + g, to = g * groups + m;
          const std::int64_t base = along_columns ? r * cols : first * cols;
          std::copy_n(src.begin() + base + from * static_cast<std::int64_t>(run), run,
                      values.begin() + base + to * static_cast<std::int64_t>(run));
        }
      }
    }
  };
  const std::int64_t d = c.ssm_head_dim, qk = 2 * nk * d;
  if (is(LayerTensor::kAttnQkv) || is(LayerTensor::kSsmConv1d)) regroup(qk, d, false);
  if (is(LayerTensor::kAttnGate)) regroup(0, d, false);
  if (is(LayerTensor::kSsmAlpha) || is(LayerTensor::kSsmBeta)) regroup(0, 1, false);
  if (is(LayerTensor::kSsmA) || is(LayerTensor::kSsmDt)) regroup(0, 1, true);  // 1-D: one row
  if (is(LayerTensor::kSsmOut)) regroup(0, d, true);
  if (t.name == kOutputNormName || is(LayerTensor::kAttnNorm) || is(LayerTensor::kPostAttentionNorm) ||
      is(LayerTensor::kAttnQNorm) || is(LayerTensor::kAttnKNorm)) {
    for (float& v : values) v -= 1.0f;
  }
  if (is(LayerTensor::kSsmA)) {
    for (float& v : values) {
      if (!(v < 0)) return invalid_argument_error("{}: tensor '{}' holds {}; ssm_a = -exp(A_log) is negative", where, t.name, v);
      v = std::log(-v);
    }
  }
  if (is(LayerTensor::kSsmConv1d)) shape = {c.ssm_conv_channels(), 1, c.ssm_conv_kernel};
  if (is(LayerTensor::kFfnGateInpShexp)) shape = {1, c.hidden};
  return ok_status();
}

}  // namespace

std::string hf_config_json(const ModelConfig& c, hal::DType dtype, Int4Checkpoint int4) {
  if (c.is_hybrid()) return hybrid_config_json(c, dtype);
  ordered_json j;
  const bool qwen3 = c.architecture == "qwen3" || c.architecture == "qwen3moe";
  j["architectures"] = {c.is_moe() ? "Qwen3MoeForCausalLM" : qwen3 ? "Qwen3ForCausalLM" : "Qwen2ForCausalLM"};
  j["model_type"] = c.is_moe() ? "qwen3_moe" : qwen3 ? "qwen3" : "qwen2";
  if (qwen3) {
    j["attention_bias"] = false;
    j["head_dim"] = c.head_dim;
  }
  if (c.is_moe()) {
    j["decoder_sparse_step"] = 1;
    j["mlp_only_layers"] = ordered_json::array();
    j["moe_intermediate_size"] = c.expert_ffn;
    j["norm_topk_prob"] = c.norm_topk_prob;
    j["num_experts"] = c.n_experts;
    j["num_experts_per_tok"] = c.n_experts_used;
  }
  if (!c.name.empty()) j["_name_or_path"] = c.name;
  j["hidden_act"] = "silu";
  j["hidden_size"] = c.hidden;
  j["intermediate_size"] = c.ffn;
  j["max_position_embeddings"] = c.context_length;
  j["num_attention_heads"] = c.n_heads;
  j["num_hidden_layers"] = c.n_layers;
  j["num_key_value_heads"] = c.n_kv_heads;
  j["rms_norm_eps"] = c.rms_eps;
  j["rope_theta"] = c.rope_theta;
  j["tie_word_embeddings"] = c.tied_embeddings;
  j["torch_dtype"] = torch_dtype(dtype);
  if (int4 == Int4Checkpoint::kAwq) {
    j["quantization_config"] = {{"bits", 4}, {"group_size", hal::kAwqInt4Group}, {"quant_method", "awq"},
                                {"version", "gemm"}, {"zero_point", true}};
  }
  if (int4 == Int4Checkpoint::kGptq) {
    j["quantization_config"] = {{"bits", 4},          {"checkpoint_format", "gptq"}, {"damp_percent", 0.01},
                                {"desc_act", false},  {"group_size", hal::kAwqInt4Group}, {"quant_method", "gptq"},
                                {"static_groups", false}, {"sym", true},           {"true_sequential", true}};
  }
  j["use_cache"] = true;
  j["vocab_size"] = c.vocab;
  return j.dump(2) + "\n";
}

Status write_hf_model(const TensorSource& src, const ModelConfig& c, const HfWriteOptions& o, const std::string& dir) {
  if (find_arch_spec(c.architecture) == nullptr) {
    return invalid_argument_error("{}: only {} models can be written as safetensors, not '{}'", dir,
                                  supported_architectures(), c.architecture);
  }
  if ((c.is_moe() || c.is_hybrid()) && o.int4 != Int4Checkpoint::kNone) {
    return unimplemented_error("{}: AWQ / GPTQ checkpoints of a mixture of experts or a Qwen3.5 model are not written",
                               dir);
  }
  if (o.dtype != hal::DType::kF32 && o.dtype != hal::DType::kF16 && o.dtype != hal::DType::kBF16) {
    return invalid_argument_error("safetensors weights must be f32, f16 or bf16, not {}", hal::dtype_name(o.dtype));
  }
  const std::vector<ExpectedTensor> expected = expected_tensors(c);
  if (o.shards < 1 || static_cast<std::size_t>(o.shards) > expected.size()) {
    return invalid_argument_error("--shards {} must be in 1..{} (the model's tensor count)", o.shards, expected.size());
  }
  const bool int4 = o.int4 != Int4Checkpoint::kNone;
  const bool gptq = o.int4 == Int4Checkpoint::kGptq;
  const char* int4_name = gptq ? "GPTQ" : "AWQ";
  if (int4 && o.dtype != hal::DType::kF16) {
    return invalid_argument_error("an {} checkpoint keeps its other tensors in f16, not {}", int4_name,
                                  hal::dtype_name(o.dtype));
  }
  auto int4_matrix = [&](const TensorInfo& t) {
    return int4 && t.dims.size() == 2 && t.name != kTokenEmbdName && t.name != kOutputName;
  };
  std::vector<const TensorInfo*> tensors;
  std::uint64_t total = 0;
  for (const ExpectedTensor& e : expected) {
    const TensorInfo* t = src.find_tensor(e.name);
    if (t == nullptr) return not_found_error("{}: tensor {} is missing", src.path(), src.tensor_label(e.name));
    tensors.push_back(t);
    const std::uint64_t cols = static_cast<std::uint64_t>(t->dims[0]), rows = static_cast<std::uint64_t>(t->n_elements) / cols;
    if (!int4_matrix(*t)) {
      total += hal::row_bytes(o.dtype, t->dims[0]) * rows;
    } else if (cols % hal::kAwqInt4Group != 0 || rows % 8 != 0) {
      return invalid_argument_error("{}: tensor '{}' has {} inputs and {} outputs; {} needs inputs in whole groups of "
                                    "{} and outputs in multiples of 8",
                                    src.path(), t->name, cols, rows, int4_name, hal::kAwqInt4Group);
    } else {
      const std::uint64_t groups = cols / hal::kAwqInt4Group;
      total += cols * rows / 2 + groups * rows / 2 + groups * rows * 2 + (gptq ? cols * 4 : 0);  // + g_idx
    }
  }
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) return invalid_argument_error("{}: cannot create the directory: {}", dir, ec.message());
  SX_RETURN_IF_ERROR(write_text((fs::path(dir) / kHfConfigFile).string(), hf_config_json(c, o.dtype, o.int4)));
  ordered_json gen = ordered_json::object();
  if (o.eos_ids.size() == 1) gen["eos_token_id"] = o.eos_ids[0];
  if (o.eos_ids.size() > 1) gen["eos_token_id"] = o.eos_ids;
  SX_RETURN_IF_ERROR(write_text((fs::path(dir) / kHfGenerationConfigFile).string(), gen.dump(2) + "\n"));
  if (!o.tokenizer_json.empty()) {
    SX_RETURN_IF_ERROR(write_text((fs::path(dir) / kHfTokenizerFile).string(), o.tokenizer_json));
  }
  if (!o.tokenizer_config_json.empty()) {
    SX_RETURN_IF_ERROR(write_text((fs::path(dir) / "tokenizer_config.json").string(), o.tokenizer_config_json));
  }
  // Remove what an earlier write may have left, so the directory holds one consistent checkpoint.
  for (const auto& entry : fs::directory_iterator(dir, ec)) {
    const std::string name = entry.path().filename().string();
    if (name.ends_with(".safetensors") || name == kSafetensorsIndexFile) fs::remove(entry.path(), ec);
  }

  const int n = o.shards;
  auto shard_name = [&](int i) {
    return n == 1 ? std::string(kSafetensorsSingleFile) : fmt::format("model-{:05d}-of-{:05d}.safetensors", i + 1, n);
  };
  ordered_json weight_map = ordered_json::object();
  std::size_t next = 0;
  std::uint64_t written = 0;
  for (int s = 0; s < n; ++s) {
    SafetensorsWriter w;
    w.set_metadata("format", "pt");
    // Take tensors until this shard reaches its share of the bytes, leaving one for each later shard.
    const std::uint64_t target = total * static_cast<std::uint64_t>(s + 1) / static_cast<std::uint64_t>(n);
    const std::size_t last = tensors.size() - static_cast<std::size_t>(n - 1 - s);
    bool any = false;
    while (next < last && (!any || written < target || s == n - 1)) {
      const TensorInfo& t = *tensors[next];
      std::string hf = gguf_to_hf_name(t.name).value_or(t.name);
      if (c.is_hybrid() && hf.starts_with("model.")) hf = fmt::format("model.language_model.{}", hf.substr(6));
      const auto layer = parse_layer_tensor_name(t.name);
      auto is = [&](LayerTensor k) { return layer && layer->suffix == layer_tensor_suffix(k); };
      if (c.is_hybrid() && t.dims.size() == 3) {
        // Transformers 5's fused experts: gate_up_proj [experts][2 * ffn][hidden] (each expert's gate
        // rows, then its up rows; written with the gate stack, the up stack skipped) and down_proj.
        const std::string base = fmt::format("model.language_model.layers.{}.mlp.experts.", layer ? layer->layer : 0);
        const std::int64_t experts = t.dims[2];
        if (is(LayerTensor::kFfnGateExps)) {
          const TensorInfo* up = src.find_tensor(layer_tensor_name(layer->layer, LayerTensor::kFfnUpExps));
          if (up == nullptr || up->dims != t.dims) {
            return not_found_error("{}: tensor {} is missing or unlike {}", src.path(),
                                   src.tensor_label(layer_tensor_name(layer->layer, LayerTensor::kFfnUpExps)), t.name);
          }
          SX_ASSIGN_OR_RETURN(std::vector<std::uint8_t> g, convert(t, o.dtype, src.path()));
          SX_ASSIGN_OR_RETURN(std::vector<std::uint8_t> u, convert(*up, o.dtype, src.path()));
          const std::size_t half = g.size() / static_cast<std::size_t>(experts);
          std::vector<std::uint8_t> bytes(2 * g.size());
          for (std::size_t e = 0; e < static_cast<std::size_t>(experts); ++e) {
            std::memcpy(bytes.data() + 2 * e * half, g.data() + e * half, half);
            std::memcpy(bytes.data() + (2 * e + 1) * half, u.data() + e * half, half);
          }
          written += bytes.size();
          SX_RETURN_IF_ERROR(w.add_tensor(base + "gate_up_proj", o.dtype, {experts, 2 * t.dims[1], t.dims[0]}, bytes));
          weight_map[base + "gate_up_proj"] = shard_name(s);
        } else if (is(LayerTensor::kFfnDownExps)) {
          SX_ASSIGN_OR_RETURN(std::vector<std::uint8_t> bytes, convert(t, o.dtype, src.path()));
          written += bytes.size();
          SX_RETURN_IF_ERROR(w.add_tensor(base + "down_proj", o.dtype, {experts, t.dims[1], t.dims[0]}, bytes));
          weight_map[base + "down_proj"] = shard_name(s);
        }
      } else if (c.is_hybrid()) {
        std::vector<float> values;
        std::vector<std::int64_t> shape;
        SX_RETURN_IF_ERROR(hybrid_tensor(t, c, values, shape, src.path()));
        TensorInfo f32 = t;
        f32.dtype = hal::DType::kF32;
        f32.type_name = "F32";
        f32.data = std::span<const std::uint8_t>(reinterpret_cast<const std::uint8_t*>(values.data()),
                                                 values.size() * sizeof(float));
        SX_ASSIGN_OR_RETURN(std::vector<std::uint8_t> bytes, convert(f32, o.dtype, src.path()));
        written += bytes.size();
        SX_RETURN_IF_ERROR(w.add_tensor(hf, o.dtype, std::move(shape), bytes));
        weight_map[hf] = shard_name(s);
      } else if (int4_matrix(t)) {
        const Int4Tensors a = quantize_int4(t, o.int4);
        const std::string base = hf.substr(0, hf.size() - std::string_view(".weight").size());
        const std::int64_t in = t.dims[0], out = t.dims[1];
        const std::vector<std::int64_t> qweight_shape =
            gptq ? std::vector<std::int64_t>{in / 8, out} : std::vector<std::int64_t>{in, out / 8};
        SX_RETURN_IF_ERROR(w.add_tensor(base + ".qweight", "I32", qweight_shape, a.qweight));
        SX_RETURN_IF_ERROR(w.add_tensor(base + ".qzeros", "I32", {in / hal::kAwqInt4Group, out / 8}, a.qzeros));
        SX_RETURN_IF_ERROR(w.add_tensor(base + ".scales", "F16", {in / hal::kAwqInt4Group, out}, a.scales));
        if (gptq) SX_RETURN_IF_ERROR(w.add_tensor(base + ".g_idx", "I32", {in}, a.g_idx));
        for (const char* suffix : {".qweight", ".qzeros", ".scales", ".g_idx"}) {
          if (gptq || std::string_view(suffix) != ".g_idx") weight_map[base + suffix] = shard_name(s);
        }
        written += a.qweight.size() + a.qzeros.size() + a.scales.size() + a.g_idx.size();
      } else if (t.dims.size() == 3) {
        // Stacked experts (Qwen3-MoE): one tensor per expert, as transformers names them.
        const std::int64_t experts = t.dims[2];
        const std::uint64_t per = t.n_bytes / static_cast<std::uint64_t>(experts);
        LayerTensor stacked = LayerTensor::kFfnGateExps;
        for (LayerTensor k : {LayerTensor::kFfnGateExps, LayerTensor::kFfnUpExps, LayerTensor::kFfnDownExps}) {
          if (layer && layer->suffix == layer_tensor_suffix(k)) stacked = k;
        }
        for (std::int64_t e = 0; e < experts; ++e) {
          TensorInfo one = t;
          one.dims.pop_back();
          one.n_elements = t.n_elements / experts;
          one.n_bytes = per;
          one.data = t.data.subspan(static_cast<std::size_t>(per * static_cast<std::uint64_t>(e)), per);
          SX_ASSIGN_OR_RETURN(std::vector<std::uint8_t> bytes, convert(one, o.dtype, src.path()));
          const std::string name = hf_expert_name(layer ? layer->layer : 0, e, stacked);
          written += bytes.size();
          SX_RETURN_IF_ERROR(w.add_tensor(name, o.dtype, {one.dims[1], one.dims[0]}, bytes));
          weight_map[name] = shard_name(s);
        }
      } else {
        SX_ASSIGN_OR_RETURN(std::vector<std::uint8_t> bytes, convert(t, o.dtype, src.path()));
        std::vector<std::int64_t> shape(t.dims.rbegin(), t.dims.rend());
        written += bytes.size();
        SX_RETURN_IF_ERROR(w.add_tensor(hf, o.dtype, std::move(shape), bytes));
        weight_map[hf] = shard_name(s);
      }
      any = true;
      ++next;
    }
    if (s == n - 1 && o.skipped_stand_ins) {
      // Small stand-ins for what a Qwen3.5 checkpoint holds beyond the language model.
      const std::vector<std::uint8_t> zeros(hal::row_bytes(o.dtype, 16) * 4, 0);
      for (const char* name : {"model.visual.patch_embed.proj.weight", "model.visual.blocks.0.attn.qkv.weight",
                               "mtp.fc.weight"}) {
        SX_RETURN_IF_ERROR(w.add_tensor(name, o.dtype, {4, 16}, zeros));
        weight_map[name] = shard_name(s);
      }
    }
    SX_RETURN_IF_ERROR(w.write((fs::path(dir) / shard_name(s)).string()));
  }
  if (n > 1) {
    ordered_json index;
    index["metadata"] = {{"total_size", total}};
    index["weight_map"] = std::move(weight_map);
    SX_RETURN_IF_ERROR(write_text((fs::path(dir) / kSafetensorsIndexFile).string(), index.dump(2) + "\n"));
  }
  return ok_status();
}

}  // namespace sx::model
