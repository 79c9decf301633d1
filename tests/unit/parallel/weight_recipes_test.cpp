// Weight-format recipes: llama.cpp's Q4_0 / Q4_K_M choices (use_more_bits, the fallbacks for inner
// dimensions that are not whole 256-blocks) and the AWQ layout, on the real Qwen2.5 shapes.
#include <gtest/gtest.h>

#include "runtime/model/random_model.h"
#include "runtime/parallel/weight_recipes.h"

namespace sx::parallel {
namespace {

using hal::DType;

TEST(WeightRecipes, Names) {
  EXPECT_EQ(recipe_names(), "f32, f16, bf16, q8_0, q4_0, q4_k_m, awq-int4");
  for (WeightRecipe r : {WeightRecipe::kF32, WeightRecipe::kF16, WeightRecipe::kBF16, WeightRecipe::kQ8_0,
                         WeightRecipe::kQ4_0, WeightRecipe::kQ4_K_M, WeightRecipe::kAwqInt4}) {
    EXPECT_EQ(recipe_from_name(recipe_name(r)), r);
  }
  EXPECT_EQ(recipe_from_name("AWQ_INT4"), WeightRecipe::kAwqInt4);
  EXPECT_EQ(recipe_from_name("Q4_K_M"), WeightRecipe::kQ4_K_M);
  EXPECT_FALSE(recipe_from_name("q4_k").has_value());
  EXPECT_FALSE(recipe_from_name("q5_k_m").has_value());
}

TEST(WeightRecipes, UseMoreBitsIsLlamaCpps) {
  // n = 28 (7B): n/8 = 3, 7n/8 = 24: layers 0-2, 24-27 and 3 + 2, 3 + 5, ... (i - 3) % 3 == 2.
  std::vector<std::int64_t> picked;
  for (std::int64_t i = 0; i < 28; ++i) {
    if (use_more_bits(i, 28)) picked.push_back(i);
  }
  EXPECT_EQ(picked, (std::vector<std::int64_t>{0, 1, 2, 5, 8, 11, 14, 17, 20, 23, 24, 25, 26, 27}));
}

TEST(WeightRecipes, Q4KM7b) {
  const auto c = model::qwen2_5_config("7b");  // hidden 3584 = 14 x 256, FFN 18944 = 74 x 256
  const WeightTypes w = recipe_weight_types(c, WeightRecipe::kQ4_K_M);
  EXPECT_EQ(w.token_embd, DType::kQ4_K);
  EXPECT_EQ(w.output, DType::kQ6_K);
  for (std::int64_t i = 0; i < c.n_layers; ++i) {
    const LayerWeightTypes& l = w.layers[static_cast<std::size_t>(i)];
    const DType more = use_more_bits(i, c.n_layers) ? DType::kQ6_K : DType::kQ4_K;
    EXPECT_EQ(l.v, more) << i;
    EXPECT_EQ(l.down, more) << i;
    for (DType t : {l.q, l.k, l.o, l.gate, l.up}) EXPECT_EQ(t, DType::kQ4_K) << i;
  }
  // Held once: 4.36 GiB (llama.cpp's Qwen2.5-7B-Instruct-Q4_K_M.gguf is 4.68 GB).
  auto s = plan_shards(c, w, {1, 1, DType::kBF16});
  ASSERT_TRUE(s.ok()) << s.status().to_string();
  EXPECT_NEAR(static_cast<double>(s->model_weight_bytes) / 1e9, 4.68, 0.02);
}

TEST(WeightRecipes, Q4KMFallbacksFor72bAnd05b) {
  // 72B: FFN 29568 = 115.5 x 256, so ffn_down falls back: Q4_K -> Q5_0, Q6_K -> Q8_0.
  const auto big = model::qwen2_5_config("72b");
  const WeightTypes w = recipe_weight_types(big, WeightRecipe::kQ4_K_M);
  EXPECT_EQ(w.layers[0].down, DType::kQ8_0);   // use_more_bits(0, 80)
  EXPECT_EQ(w.layers[10].down, DType::kQ5_0);  // (10 - 10) % 3 == 0
  EXPECT_EQ(w.layers[12].down, DType::kQ8_0);  // (12 - 10) % 3 == 2
  EXPECT_EQ(w.layers[10].v, DType::kQ4_K);
  EXPECT_EQ(w.layers[12].v, DType::kQ6_K);
  EXPECT_EQ(w.layers[10].gate, DType::kQ4_K);
  // 0.5B: hidden 896 = 3.5 x 256 and tied: the one table takes the LM head's Q6_K -> Q8_0; the
  // hidden-wide matrices Q4_K -> Q5_0; FFN 4864 = 19 x 256 keeps Q4_K / Q6_K for down.
  const auto small = model::qwen2_5_config("0.5b");
  const WeightTypes s = recipe_weight_types(small, WeightRecipe::kQ4_K_M);
  EXPECT_EQ(s.token_embd, DType::kQ8_0);
  EXPECT_EQ(s.layers[5].q, DType::kQ5_0);
  EXPECT_EQ(s.layers[5].o, DType::kQ5_0);  // q_dim 896 too
  EXPECT_EQ(s.layers[6].down, DType::kQ4_K);  // (6 - 3) % 3 == 0; layer 5 has more bits
  EXPECT_EQ(s.layers[0].down, DType::kQ6_K);
  // The 72B Q4_K_M file held once: 44.11 GiB (llama.cpp's Qwen2.5-72B-Instruct-Q4_K_M.gguf: 47.4 GB).
  auto p = plan_shards(big, w, {1, 1, DType::kBF16});
  ASSERT_TRUE(p.ok()) << p.status().to_string();
  EXPECT_NEAR(static_cast<double>(p->model_weight_bytes) / 1e9, 47.4, 0.3);
  // Its Q4_K o weights (blocks of 256 columns, head_dim 128) split with heads in pairs: TP 8 as 8
  // heads each, TP 6 as 10, 10, 12, 10, 10, 12 (the seed's 6 x 4090 box), every boundary on a block.
  EXPECT_TRUE(plan_shards(big, w, {8, 1, DType::kBF16}).ok());
  auto six = plan_shards(big, w, {6, 1, DType::kBF16});
  ASSERT_TRUE(six.ok()) << six.status().to_string();
  std::vector<std::int64_t> heads;
  for (const RankPlan& r : six->ranks) {
    heads.push_back(r.q_heads.size());
    EXPECT_EQ(r.q_heads.begin * big.head_dim % 256, 0) << r.rank;
  }
  EXPECT_EQ(heads, (std::vector<std::int64_t>{10, 10, 12, 10, 10, 12}));
}

TEST(WeightRecipes, Q4_0AndAwq) {
  const auto c = model::qwen2_5_config("14b");
  const WeightTypes q = recipe_weight_types(c, WeightRecipe::kQ4_0);
  EXPECT_EQ(q.token_embd, DType::kQ4_0);
  EXPECT_EQ(q.output, DType::kQ6_K);
  EXPECT_EQ(q.layers[3].down, DType::kQ4_0);
  const WeightTypes a = recipe_weight_types(c, WeightRecipe::kAwqInt4);
  EXPECT_EQ(a.token_embd, DType::kBF16);
  EXPECT_EQ(a.output, DType::kBF16);
  for (const LayerWeightTypes& l : a.layers) {
    for (DType t : {l.q, l.k, l.v, l.o, l.gate, l.up, l.down}) EXPECT_EQ(t, DType::kAwqInt4);
  }
  // AWQ at TP 6: FFN rows split in 128-row units (13824 = 108 units -> 18 a rank).
  auto s = plan_shards(c, a, {6, 1, DType::kBF16});
  ASSERT_TRUE(s.ok()) << s.status().to_string();
  EXPECT_EQ(s->ffn_unit, 128);
  for (const RankPlan& r : s->ranks) EXPECT_EQ(r.ffn.size(), 18 * 128);
}

}  // namespace
}  // namespace sx::parallel
