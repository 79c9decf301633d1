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
};

constexpr HfArch kArchs[] = {
    {"qwen2", "Qwen2ForCausalLM", true, false, "qwen2"},
    {"qwen3", "Qwen3ForCausalLM", false, true, "qwen3"},
    {"qwen3_moe", "Qwen3MoeForCausalLM", false, true, "qwen3moe", true},
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
    // Qwen3.5 / 3.6 / 3.8 run from their GGUF files (qwen35, qwen35moe); their checkpoints not yet.
    const bool hybrid = model_type.starts_with("qwen3_5") || class_name.starts_with("Qwen3_5");
    return unimplemented_error("{}: {} is not supported (supported: {}){}", file, shown, supported_hf_architectures(),
                               hybrid ? "; Sextant runs Qwen3.5 / 3.6 / 3.8 from GGUF files (llama.cpp's "
                                        "convert_hf_to_gguf.py writes one from this checkpoint)"
                                      : "");
  }
  if (by_type != nullptr && by_class != nullptr && by_type != by_class) {
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

  HfConfig out;
  ModelConfig& c = out.config;
  c.architecture = std::string(arch->architecture);
  SX_ASSIGN_OR_RETURN(c.name, r.string("_name_or_path"));
  SX_ASSIGN_OR_RETURN(c.n_layers, r.size("num_hidden_layers"));
  SX_ASSIGN_OR_RETURN(c.hidden, r.size("hidden_size"));
  SX_ASSIGN_OR_RETURN(c.n_heads, r.size("num_attention_heads"));
  SX_ASSIGN_OR_RETURN(c.n_kv_heads, r.size("num_key_value_heads", c.n_heads));
  SX_ASSIGN_OR_RETURN(c.ffn, r.size("intermediate_size"));
  SX_ASSIGN_OR_RETURN(c.vocab, r.size("vocab_size"));
  SX_ASSIGN_OR_RETURN(c.context_length, r.size("max_position_embeddings"));
  SX_ASSIGN_OR_RETURN(c.rope_theta, r.positive("rope_theta", 10000.0));
  SX_ASSIGN_OR_RETURN(c.rms_eps, r.positive("rms_norm_eps", 1e-6));
  SX_ASSIGN_OR_RETURN(c.tied_embeddings, r.boolean("tie_word_embeddings", false));
  c.qkv_bias = arch->qkv_bias;
  if (!arch->qkv_bias) {
    SX_ASSIGN_OR_RETURN(const bool attention_bias, r.boolean("attention_bias", false));
    if (attention_bias) {
      return unimplemented_error("{}: 'attention_bias' is true; {} with q/k/v biases is not supported", file,
                                 arch->class_name);
    }
  }

  if (c.n_heads % c.n_kv_heads != 0) {
    return invalid_argument_error("{}: 'num_attention_heads' {} is not a multiple of 'num_key_value_heads' {}", file,
                                  c.n_heads, c.n_kv_heads);
  }
  const bool head_dim_given = r.find("head_dim") != nullptr;
  if (head_dim_given) {
    SX_ASSIGN_OR_RETURN(c.head_dim, r.size("head_dim"));
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
  if (arch->moe) {
    SX_ASSIGN_OR_RETURN(c.n_experts, r.size("num_experts"));
    SX_ASSIGN_OR_RETURN(c.n_experts_used, r.size("num_experts_per_tok"));
    SX_ASSIGN_OR_RETURN(c.expert_ffn, r.size("moe_intermediate_size"));
    SX_ASSIGN_OR_RETURN(c.norm_topk_prob, r.boolean("norm_topk_prob", false));  // transformers' default
    SX_ASSIGN_OR_RETURN(const std::int64_t step, r.size("decoder_sparse_step", 1));
    const json* dense_layers = r.find("mlp_only_layers");
    if (step != 1 || (dense_layers != nullptr && !(dense_layers->is_array() && dense_layers->empty()))) {
      return unimplemented_error("{}: dense layers among the sparse ones (decoder_sparse_step {}, mlp_only_layers "
                                 "{}) are not supported: every layer must be a mixture of experts", file, step,
                                 dense_layers != nullptr ? dense_layers->dump() : "[]");
    }
    if (c.n_experts_used > c.n_experts) {
      return invalid_argument_error("{}: 'num_experts_per_tok' {} is more than 'num_experts' {}", file,
                                    c.n_experts_used, c.n_experts);
    }
  }

  SX_ASSIGN_OR_RETURN(out.torch_dtype, r.string("torch_dtype"));
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
