// Hugging Face config.json -> ModelConfig for Qwen2 / Qwen3 (the keys are listed in hf_config.h).
// nlohmann's parse exceptions are caught here; every other access checks the type first.
#include "runtime/model/hf_config.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <optional>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "runtime/base/json_parse.h"
#include "runtime/base/json_depth.h"
#include "runtime/model/json_util.h"
#include "runtime/base/mapped_file.h"

namespace sx::model {

namespace {

using nlohmann::json;

struct HfArch {
  std::string_view model_type;
  std::string_view class_name;
  bool qkv_bias;
  bool head_dim_key;  // head_dim is a key of its own (may differ from hidden / heads)
  std::string_view architecture;  // ModelConfig::architecture (GGUF general.architecture)
  bool moe = false;               // num_experts, num_experts_per_tok, moe_intermediate_size
  bool hybrid = false;            // Gated DeltaNet + gated attention (Qwen3.5): keys in text_config
};

constexpr HfArch kArchs[] = {
    {"qwen2", "Qwen2ForCausalLM", true, false, "qwen2"},
    {"qwen3", "Qwen3ForCausalLM", false, true, "qwen3"},
    {"qwen3_moe", "Qwen3MoeForCausalLM", false, true, "qwen3moe", true},
    // Qwen3.5 / 3.6 / 3.8: the multimodal checkpoints (text weights only) and text-only ones.
    {"qwen3_5", "Qwen3_5ForConditionalGeneration", false, true, "qwen35", false, true},
    {"qwen3_5_text", "Qwen3_5ForCausalLM", false, true, "qwen35", false, true},
    {"qwen3_5_moe", "Qwen3_5MoeForConditionalGeneration", false, true, "qwen35moe", true, true},
    {"qwen3_5_moe_text", "Qwen3_5MoeForCausalLM", false, true, "qwen35moe", true, true},
};

constexpr std::int64_t kMaxSize = std::numeric_limits<std::int32_t>::max();

// Reads keys of one JSON object, naming the file (and the parent key) in every message.
class Reader {
 public:
  Reader(const json& obj, std::string_view file, std::string prefix = "")
      : obj_(obj), file_(file), prefix_(std::move(prefix)) {}

  const json* find(std::string_view key) const {
    auto it = obj_.find(key);
    if (it == obj_.end() || it->is_null()) return nullptr;  // transformers treats null as absent
    return &*it;
  }
  std::string where(std::string_view key) const { return fmt::format("{}: '{}{}'", file_, prefix_, key); }
  std::string_view file() const { return file_; }
  const std::string& prefix() const { return prefix_; }

  Status wrong_type(std::string_view key, const json& v, std::string_view expected) const {
    return invalid_argument_error("{} is {} ({}); expected {}", where(key), json_type_name(v), v.dump(), expected);
  }

  // A positive integer in 1..2^31-1; required unless `fallback` is given.
  Result<std::int64_t> size(std::string_view key, std::optional<std::int64_t> fallback = std::nullopt) const {
    const json* v = find(key);
    if (v == nullptr) {
      if (fallback) return *fallback;
      return not_found_error("{} is missing", where(key));
    }
    if (!v->is_number_integer()) return wrong_type(key, *v, "an integer");
    const bool in_range = v->is_number_unsigned()
                              ? v->get<std::uint64_t>() >= 1 && v->get<std::uint64_t>() <= static_cast<std::uint64_t>(kMaxSize)
                              : v->get<std::int64_t>() >= 1 && v->get<std::int64_t>() <= kMaxSize;
    if (!in_range) {
      return invalid_argument_error("{} is {}; it must be in 1..{}", where(key), v->dump(), kMaxSize);
    }
    return v->get<std::int64_t>();
  }

  // A finite positive number (integers allowed: "rope_theta": 1000000).
  Result<double> positive(std::string_view key, double fallback) const {
    const json* v = find(key);
    if (v == nullptr) return fallback;
    if (!v->is_number()) return wrong_type(key, *v, "a number");
    const double d = v->get<double>();
    if (!(d > 0) || !std::isfinite(d)) {
      return invalid_argument_error("{} is {}; it must be a positive number", where(key), v->dump());
    }
    return d;
  }

