// Model config from GGUF metadata, the per-architecture tensor table and the shape checks.
#include "runtime/model/model_config.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <functional>

#include <fmt/format.h>

#include "runtime/base/op_limits.h"
#include "runtime/model/model_check.h"

namespace sx::model {

namespace {

const std::vector<ArchSpec>& arch_specs() {
  static const std::vector<ArchSpec> kSpecs = {
      {"qwen2",
       {LayerTensor::kAttnNorm, LayerTensor::kAttnQ, LayerTensor::kAttnK, LayerTensor::kAttnV,
        LayerTensor::kAttnOutput, LayerTensor::kFfnNorm, LayerTensor::kFfnGate, LayerTensor::kFfnUp,
        LayerTensor::kFfnDown},
       {LayerTensor::kAttnQBias, LayerTensor::kAttnKBias, LayerTensor::kAttnVBias}},
      // Qwen3 dense: no qkv bias, an RMSNorm of every query and key head before rope
      // (attn_q_norm / attn_k_norm, head_dim wide), head_dim from attention.key_length.
      {"qwen3",
       {LayerTensor::kAttnNorm, LayerTensor::kAttnQ, LayerTensor::kAttnK, LayerTensor::kAttnV,
        LayerTensor::kAttnOutput, LayerTensor::kAttnQNorm, LayerTensor::kAttnKNorm, LayerTensor::kFfnNorm,
        LayerTensor::kFfnGate, LayerTensor::kFfnUp, LayerTensor::kFfnDown},
       {}},
      // Qwen3-MoE: qwen3's attention; every layer's FFN a router and stacked experts (llama.cpp
      // always renormalises the top-k weights for it, as the published configs' norm_topk_prob).
      {"qwen3moe",
       {LayerTensor::kAttnNorm, LayerTensor::kAttnQ, LayerTensor::kAttnK, LayerTensor::kAttnV,
        LayerTensor::kAttnOutput, LayerTensor::kAttnQNorm, LayerTensor::kAttnKNorm, LayerTensor::kFfnNorm,
        LayerTensor::kFfnGateInp, LayerTensor::kFfnGateExps, LayerTensor::kFfnUpExps, LayerTensor::kFfnDownExps},
       {}},
      // Qwen3.5 / 3.6 / 3.8 (Qwen3-Next design): every fourth layer gated full attention (attn_q
      // holds [query | gate] per head; q/k norms), the others Gated DeltaNet; a post-attention
      // norm before the FFN in place of ffn_norm; no biases.
      {"qwen35",
       {LayerTensor::kAttnNorm, LayerTensor::kAttnQ, LayerTensor::kAttnK, LayerTensor::kAttnV,
        LayerTensor::kAttnOutput, LayerTensor::kAttnQNorm, LayerTensor::kAttnKNorm, LayerTensor::kPostAttentionNorm,
        LayerTensor::kFfnGate, LayerTensor::kFfnUp, LayerTensor::kFfnDown},
       {},
       {LayerTensor::kAttnNorm, LayerTensor::kAttnQkv, LayerTensor::kAttnGate, LayerTensor::kSsmConv1d,
        LayerTensor::kSsmDt, LayerTensor::kSsmA, LayerTensor::kSsmAlpha, LayerTensor::kSsmBeta, LayerTensor::kSsmNorm,
        LayerTensor::kSsmOut, LayerTensor::kPostAttentionNorm, LayerTensor::kFfnGate, LayerTensor::kFfnUp,
        LayerTensor::kFfnDown}},
      // The MoE sizes: qwen35's layers with routed experts and a shared expert behind a sigmoid gate.
      {"qwen35moe",
       {LayerTensor::kAttnNorm, LayerTensor::kAttnQ, LayerTensor::kAttnK, LayerTensor::kAttnV,
        LayerTensor::kAttnOutput, LayerTensor::kAttnQNorm, LayerTensor::kAttnKNorm, LayerTensor::kPostAttentionNorm,
        LayerTensor::kFfnGateInp, LayerTensor::kFfnGateExps, LayerTensor::kFfnUpExps, LayerTensor::kFfnDownExps,
        LayerTensor::kFfnGateInpShexp, LayerTensor::kFfnGateShexp, LayerTensor::kFfnUpShexp,
        LayerTensor::kFfnDownShexp},
       {},
       {LayerTensor::kAttnNorm, LayerTensor::kAttnQkv, LayerTensor::kAttnGate, LayerTensor::kSsmConv1d,
        LayerTensor::kSsmDt, LayerTensor::kSsmA, LayerTensor::kSsmAlpha, LayerTensor::kSsmBeta, LayerTensor::kSsmNorm,
        LayerTensor::kSsmOut, LayerTensor::kPostAttentionNorm, LayerTensor::kFfnGateInp, LayerTensor::kFfnGateExps,
        LayerTensor::kFfnUpExps, LayerTensor::kFfnDownExps, LayerTensor::kFfnGateInpShexp,
        LayerTensor::kFfnGateShexp, LayerTensor::kFfnUpShexp, LayerTensor::kFfnDownShexp}},
  };
  return kSpecs;
}

// Hyper-parameter keys, "<arch>.<suffix>".
constexpr std::string_view kBlockCount = "block_count";
constexpr std::string_view kContextLength = "context_length";
constexpr std::string_view kEmbeddingLength = "embedding_length";
constexpr std::string_view kFeedForwardLength = "feed_forward_length";
constexpr std::string_view kHeadCount = "attention.head_count";
constexpr std::string_view kHeadCountKv = "attention.head_count_kv";
constexpr std::string_view kRopeFreqBase = "rope.freq_base";
constexpr std::string_view kRmsEps = "attention.layer_norm_rms_epsilon";
constexpr std::string_view kKeyLength = "attention.key_length";
constexpr std::string_view kValueLength = "attention.value_length";
constexpr std::string_view kExpertCount = "expert_count";
constexpr std::string_view kExpertUsedCount = "expert_used_count";
constexpr std::string_view kExpertFfn = "expert_feed_forward_length";
constexpr std::string_view kExpertSharedFfn = "expert_shared_feed_forward_length";
constexpr std::string_view kFullAttentionInterval = "full_attention_interval";
constexpr std::string_view kRecurrentLayers = "attention.recurrent_layers";
constexpr std::string_view kSsmConvKernel = "ssm.conv_kernel";
constexpr std::string_view kSsmInnerSize = "ssm.inner_size";
constexpr std::string_view kSsmStateSize = "ssm.state_size";
constexpr std::string_view kSsmTimeStepRank = "ssm.time_step_rank";
constexpr std::string_view kSsmGroupCount = "ssm.group_count";
constexpr std::string_view kRopeDimensionCount = "rope.dimension_count";
constexpr std::string_view kRopeDimensionSections = "rope.dimension_sections";
constexpr std::string_view kNextnPredictLayers = "nextn_predict_layers";

std::string arch_key(std::string_view arch, std::string_view suffix) { return fmt::format("{}.{}", arch, suffix); }

// A positive count that fits comfortably in int32 (shapes multiply these).
Result<std::int64_t> read_size(const GgufFile& f, const std::string& key) {
  SX_ASSIGN_OR_RETURN(std::uint64_t v, f.get_uint(key));
  if (v == 0 || v > static_cast<std::uint64_t>(std::numeric_limits<std::int32_t>::max())) {
    return invalid_argument_error("{}: metadata key '{}' is {}; it must be in 1..{}", f.path(), key, v,
                                  std::numeric_limits<std::int32_t>::max());
  }
  return static_cast<std::int64_t>(v);
}

Result<double> read_positive_float(const GgufFile& f, const std::string& key) {
  SX_ASSIGN_OR_RETURN(double v, f.get_float(key));
  if (!(v > 0) || !std::isfinite(v)) {
    return invalid_argument_error("{}: metadata key '{}' is {}; it must be a positive finite number", f.path(), key, v);
  }
  return v;
}

}  // namespace

const ArchSpec* find_arch_spec(std::string_view architecture) {
  for (const ArchSpec& s : arch_specs()) {
    if (s.name == architecture) return &s;
  }
  return nullptr;
}

const std::vector<LayerTensor>& layer_tensors_of(const ArchSpec& spec, const ModelConfig& c, std::int64_t layer) {
  return c.is_recurrent(layer) && !spec.recurrent_layer_tensors.empty() ? spec.recurrent_layer_tensors
                                                                        : spec.layer_tensors;
}

namespace {
// Whether an architecture's layers (of either kind) have tensor `t` (its row in arch_specs() says).
bool arch_has(std::string_view architecture, LayerTensor t) {
  const ArchSpec* spec = find_arch_spec(architecture);
  if (spec == nullptr) return false;
  for (const auto* set : {&spec->layer_tensors, &spec->recurrent_layer_tensors}) {
    if (std::find(set->begin(), set->end(), t) != set->end()) return true;
  }
  return false;
}
bool arch_is_hybrid(std::string_view architecture) {
  const ArchSpec* spec = find_arch_spec(architecture);
  return spec != nullptr && !spec->recurrent_layer_tensors.empty();
}
}  // namespace

bool has_qk_norm(const ModelConfig& c) { return arch_has(c.architecture, LayerTensor::kAttnQNorm); }

std::string supported_architectures() {
  std::string out;
  for (const ArchSpec& s : arch_specs()) {
    if (!out.empty()) out += ", ";
    out += s.name;
  }
  return out;
}

std::vector<std::int64_t> layer_tensor_dims(const ModelConfig& c, LayerTensor t) {
  switch (t) {
    case LayerTensor::kAttnNorm:
    case LayerTensor::kFfnNorm:
    case LayerTensor::kPostAttentionNorm:
    case LayerTensor::kFfnGateInpShexp: return {c.hidden};
    // A hybrid's attention gates its output: attn_q gives [query | gate] per head.
    case LayerTensor::kAttnQ: return {c.hidden, c.is_hybrid() ? 2 * c.q_dim() : c.q_dim()};
    case LayerTensor::kAttnQBias: return {c.q_dim()};
    case LayerTensor::kAttnK:
    case LayerTensor::kAttnV: return {c.hidden, c.kv_dim()};
    case LayerTensor::kAttnKBias:
    case LayerTensor::kAttnVBias: return {c.kv_dim()};
    case LayerTensor::kAttnOutput: return {c.q_dim(), c.hidden};
    case LayerTensor::kAttnQNorm:
    case LayerTensor::kAttnKNorm: return {c.head_dim};
    case LayerTensor::kFfnGate:
    case LayerTensor::kFfnUp: return {c.hidden, c.ffn};
    case LayerTensor::kFfnDown: return {c.ffn, c.hidden};
    case LayerTensor::kFfnGateInp: return {c.hidden, c.n_experts};
    case LayerTensor::kFfnGateExps:
    case LayerTensor::kFfnUpExps: return {c.hidden, c.expert_ffn, c.n_experts};
    case LayerTensor::kFfnDownExps: return {c.expert_ffn, c.hidden, c.n_experts};
    case LayerTensor::kAttnQkv: return {c.hidden, c.ssm_conv_channels()};
    case LayerTensor::kAttnGate: return {c.hidden, c.ssm_inner()};
    case LayerTensor::kSsmConv1d: return {c.ssm_conv_kernel, c.ssm_conv_channels()};
    case LayerTensor::kSsmDt:
    case LayerTensor::kSsmA: return {c.ssm_v_heads};
    case LayerTensor::kSsmAlpha:
    case LayerTensor::kSsmBeta: return {c.hidden, c.ssm_v_heads};
    case LayerTensor::kSsmNorm: return {c.ssm_head_dim};
    case LayerTensor::kSsmOut: return {c.ssm_inner(), c.hidden};
    case LayerTensor::kFfnGateShexp:
    case LayerTensor::kFfnUpShexp: return {c.hidden, c.shared_expert_ffn};
    case LayerTensor::kFfnDownShexp: return {c.shared_expert_ffn, c.hidden};
  }
  return {};
}

Status for_each_expected_tensor(const ModelConfig& c, const std::function<Status(ExpectedTensor)>& fn) {
  const ArchSpec* spec = find_arch_spec(c.architecture);
  if (spec == nullptr) {
    return unimplemented_error("architecture '{}' is not supported (supported: {})", c.architecture,
                               supported_architectures());
  }
  SX_RETURN_IF_ERROR(fn({std::string(kTokenEmbdName), {c.hidden, c.vocab}}));
  for (std::int64_t i = 0; i < c.n_layers; ++i) {
    for (LayerTensor t : layer_tensors_of(*spec, c, i)) {
      SX_RETURN_IF_ERROR(fn({layer_tensor_name(i, t), layer_tensor_dims(c, t)}));
      // Keep llama.cpp's order: each bias right after its weight.
      if (c.qkv_bias) {
        const LayerTensor bias = t == LayerTensor::kAttnQ   ? LayerTensor::kAttnQBias
                                 : t == LayerTensor::kAttnK ? LayerTensor::kAttnKBias
                                 : t == LayerTensor::kAttnV ? LayerTensor::kAttnVBias
                                                            : t;
        if (bias != t && std::find(spec->qkv_bias_tensors.begin(), spec->qkv_bias_tensors.end(), bias) !=
                             spec->qkv_bias_tensors.end()) {
          SX_RETURN_IF_ERROR(fn({layer_tensor_name(i, bias), layer_tensor_dims(c, bias)}));
        }
      }
    }
  }
  SX_RETURN_IF_ERROR(fn({std::string(kOutputNormName), {c.hidden}}));
  if (!c.tied_embeddings) SX_RETURN_IF_ERROR(fn({std::string(kOutputName), {c.hidden, c.vocab}}));
  return ok_status();
}

std::vector<ExpectedTensor> expected_tensors(const ModelConfig& c) {
  std::vector<ExpectedTensor> out;
  for_each_expected_tensor(c, [&](ExpectedTensor t) {
    out.push_back(std::move(t));
    return ok_status();
  }).ignore();
  return out;
}

namespace {

// The hybrid's own fields: present exactly for a hybrid architecture, and in the ranges the ops
// are written for (hal/op_checks.h).
Status validate_hybrid(const ModelConfig& c, std::string_view where) {
  const bool hybrid_arch = arch_is_hybrid(c.architecture);
  if (!hybrid_arch) {
    if (c.is_hybrid() || !c.recurrent_layers.empty()) {
      return invalid_argument_error("{}: architecture '{}' has no linear-attention layers", where, c.architecture);
    }
    return ok_status();
  }
  const std::pair<std::string_view, std::int64_t> sizes[] = {
      {"ssm.group_count (DeltaNet K heads)", c.ssm_k_heads},
      {"ssm.time_step_rank (DeltaNet V heads)", c.ssm_v_heads},
      {"ssm.state_size (DeltaNet head size)", c.ssm_head_dim},
  };
  for (const auto& [what, v] : sizes) {
    if (v < 1 || v > 4096) return invalid_argument_error("{}: {} is {}; it must be in 1..4096", where, what, v);
  }
  if (c.ssm_v_heads % c.ssm_k_heads != 0) {
    return invalid_argument_error("{}: {} DeltaNet V heads is not a multiple of {} K heads", where, c.ssm_v_heads,
                                  c.ssm_k_heads);
  }
  if (c.ssm_head_dim > op_limits::kMaxDeltaHeadDim) {
    return invalid_argument_error("{}: DeltaNet heads of {} (ssm.state_size); the ops take at most {}", where,
                                  c.ssm_head_dim, op_limits::kMaxDeltaHeadDim);
  }
  if (c.ssm_conv_kernel < 2 || c.ssm_conv_kernel > op_limits::kMaxConvKernel) {
    return invalid_argument_error("{}: ssm.conv_kernel is {}; it must be in 2..{}", where, c.ssm_conv_kernel,
                                  op_limits::kMaxConvKernel);
  }
  if (static_cast<std::int64_t>(c.recurrent_layers.size()) != c.n_layers) {
    return invalid_argument_error("{}: the layer pattern names {} layers but the model has {}", where,
                                  c.recurrent_layers.size(), c.n_layers);
  }
  if (c.rot_dim < 0 || c.rot_dim > c.head_dim || c.rot_dim % 2 != 0) {
    return invalid_argument_error("{}: rope.dimension_count {} must be even and at most the head size {}", where,
                                  c.rot_dim, c.head_dim);
  }
  const bool shared = arch_has(c.architecture, LayerTensor::kFfnGateShexp);
  if (shared != (c.shared_expert_ffn > 0)) {
    return invalid_argument_error("{}: a shared expert of {} rows for architecture '{}'", where, c.shared_expert_ffn,
                                  c.architecture);
  }
  return ok_status();
}

}  // namespace

Status validate_model_config(const ModelConfig& c, std::string_view where) {
  const std::pair<std::string_view, std::int64_t> sizes[] = {
      {"n_layers", c.n_layers}, {"hidden", c.hidden}, {"n_heads", c.n_heads}, {"n_kv_heads", c.n_kv_heads},
      {"head_dim", c.head_dim}, {"ffn", c.ffn},       {"vocab", c.vocab},     {"context_length", c.context_length},
  };
  for (const auto& [what, v] : sizes) {
    if (v < 1 || v > std::numeric_limits<std::int32_t>::max()) {
      return invalid_argument_error("{}: {} is {}; it must be in 1..{}", where, what, v,
                                    std::numeric_limits<std::int32_t>::max());
    }
  }
  if (find_arch_spec(c.architecture) == nullptr) {
    return unimplemented_error("{}: architecture '{}' is not supported (supported: {})", where, c.architecture,
                               supported_architectures());
  }
  if (c.n_heads % c.n_kv_heads != 0) {
    return invalid_argument_error("{}: {} attention heads is not a multiple of {} kv heads", where, c.n_heads,
                                  c.n_kv_heads);
  }
  if (c.head_dim % 2 != 0) {
    return invalid_argument_error("{}: head_dim {} is odd; rope needs an even head dimension", where, c.head_dim);
  }
  const bool moe_arch = arch_has(c.architecture, LayerTensor::kFfnGateInp);
  if (moe_arch != c.is_moe()) {
    return invalid_argument_error("{}: {} experts for architecture '{}' ({})", where, c.n_experts, c.architecture,
                                  moe_arch ? "a mixture of experts needs at least one" : "a dense model has none");
  }
  if (c.is_moe()) {
    if (c.n_experts > 4096 || c.expert_ffn < 1 || c.expert_ffn > std::numeric_limits<std::int32_t>::max()) {
      return invalid_argument_error("{}: {} experts of {} rows; the experts must be 1..4096 of 1..2^31-1 rows", where,
                                    c.n_experts, c.expert_ffn);
    }
    if (c.n_experts_used < 1 || c.n_experts_used > c.n_experts || c.n_experts_used > op_limits::kMaxTopK) {
      return invalid_argument_error("{}: {} experts used per token of {}; it must be 1..min(experts, {})", where,
                                    c.n_experts_used, c.n_experts, op_limits::kMaxTopK);
    }
  }
  SX_RETURN_IF_ERROR(validate_hybrid(c, where));
  if (c.architecture == "qwen2" && c.q_dim() != c.hidden) {
    return invalid_argument_error("{}: {} heads x head_dim {} = {} differs from hidden {} (qwen2 needs them equal)",
                                  where, c.n_heads, c.head_dim, c.q_dim(), c.hidden);
  }
  if (!(c.rope_theta > 0) || !std::isfinite(c.rope_theta)) {
    return invalid_argument_error("{}: rope_theta {} must be positive", where, c.rope_theta);
  }
  if (!(c.rms_eps > 0) || !std::isfinite(c.rms_eps)) {
    return invalid_argument_error("{}: rms_eps {} must be positive", where, c.rms_eps);
  }
  return ok_status();
}

namespace {

// A hybrid's DeltaNet sizes, layer pattern (the explicit list, else every full_attention_interval-th
// layer is full attention; llama.cpp's precedence) and partial multimodal rope.
Status read_hybrid(const GgufFile& f, ModelConfig& c) {
  const std::string& a = c.architecture;
  SX_ASSIGN_OR_RETURN(c.ssm_conv_kernel, read_size(f, arch_key(a, kSsmConvKernel)));
  SX_ASSIGN_OR_RETURN(c.ssm_head_dim, read_size(f, arch_key(a, kSsmStateSize)));
  SX_ASSIGN_OR_RETURN(c.ssm_v_heads, read_size(f, arch_key(a, kSsmTimeStepRank)));
  SX_ASSIGN_OR_RETURN(c.ssm_k_heads, read_size(f, arch_key(a, kSsmGroupCount)));
  if (f.find(arch_key(a, kSsmInnerSize)) != nullptr) {
    SX_ASSIGN_OR_RETURN(const std::int64_t inner, read_size(f, arch_key(a, kSsmInnerSize)));
    if (inner != c.ssm_inner()) {
      return invalid_argument_error("{}: '{}' is {} but {} V heads x {} = {}", f.path(), arch_key(a, kSsmInnerSize),
                                    inner, c.ssm_v_heads, c.ssm_head_dim, c.ssm_inner());
    }
  }
  const std::int64_t blocks = c.n_layers + c.n_nextn_layers;
  if (f.find(arch_key(a, kRecurrentLayers)) != nullptr) {
    SX_ASSIGN_OR_RETURN(std::vector<bool> pattern, f.get_bool_array(arch_key(a, kRecurrentLayers)));
    if (static_cast<std::int64_t>(pattern.size()) != blocks) {
      return invalid_argument_error("{}: '{}' has {} items for {} blocks", f.path(), arch_key(a, kRecurrentLayers),
                                    pattern.size(), blocks);
    }
    pattern.resize(static_cast<std::size_t>(c.n_layers));
    c.recurrent_layers = std::move(pattern);
  } else {
    std::uint64_t interval = 4;
    if (f.find(arch_key(a, kFullAttentionInterval)) != nullptr) {
      SX_ASSIGN_OR_RETURN(interval, f.get_uint(arch_key(a, kFullAttentionInterval)));
      if (interval == 0) {
        return invalid_argument_error("{}: '{}' is 0", f.path(), arch_key(a, kFullAttentionInterval));
      }
    }
    for (std::int64_t i = 0; i < c.n_layers; ++i) {
      c.recurrent_layers.push_back((static_cast<std::uint64_t>(i) + 1) % interval != 0);
    }
  }
  if (f.find(arch_key(a, kRopeDimensionCount)) != nullptr) {
    SX_ASSIGN_OR_RETURN(c.rot_dim, read_size(f, arch_key(a, kRopeDimensionCount)));
  }
  if (f.find(arch_key(a, kRopeDimensionSections)) != nullptr) {
    SX_ASSIGN_OR_RETURN(c.rope_sections, f.get_int_array(arch_key(a, kRopeDimensionSections)));
  }
  return ok_status();
}

}  // namespace

Result<ModelConfig> model_config_from_gguf(const GgufFile& f) {
  ModelConfig c;
  SX_ASSIGN_OR_RETURN(c.architecture, f.get_string(kKeyArchitecture));
  const ArchSpec* spec = find_arch_spec(c.architecture);
  if (spec == nullptr) {
    return unimplemented_error("{}: architecture '{}' is not supported (supported: {})", f.path(), c.architecture,
                               supported_architectures());
  }
  const std::string& a = c.architecture;
  if (f.find("general.name") != nullptr) {
    SX_ASSIGN_OR_RETURN(c.name, f.get_string("general.name"));
  }
  SX_ASSIGN_OR_RETURN(c.n_layers, read_size(f, arch_key(a, kBlockCount)));
  if (f.find(arch_key(a, kNextnPredictLayers)) != nullptr) {
    // block_count counts the multi-token-prediction layers after the trunk.
    SX_ASSIGN_OR_RETURN(const std::uint64_t nextn, f.get_uint(arch_key(a, kNextnPredictLayers)));
    if (nextn >= static_cast<std::uint64_t>(c.n_layers)) {
      return invalid_argument_error("{}: '{}' is {} of {} blocks", f.path(), arch_key(a, kNextnPredictLayers), nextn,
                                    c.n_layers);
    }
    c.n_nextn_layers = static_cast<std::int64_t>(nextn);
    c.n_layers -= c.n_nextn_layers;
  }
  const std::size_t per_layer = std::min(spec->layer_tensors.size(), spec->recurrent_layer_tensors.empty()
                                                                         ? spec->layer_tensors.size()
                                                                         : spec->recurrent_layer_tensors.size());
  if (static_cast<std::uint64_t>(c.n_layers) * per_layer > f.tensors().size()) {
    return invalid_argument_error("{}: '{}' is {} but the file has only {} tensors ({} per layer)", f.path(),
                                  arch_key(a, kBlockCount), c.n_layers, f.tensors().size(), per_layer);
  }
  SX_ASSIGN_OR_RETURN(c.context_length, read_size(f, arch_key(a, kContextLength)));
  SX_ASSIGN_OR_RETURN(c.hidden, read_size(f, arch_key(a, kEmbeddingLength)));
  if (f.find(arch_key(a, kFeedForwardLength)) != nullptr || !arch_has(a, LayerTensor::kFfnGateInp)) {
    SX_ASSIGN_OR_RETURN(c.ffn, read_size(f, arch_key(a, kFeedForwardLength)));
  }
  SX_ASSIGN_OR_RETURN(c.n_heads, read_size(f, arch_key(a, kHeadCount)));
  SX_ASSIGN_OR_RETURN(c.n_kv_heads, read_size(f, arch_key(a, kHeadCountKv)));
  SX_ASSIGN_OR_RETURN(c.rope_theta, read_positive_float(f, arch_key(a, kRopeFreqBase)));
  SX_ASSIGN_OR_RETURN(c.rms_eps, read_positive_float(f, arch_key(a, kRmsEps)));
  if (arch_has(a, LayerTensor::kFfnGateInp)) {  // a mixture of experts
    SX_ASSIGN_OR_RETURN(c.n_experts, read_size(f, arch_key(a, kExpertCount)));
    SX_ASSIGN_OR_RETURN(c.n_experts_used, read_size(f, arch_key(a, kExpertUsedCount)));
    SX_ASSIGN_OR_RETURN(c.expert_ffn, read_size(f, arch_key(a, kExpertFfn)));
    c.norm_topk_prob = true;  // llama.cpp's qwen3moe graph always renormalises
    if (c.ffn == 0) c.ffn = c.expert_ffn;  // qwen35moe files have no dense FFN width
    if (arch_has(a, LayerTensor::kFfnGateShexp)) {
      SX_ASSIGN_OR_RETURN(c.shared_expert_ffn, read_size(f, arch_key(a, kExpertSharedFfn)));
    }
  }
  if (arch_is_hybrid(a)) SX_RETURN_IF_ERROR(read_hybrid(f, c));

  const std::string key_length = arch_key(a, kKeyLength);
  if (f.find(key_length) != nullptr) {
    SX_ASSIGN_OR_RETURN(c.head_dim, read_size(f, key_length));
    const std::string value_length = arch_key(a, kValueLength);
    if (f.find(value_length) != nullptr) {
      SX_ASSIGN_OR_RETURN(std::int64_t v, read_size(f, value_length));
      if (v != c.head_dim) {
        return unimplemented_error("{}: '{}' {} differs from '{}' {}; only equal key/value head sizes are supported",
                                   f.path(), value_length, v, key_length, c.head_dim);
      }
    }
  } else {
    if (c.hidden % c.n_heads != 0) {
      return invalid_argument_error("{}: '{}' {} is not a multiple of '{}' {}", f.path(),
                                    arch_key(a, kEmbeddingLength), c.hidden, arch_key(a, kHeadCount), c.n_heads);
    }
    c.head_dim = c.hidden / c.n_heads;
  }
  if (c.n_heads % c.n_kv_heads != 0) {
    return invalid_argument_error("{}: '{}' {} is not a multiple of '{}' {}", f.path(), arch_key(a, kHeadCount),
                                  c.n_heads, arch_key(a, kHeadCountKv), c.n_kv_heads);
  }

  const TensorInfo* embd = f.find_tensor(kTokenEmbdName);
  if (embd == nullptr) return not_found_error("{}: tensor '{}' is missing", f.path(), kTokenEmbdName);
  if (embd->dims.size() != 2 || embd->dims[0] != c.hidden) {
    return invalid_argument_error("{}: tensor '{}' has dims {} but the config expects [{}, vocab]", f.path(),
                                  kTokenEmbdName, embd->dims_string(), c.hidden);
  }
  c.vocab = embd->dims[1];
  if (f.find("tokenizer.ggml.tokens") != nullptr) {
    SX_ASSIGN_OR_RETURN(std::uint64_t n_tokens, f.get_array_size("tokenizer.ggml.tokens"));
    if (n_tokens > static_cast<std::uint64_t>(c.vocab)) {
      return invalid_argument_error("{}: the tokenizer has {} tokens but '{}' has only {} rows", f.path(), n_tokens,
                                    kTokenEmbdName, c.vocab);
    }
  }
  c.tied_embeddings = f.find_tensor(kOutputName) == nullptr;
  c.qkv_bias = !spec->qkv_bias_tensors.empty() &&
               f.find_tensor(layer_tensor_name(0, spec->qkv_bias_tensors.front())) != nullptr;
  SX_RETURN_IF_ERROR(validate_model_config(c, f.path()));
  return c;
}

Status check_model_tensors(const TensorSource& f, const ModelConfig& c) { return check_model(f, c).status(); }

Status check_qwen2_tensors(const TensorSource& f, const ModelConfig& c) {
  if (c.architecture != "qwen2") {
    return invalid_argument_error("{}: check_qwen2_tensors called for architecture '{}'", f.path(), c.architecture);
  }
  return check_model_tensors(f, c);
}

void set_model_config_metadata(GgufWriter& w, const ModelConfig& c) {
  const std::string& a = c.architecture;
  w.set_string(std::string(kKeyArchitecture), a);
  if (!c.name.empty()) w.set_string("general.name", c.name);
  w.set_uint32(arch_key(a, kBlockCount), static_cast<std::uint32_t>(c.n_layers));
  w.set_uint32(arch_key(a, kContextLength), static_cast<std::uint32_t>(c.context_length));
  w.set_uint32(arch_key(a, kEmbeddingLength), static_cast<std::uint32_t>(c.hidden));
  // qwen35moe files have no dense FFN width (the MoE's ffn mirrors expert_ffn).
  if (!(c.is_moe() && c.is_hybrid())) {
    w.set_uint32(arch_key(a, kFeedForwardLength), static_cast<std::uint32_t>(c.ffn));
  }
  w.set_uint32(arch_key(a, kHeadCount), static_cast<std::uint32_t>(c.n_heads));
  w.set_uint32(arch_key(a, kHeadCountKv), static_cast<std::uint32_t>(c.n_kv_heads));
  w.set_float32(arch_key(a, kRopeFreqBase), static_cast<float>(c.rope_theta));
  w.set_float32(arch_key(a, kRmsEps), static_cast<float>(c.rms_eps));
  if (c.is_moe()) {
    w.set_uint32(arch_key(a, kExpertCount), static_cast<std::uint32_t>(c.n_experts));
    w.set_uint32(arch_key(a, kExpertUsedCount), static_cast<std::uint32_t>(c.n_experts_used));
    w.set_uint32(arch_key(a, kExpertFfn), static_cast<std::uint32_t>(c.expert_ffn));
    if (c.shared_expert_ffn > 0) {
      w.set_uint32(arch_key(a, kExpertSharedFfn), static_cast<std::uint32_t>(c.shared_expert_ffn));
    }
  }
  if (c.is_hybrid()) {
    // Both spellings of the layer pattern, as llama.cpp's converter writes them.
    std::int64_t interval = 0;
    for (std::int64_t i = 0; i < c.n_layers && interval == 0; ++i) interval = c.is_recurrent(i) ? 0 : i + 1;
    if (interval > 0) w.set_uint32(arch_key(a, kFullAttentionInterval), static_cast<std::uint32_t>(interval));
    w.set_bool_array(arch_key(a, kRecurrentLayers), c.recurrent_layers);
    w.set_uint32(arch_key(a, kSsmConvKernel), static_cast<std::uint32_t>(c.ssm_conv_kernel));
    w.set_uint32(arch_key(a, kSsmStateSize), static_cast<std::uint32_t>(c.ssm_head_dim));
    w.set_uint32(arch_key(a, kSsmGroupCount), static_cast<std::uint32_t>(c.ssm_k_heads));
    w.set_uint32(arch_key(a, kSsmTimeStepRank), static_cast<std::uint32_t>(c.ssm_v_heads));
    w.set_uint32(arch_key(a, kSsmInnerSize), static_cast<std::uint32_t>(c.ssm_inner()));
    w.set_uint32(arch_key(a, kRopeDimensionCount), static_cast<std::uint32_t>(c.rot_dim ? c.rot_dim : c.head_dim));
    std::vector<std::int32_t> sections(c.rope_sections.begin(), c.rope_sections.end());
    sections.resize(4, 0);
    w.set_int32_array(arch_key(a, kRopeDimensionSections), sections);
  }
  if (c.n_heads * c.head_dim != c.hidden) {
    w.set_uint32(arch_key(a, kKeyLength), static_cast<std::uint32_t>(c.head_dim));
    w.set_uint32(arch_key(a, kValueLength), static_cast<std::uint32_t>(c.head_dim));
  }
}

// ---- tokenizer metadata ----

Result<TokenizerMetadata> tokenizer_metadata_from_gguf(const GgufFile& f) {
  TokenizerMetadata t;
  if (f.find("tokenizer.ggml.model") != nullptr) {
    SX_ASSIGN_OR_RETURN(t.model, f.get_string("tokenizer.ggml.model"));
  }
  if (f.find("tokenizer.ggml.pre") != nullptr) {
    SX_ASSIGN_OR_RETURN(t.pre, f.get_string("tokenizer.ggml.pre"));
  }
  SX_ASSIGN_OR_RETURN(t.tokens, f.get_string_array("tokenizer.ggml.tokens"));
  if (f.find("tokenizer.ggml.merges") != nullptr) {
    SX_ASSIGN_OR_RETURN(t.merges, f.get_string_array("tokenizer.ggml.merges"));
  }
  if (f.find("tokenizer.ggml.token_type") != nullptr) {
    SX_ASSIGN_OR_RETURN(std::vector<std::int64_t> types, f.get_int_array("tokenizer.ggml.token_type"));
    if (types.size() != t.tokens.size()) {
      return invalid_argument_error("{}: 'tokenizer.ggml.token_type' has {} items but 'tokenizer.ggml.tokens' has {}",
                                    f.path(), types.size(), t.tokens.size());
    }
    t.token_types.reserve(types.size());
    for (std::int64_t x : types) t.token_types.push_back(static_cast<std::int32_t>(x));
  }
  const std::pair<std::string_view, std::int64_t*> ids[] = {
      {"tokenizer.ggml.eos_token_id", &t.eos_id},
      {"tokenizer.ggml.bos_token_id", &t.bos_id},
      {"tokenizer.ggml.padding_token_id", &t.pad_id},
  };
  for (const auto& [key, dst] : ids) {
    if (f.find(key) == nullptr) continue;
    SX_ASSIGN_OR_RETURN(std::uint64_t id, f.get_uint(key));
    if (id >= t.tokens.size()) {
      return invalid_argument_error("{}: metadata key '{}' is {} but there are only {} tokens", f.path(), key, id,
                                    t.tokens.size());
    }
    *dst = static_cast<std::int64_t>(id);
  }
  if (f.find("tokenizer.ggml.add_bos_token") != nullptr) {
    SX_ASSIGN_OR_RETURN(t.add_bos, f.get_bool("tokenizer.ggml.add_bos_token"));
  }
  if (f.find("tokenizer.chat_template") != nullptr) {
    SX_ASSIGN_OR_RETURN(t.chat_template, f.get_string("tokenizer.chat_template"));
  }
  return t;
}

void set_tokenizer_metadata(GgufWriter& w, const TokenizerMetadata& t, std::int64_t vocab_rows) {
  w.set_string("tokenizer.ggml.model", t.model);
  w.set_string("tokenizer.ggml.pre", t.pre);
  std::vector<std::string> tokens = t.tokens;
  std::vector<std::int32_t> types = t.token_types;
  if (types.empty()) types.assign(t.tokens.size(), kTokenNormal);
  for (auto id = static_cast<std::int64_t>(tokens.size()); id < vocab_rows; ++id) {
    tokens.push_back(fmt::format("[PAD{}]", id));
    types.push_back(kTokenUnused);
  }
  w.set_string_array("tokenizer.ggml.tokens", tokens);
  w.set_int32_array("tokenizer.ggml.token_type", types);
  w.set_string_array("tokenizer.ggml.merges", t.merges);  // llama.cpp requires the key, even empty
  if (t.eos_id >= 0) w.set_uint32("tokenizer.ggml.eos_token_id", static_cast<std::uint32_t>(t.eos_id));
  if (t.bos_id >= 0) w.set_uint32("tokenizer.ggml.bos_token_id", static_cast<std::uint32_t>(t.bos_id));
  if (t.pad_id >= 0) w.set_uint32("tokenizer.ggml.padding_token_id", static_cast<std::uint32_t>(t.pad_id));
  w.set_bool("tokenizer.ggml.add_bos_token", t.add_bos);
  if (!t.chat_template.empty()) w.set_string("tokenizer.chat_template", t.chat_template);
}

}  // namespace sx::model
