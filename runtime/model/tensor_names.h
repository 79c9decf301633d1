// GGUF tensor names in the llama.cpp convention used by qwen2 (and qwen3) files.
//
// Global tensors: token_embd.weight, output_norm.weight, output.weight (absent when the embedding
// is tied). Per layer i: blk.{i}.<suffix>, e.g. blk.0.attn_q.weight, blk.0.attn_q.bias.
// Pure functions; thread-safe.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace sx::model {

inline constexpr std::string_view kTokenEmbdName = "token_embd.weight";
inline constexpr std::string_view kOutputNormName = "output_norm.weight";
inline constexpr std::string_view kOutputName = "output.weight";

// The per-layer tensors of the architectures we know.
enum class LayerTensor {
  kAttnNorm,    // attn_norm.weight
  kAttnQ,       // attn_q.weight
  kAttnQBias,   // attn_q.bias
  kAttnK,       // attn_k.weight
  kAttnKBias,   // attn_k.bias
  kAttnV,       // attn_v.weight
  kAttnVBias,   // attn_v.bias
  kAttnOutput,  // attn_output.weight
  kAttnQNorm,   // attn_q_norm.weight (qwen3)
  kAttnKNorm,   // attn_k_norm.weight (qwen3)
  kFfnNorm,     // ffn_norm.weight
  kFfnGate,     // ffn_gate.weight
  kFfnUp,       // ffn_up.weight
  kFfnDown,     // ffn_down.weight
  // qwen3moe: the router and the experts, each expert's matrix stacked in one 3-D tensor
  kFfnGateInp,   // ffn_gate_inp.weight  [n_experts][hidden]
  kFfnGateExps,  // ffn_gate_exps.weight [n_experts][expert_ffn][hidden]
  kFfnUpExps,    // ffn_up_exps.weight   [n_experts][expert_ffn][hidden]
  kFfnDownExps,  // ffn_down_exps.weight [n_experts][hidden][expert_ffn]
  // qwen35 / qwen35moe: the norm before the FFN (there is no ffn_norm), the Gated DeltaNet layers'
  // tensors, and the MoE's shared expert with its sigmoid gate
  kPostAttentionNorm,  // post_attention_norm.weight
  kAttnQkv,            // attn_qkv.weight   [2 * k_heads * d + v_heads * d][hidden]
  kAttnGate,           // attn_gate.weight  [v_heads * d][hidden]
  kSsmConv1d,          // ssm_conv1d.weight [channels][conv_kernel]
  kSsmDt,              // ssm_dt.bias       [v_heads]
  kSsmA,               // ssm_a             [v_heads] (-exp(A_log))
  kSsmAlpha,           // ssm_alpha.weight  [v_heads][hidden]
  kSsmBeta,            // ssm_beta.weight   [v_heads][hidden]
  kSsmNorm,            // ssm_norm.weight   [d]
  kSsmOut,             // ssm_out.weight    [hidden][v_heads * d]
  kFfnGateInpShexp,    // ffn_gate_inp_shexp.weight [hidden]
  kFfnGateShexp,       // ffn_gate_shexp.weight [shared_ffn][hidden]
  kFfnUpShexp,         // ffn_up_shexp.weight   [shared_ffn][hidden]
  kFfnDownShexp,       // ffn_down_shexp.weight [hidden][shared_ffn]
};

// "attn_q.weight"
std::string_view layer_tensor_suffix(LayerTensor t);
// "blk.3.attn_q.weight"
std::string layer_tensor_name(std::int64_t layer, LayerTensor t);
// "blk.3.attn_q.weight" -> {3, "attn_q.weight"}; nullopt for names not of the form blk.N.rest.
struct LayerTensorName {
  std::int64_t layer;
  std::string_view suffix;
};
std::optional<LayerTensorName> parse_layer_tensor_name(std::string_view name);

// Convenience spellings.
inline std::string attn_norm_name(std::int64_t i) { return layer_tensor_name(i, LayerTensor::kAttnNorm); }
inline std::string attn_q_name(std::int64_t i) { return layer_tensor_name(i, LayerTensor::kAttnQ); }
inline std::string attn_q_bias_name(std::int64_t i) { return layer_tensor_name(i, LayerTensor::kAttnQBias); }
inline std::string attn_k_name(std::int64_t i) { return layer_tensor_name(i, LayerTensor::kAttnK); }
inline std::string attn_k_bias_name(std::int64_t i) { return layer_tensor_name(i, LayerTensor::kAttnKBias); }
inline std::string attn_v_name(std::int64_t i) { return layer_tensor_name(i, LayerTensor::kAttnV); }
inline std::string attn_v_bias_name(std::int64_t i) { return layer_tensor_name(i, LayerTensor::kAttnVBias); }
inline std::string attn_output_name(std::int64_t i) { return layer_tensor_name(i, LayerTensor::kAttnOutput); }
inline std::string ffn_norm_name(std::int64_t i) { return layer_tensor_name(i, LayerTensor::kFfnNorm); }
inline std::string ffn_gate_name(std::int64_t i) { return layer_tensor_name(i, LayerTensor::kFfnGate); }
inline std::string ffn_up_name(std::int64_t i) { return layer_tensor_name(i, LayerTensor::kFfnUp); }
inline std::string ffn_down_name(std::int64_t i) { return layer_tensor_name(i, LayerTensor::kFfnDown); }

}  // namespace sx::model