  Result<bool> boolean(std::string_view key, bool fallback) const {
    const json* v = find(key);
    if (v == nullptr) return fallback;
    if (!v->is_boolean()) return wrong_type(key, *v, "true or false");
    return v->get<bool>();
  }

  Result<std::string> string(std::string_view key) const {
    const json* v = find(key);
    if (v == nullptr) return std::string();
    if (!v->is_string()) return wrong_type(key, *v, "a string");
    return v->get<std::string>();
  }

 private:
  const json& obj_;
  std::string_view file_;
  std::string prefix_;
};

// Qwen3.5's text_config: the Gated DeltaNet sizes (linear_*), which layers are full attention
// (layer_types, else every full_attention_interval-th), and the partial multimodal rope
// (rope_parameters, or the older top-level rope_theta / partial_rotary_factor / rope_scaling).
// The V heads are stored grouped by their K head, as transformers computes them.
Status read_hybrid(const Reader& t, ModelConfig& c) {
  SX_ASSIGN_OR_RETURN(c.ssm_k_heads, t.size("linear_num_key_heads"));
  SX_ASSIGN_OR_RETURN(c.ssm_v_heads, t.size("linear_num_value_heads"));
  SX_ASSIGN_OR_RETURN(c.ssm_head_dim, t.size("linear_key_head_dim"));
  SX_ASSIGN_OR_RETURN(const std::int64_t v_dim, t.size("linear_value_head_dim", c.ssm_head_dim));
  if (v_dim != c.ssm_head_dim) {
    return unimplemented_error("{} is {} but {} is {}: DeltaNet heads whose keys and values differ in size are not "
                               "supported", t.where("linear_value_head_dim"), v_dim, t.where("linear_key_head_dim"),
                               c.ssm_head_dim);
  }
  if (c.ssm_v_heads % c.ssm_k_heads != 0) {
    return invalid_argument_error("{} {} is not a multiple of {} {}", t.where("linear_num_value_heads"), c.ssm_v_heads,
                                  t.where("linear_num_key_heads"), c.ssm_k_heads);
  }
  SX_ASSIGN_OR_RETURN(c.ssm_conv_kernel, t.size("linear_conv_kernel_dim", 4));
  c.ssm_v_grouped = true;
  SX_ASSIGN_OR_RETURN(const bool gated, t.boolean("attn_output_gate", true));
  if (!gated) {
    return unimplemented_error("{} is false: Qwen3.5's full-attention layers without their output gate are not "
                               "supported", t.where("attn_output_gate"));
  }
  c.recurrent_layers.clear();
  if (const json* types = t.find("layer_types")) {
    if (!types->is_array() || static_cast<std::int64_t>(types->size()) != c.n_layers) {
      return invalid_argument_error("{} must be an array of {} layer types (num_hidden_layers), not {}",
                                    t.where("layer_types"), c.n_layers, types->dump().substr(0, 80));
    }
    for (const json& v : *types) {
      if (!v.is_string() || (v != "linear_attention" && v != "full_attention")) {
        return invalid_argument_error("{} holds {}; each must be \"linear_attention\" or \"full_attention\"",
                                      t.where("layer_types"), v.dump());
      }
      c.recurrent_layers.push_back(v == "linear_attention");
    }
  } else {
    SX_ASSIGN_OR_RETURN(const std::int64_t interval, t.size("full_attention_interval", 4));
    for (std::int64_t i = 0; i < c.n_layers; ++i) c.recurrent_layers.push_back((i + 1) % interval != 0);
  }
  // rope_parameters (transformers 5) or the keys it replaced.
  const json* rp = t.find("rope_parameters");
  if (rp != nullptr && !rp->is_object()) return t.wrong_type("rope_parameters", *rp, "an object");
  const Reader rope = rp != nullptr ? Reader(*rp, t.file(), t.prefix() + "rope_parameters.") : t;
  SX_ASSIGN_OR_RETURN(c.rope_theta, rope.positive("rope_theta", 10000.0));
  SX_ASSIGN_OR_RETURN(const double factor, rope.positive("partial_rotary_factor", 0.25));
  const double rot = factor * static_cast<double>(c.head_dim);
  if (factor > 1 || rot != std::floor(rot) || static_cast<std::int64_t>(rot) % 2 != 0) {
    return invalid_argument_error("{} {} of head_dim {} is not an even number of rotated dims",
                                  rope.where("partial_rotary_factor"), factor, c.head_dim);
  }
  c.rot_dim = static_cast<std::int64_t>(rot);
  const json* scaling = rp == nullptr ? t.find("rope_scaling") : nullptr;
  const json* sections = rp != nullptr ? rope.find("mrope_section")
                         : scaling != nullptr && scaling->is_object() && scaling->contains("mrope_section")
                             ? &(*scaling)["mrope_section"]
                             : nullptr;
  c.rope_sections = {11, 11, 10, 0};  // transformers' default, as llama.cpp writes it when absent
  if (sections != nullptr) {
    if (!sections->is_array() || sections->size() > 4) {
      return invalid_argument_error("{}: 'mrope_section' is {}; expected up to 4 section sizes", t.file(),
                                    sections->dump().substr(0, 80));
    }
    c.rope_sections.assign(4, 0);
    for (std::size_t i = 0; i < sections->size(); ++i) {
      const json& v = (*sections)[i];
      if (!v.is_number_integer() || v.get<std::int64_t>() < 0 || v.get<std::int64_t>() > c.head_dim) {
        return invalid_argument_error("{}: 'mrope_section' holds {}; expected sizes in 0..{}", t.file(), v.dump(),
                                      c.head_dim);
      }
      c.rope_sections[i] = v.get<std::int64_t>();
    }
  }
  return ok_status();
}

Result<const HfArch*> find_arch(const Reader& r, std::string_view file) {
  SX_ASSIGN_OR_RETURN(std::string model_type, r.string("model_type"));
  std::string class_name;
  if (const json* a = r.find("architectures")) {
    if (!a->is_array() || a->empty() || !(*a)[0].is_string()) {
      return r.wrong_type("architectures", *a, "an array of class names such as [\"Qwen2ForCausalLM\"]");
    }
    class_name = (*a)[0].get<std::string>();
  }
  if (model_type.empty() && class_name.empty()) {
    return not_found_error("{}: neither 'model_type' nor 'architectures' is present, so the architecture is unknown "
                           "(supported: {})",
                           file, supported_hf_architectures());
  }
  const HfArch* by_type = nullptr;
  const HfArch* by_class = nullptr;
  for (const HfArch& a : kArchs) {
    if (a.model_type == model_type) by_type = &a;
    if (a.class_name == class_name) by_class = &a;
  }
  const std::string shown = model_type.empty() ? fmt::format("architectures '{}'", class_name)
                            : class_name.empty() ? fmt::format("model_type '{}'", model_type)
                                                 : fmt::format("model_type '{}' ({})", model_type, class_name);
  if ((!model_type.empty() && by_type == nullptr) || (!class_name.empty() && by_class == nullptr)) {
    return unimplemented_error("{}: {} is not supported (supported: {})", file, shown, supported_hf_architectures());
  }
  // A multimodal model_type with its text-only class (or the other way round) is the same model.
  if (by_type != nullptr && by_class != nullptr && by_type->architecture != by_class->architecture) {
    return invalid_argument_error("{}: 'model_type' is '{}' but 'architectures' names {}; they must agree", file,
                                  model_type, class_name);
  }
  return by_type != nullptr ? by_type : by_class;
}

}  // namespace

std::string supported_hf_architectures() {
  std::string out;
  for (const HfArch& a : kArchs) out += fmt::format("{}{} ({})", out.empty() ? "" : ", ", a.model_type, a.class_name);
  return out;
}

Result<HfConfig> parse_hf_config(std::string_view json_text, std::string_view display_name) {
  const std::string_view file = display_name;
  if (json_nesting_depth(json_text) > kMaxJsonDepth) {
    return invalid_argument_error("{}: not a config.json: nests JSON arrays/objects more than {} levels deep", file,
                                  kMaxJsonDepth);
  }
  JsonParse parsed = parse_json(json_text);
  if (!parsed.ok()) return invalid_argument_error("{}: not valid JSON: {}", file, parsed.error);
  const json root = std::move(parsed.value);
  if (!root.is_object()) {
    return invalid_argument_error("{}: a config.json holds one JSON object; this holds {}", file, json_type_name(root));
  }
  const Reader r(root, file);
  SX_ASSIGN_OR_RETURN(const HfArch* arch, find_arch(r, file));

  // Qwen3.5's multimodal checkpoints keep the language model's keys in text_config.
  const json* text_config = arch->hybrid ? r.find("text_config") : nullptr;
  if (text_config != nullptr && !text_config->is_object()) return r.wrong_type("text_config", *text_config, "an object");
  const Reader t(text_config != nullptr ? *text_config : root, file, text_config != nullptr ? "text_config." : "");
  HfConfig out;
  ModelConfig& c = out.config;
  c.architecture = std::string(arch->architecture);
  SX_ASSIGN_OR_RETURN(c.name, r.string("_name_or_path"));
  SX_ASSIGN_OR_RETURN(c.n_layers, t.size("num_hidden_layers"));
  SX_ASSIGN_OR_RETURN(c.hidden, t.size("hidden_size"));
  SX_ASSIGN_OR_RETURN(c.n_heads, t.size("num_attention_heads"));
  SX_ASSIGN_OR_RETURN(c.n_kv_heads, t.size("num_key_value_heads", c.n_heads));
  if (!(arch->hybrid && arch->moe) || t.find("intermediate_size") != nullptr) {
    SX_ASSIGN_OR_RETURN(c.ffn, t.size("intermediate_size"));  // Qwen3.5-MoE has none (every FFN is experts)
  }
  SX_ASSIGN_OR_RETURN(c.vocab, t.size("vocab_size"));
  SX_ASSIGN_OR_RETURN(c.context_length, t.size("max_position_embeddings"));
  SX_ASSIGN_OR_RETURN(c.rope_theta, t.positive("rope_theta", 10000.0));
  SX_ASSIGN_OR_RETURN(c.rms_eps, t.positive("rms_norm_eps", 1e-6));
  // A multimodal checkpoint may say it at the top level.
  SX_ASSIGN_OR_RETURN(const bool tied_root, r.boolean("tie_word_embeddings", false));
  SX_ASSIGN_OR_RETURN(c.tied_embeddings, t.boolean("tie_word_embeddings", tied_root));
  c.qkv_bias = arch->qkv_bias;
  if (!arch->qkv_bias) {
    SX_ASSIGN_OR_RETURN(const bool attention_bias, t.boolean("attention_bias", false));
    if (attention_bias) {
      return unimplemented_error("{}: 'attention_bias' is true; {} with q/k/v biases is not supported", file,
                                 arch->class_name);
    }
  }

  if (c.n_heads % c.n_kv_heads != 0) {
    return invalid_argument_error("{}: 'num_attention_heads' {} is not a multiple of 'num_key_value_heads' {}", file,
                                  c.n_heads, c.n_kv_heads);
  }
  const bool head_dim_given = t.find("head_dim") != nullptr;
  if (head_dim_given) {
    SX_ASSIGN_OR_RETURN(c.head_dim, t.size("head_dim"));
  }
  if (!head_dim_given || !arch->head_dim_key) {
    if (c.hidden % c.n_heads != 0) {
      return invalid_argument_error(
          "{}: 'hidden_size' {} is not a multiple of 'num_attention_heads' {}, so the head size is not whole{}", file,
          c.hidden, c.n_heads, arch->head_dim_key ? " (give 'head_dim')" : "");
    }
    const std::int64_t implied = c.hidden / c.n_heads;
    if (head_dim_given && c.head_dim != implied) {
      return invalid_argument_error(
          "{}: 'head_dim' is {} but {} uses hidden_size / num_attention_heads = {} / {} = {}; they must agree", file,
          c.head_dim, arch->class_name, c.hidden, c.n_heads, implied);
    }
    c.head_dim = implied;
  }
  if (c.head_dim % 2 != 0) {
    return invalid_argument_error("{}: the head size is {}, odd; rope needs an even head dimension", file, c.head_dim);
  }
  if (arch->hybrid) SX_RETURN_IF_ERROR(read_hybrid(t, c));
  if (arch->moe) {
    SX_ASSIGN_OR_RETURN(c.n_experts, t.size("num_experts"));
    SX_ASSIGN_OR_RETURN(c.n_experts_used, t.size("num_experts_per_tok"));
    SX_ASSIGN_OR_RETURN(c.expert_ffn, t.size("moe_intermediate_size"));
    // transformers' default for Qwen3-MoE; llama.cpp always renormalises Qwen3.5-MoE's top-k.
    SX_ASSIGN_OR_RETURN(c.norm_topk_prob, t.boolean("norm_topk_prob", arch->hybrid));
    SX_ASSIGN_OR_RETURN(const std::int64_t step, t.size("decoder_sparse_step", 1));
    const json* dense_layers = t.find("mlp_only_layers");
    if (step != 1 || (dense_layers != nullptr && !(dense_layers->is_array() && dense_layers->empty()))) {
      return unimplemented_error("{}: dense layers among the sparse ones (decoder_sparse_step {}, mlp_only_layers "
                                 "{}) are not supported: every layer must be a mixture of experts", file, step,
                                 dense_layers != nullptr ? dense_layers->dump() : "[]");
    }
    if (arch->hybrid) {
      SX_ASSIGN_OR_RETURN(c.shared_expert_ffn, t.size("shared_expert_intermediate_size"));
      if (c.ffn == 0) c.ffn = c.expert_ffn;  // as for qwen35moe GGUF files, which have no dense FFN width
    }
    if (c.n_experts_used > c.n_experts) {
      return invalid_argument_error("{}: 'num_experts_per_tok' {} is more than 'num_experts' {}", file,
                                    c.n_experts_used, c.n_experts);
    }
  }

  SX_ASSIGN_OR_RETURN(out.torch_dtype, r.string("torch_dtype"));
  if (out.torch_dtype.empty()) {
    SX_ASSIGN_OR_RETURN(out.torch_dtype, r.string("dtype"));  // transformers 5 spells it so
  }
  if (out.torch_dtype.empty() && text_config != nullptr) {
    SX_ASSIGN_OR_RETURN(out.torch_dtype, t.string("dtype"));
  }
  if (arch->hybrid) SX_RETURN_IF_ERROR(validate_model_config(c, file));
  if (const json* q = r.find("quantization_config")) {
    if (!q->is_object()) return r.wrong_type("quantization_config", *q, "an object");
    const Reader qr(*q, file, "quantization_config.");
    SX_ASSIGN_OR_RETURN(out.quant_method, qr.string("quant_method"));
    if (qr.find("bits") != nullptr) {
      SX_ASSIGN_OR_RETURN(out.quant_bits, qr.size("bits"));
    }
    if (qr.find("checkpoint_format") != nullptr) {
      SX_ASSIGN_OR_RETURN(out.quant_checkpoint_format, qr.string("checkpoint_format"));
    }
    if (qr.find("group_size") != nullptr) {
      // GPTQ writes -1 for "one group per row".
      const json* g = qr.find("group_size");
      if (g->is_number_integer() && g->get<std::int64_t>() == -1) {
        out.quant_group_size = -1;
      } else {
        SX_ASSIGN_OR_RETURN(out.quant_group_size, qr.size("group_size"));
      }
    }
  }
  return out;
}

Result<HfConfig> read_hf_config(const std::string& path) {
  SX_ASSIGN_OR_RETURN(std::unique_ptr<MappedFile> file, MappedFile::open(path));
  const auto bytes = file->bytes();
  return parse_hf_config(std::string_view(reinterpret_cast<const char*>(bytes.data()), bytes.size()), path);
}

Result<ModelConfig> model_config_from_hf_json(const std::string& path) {
  SX_ASSIGN_OR_RETURN(HfConfig c, read_hf_config(path));
  return std::move(c.config);
}

}  // namespace sx::model
