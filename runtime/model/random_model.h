// Random-weight Qwen2 GGUF models with the exact shapes of real sizes (for shard-planner tests,
// benchmarks and loaders), plus the Qwen2.5 and Qwen3 size presets.
//
// Weights are deterministic functions of (seed, tensor name): a tensor's values do not depend on
// which other tensors exist or on write order. 2-D weights are uniform with standard deviation
// init_std, stored as weight_type; 1-D tensors are always F32 (norm weights 1 + small noise,
// biases small noise). Writing streams row blocks straight into the file: memory use is a few MB
// whatever the model size.
//
// Weight formats: one format for every 2-D weight (F32, F16, BF16 or any GGML block format with a
// quantiser: Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q4_K, Q5_K, Q6_K), or a llama.cpp-style mix (WeightMix):
//   kQ4_K_M  llama.cpp's Q4_K_M (llama_tensor_get_type): Q4_K; Q6_K for the LM head (the token
//            embedding when tied) and for attn_v / ffn_down of the layers with more bits
//            (i < n/8 || i >= 7n/8 || (i - n/8) % 3 == 2); a tensor whose row length (inner dim) is
//            not whole 256-blocks falls back as llama.cpp does: Q4_K -> Q5_0, Q6_K -> Q8_0.
//   kQ5_K    llama.cpp's Q5_K_S without its Q6_K head: Q5_K everywhere, Q5_1 where rows are not
//            whole 256-blocks (llama.cpp's fallback for Q5_K).
//   kQ6_K    llama.cpp's Q6_K: Q6_K everywhere, Q8_0 where rows are not whole 256-blocks.
// The same rules as parallel::recipe_weight_types (q4_k_m), so `sextant plan` sizes these files.
//
// Errors: INVALID_ARGUMENT for an inconsistent spec (bad config, a weight_type without a
// quantiser, a dimension not a multiple of the block, tokenizer larger than vocab or a synthesized
// vocab under 259 tokens); write errors name the path. Threading: pure apart from the file written.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "runtime/base/status.h"
#include "runtime/hal/dtype.h"
#include "runtime/model/gguf_writer.h"
#include "runtime/model/model_config.h"

namespace sx::model {

enum class WeightMix { kUniform, kQ4_K_M, kQ5_K, kQ6_K };

struct RandomModelSpec {
  ModelConfig config;
  hal::DType weight_type = hal::DType::kF32;  // 2-D weights when mix is kUniform (see above)
  WeightMix mix = WeightMix::kUniform;
  std::uint64_t seed = 0;
  float init_std = 0.02f;
  TokenizerMetadata tokenizer;  // tokens empty: synthesize_tokenizer(config.vocab)
};

// Qwen2.5 dense presets: "0.5b", "1.5b", "3b", "7b", "14b", "32b", "72b" (qkv bias, rms eps 1e-6,
// rope theta 1e6; 0.5b-3b tied with 32k context, 7b+ untied with 128k). An unknown size is a
// programmer error (aborts); use find_qwen2_5_config for user input.
ModelConfig qwen2_5_config(std::string_view size);
Result<ModelConfig> find_qwen2_5_config(std::string_view size);
const std::vector<std::string_view>& qwen2_5_sizes();

// Qwen3 dense shapes: "0.6b", "1.7b", "4b", "8b", "14b", "32b" (architecture "qwen3": head_dim 128
// whatever the hidden size, so q_dim != hidden for 0.6b, 4b and 32b; q/k norms, no qkv bias; rms eps
// 1e-6, rope theta 1e6, vocab 151936, 40960 positions; 0.6b-4b tied). Numbers from the published
// Hugging Face config.json files. Shapes only (for the shard planner and `sextant plan`): qwen3 is
// not a loadable architecture yet, so these cannot be written as GGUF. An unknown size aborts; use
// find_qwen3_config for user input.
ModelConfig qwen3_config(std::string_view size);
Result<ModelConfig> find_qwen3_config(std::string_view size);
const std::vector<std::string_view>& qwen3_sizes();

// Qwen3-MoE shapes: "30b-a3b" (48 layers, hidden 2048, 32 / 4 heads, 128 experts of 768, 8 used),
// "235b-a22b" (94 layers, hidden 4096, 64 / 4 heads, 128 experts of 1536, 8 used); architecture
// "qwen3moe", head_dim 128, untied, the published config.json numbers.
Result<ModelConfig> find_qwen3moe_config(std::string_view size);
const std::vector<std::string_view>& qwen3moe_sizes();

// Qwen3.5 / 3.6 / 3.8 shapes (docs/research/qwen35-shapes.md: the published configs and llama.cpp's
// GGUF keys): "qwen35" dense "0.8b", "2b", "4b", "9b", "27b" (Qwen3.6-27B and Qwen3.8-27B share
// 27b's shape) and "qwen35moe" "35b-a3b" (also Qwen3.6-35B-A3B), "122b-a10b", "397b-a17b". Every
// fourth layer gated full attention with heads of 256 (64 rotated, sections [11, 11, 10, 0], theta
// 1e7); the others Gated DeltaNet with 16 K heads and 16-64 V heads of 128, conv kernel 4; vocab
// 248320; 262144 positions.
Result<ModelConfig> find_qwen35_config(std::string_view size);
const std::vector<std::string_view>& qwen35_sizes();
Result<ModelConfig> find_qwen35moe_config(std::string_view size);
const std::vector<std::string_view>& qwen35moe_sizes();
// Sets c's layer pattern for n_layers: every interval-th layer full attention, the others DeltaNet.
void set_hybrid_layers(ModelConfig& c, std::int64_t n_layers, std::int64_t interval = 4);

// A minimal byte-level BPE vocabulary of `vocab` tokens: the 256 GPT-2 byte tokens (ids 0..255 in
// the order Qwen2's vocabulary has them), "[PAD{i}]" fillers (unused), then <|endoftext|>,
// <|im_start|>, <|im_end|> as the last three ids (control). No merges; eos = <|im_end|>,
// bos = pad = <|endoftext|>; a ChatML chat template. vocab must be >= 259.
Result<TokenizerMetadata> synthesize_tokenizer(std::int64_t vocab);

// The format of 2-D weight `name` (an expected_tensors name) with rows of `row_len` elements under
// `mix` (`uniform` for kUniform).
hal::DType mixed_weight_type(const ModelConfig& config, WeightMix mix, hal::DType uniform, std::string_view name,
                             std::int64_t row_len);

// Fills `w` with the metadata and (streamed) tensors of the model; nothing is generated until the
// writer writes.
Status add_random_model(const RandomModelSpec& spec, GgufWriter& w);
// add_random_model + write(path).
Status write_random_gguf(const RandomModelSpec& spec, const std::string& path);

// The generator behind the weights: fills `out` with the values of elements
// [first, first + out.size()) of tensor `name` in row-major order. Exposed so tests can rebuild
// expected values without reading files.
void random_tensor_values(const RandomModelSpec& spec, std::string_view name, std::int64_t first,
                          std::span<float> out);

}  // namespace sx::model
