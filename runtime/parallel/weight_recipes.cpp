// Weight-format recipes (the rules are in weight_recipes.h).
#include "runtime/parallel/weight_recipes.h"

#include <algorithm>
#include <cctype>

namespace sx::parallel {

namespace {

using hal::DType;

struct RecipeInfo {
  WeightRecipe recipe;
  std::string_view name;
  std::string_view description;
};

constexpr RecipeInfo kRecipes[] = {
    {WeightRecipe::kF32, "f32", "f32 (every matrix)"},
    {WeightRecipe::kF16, "f16", "f16 (every matrix)"},
    {WeightRecipe::kBF16, "bf16", "bf16 (every matrix)"},
    {WeightRecipe::kQ8_0, "q8_0", "q8_0 (every matrix)"},
    {WeightRecipe::kQ4_0, "q4_0", "llama.cpp Q4_0 (Q4_0; Q6_K for the LM head)"},
    {WeightRecipe::kQ4_K_M, "q4_k_m",
     "llama.cpp Q4_K_M (Q4_K; Q6_K for the LM head and for attn_v / ffn_down in 1 of 3 layers and the first and "
     "last eighth)"},
    {WeightRecipe::kAwqInt4, "awq-int4", "AWQ / GPTQ int4, groups of 128 (embeddings and LM head bf16)"},
};

const RecipeInfo& info(WeightRecipe r) {
  for (const RecipeInfo& i : kRecipes) {
    if (i.recipe == r) return i;
  }
  return kRecipes[0];
}

// llama.cpp's convert_incompatible_tensor fallback for a K-quant whose inner dimension is not whole
// 256-blocks.
DType k_quant_or_fallback(DType t, std::int64_t inner) {
  if (inner % hal::dtype_info(t).block_elems == 0) return t;
  if (t == DType::kQ4_K) return DType::kQ5_0;
  if (t == DType::kQ6_K) return DType::kQ8_0;
  return t;
}

}  // namespace

std::string_view recipe_name(WeightRecipe r) { return info(r).name; }
std::string_view recipe_description(WeightRecipe r) { return info(r).description; }

std::optional<WeightRecipe> recipe_from_name(std::string_view name) {
  std::string lower(name);
  std::transform(lower.begin(), lower.end(), lower.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  if (lower == "awq_int4" || lower == "awq") return WeightRecipe::kAwqInt4;
  for (const RecipeInfo& i : kRecipes) {
    if (i.name == lower) return i.recipe;
  }
  return std::nullopt;
}

std::string recipe_names() {
  std::string out;
  for (const RecipeInfo& i : kRecipes) {
    if (!out.empty()) out += ", ";
    out += i.name;
  }
  return out;
}

bool use_more_bits(std::int64_t layer, std::int64_t n_layers) {
  return layer < n_layers / 8 || layer >= 7 * n_layers / 8 || (layer - n_layers / 8) % 3 == 2;
}

WeightTypes recipe_weight_types(const model::ModelConfig& c, WeightRecipe r) {
  switch (r) {
    case WeightRecipe::kF32: return uniform_weight_types(c, DType::kF32);
    case WeightRecipe::kF16: return uniform_weight_types(c, DType::kF16);
    case WeightRecipe::kBF16: return uniform_weight_types(c, DType::kBF16);
    case WeightRecipe::kQ8_0: return uniform_weight_types(c, DType::kQ8_0);
    case WeightRecipe::kQ4_0: {
      WeightTypes w = uniform_weight_types(c, DType::kQ4_0);
      w.output = k_quant_or_fallback(DType::kQ6_K, c.hidden);
      if (c.tied_embeddings) w.token_embd = w.output;
      return w;
    }
    case WeightRecipe::kQ4_K_M: {
      WeightTypes w = uniform_weight_types(c, DType::kQ4_K);
      w.output = k_quant_or_fallback(DType::kQ6_K, c.hidden);
      w.token_embd = c.tied_embeddings ? w.output : k_quant_or_fallback(DType::kQ4_K, c.hidden);
      for (std::int64_t i = 0; i < c.n_layers; ++i) {
        LayerWeightTypes& l = w.layers[static_cast<std::size_t>(i)];
        const DType more = use_more_bits(i, c.n_layers) ? DType::kQ6_K : DType::kQ4_K;
        l.q = l.k = l.gate = l.up = k_quant_or_fallback(DType::kQ4_K, c.hidden);
        l.v = k_quant_or_fallback(more, c.hidden);
        l.o = k_quant_or_fallback(DType::kQ4_K, c.q_dim());
        l.down = k_quant_or_fallback(more, c.is_moe() ? c.expert_ffn : c.ffn);  // the router stays F32
        if (c.is_hybrid()) {  // make-model's mix: the DeltaNet matrices Q4_K, the conv taps F32
          l.qkv = l.z = l.alpha = l.beta = k_quant_or_fallback(DType::kQ4_K, c.hidden);
          l.ssm_out = k_quant_or_fallback(DType::kQ4_K, c.ssm_inner());
        }
        if (c.shared_expert_ffn > 0) {
          l.sh_gate = l.sh_up = k_quant_or_fallback(DType::kQ4_K, c.hidden);
          l.sh_down = k_quant_or_fallback(DType::kQ4_K, c.shared_expert_ffn);
        }
      }
      return w;
    }
    case WeightRecipe::kAwqInt4: {
      WeightTypes w = uniform_weight_types(c, DType::kAwqInt4);
      w.token_embd = w.output = DType::kBF16;
      if (c.is_moe()) {
        for (LayerWeightTypes& l : w.layers) l.router = DType::kBF16;  // not quantised by AWQ / GPTQ
      }
      return w;
    }
  }
  return uniform_weight_types(c, DType::kF32);
}

}  // namespace sx::parallel
