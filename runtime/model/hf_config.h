// Model hyper-parameters from a Hugging Face config.json, so a deployment can be planned before any
// weights are fetched (`sextant plan --config`).
//
// Supported: Qwen2ForCausalLM (model_type "qwen2": Qwen2 / Qwen2.5 dense, qkv bias),
// Qwen3ForCausalLM ("qwen3": q/k norms, no qkv bias, head_dim its own key), Qwen3MoeForCausalLM and
// the Qwen3.5 classes below. The architecture is
// taken from "model_type", or from "architectures"[0] when model_type is absent; when both are
// present they must agree.
//
// Keys read (ModelConfig field <- key):
//   n_layers <- num_hidden_layers          hidden <- hidden_size
//   n_heads <- num_attention_heads         n_kv_heads <- num_key_value_heads (absent: = heads, as
//                                                        transformers does)
//   head_dim <- head_dim (qwen3; absent or qwen2: hidden / heads, and a qwen2 head_dim must equal it)
//   ffn <- intermediate_size               vocab <- vocab_size
//   context_length <- max_position_embeddings
//   rope_theta <- rope_theta (absent: 10000)   rms_eps <- rms_norm_eps (absent: 1e-6)
//   tied_embeddings <- tie_word_embeddings (absent: false)
//   qkv_bias: true for qwen2, false for qwen3; name <- "_name_or_path" when present.
// Qwen3_5ForConditionalGeneration / Qwen3_5MoeForConditionalGeneration ("qwen3_5", "qwen3_5_moe";
// also their text-only ...ForCausalLM, "qwen3_5_text", "qwen3_5_moe_text") read the same keys from
// text_config when present, plus: ssm_k_heads / ssm_v_heads / ssm_head_dim <- linear_num_key_heads /
// linear_num_value_heads / linear_key_head_dim (linear_value_head_dim must equal it),
// ssm_conv_kernel <- linear_conv_kernel_dim (4), recurrent_layers <- layer_types, else every
// full_attention_interval-th (4) layer is full attention, rope_theta / rot_dim / rope_sections <-
// rope_parameters.{rope_theta, partial_rotary_factor (0.25) x head_dim, mrope_section} (or the
// older top-level rope_theta, partial_rotary_factor, rope_scaling.mrope_section),
// shared_expert_ffn <- shared_expert_intermediate_size (ffn = the experts' width), norm_topk_prob
// default true, ssm_v_grouped = true; attn_output_gate false is UNIMPLEMENTED; tie_word_embeddings
// and torch_dtype (or dtype) may sit at the top level. The checkpoint's storage format is reported too (HfConfig): torch_dtype and, for a quantized
// checkpoint, quantization_config.{quant_method, bits, group_size, checkpoint_format}. rope_scaling is ignored: the
// context is max_position_embeddings.
//
// Errors (messages name the file and the key):
//   NOT_FOUND         the file, or a required key, is missing
//   INVALID_ARGUMENT  not JSON (or nested more than 128 levels deep), not an object, a key of the
//                     wrong type (an integer given as 1.5 or "28"), a size out of 1..2^31-1,
//                     inconsistent keys (heads not a multiple of KV heads, hidden not a multiple of
//                     heads without head_dim, an odd head_dim,
//                     model_type and architectures disagreeing), a non-positive rope_theta or
//                     rms_norm_eps
//   UNIMPLEMENTED     another architecture (names it and the supported ones)
// Threading: pure functions apart from reading the file.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "runtime/base/status.h"
#include "runtime/model/model_config.h"

namespace sx::model {

struct HfConfig {
  ModelConfig config;
  std::string torch_dtype;   // "bfloat16", "float16", "float32"; empty when absent
  std::string quant_method;  // quantization_config.quant_method ("awq", "gptq", ...); empty: not quantized
  std::int64_t quant_bits = 0;        // quantization_config.bits (0: absent)
  std::int64_t quant_group_size = 0;  // quantization_config.group_size (0: absent)
  std::string quant_checkpoint_format;  // quantization_config.checkpoint_format (GPTQ: "gptq", "gptq_v2"; empty: absent)
};

// Reads and checks a config.json.
Result<HfConfig> read_hf_config(const std::string& path);
// The same from the text of one; `display_name` names it in messages.
Result<HfConfig> parse_hf_config(std::string_view json_text, std::string_view display_name);

// read_hf_config(path).config
Result<ModelConfig> model_config_from_hf_json(const std::string& path);

// "qwen2 (Qwen2ForCausalLM), qwen3 (Qwen3ForCausalLM)"
std::string supported_hf_architectures();

}  // namespace sx::model
