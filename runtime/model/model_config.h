// Model hyper-parameters read from GGUF metadata, checked against the tensors actually present.
//
// Architectures are described by a table (ArchSpec): keys are "<arch>.<suffix>" and the per-layer
// tensors are listed per architecture, so adding qwen3 means adding a row (plus its q/k norms).
// Supported today: qwen2 (Qwen2 / Qwen2.5 dense), qwen3 (Qwen3 dense: q/k head norms, head_dim of
// its own), qwen3moe (Qwen3-MoE: qwen3's attention, every FFN a routed mixture of experts).
//
// Shapes are in GGUF ne order (ne[0] innermost): a weight mapping in -> out has dims {in, out}.
//
// Errors (messages name the file and the key or tensor):
//   NOT_FOUND         a required key or tensor is missing
//   UNIMPLEMENTED     an architecture we do not support (names it and the supported ones)
//   INVALID_ARGUMENT  a key of the wrong type or range, an inconsistent config (hidden % heads,
//                     heads % kv_heads, odd head_dim, ...), a tensor whose dims differ from what the
//                     config implies (names expected and actual), an unexpected per-layer tensor
// Threading: pure functions over immutable inputs.
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "runtime/base/status.h"
#include "runtime/model/gguf.h"
#include "runtime/model/gguf_writer.h"
#include "runtime/model/tensor_names.h"

namespace sx::model {

struct ModelConfig {
  std::string architecture = "qwen2";
  std::string name;
  std::int64_t n_layers = 0;
  std::int64_t hidden = 0;
  std::int64_t n_heads = 0;
  std::int64_t n_kv_heads = 0;
  std::int64_t head_dim = 0;
  std::int64_t ffn = 0;
  std::int64_t vocab = 0;
  std::int64_t context_length = 0;
  double rope_theta = 10000.0;
  double rms_eps = 1e-6;
  bool tied_embeddings = false;
  bool qkv_bias = false;
  // Mixture of experts (qwen3moe): every layer's FFN is n_experts experts of expert_ffn rows, of
  // which the router picks n_experts_used per token (softmax, top-k, renormalised when
  // norm_topk_prob). 0 experts: a dense FFN of ffn rows.
  std::int64_t n_experts = 0;
  std::int64_t n_experts_used = 0;
  std::int64_t expert_ffn = 0;
  bool norm_topk_prob = true;

  // The MoE's always-on shared expert (qwen35moe): its FFN width; 0 without one.
  std::int64_t shared_expert_ffn = 0;

  // Hybrid models (qwen35, qwen35moe): Gated DeltaNet layers beside gated full-attention layers.
  // recurrent_layers[i] says layer i is a DeltaNet layer (empty for the other architectures). A
  // DeltaNet layer has ssm_k_heads query/key heads and ssm_v_heads value heads, all of ssm_head_dim
  // (GGUF ssm.group_count, ssm.time_step_rank, ssm.state_size), and a causal conv of
  // ssm_conv_kernel taps. Full-attention layers rotate rot_dim of each head's dims (0: all) with
  // rope_sections (multimodal RoPE; text feeds every section the same position).
  std::vector<bool> recurrent_layers;
  std::int64_t ssm_k_heads = 0, ssm_v_heads = 0, ssm_head_dim = 0, ssm_conv_kernel = 0;
  // How the file orders the V heads (rows of attn_qkv's values, attn_gate, ssm_alpha / ssm_beta,
  // ssm_a, ssm_dt, ssm_conv1d's value channels, columns of ssm_out): false, tiled as llama.cpp's
  // GGUF files (V head j reads K head j % ssm_k_heads); true, grouped by K head as Hugging Face
  // checkpoints (V head j reads K head j / (ssm_v_heads / ssm_k_heads)).
  bool ssm_v_grouped = false;
  std::int64_t rot_dim = 0;
  std::vector<std::int64_t> rope_sections;
  // Multi-token-prediction layers after the n_layers of the trunk (GGUF nextn_predict_layers,
  // counted in block_count): not loaded.
  std::int64_t n_nextn_layers = 0;

  bool is_moe() const { return n_experts > 0; }
  bool is_hybrid() const { return ssm_v_heads > 0; }
  bool is_recurrent(std::int64_t layer) const {
    return layer >= 0 && static_cast<std::size_t>(layer) < recurrent_layers.size() &&
           recurrent_layers[static_cast<std::size_t>(layer)];
  }
  // The channels of a DeltaNet layer's q|k|v (its conv's width) and of its values.
  std::int64_t ssm_conv_channels() const { return (2 * ssm_k_heads + ssm_v_heads) * ssm_head_dim; }
  std::int64_t ssm_inner() const { return ssm_v_heads * ssm_head_dim; }

