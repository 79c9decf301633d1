// HfModel: a Hugging Face safetensors directory as a TensorSource (GGUF names, ne-order dims).
#include "runtime/model/hf_model.h"

#include <algorithm>
#include <array>
#include <charconv>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <map>
#include <utility>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "runtime/base/json_parse.h"
#include "runtime/base/half.h"
#include "runtime/base/json_depth.h"
#include "runtime/base/mapped_file.h"
#include "runtime/model/json_util.h"
#include "runtime/model/tensor_names.h"

namespace sx::model {

namespace {

namespace fs = std::filesystem;
using nlohmann::json;

constexpr std::string_view kHfLayerPrefix = "model.layers.";

struct SuffixPair {
  std::string_view hf;
  LayerTensor gguf;
};
constexpr std::array<SuffixPair, 29> kLayerSuffixes = {{
    {"input_layernorm.weight", LayerTensor::kAttnNorm},
    {"self_attn.q_proj.weight", LayerTensor::kAttnQ},
    {"self_attn.q_proj.bias", LayerTensor::kAttnQBias},
    {"self_attn.k_proj.weight", LayerTensor::kAttnK},
    {"self_attn.k_proj.bias", LayerTensor::kAttnKBias},
    {"self_attn.v_proj.weight", LayerTensor::kAttnV},
    {"self_attn.v_proj.bias", LayerTensor::kAttnVBias},
    {"self_attn.o_proj.weight", LayerTensor::kAttnOutput},
    {"self_attn.q_norm.weight", LayerTensor::kAttnQNorm},
    {"self_attn.k_norm.weight", LayerTensor::kAttnKNorm},
    {"post_attention_layernorm.weight", LayerTensor::kFfnNorm},
    {"mlp.gate_proj.weight", LayerTensor::kFfnGate},
    {"mlp.up_proj.weight", LayerTensor::kFfnUp},
    {"mlp.down_proj.weight", LayerTensor::kFfnDown},
    {"mlp.gate.weight", LayerTensor::kFfnGateInp},  // Qwen3-MoE's router
    // Qwen3.5: the norm before the FFN (post_attention_layernorm maps here for a hybrid), the Gated
    // DeltaNet layers, the shared expert and its gate.
    {"post_attention_layernorm.weight", LayerTensor::kPostAttentionNorm},
    {"linear_attn.in_proj_qkv.weight", LayerTensor::kAttnQkv},
    {"linear_attn.in_proj_z.weight", LayerTensor::kAttnGate},
    {"linear_attn.in_proj_a.weight", LayerTensor::kSsmAlpha},
    {"linear_attn.in_proj_b.weight", LayerTensor::kSsmBeta},
    {"linear_attn.conv1d.weight", LayerTensor::kSsmConv1d},
    {"linear_attn.dt_bias", LayerTensor::kSsmDt},
    {"linear_attn.A_log", LayerTensor::kSsmA},
    {"linear_attn.norm.weight", LayerTensor::kSsmNorm},
    {"linear_attn.out_proj.weight", LayerTensor::kSsmOut},
    {"mlp.shared_expert_gate.weight", LayerTensor::kFfnGateInpShexp},
    {"mlp.shared_expert.gate_proj.weight", LayerTensor::kFfnGateShexp},
    {"mlp.shared_expert.up_proj.weight", LayerTensor::kFfnUpShexp},
    {"mlp.shared_expert.down_proj.weight", LayerTensor::kFfnDownShexp},
}};

// Qwen3.5's multimodal checkpoints keep the language model under this prefix (read as "model."),
// the vision tower and the multi-token-prediction layers under these (not read).
constexpr std::string_view kHfLanguageModelPrefix = "model.language_model.";
constexpr std::string_view kHfVisionPrefix = "model.visual.";
constexpr std::string_view kHfMtpPrefixes[] = {"mtp.", "model.mtp."};

// Transformers 5's fused experts: "model.layers.L.mlp.experts.gate_up_proj" [experts][2 * ffn][hidden]
// (each expert's gate rows, then its up rows) and ".down_proj" [experts][hidden][ffn], with or
// without a ".weight" suffix.
struct FusedExperts {
  std::int64_t layer;
  bool gate_up;  // else down_proj
};
std::optional<FusedExperts> parse_fused_experts(std::string_view name);

// Qwen3-MoE's experts: one tensor per expert, "model.layers.L.mlp.experts.E.<kind>", stacked at load
// into the GGUF layout's 3-D tensor (expert E's matrix after E - 1's).
constexpr std::array<SuffixPair, 3> kExpertSuffixes = {{
    {"gate_proj.weight", LayerTensor::kFfnGateExps},
    {"up_proj.weight", LayerTensor::kFfnUpExps},
    {"down_proj.weight", LayerTensor::kFfnDownExps},
}};
constexpr std::string_view kHfExpertsInfix = "mlp.experts.";

// "model.layers.L.mlp.experts.E.gate_proj.weight" -> {L, E, kFfnGateExps}.
struct ExpertName {
  std::int64_t layer, expert;
  LayerTensor stacked;
};
std::optional<ExpertName> parse_expert_name(std::string_view name);

struct GlobalPair {
  std::string_view hf;
  std::string_view gguf;
};
constexpr std::array<GlobalPair, 3> kGlobals = {{
    {"model.embed_tokens.weight", kTokenEmbdName},
    {"model.norm.weight", kOutputNormName},
    {"lm_head.weight", kOutputName},
}};

// "12.rest" -> {12, "rest"}: decimal digits without a leading zero (except "0"), then a dot.
std::optional<std::pair<std::int64_t, std::string_view>> split_layer(std::string_view s) {
  const std::size_t dot = s.find('.');
  if (dot == 0 || dot == std::string_view::npos || dot > 9 || (dot > 1 && s[0] == '0') || s[0] < '0' || s[0] > '9') {
    return std::nullopt;
  }
  std::int64_t layer = 0;
  const auto [end, ec] = std::from_chars(s.data(), s.data() + dot, layer);
  if (ec != std::errc() || end != s.data() + dot) return std::nullopt;
  return std::pair{layer, s.substr(dot + 1)};
}

std::string_view text_of(const MappedFile& f) {
  const auto b = f.bytes();
  return {reinterpret_cast<const char*>(b.data()), b.size()};
}

// An id in 0..2^31-1.
Result<std::int32_t> token_id(const json& v, std::string_view file, std::string_view key) {
  if (!v.is_number_integer() || (!v.is_number_unsigned() && v.get<std::int64_t>() < 0) ||
      v.get<std::uint64_t>() > static_cast<std::uint64_t>(INT32_MAX)) {
    return invalid_argument_error("{}: '{}' has {} ({}); expected a token id (an integer in 0..{})", file, key,
                                  json_type_name(v), v.dump(), INT32_MAX);
  }
  return static_cast<std::int32_t>(v.get<std::int64_t>());
}

std::optional<ExpertName> parse_expert_name(std::string_view name) {
  if (!name.starts_with(kHfLayerPrefix)) return std::nullopt;
  const auto layer = split_layer(name.substr(kHfLayerPrefix.size()));
  if (!layer || !layer->second.starts_with(kHfExpertsInfix)) return std::nullopt;
  const auto expert = split_layer(layer->second.substr(kHfExpertsInfix.size()));
  if (!expert) return std::nullopt;
  for (const SuffixPair& p : kExpertSuffixes) {
    if (p.hf == expert->second) return ExpertName{layer->first, expert->first, p.gguf};
  }
  return std::nullopt;
}

std::optional<FusedExperts> parse_fused_experts(std::string_view name) {
  if (!name.starts_with(kHfLayerPrefix)) return std::nullopt;
  const auto layer = split_layer(name.substr(kHfLayerPrefix.size()));
  if (!layer || !layer->second.starts_with(kHfExpertsInfix)) return std::nullopt;
  std::string_view rest = layer->second.substr(kHfExpertsInfix.size());
  if (rest.ends_with(".weight")) rest.remove_suffix(std::string_view(".weight").size());
  if (rest == "gate_up_proj") return FusedExperts{layer->first, true};
  if (rest == "down_proj") return FusedExperts{layer->first, false};
  return std::nullopt;
}

// A tensor name as the maps above spell it ("model.language_model.X" -> "model.X").
std::string normalized_hf_name(std::string_view name) {
  if (name.starts_with(kHfLanguageModelPrefix)) {
    return fmt::format("{}{}", kHfLayerPrefix.substr(0, 6), name.substr(kHfLanguageModelPrefix.size()));
  }
  return std::string(name);
}

}  // namespace

std::string hf_expert_name(std::int64_t layer, std::int64_t expert, LayerTensor stacked) {
  for (const SuffixPair& p : kExpertSuffixes) {
    if (p.gguf == stacked) return fmt::format("{}{}.{}{}.{}", kHfLayerPrefix, layer, kHfExpertsInfix, expert, p.hf);
  }
  return {};
}

std::optional<std::string> hf_to_gguf_name(std::string_view hf_name, bool hybrid) {
  const std::string name = normalized_hf_name(hf_name);
  for (const GlobalPair& g : kGlobals) {
    if (g.hf == name) return std::string(g.gguf);
  }
  if (!name.starts_with(kHfLayerPrefix)) return std::nullopt;
  const auto split = split_layer(std::string_view(name).substr(kHfLayerPrefix.size()));
  if (!split) return std::nullopt;
  for (const SuffixPair& p : kLayerSuffixes) {
    if (p.hf != split->second) continue;
    // The same HF name: the FFN norm of Qwen2 / Qwen3, the post-attention norm of Qwen3.5.
    if (p.gguf == LayerTensor::kFfnNorm && hybrid) continue;
    return layer_tensor_name(split->first, p.gguf);
  }
  return std::nullopt;
}

std::optional<std::string> gguf_to_hf_name(std::string_view name) {
  for (const GlobalPair& g : kGlobals) {
    if (g.gguf == name) return std::string(g.hf);
  }
  const auto layer = parse_layer_tensor_name(name);
  if (!layer) return std::nullopt;
  for (const SuffixPair& p : kLayerSuffixes) {
    if (layer_tensor_suffix(p.gguf) == layer->suffix) return fmt::format("{}{}.{}", kHfLayerPrefix, layer->layer, p.hf);
  }
  return std::nullopt;
}

Result<GenerationConfig> parse_generation_config(std::string_view text, std::string_view file) {
  if (json_nesting_depth(text) > kMaxJsonDepth) {
    return invalid_argument_error("{}: nests JSON arrays/objects more than {} levels deep", file, kMaxJsonDepth);
  }
  JsonParse parsed = parse_json(text);
  if (!parsed.ok()) return invalid_argument_error("{}: not valid JSON ({})", file, parsed.error);
  const json j = std::move(parsed.value);
  if (!j.is_object()) return invalid_argument_error("{}: expected a JSON object, found {}", file, json_type_name(j));
  GenerationConfig g;
  g.present = true;
  auto find = [&](std::string_view key) -> const json* {
    auto it = j.find(key);
    return it == j.end() || it->is_null() ? nullptr : &*it;
  };
  if (const json* e = find("eos_token_id")) {
    if (e->is_array()) {
      for (const json& v : *e) {
        SX_ASSIGN_OR_RETURN(std::int32_t id, token_id(v, file, "eos_token_id"));
        g.eos_ids.push_back(id);
      }
    } else {
      SX_ASSIGN_OR_RETURN(std::int32_t id, token_id(*e, file, "eos_token_id"));
      g.eos_ids.push_back(id);
    }
  }
  if (const json* b = find("bos_token_id")) {
    SX_ASSIGN_OR_RETURN(g.bos_id, token_id(*b, file, "bos_token_id"));
  }
  auto number = [&](std::string_view key, double lo, double hi) -> Result<std::optional<double>> {
    const json* v = find(key);
    if (v == nullptr) return std::optional<double>();
    if (!v->is_number() || !std::isfinite(v->get<double>()) || v->get<double>() < lo || v->get<double>() > hi) {
      return invalid_argument_error("{}: '{}' is {} ({}); expected a number in [{}, {}]", file, key, json_type_name(*v),
                                    v->dump(), lo, hi);
    }
    return std::optional<double>(v->get<double>());
  };
  SX_ASSIGN_OR_RETURN(g.temperature, number("temperature", 0, 1e6));
  SX_ASSIGN_OR_RETURN(g.top_p, number("top_p", 0, 1));
  SX_ASSIGN_OR_RETURN(g.repetition_penalty, number("repetition_penalty", 1e-6, 1e6));
  if (const json* k = find("top_k")) {
    if (!k->is_number_integer()) {
      return invalid_argument_error("{}: 'top_k' is {} ({}); expected an integer", file, json_type_name(*k), k->dump());
    }
    // nlohmann counts unsigned numbers as integers too: 2^64-1 read as int64 would be -1 (off).
    if (k->is_number_unsigned() && k->get<std::uint64_t>() > static_cast<std::uint64_t>(INT64_MAX)) {
      return invalid_argument_error("{}: 'top_k' is {}; expected an integer no larger than {}", file, k->dump(),
                                    INT64_MAX);
    }
    g.top_k = k->get<std::int64_t>();
  }
  return g;
}

Result<GenerationConfig> read_generation_config(const std::string& path) {
  std::error_code ec;
  if (!fs::exists(path, ec)) return GenerationConfig{};
  SX_ASSIGN_OR_RETURN(std::unique_ptr<MappedFile> f, MappedFile::open(path));
  return parse_generation_config(text_of(*f), path);
}

Result<std::unique_ptr<HfModel>> HfModel::open(const std::string& dir) {
  std::error_code ec;
  const fs::file_status st = fs::status(dir, ec);
  if (!fs::exists(st)) return not_found_error("{}: no such file or directory", dir);
  if (!fs::is_directory(st)) {
    return invalid_argument_error(
        "{} is a file, not a Hugging Face model directory (give the directory that holds config.json and the "
        ".safetensors files)",
        dir);
  }
  std::unique_ptr<HfModel> m(new HfModel());
  m->dir_ = dir;
  const fs::path root(dir);
  const std::string config_path = (root / kHfConfigFile).string();
  if (!fs::exists(config_path, ec)) {
    return not_found_error("{}: {} is missing; a Hugging Face model directory needs it for the hyper-parameters", dir,
                           kHfConfigFile);
  }
  SX_ASSIGN_OR_RETURN(m->hf_, read_hf_config(config_path));
  SX_ASSIGN_OR_RETURN(m->generation_, read_generation_config((root / kHfGenerationConfigFile).string()));
  SX_ASSIGN_OR_RETURN(SafetensorsModel weights, open_safetensors_dir(dir));
  m->weights_ = std::make_unique<SafetensorsModel>(std::move(weights));
  m->warnings_ = m->weights_->warnings();

  const bool int4 = !m->hf_.quant_method.empty();
  if (int4) SX_RETURN_IF_ERROR(m->check_quantization());
  // A mixture of experts' tensors, per (layer, stacked tensor), by expert id.
  std::map<std::pair<std::int64_t, LayerTensor>, std::vector<const SafetensorsTensor*>> experts;
  std::map<std::pair<std::int64_t, bool>, const SafetensorsTensor*> fused;  // (layer, gate_up) -> tensor
  const ModelConfig& hc = m->hf_.config;
  const bool hybrid = hc.is_hybrid();
  if (int4 && hybrid) {
    return unimplemented_error("{}: {} checkpoints of {} are not supported; use its BF16 checkpoint or a GGUF file",
                               dir, m->hf_.quant_method, hc.architecture);
  }
  std::int64_t n_vision = 0, n_mtp = 0;
  for (const SafetensorsTensor* t : m->weights_->tensors()) {
    if (t->name.starts_with(kHfVisionPrefix)) {
      ++n_vision;
      continue;
    }
    if (std::any_of(std::begin(kHfMtpPrefixes), std::end(kHfMtpPrefixes),
                    [&](std::string_view p) { return t->name.starts_with(p); })) {
      ++n_mtp;
      continue;
    }
    const std::string hf_name = normalized_hf_name(t->name);
    if (const auto f = parse_fused_experts(hf_name); f && hc.is_moe() && !int4) {
      if (f->layer >= hc.n_layers) {
        return invalid_argument_error("{}: tensor '{}' names layer {}, but config.json has {} layers", dir, t->name,
                                      f->layer, hc.n_layers);
      }
      fused[{f->layer, f->gate_up}] = t;
      continue;
    }
    if (const auto e = parse_expert_name(hf_name); e && hc.is_moe() && !int4) {
      if (e->layer >= hc.n_layers || e->expert >= hc.n_experts) {
        return invalid_argument_error("{}: tensor '{}' names layer {} / expert {}, but config.json has {} layers of {} "
                                      "experts", dir, t->name, e->layer, e->expert, hc.n_layers, hc.n_experts);
      }
      auto& slot = experts[{e->layer, e->stacked}];
      slot.resize(static_cast<std::size_t>(hc.n_experts), nullptr);
      slot[static_cast<std::size_t>(e->expert)] = t;
      continue;
    }
    if (int4 && (t->name.ends_with(".qzeros") || t->name.ends_with(".scales") || t->name.ends_with(".g_idx"))) {
      // Read with its .qweight; one without a .qweight is left over from something else.
      const std::string base = t->name.substr(0, t->name.rfind('.'));
      if (m->weights_->find(base + ".qweight") == nullptr) {
        m->warnings_.push_back(fmt::format("{}: tensor '{}' in {} is not used: there is no '{}.qweight' to go with it",
                                           dir, t->name, fs::path(t->file).filename().string(), base));
      }
      continue;
    }
    if (int4 && t->name.ends_with(".qweight")) {
      const std::string base = t->name.substr(0, t->name.size() - std::string_view(".qweight").size());
      std::optional<std::string> name = hf_to_gguf_name(base + ".weight");
      if (!name) {
        m->warnings_.push_back(fmt::format("{}: tensor '{}' in {} is not used by {}", dir, t->name,
                                           fs::path(t->file).filename().string(), m->hf_.config.architecture));
        continue;
      }
      SX_ASSIGN_OR_RETURN(TensorInfo info, m->repack_int4(base, *t, std::move(*name)));
      m->hf_names_.push_back(t->name);
      m->tensors_.push_back(std::move(info));
      continue;
    }
    std::optional<std::string> name = hf_to_gguf_name(t->name, hybrid);
    if (!name) {
      m->warnings_.push_back(fmt::format("{}: tensor '{}' in {} is not used by {}", dir, t->name,
                                         fs::path(t->file).filename().string(), m->hf_.config.architecture));
      continue;
    }
    if (*name == kOutputName && m->hf_.config.tied_embeddings) {
      m->warnings_.push_back(fmt::format(
          "{}: tensor 'lm_head.weight' is ignored: config.json says tie_word_embeddings, so the LM head is "
          "model.embed_tokens.weight",
          dir));
      continue;
    }
    TensorInfo info;
    info.name = std::move(*name);
    info.dims.assign(t->shape.rbegin(), t->shape.rend());
    info.type_name = t->dtype_name;
    info.dtype = t->dtype;
    info.ggml_type = UINT32_MAX;
    info.offset = t->begin;
    info.n_bytes = t->n_bytes();
    info.n_elements = t->n_elements;
    info.data = t->data;
    info.file = t->file;
    if (hybrid) SX_RETURN_IF_ERROR(m->to_gguf_convention(*t, info));
    // The forward keeps 1-D tensors in F32.
    if (info.dims.size() == 1 && (info.dtype == hal::DType::kF16 || info.dtype == hal::DType::kBF16)) {
      std::vector<std::uint8_t>& wide = m->owned_.emplace_back(static_cast<std::size_t>(t->n_elements) * sizeof(float));
      hal::dequantize_row(*t->dtype, t->data.data(), reinterpret_cast<float*>(wide.data()), t->n_elements);
      info.dtype = hal::DType::kF32;
      info.type_name = "F32";
      info.n_bytes = wide.size();
      info.data = wide;
    }
    m->hf_names_.push_back(t->name);
    m->tensors_.push_back(std::move(info));
  }
  if (n_vision > 0) {
    m->warnings_.push_back(fmt::format("{}: the vision tower's {} tensors (model.visual.*) are not loaded: Sextant "
                                       "serves the language model only (as vLLM's --language-model-only)",
                                       dir, n_vision));
  }
  if (n_mtp > 0) {
    m->warnings_.push_back(fmt::format("{}: the multi-token-prediction layer's {} tensors (mtp.*) are not loaded "
                                       "(they serve speculative decoding)", dir, n_mtp));
  }
  SX_RETURN_IF_ERROR(m->add_fused_experts(fused));
  // Each layer's experts stacked into one tensor, as GGUF holds them (copied into memory this model
  // owns: the experts' bytes once more while it is open).
  for (const auto& [key, list] : experts) {
    const auto& [layer, stacked] = key;
    const SafetensorsTensor* first = list.front();
    for (std::size_t e = 0; e < list.size(); ++e) {
      const SafetensorsTensor* t = list[e];
      if (t == nullptr) {
        return not_found_error("{}: tensor '{}' is missing (config.json has {} experts per layer)", dir,
                               hf_expert_name(layer, static_cast<std::int64_t>(e), stacked), hc.n_experts);
      }
      if (first != nullptr && (t->shape != first->shape || t->dtype != first->dtype)) {
        return invalid_argument_error("{}: tensor '{}' is {} {} but expert 0's is {} {}", dir, t->name, t->dtype_name,
                                      dims_to_string(t->shape), first->dtype_name, dims_to_string(first->shape));
      }
    }
    TensorInfo info;
    info.name = layer_tensor_name(layer, stacked);
    info.dims.assign(first->shape.rbegin(), first->shape.rend());
    info.dims.push_back(hc.n_experts);
    info.type_name = first->dtype_name;
    info.dtype = first->dtype;
    info.ggml_type = UINT32_MAX;
    info.n_elements = first->n_elements * hc.n_experts;
    std::vector<std::uint8_t>& all = m->owned_.emplace_back(first->n_bytes() * list.size());
    for (std::size_t e = 0; e < list.size(); ++e) {
      std::memcpy(all.data() + e * first->n_bytes(), list[e]->data.data(), first->n_bytes());
    }
    info.n_bytes = all.size();
    info.data = all;
    info.file = first->file;
    m->hf_names_.push_back(fmt::format("{}{}.{}* ({} tensors)", kHfLayerPrefix, layer, kHfExpertsInfix, list.size()));
    m->tensors_.push_back(std::move(info));
  }
  // Sort both by GGUF name for find_tensor.
  std::vector<std::size_t> order(m->tensors_.size());
  for (std::size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::sort(order.begin(), order.end(),
            [&](std::size_t a, std::size_t b) { return m->tensors_[a].name < m->tensors_[b].name; });
  std::vector<TensorInfo> tensors;
  std::vector<std::string> names;
  for (std::size_t i : order) {
    tensors.push_back(std::move(m->tensors_[i]));
    names.push_back(std::move(m->hf_names_[i]));
  }
  m->tensors_ = std::move(tensors);
  m->hf_names_ = std::move(names);
  return m;
}

// Qwen3.5's checkpoint conventions turned into GGUF's (llama.cpp's converter does the same, but
// the V heads stay grouped: ModelConfig::ssm_v_grouped): conv1d [channels][1][kernel] and the
// shared expert's gate [1][hidden] lose their unit dimension; the (1 + w) RMSNorm weights
// (not the gated ssm norm) get their 1 added; A_log becomes ssm_a = -exp(A_log).
Status HfModel::to_gguf_convention(const SafetensorsTensor& t, TensorInfo& info) {
  const auto layer = parse_layer_tensor_name(info.name);
  auto is = [&](LayerTensor k) { return layer && layer->suffix == layer_tensor_suffix(k); };
  if ((is(LayerTensor::kSsmConv1d) && info.dims.size() == 3 && info.dims[1] == 1) ||
      (is(LayerTensor::kFfnGateInpShexp) && info.dims.size() == 2 && info.dims[1] == 1)) {
    info.dims.erase(info.dims.begin() + 1);
  }
  const bool plus_one = info.name == kOutputNormName || is(LayerTensor::kAttnNorm) ||
                        is(LayerTensor::kPostAttentionNorm) || is(LayerTensor::kAttnQNorm) ||
                        is(LayerTensor::kAttnKNorm);
  const bool a_log = is(LayerTensor::kSsmA);
  if (!plus_one && !a_log) return ok_status();
  if (info.dims.size() != 1 || !t.dtype.has_value() || !hal::can_dequantize(*t.dtype)) {
    return invalid_argument_error("{}: tensor '{}' in {} is {} {}; expected a 1-D float vector", dir_, t.name,
                                  fs::path(t.file).filename().string(), t.dtype_name, t.shape_string());
  }
  std::vector<std::uint8_t>& wide = owned_.emplace_back(static_cast<std::size_t>(t.n_elements) * sizeof(float));
  float* v = reinterpret_cast<float*>(wide.data());
  hal::dequantize_row(*t.dtype, t.data.data(), v, t.n_elements);
  for (std::int64_t i = 0; i < t.n_elements; ++i) v[i] = a_log ? -std::exp(v[i]) : v[i] + 1.0f;
  info.dtype = hal::DType::kF32;
  info.type_name = "F32";
  info.n_bytes = wide.size();
  info.data = wide;
  return ok_status();
}

// Fused experts as GGUF's stacks: down_proj [experts][hidden][ffn] is ffn_down_exps as it is;
// gate_up_proj [experts][2 * ffn][hidden] is split (copied) into ffn_gate_exps and ffn_up_exps.
Status HfModel::add_fused_experts(const std::map<std::pair<std::int64_t, bool>, const SafetensorsTensor*>& fused) {
  const ModelConfig& hc = hf_.config;
  for (const auto& [key, t] : fused) {
    const auto [layer, gate_up] = key;
    const std::int64_t rows = gate_up ? 2 * hc.expert_ffn : hc.hidden, cols = gate_up ? hc.hidden : hc.expert_ffn;
    if (t->shape != std::vector<std::int64_t>{hc.n_experts, rows, cols} || !t->dtype.has_value()) {
      return invalid_argument_error("{}: tensor '{}' in {} is {} {}; config.json implies [{}, {}, {}] ({} experts, "
                                    "{}{} rows of {})",
                                    dir_, t->name, fs::path(t->file).filename().string(), t->dtype_name,
                                    t->shape_string(), hc.n_experts, rows, cols, hc.n_experts, gate_up ? "2 x " : "",
                                    hc.expert_ffn, cols);
    }
    auto add = [&](LayerTensor stacked, std::span<const std::uint8_t> bytes) {
      TensorInfo info;
      info.name = layer_tensor_name(layer, stacked);
      info.dims = {cols, gate_up ? hc.expert_ffn : rows, hc.n_experts};
      info.type_name = t->dtype_name;
      info.dtype = t->dtype;
      info.ggml_type = UINT32_MAX;
      info.n_elements = info.dims[0] * info.dims[1] * info.dims[2];
      info.n_bytes = bytes.size();
      info.data = bytes;
      info.file = t->file;
      hf_names_.push_back(t->name);
      tensors_.push_back(std::move(info));
    };
    if (!gate_up) {
      add(LayerTensor::kFfnDownExps, t->data);
      continue;
    }
    const std::size_t half = hal::row_bytes(*t->dtype, cols) * static_cast<std::size_t>(hc.expert_ffn);
    owned_.emplace_back(half * static_cast<std::size_t>(hc.n_experts));
    owned_.emplace_back(half * static_cast<std::size_t>(hc.n_experts));
    std::vector<std::uint8_t>& g = owned_[owned_.size() - 2];
    std::vector<std::uint8_t>& u = owned_.back();
    for (std::size_t e = 0; e < static_cast<std::size_t>(hc.n_experts); ++e) {
      std::memcpy(g.data() + e * half, t->data.data() + 2 * e * half, half);
      std::memcpy(u.data() + e * half, t->data.data() + (2 * e + 1) * half, half);
    }
    add(LayerTensor::kFfnGateExps, g);
    add(LayerTensor::kFfnUpExps, u);
  }
  return ok_status();
}

Status HfModel::check_quantization() const {
  const std::string where = (fs::path(dir_) / kHfConfigFile).string();
  const std::string& method = hf_.quant_method;
  if (method != "awq" && method != "gptq") {
    return unimplemented_error("{}: quantization_config.quant_method '{}' is not supported (supported: awq, gptq)",
                               where, method);
  }
  const char* name = method == "awq" ? "AWQ" : "GPTQ";
  if (hf_.quant_bits != 4 || hf_.quant_group_size != hal::kAwqInt4Group) {
    return unimplemented_error("{}: {} with {} bits in groups of {} is not supported (supported: 4 bits, groups of {})",
                               where, name, hf_.quant_bits, hf_.quant_group_size, hal::kAwqInt4Group);
  }
  const std::string& format = hf_.quant_checkpoint_format;
  if (method == "gptq" && !format.empty() && format != "gptq" && format != "gptq_v2") {
    return unimplemented_error("{}: GPTQ quantization_config.checkpoint_format '{}' is not supported (supported: gptq, "
                               "gptq_v2)",
                               where, format);
  }
  return ok_status();
}

Result<TensorInfo> HfModel::repack_int4(const std::string& base, const SafetensorsTensor& qweight, std::string name) {
  const bool gptq = hf_.quant_method == "gptq";
  const char* method = gptq ? "GPTQ" : "AWQ";
  const std::string shard = fs::path(qweight.file).filename().string();
  auto part = [&](std::string_view suffix, std::string_view dtype, std::size_t dims) -> Result<const SafetensorsTensor*> {
    const std::string n = base + std::string(suffix);
    const SafetensorsTensor* t = weights_->find(n);
    if (t == nullptr) {
      return not_found_error("{}: tensor '{}' is missing: {} stores '{}.qweight' with its .qzeros and .scales", dir_, n,
                             method, base);
    }
    if (t->dtype_name != dtype) {
      return invalid_argument_error("{}: {} tensor '{}' in {} has dtype {}; expected {}", dir_, method, n,
                                    fs::path(t->file).filename().string(), t->dtype_name, dtype);
    }
    if (t->shape.size() != dims) {
      return invalid_argument_error("{}: {} tensor '{}' has shape {}; expected {} dimension{}", dir_, method, n,
                                    t->shape_string(), dims, dims == 1 ? "" : "s");
    }
    return t;
  };
  SX_ASSIGN_OR_RETURN(const SafetensorsTensor* qw, part(".qweight", "I32", 2));
  SX_ASSIGN_OR_RETURN(const SafetensorsTensor* qz, part(".qzeros", "I32", 2));
  SX_ASSIGN_OR_RETURN(const SafetensorsTensor* sc, part(".scales", "F16", 2));
  constexpr std::int64_t kGroup = hal::kAwqInt4Group;
  // AWQ: qweight [in, out / 8]; GPTQ: [in / 8, out].
  const std::int64_t in = gptq ? qw->shape[0] * 8 : qw->shape[0];
  const std::int64_t out = gptq ? qw->shape[1] : qw->shape[1] * 8;
  if (in % kGroup != 0 || qz->shape != std::vector<std::int64_t>{in / kGroup, out / 8} ||
      sc->shape != std::vector<std::int64_t>{in / kGroup, out}) {
    return invalid_argument_error(
        "{}: {} tensors of '{}' in {} do not agree: qweight {}, qzeros {}, scales {}; expected {}, "
        "[in / {}, out / 8], [in / {}, out] with in a multiple of {}",
        dir_, method, base, shard, qw->shape_string(), qz->shape_string(), sc->shape_string(),
        gptq ? "[in / 8, out]" : "[in, out / 8]", kGroup, kGroup, kGroup);
  }
  if (gptq && weights_->find(base + ".g_idx") != nullptr) {
    // Act-order (desc_act) checkpoints map inputs to groups out of order; only the plain order is read.
    SX_ASSIGN_OR_RETURN(const SafetensorsTensor* gi, part(".g_idx", "I32", 1));
    if (gi->shape[0] != in) {
      return invalid_argument_error("{}: GPTQ tensor '{}.g_idx' has shape {}; expected [{}] (one group per input)", dir_,
                                    base, gi->shape_string(), in);
    }
    for (std::int64_t i = 0; i < in; ++i) {
      std::int32_t g;
      std::memcpy(&g, gi->data.data() + static_cast<std::size_t>(i) * 4, 4);
      if (g != i / kGroup) {
        return unimplemented_error(
            "{}: GPTQ tensor '{}.g_idx' puts input {} in group {}, not {}: act-order (desc_act) checkpoints are not "
            "supported; use one quantized with desc_act false",
            dir_, base, i, g, i / kGroup);
      }
    }
  }
  // AutoAWQ packs columns (0, 2, 4, 6, 1, 3, 5, 7) into nibbles 0..7: column c sits in nibble kAwqNibble[c].
  static constexpr int kAwqNibble[8] = {0, 4, 1, 5, 2, 6, 3, 7};
  auto word_nibble = [](const std::uint8_t* packed, std::int64_t word, int nibble) {
    std::uint32_t w;
    std::memcpy(&w, packed + static_cast<std::size_t>(word) * 4, 4);
    return static_cast<std::uint8_t>((w >> (4 * nibble)) & 15);
  };
  auto weight_q = [&](std::int64_t k, std::int64_t n) {  // the 4-bit value of input k, output n
    return gptq ? word_nibble(qw->data.data(), (k / 8) * out + n, static_cast<int>(k % 8))
                : word_nibble(qw->data.data(), k * (out / 8) + n / 8, kAwqNibble[n % 8]);
  };
  // GPTQ's v1 checkpoints store each zero minus one (AutoGPTQ's convention); gptq_v2 stores it as is.
  const int zero_offset = gptq && hf_.quant_checkpoint_format != "gptq_v2" ? 1 : 0;
  const std::int64_t groups = in / kGroup;
  std::vector<std::uint8_t>& buf =
      owned_.emplace_back(static_cast<std::size_t>(out * groups) * static_cast<std::size_t>(hal::kAwqInt4BlockBytes));
  for (std::int64_t n = 0; n < out; ++n) {
    for (std::int64_t g = 0; g < groups; ++g) {
      std::uint8_t* b = buf.data() + static_cast<std::size_t>(n * groups + g) * hal::kAwqInt4BlockBytes;
      for (std::int64_t j = 0; j < kGroup / 2; ++j) {
        const std::int64_t k = g * kGroup + 2 * j;
        b[j] = static_cast<std::uint8_t>(weight_q(k, n) | (weight_q(k + 1, n) << 4));
      }
      const int zero_nibble = gptq ? static_cast<int>(n % 8) : kAwqNibble[n % 8];
      const int stored = word_nibble(qz->data.data(), g * (out / 8) + n / 8, zero_nibble);
      const std::uint16_t zero = f32_to_f16(static_cast<float>(stored + zero_offset));
      std::memcpy(b + kGroup / 2, sc->data.data() + static_cast<std::size_t>(g * out + n) * 2, 2);
      std::memcpy(b + kGroup / 2 + 2, &zero, 2);
    }
  }
  TensorInfo info;
  info.name = std::move(name);
  info.dims = {in, out};
  info.type_name = method;
  info.dtype = hal::DType::kAwqInt4;
  info.ggml_type = UINT32_MAX;
  info.n_elements = in * out;
  info.n_bytes = buf.size();
  info.data = buf;
  info.file = qweight.file;
  return info;
}

const TensorInfo* HfModel::find_tensor(std::string_view name) const {
  auto it = std::lower_bound(tensors_.begin(), tensors_.end(), name,
                             [](const TensorInfo& t, std::string_view n) { return t.name < n; });
  return it != tensors_.end() && it->name == name ? &*it : nullptr;
}

std::string HfModel::tensor_label(std::string_view name) const {
  if (const TensorInfo* t = find_tensor(name)) {
    const std::size_t i = static_cast<std::size_t>(t - tensors_.data());
    return fmt::format("'{}' in {}", hf_names_[i], fs::path(t->file).filename().string());
  }
  return fmt::format("'{}'", gguf_to_hf_name(name).value_or(std::string(name)));
}

std::string HfModel::missing_detail(std::string_view) const {
  if (weights_->index_path().empty()) return fmt::format("{} does not hold it", kSafetensorsSingleFile);
  return fmt::format("{} does not name it and none of the {} shards holds it", kSafetensorsIndexFile,
                     weights_->shards().size());
}

std::string HfModel::shape_label(std::span<const std::int64_t> dims) const {
  std::vector<std::int64_t> reversed(dims.rbegin(), dims.rend());
  return dims_to_string(reversed);
}

std::vector<std::string> HfModel::weight_files() const {
  std::vector<std::string> files;
  for (const SafetensorsFile& f : weights_->shards()) files.push_back(f.path());
  return files;
}

std::string HfModel::tokenizer_path() const { return (fs::path(dir_) / kHfTokenizerFile).string(); }

}  // namespace sx::model
