// GGUF tensor names (llama.cpp convention).
#include "runtime/model/tensor_names.h"

#include <charconv>

#include <fmt/format.h>

namespace sx::model {

std::string_view layer_tensor_suffix(LayerTensor t) {
  switch (t) {
    case LayerTensor::kAttnNorm: return "attn_norm.weight";
    case LayerTensor::kAttnQ: return "attn_q.weight";
    case LayerTensor::kAttnQBias: return "attn_q.bias";
    case LayerTensor::kAttnK: return "attn_k.weight";
    case LayerTensor::kAttnKBias: return "attn_k.bias";
    case LayerTensor::kAttnV: return "attn_v.weight";
    case LayerTensor::kAttnVBias: return "attn_v.bias";
    case LayerTensor::kAttnOutput: return "attn_output.weight";
    case LayerTensor::kAttnQNorm: return "attn_q_norm.weight";
    case LayerTensor::kAttnKNorm: return "attn_k_norm.weight";
    case LayerTensor::kFfnNorm: return "ffn_norm.weight";
    case LayerTensor::kFfnGate: return "ffn_gate.weight";
    case LayerTensor::kFfnUp: return "ffn_up.weight";
    case LayerTensor::kFfnDown: return "ffn_down.weight";
    case LayerTensor::kFfnGateInp: return "ffn_gate_inp.weight";
    case LayerTensor::kFfnGateExps: return "ffn_gate_exps.weight";
    case LayerTensor::kFfnUpExps: return "ffn_up_exps.weight";
    case LayerTensor::kFfnDownExps: return "ffn_down_exps.weight";
    case LayerTensor::kPostAttentionNorm: return "post_attention_norm.weight";
    case LayerTensor::kAttnQkv: return "attn_qkv.weight";
    case LayerTensor::kAttnGate: return "attn_gate.weight";
    case LayerTensor::kSsmConv1d: return "ssm_conv1d.weight";
    case LayerTensor::kSsmDt: return "ssm_dt.bias";
    case LayerTensor::kSsmA: return "ssm_a";
    case LayerTensor::kSsmAlpha: return "ssm_alpha.weight";
    case LayerTensor::kSsmBeta: return "ssm_beta.weight";
    case LayerTensor::kSsmNorm: return "ssm_norm.weight";
    case LayerTensor::kSsmOut: return "ssm_out.weight";
    case LayerTensor::kFfnGateInpShexp: return "ffn_gate_inp_shexp.weight";
    case LayerTensor::kFfnGateShexp: return "ffn_gate_shexp.weight";
    case LayerTensor::kFfnUpShexp: return "ffn_up_shexp.weight";
    case LayerTensor::kFfnDownShexp: return "ffn_down_shexp.weight";
  }
  return "unknown";
}

std::string layer_tensor_name(std::int64_t layer, LayerTensor t) {
  return fmt::format("blk.{}.{}", layer, layer_tensor_suffix(t));
}

std::optional<LayerTensorName> parse_layer_tensor_name(std::string_view name) {
  constexpr std::string_view kPrefix = "blk.";
  if (name.substr(0, kPrefix.size()) != kPrefix) return std::nullopt;
  const std::string_view rest = name.substr(kPrefix.size());
  const std::size_t dot = rest.find('.');
  if (dot == std::string_view::npos || dot == 0 || dot + 1 >= rest.size()) return std::nullopt;
  std::int64_t layer = 0;
  const auto [ptr, ec] = std::from_chars(rest.data(), rest.data() + dot, layer);
  if (ec != std::errc() || ptr != rest.data() + dot || layer < 0) return std::nullopt;
  return LayerTensorName{layer, rest.substr(dot + 1)};
}

}  // namespace sx::model