  std::int64_t q_dim() const { return n_heads * head_dim; }
  std::int64_t kv_dim() const { return n_kv_heads * head_dim; }
  bool operator==(const ModelConfig&) const = default;
};

// What an architecture looks like in a GGUF file.
struct ArchSpec {
  std::string_view name;                            // general.architecture value
  std::vector<LayerTensor> layer_tensors;           // every layer has these
  std::vector<LayerTensor> qkv_bias_tensors;        // present iff the model has a qkv bias
  std::vector<LayerTensor> recurrent_layer_tensors; // a hybrid's DeltaNet layers have these instead
};
// The tensors layer i of c has (its architecture's recurrent set for a hybrid's DeltaNet layer).
const std::vector<LayerTensor>& layer_tensors_of(const ArchSpec& spec, const ModelConfig& c, std::int64_t layer);

// nullptr when unsupported.
const ArchSpec* find_arch_spec(std::string_view architecture);
// "qwen2, qwen3"
std::string supported_architectures();
// Whether every query and key head is RMS-normalised before rope (qwen3: attn_q_norm / attn_k_norm).
bool has_qk_norm(const ModelConfig& c);

// One tensor a model must have, with its dims in ne order.
struct ExpectedTensor {
  std::string name;
  std::vector<std::int64_t> dims;
};
// Every tensor of the model in file order (token_embd, layers, output_norm, output), derived from
// the config; empty for an unsupported architecture.
std::vector<ExpectedTensor> expected_tensors(const ModelConfig& c);
// Calls fn for each expected tensor in that order; stops at (and returns) the first error.
Status for_each_expected_tensor(const ModelConfig& c, const std::function<Status(ExpectedTensor)>& fn);
// Dims of one per-layer tensor.
std::vector<std::int64_t> layer_tensor_dims(const ModelConfig& c, LayerTensor t);

// Internal consistency (positive sizes, hidden % heads when head_dim is implied, heads % kv_heads,
// even head_dim, ...). `where` prefixes messages (e.g. the file).
Status validate_model_config(const ModelConfig& c, std::string_view where);

// Reads the hyper-parameters (keys listed in the .cpp) and derives vocab from token_embd.weight,
// tied_embeddings from the absence of output.weight and qkv_bias from blk.0.attn_q.bias.
Result<ModelConfig> model_config_from_gguf(const GgufFile& f);

// check_model(f, c).status() (model_check.h): every expected tensor present with the expected dims
// and a weight format; no per-layer tensor beyond them.
Status check_model_tensors(const TensorSource& f, const ModelConfig& c);
Status check_qwen2_tensors(const TensorSource& f, const ModelConfig& c);

// Writes general.architecture / general.name and the "<arch>.*" hyper-parameter keys.
void set_model_config_metadata(GgufWriter& w, const ModelConfig& c);

// ---- tokenizer metadata (tokenizer.ggml.* keys, gpt2-style BPE) ----

// Token types as llama.cpp stores them.
enum TokenType : std::int32_t {
  kTokenNormal = 1,
  kTokenUnknown = 2,
  kTokenControl = 3,
  kTokenUserDefined = 4,
  kTokenUnused = 5,
  kTokenByte = 6,
};

struct TokenizerMetadata {
  std::string model = "gpt2";               // tokenizer.ggml.model
  std::string pre = "qwen2";                // tokenizer.ggml.pre
  std::vector<std::string> tokens;          // tokenizer.ggml.tokens
  std::vector<std::string> merges;          // tokenizer.ggml.merges ("a b")
  std::vector<std::int32_t> token_types;    // tokenizer.ggml.token_type (empty: all normal)
  std::int64_t eos_id = -1;                 // -1: absent
  std::int64_t bos_id = -1;
  std::int64_t pad_id = -1;
  bool add_bos = false;                     // tokenizer.ggml.add_bos_token
  std::string chat_template;                // tokenizer.chat_template (empty: absent)

  bool operator==(const TokenizerMetadata&) const = default;
};

// Reads tokenizer.ggml.* (tokens required; the rest optional). Ids are checked against the token
// count and token_types must match it in length.
Result<TokenizerMetadata> tokenizer_metadata_from_gguf(const GgufFile& f);
// Writes tokenizer.ggml.*. The token list is padded to `vocab_rows` (the rows of token_embd.weight)
// with unused "[PAD<id>]" entries, as llama.cpp's convert_hf_to_gguf.py does: llama.cpp takes its
// vocabulary size from the token list and refuses a file whose embedding has more rows (Qwen2.5's
// tokenizer has 151665 tokens, its embedding 151936 rows). Ids past the list decode to nothing
// either way.
void set_tokenizer_metadata(GgufWriter& w, const TokenizerMetadata& t, std::int64_t vocab_rows);

}  // namespace sx::model
