// HfModel: a Hugging Face model directory (config.json, generation_config.json, model.safetensors
// or model.safetensors.index.json + shards) as a TensorSource the loader reads like a GGUF file.
//
// Tensor names are mapped to the GGUF convention (hf_to_gguf_name: model.embed_tokens.weight ->
// token_embd.weight, model.layers.N.self_attn.q_proj.weight -> blk.N.attn_q.weight, ...) and
// shapes reversed into ne order; the bytes are the same (a row-major [out, in] matrix is GGUF's
// [in, out]), so F32 / F16 / BF16 matrices are used in place from the mapping (zero copy). 1-D
// tensors (norm weights, biases) stored as F16 / BF16 are widened to F32 once at open, since the
// forward keeps them in F32.
//
// Qwen3.5 / 3.6 / 3.8 checkpoints (hf_config.h): the language model's tensors under
// model.language_model. are read as model.*; the vision tower (model.visual.*) and the
// multi-token-prediction layer (mtp.*) are skipped with a warning each. llama.cpp's converter is
// done at open where it is cheap: the (1 + w) RMSNorm weights get their 1 (not the gated
// linear_attn.norm), A_log becomes ssm_a = -exp(A_log), conv1d [channels][1][kernel] and
// shared_expert_gate [1][hidden] lose their unit dimension. The V heads stay in the checkpoint's
// grouped order (ModelConfig::ssm_v_grouped), so the large DeltaNet matrices are used in place.
// Experts come one tensor per expert or fused as transformers 5 stores them
// (mlp.experts.gate_up_proj [experts][2 * ffn][hidden], split into two copied stacks, and
// mlp.experts.down_proj, used in place). AWQ / GPTQ checkpoints of these models are UNIMPLEMENTED.
//
// AWQ checkpoints (quantization_config.quant_method "awq", 4 bits, group size 128; AutoAWQ's GEMM
// packing: <proj>.qweight I32 [in, out / 8], <proj>.qzeros I32 [in / 128, out / 8], <proj>.scales
// F16 [in / 128, out], nibble i of each int32 holding column (0, 2, 4, 6, 1, 3, 5, 7)[i]) are
// repacked once at open into hal::DType::kAwqInt4 rows (w = (q - zero) * scale, exactly AWQ's
// dequantisation); the other tensors are used as stored. GPTQ checkpoints (quant_method "gptq", 4
// bits, group size 128; AutoGPTQ's packing: <proj>.qweight I32 [in / 8, out] with input i in nibble
// i % 8, .qzeros I32 [in / 128, out / 8] with column n in nibble n % 8, stored minus one unless
// checkpoint_format is "gptq_v2", .scales F16 [in / 128, out], .g_idx I32 [in]) become the same
// rows. Act-order checkpoints whose g_idx is not input / 128 are UNIMPLEMENTED (naming the tensor),
// as are other bit widths and group sizes.
//
// Findings that do not stop a load are warnings(): tensors whose names map to nothing Sextant
// knows (e.g. rotary_emb.inv_freq), lm_head.weight in a model with tied embeddings (ignored),
// and the safetensors reader's own (a shard tensor the index does not name).
//
// generation_config.json (optional): eos_token_id (an id or a list) and the default sampling
// parameters. Messages name the file and the key.
//
// Errors: open() fails on anything structural (the directory's kind, config.json, the safetensors
// reader's integrity checks; see safetensors.h and hf_config.h); the tensors are checked against
// the config by check_model() (model_check.h), which reports them in safetensors terms
// (tensor_label names the HF tensor and its shard, shape_label prints row-major shapes).
// Threading: immutable after open(); safe to read from any number of threads.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "runtime/base/status.h"
#include "runtime/model/hf_config.h"
#include "runtime/model/safetensors.h"
#include "runtime/model/tensor_source.h"

namespace sx::model {

inline constexpr std::string_view kHfConfigFile = "config.json";
inline constexpr std::string_view kHfGenerationConfigFile = "generation_config.json";
inline constexpr std::string_view kHfTokenizerFile = "tokenizer.json";

// "model.layers.3.self_attn.q_proj.weight" -> "blk.3.attn_q.weight" (also spelt
// "model.language_model.layers.3...", as Qwen3.5's multimodal checkpoints do); nullopt for names
// Sextant does not use. `hybrid` (Qwen3.5): post_attention_layernorm is post_attention_norm, not
// ffn_norm.
std::optional<std::string> hf_to_gguf_name(std::string_view hf_name, bool hybrid = false);
// The inverse for every name the architectures use ("token_embd.weight" -> "model.embed_tokens.weight");
// nullopt for names without an HF spelling.
std::optional<std::string> gguf_to_hf_name(std::string_view gguf_name);
// Qwen3-MoE: the Hugging Face name of expert `expert`'s matrix of a stacked GGUF tensor
// (kFfnGateExps -> "model.layers.L.mlp.experts.E.gate_proj.weight"); empty for other tensors.
std::string hf_expert_name(std::int64_t layer, std::int64_t expert, LayerTensor stacked);

struct GenerationConfig {
  bool present = false;                 // the file exists
  std::vector<std::int32_t> eos_ids;    // eos_token_id, as a list
  std::optional<std::int32_t> bos_id;   // bos_token_id
  std::optional<double> temperature, top_p, repetition_penalty;
  std::optional<std::int64_t> top_k;
};

// Reads generation_config.json; a missing file gives present == false.
Result<GenerationConfig> read_generation_config(const std::string& path);
Result<GenerationConfig> parse_generation_config(std::string_view json_text, std::string_view display_name);

class HfModel final : public TensorSource {
 public:
  static Result<std::unique_ptr<HfModel>> open(const std::string& dir);

  const std::string& path() const override { return dir_; }
  std::string_view format() const override { return "safetensors"; }
  const std::vector<TensorInfo>& tensors() const override { return tensors_; }
  const TensorInfo* find_tensor(std::string_view name) const override;
  std::vector<std::string> weight_files() const override;
  std::string tensor_label(std::string_view name) const override;
  std::string missing_detail(std::string_view name) const override;
  std::string shape_label(std::span<const std::int64_t> dims) const override;

  const HfConfig& hf_config() const { return hf_; }
  const ModelConfig& config() const { return hf_.config; }
  const GenerationConfig& generation() const { return generation_; }
  const SafetensorsModel& weights() const { return *weights_; }
  const std::vector<std::string>& warnings() const { return warnings_; }
  // dir/tokenizer.json (not opened here).
  std::string tokenizer_path() const;

 private:
  HfModel() = default;
  Status check_quantization() const;
  Status to_gguf_convention(const SafetensorsTensor& t, TensorInfo& info);
  Status add_fused_experts(const std::map<std::pair<std::int64_t, bool>, const SafetensorsTensor*>& fused);
  Result<TensorInfo> repack_int4(const std::string& base, const SafetensorsTensor& qweight, std::string name);

  std::string dir_;
  HfConfig hf_;
  GenerationConfig generation_;
  std::unique_ptr<SafetensorsModel> weights_;
  std::vector<TensorInfo> tensors_;                      // GGUF names, sorted by name
  std::vector<std::string> hf_names_;                    // parallel to tensors_
  std::vector<std::vector<std::uint8_t>> owned_;         // widened 1-D tensors, repacked AWQ matrices
  std::vector<std::string> warnings_;
};

}  // namespace sx::model
