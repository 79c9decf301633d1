// Weight-format recipes: the storage format of every matrix of a model in a given checkpoint format,
// for planning a deployment from a config alone (`sextant plan --config ... --weights q4_k_m`).
//
// Recipes (matrix -> format; "inner" is a matrix's input dimension, the one blocks run along):
//   f32, f16, bf16, q8_0   every matrix, embeddings and LM head included, in that format (a
//                          q8_0 file as `sextant make-model` and llama.cpp's Q8_0 write it).
//   q4_0                   llama.cpp's Q4_0 file: every matrix Q4_0, the LM head Q6_K (the token
//                          embedding takes the LM head's format when the two are tied).
//   q4_k_m                 llama.cpp's Q4_K_M file (llama_tensor_get_type): Q4_K everywhere; Q6_K for
//                          the LM head, and for attn_v and ffn_down of the layers use_more_bits picks:
//                          i < n/8 || i >= 7n/8 || (i - n/8) % 3 == 2. A matrix whose inner dimension
//                          is not whole 256-blocks falls back as llama.cpp does: Q4_K -> Q5_0,
//                          Q6_K -> Q8_0 (Qwen2.5-72B's ffn_down, 29568 = 115.5 x 256; the 896-wide
//                          0.5B). Not modelled: llama.cpp's bump of attn_v to Q5_K for 70B-class
//                          models (under 0.1% of the file).
//   awq-int4               an AWQ / GPTQ 4-bit checkpoint repacked by Sextant: every layer matrix in
//                          groups of 128 (hal::DType::kAwqInt4); token embedding and LM head bf16, as
//                          the checkpoints keep them in 16 bits.
// Threading: pure functions.
#pragma once

#include <optional>
#include <string>
#include <string_view>

#include "runtime/model/model_config.h"
#include "runtime/parallel/shard_plan.h"

namespace sx::parallel {

enum class WeightRecipe { kF32, kF16, kBF16, kQ8_0, kQ4_0, kQ4_K_M, kAwqInt4 };

// "f32", "f16", "bf16", "q8_0", "q4_0", "q4_k_m", "awq-int4"
std::string_view recipe_name(WeightRecipe r);
// Case-insensitive; "awq_int4" and "awq" are accepted for awq-int4.
std::optional<WeightRecipe> recipe_from_name(std::string_view name);
// "f32, f16, bf16, q8_0, q4_0, q4_k_m, awq-int4"
std::string recipe_names();
// One line: "llama.cpp Q4_K_M (Q4_K, Q6_K for the LM head and some attn_v / ffn_down)".
std::string_view recipe_description(WeightRecipe r);

// The format of every matrix of `config` under the recipe.
WeightTypes recipe_weight_types(const model::ModelConfig& config, WeightRecipe r);

// llama.cpp's use_more_bits(i_layer, n_layers).
bool use_more_bits(std::int64_t layer, std::int64_t n_layers);

}  // namespace sx::parallel
