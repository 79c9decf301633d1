// Random-weight Qwen2 models: determinism, every weight format, statistics, the synthesized
// tokenizer, validation of the spec, and a Qwen2.5-0.5B-shaped layer.
#include <algorithm>
#include <cmath>
#include <set>
#include <filesystem>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "runtime/model/gguf.h"
#include "runtime/model/model_config.h"
#include "runtime/model/random_model.h"
#include "tests/unit/model/gguf_test_util.h"

namespace sx::model {
namespace {

using testing::fails_with;

ModelConfig tiny_config() { return testing::tiny_qwen2_config(320, /*tied=*/false); }

std::vector<float> dequantized(const TensorInfo& t) {
  std::vector<float> out(static_cast<std::size_t>(t.n_elements));
  const std::int64_t row = t.dims[0];
  const std::size_t rb = hal::row_bytes(*t.dtype, row);
  for (std::int64_t r = 0; r < t.n_elements / row; ++r) {
    hal::dequantize_row(*t.dtype, t.data.data() + r * rb, out.data() + r * row, row);
  }
  return out;
}

class RandomModelTest : public ::testing::TestWithParam<hal::DType> {};

TEST_P(RandomModelTest, WritesAValidModelWithExpectedValues) {
  testing::TempDir dir;
  RandomModelSpec spec;
  spec.config = tiny_config();
  spec.weight_type = GetParam();
  spec.seed = 42;
  const std::string path = dir.file("tiny.gguf");
  ASSERT_TRUE(write_random_qwen2_gguf(spec, path).ok());
  auto f = GgufFile::open(path);
  ASSERT_TRUE(f.ok()) << f.status().to_string();
  auto cfg = model_config_from_gguf(**f);
  ASSERT_TRUE(cfg.ok()) << cfg.status().to_string();
  cfg->rms_eps = spec.config.rms_eps;
  EXPECT_EQ(*cfg, spec.config);
  EXPECT_TRUE(check_qwen2_tensors(**f, *cfg).ok());
  EXPECT_EQ(*(*f)->get_uint("general.quantization_version"), 2u);

  const float tol = spec.weight_type == hal::DType::kF32    ? 0.0f
                    : spec.weight_type == hal::DType::kQ8_0 ? 0.035f * 0.02f * 2.0f
                                                            : 0.01f;
  for (const TensorInfo& t : (*f)->tensors()) {
    ASSERT_TRUE(require_supported(t).ok());
    EXPECT_EQ(*t.dtype, t.dims.size() == 1 ? hal::DType::kF32 : spec.weight_type) << t.name;
    std::vector<float> want(static_cast<std::size_t>(t.n_elements));
    random_tensor_values(spec, t.name, 0, want);
    const std::vector<float> got = dequantized(t);
    float worst = 0;
    for (std::size_t i = 0; i < want.size(); ++i) {
      worst = std::max(worst, std::abs(got[i] - want[i]) / (t.dims.size() == 1 ? std::abs(want[i]) + 1e-3f : 1.0f));
    }
    EXPECT_LE(worst, tol) << t.name;
  }
}

INSTANTIATE_TEST_SUITE_P(WeightTypes, RandomModelTest,
                         ::testing::Values(hal::DType::kF32, hal::DType::kF16, hal::DType::kBF16, hal::DType::kQ8_0),
                         [](const auto& info) { return std::string(hal::dtype_name(info.param)); });

TEST(RandomModel, DeterministicPerSeedAndName) {
  RandomModelSpec spec;
  spec.config = tiny_config();
  spec.seed = 7;
  GgufWriter a, b;
  ASSERT_TRUE(add_random_qwen2_model(spec, a).ok());
  ASSERT_TRUE(add_random_qwen2_model(spec, b).ok());
  EXPECT_EQ(*a.to_bytes(), *b.to_bytes());
  EXPECT_EQ(*a.to_bytes(), *a.to_bytes());  // producers can run again
  spec.seed = 8;
  GgufWriter c;
  ASSERT_TRUE(add_random_qwen2_model(spec, c).ok());
  EXPECT_NE(*a.to_bytes(), *c.to_bytes());

  // Values depend only on (seed, name, index): a window equals the same slice of the whole.
  std::vector<float> whole(1000), window(100);
  random_tensor_values(spec, "blk.0.ffn_up.weight", 0, whole);
  random_tensor_values(spec, "blk.0.ffn_up.weight", 450, window);
  EXPECT_TRUE(std::equal(window.begin(), window.end(), whole.begin() + 450));
  std::vector<float> other(1000);
  random_tensor_values(spec, "blk.1.ffn_up.weight", 0, other);
  EXPECT_NE(whole, other);
}

TEST(RandomModel, Statistics) {
  RandomModelSpec spec;
  spec.config = tiny_config();
  spec.init_std = 0.05f;
  std::vector<float> w(200000);
  random_tensor_values(spec, "blk.0.attn_q.weight", 0, w);
  double sum = 0, sq = 0;
  for (float x : w) {
    sum += x;
    sq += static_cast<double>(x) * x;
    EXPECT_LE(std::abs(x), 0.05f * std::sqrt(3.0f) + 1e-6f);
  }
  const double mean = sum / w.size();
  EXPECT_NEAR(mean, 0.0, 0.002);
  EXPECT_NEAR(std::sqrt(sq / w.size() - mean * mean), 0.05, 0.002);
  std::vector<float> norm(10000);
  random_tensor_values(spec, "blk.0.attn_norm.weight", 0, norm);
  double nsum = 0;
  for (float x : norm) nsum += x;
  EXPECT_NEAR(nsum / norm.size(), 1.0, 0.01);
}

TEST(RandomModel, SynthesizedTokenizer) {
  auto t = synthesize_tokenizer(300);
  ASSERT_TRUE(t.ok());
  ASSERT_EQ(t->tokens.size(), 300u);
  ASSERT_EQ(t->token_types.size(), 300u);
  EXPECT_EQ(t->tokens[0], "!");
  EXPECT_EQ(t->tokens[93], "~");
  EXPECT_EQ(t->tokens[94], "\xc2\xa1");        // ¡
  EXPECT_EQ(t->tokens[188], "\xc4\x80");       // Ā = byte 0x00
  EXPECT_EQ(t->tokens[220], "\xc4\xa0");       // Ġ = space, id 220 as in Qwen2
  EXPECT_EQ(t->tokens[256], "[PAD256]");
  EXPECT_EQ(t->token_types[256], kTokenUnused);
  EXPECT_EQ(t->tokens[297], "<|endoftext|>");
  EXPECT_EQ(t->tokens[298], "<|im_start|>");
  EXPECT_EQ(t->tokens[299], "<|im_end|>");
  EXPECT_EQ(t->token_types[299], kTokenControl);
  EXPECT_EQ(t->token_types[0], kTokenNormal);
  EXPECT_EQ(t->eos_id, 299);
  EXPECT_EQ(t->pad_id, 297);
  EXPECT_EQ(t->bos_id, 297);
  EXPECT_FALSE(t->add_bos);
  EXPECT_TRUE(t->merges.empty());
  EXPECT_NE(t->chat_template.find("<|im_start|>"), std::string::npos);
  std::set<std::string> unique(t->tokens.begin(), t->tokens.end());
  EXPECT_EQ(unique.size(), 300u);
  EXPECT_TRUE(synthesize_tokenizer(259).ok());
  EXPECT_TRUE(fails_with(synthesize_tokenizer(258), StatusCode::kInvalidArgument, {"258"}));
}

TEST(RandomModel, CustomTokenizerIsWritten) {
  RandomModelSpec spec;
  spec.config = tiny_config();
  spec.tokenizer.tokens = {"a", "b", "c"};
  spec.tokenizer.merges = {"a b"};
  spec.tokenizer.eos_id = 2;
  GgufWriter w;
  ASSERT_TRUE(add_random_qwen2_model(spec, w).ok());
  auto bytes = w.to_bytes();
  auto f = GgufFile::parse(*bytes, "t.gguf");
  ASSERT_TRUE(f.ok());
  auto tok = tokenizer_metadata_from_gguf(**f);
  ASSERT_TRUE(tok.ok());
  EXPECT_EQ(tok->merges, spec.tokenizer.merges);
  EXPECT_EQ(tok->eos_id, 2);
  // The list is padded to the embedding's rows with unused entries (llama.cpp takes its vocabulary
  // size from the list and refuses a file whose token_embd.weight has more rows).
  ASSERT_EQ(static_cast<std::int64_t>(tok->tokens.size()), spec.config.vocab);
  ASSERT_EQ(tok->token_types.size(), tok->tokens.size());
  for (std::size_t i = 0; i < 3; ++i) {
    EXPECT_EQ(tok->tokens[i], spec.tokenizer.tokens[i]);
    EXPECT_EQ(tok->token_types[i], kTokenNormal);
  }
  EXPECT_EQ(tok->tokens[3], "[PAD3]");
  EXPECT_EQ(tok->tokens.back(), fmt::format("[PAD{}]", spec.config.vocab - 1));
  for (std::size_t i = 3; i < tok->tokens.size(); ++i) EXPECT_EQ(tok->token_types[i], kTokenUnused) << i;
}

TEST(RandomModel, SpecValidation) {
  RandomModelSpec spec;
  spec.config = tiny_config();
  spec.config.hidden = 48;  // 4 heads x 12
  spec.config.head_dim = 12;
  spec.weight_type = hal::DType::kQ8_0;
  EXPECT_TRUE(fails_with(write_random_qwen2_gguf(spec, "/tmp/never-written.gguf"), StatusCode::kInvalidArgument,
                         {"hidden 48", "q8_0", "32"}));
  EXPECT_FALSE(std::filesystem::exists("/tmp/never-written.gguf"));
  spec.weight_type = hal::DType::kI32;
  spec.config = tiny_config();
  EXPECT_TRUE(fails_with(write_random_qwen2_gguf(spec, "/tmp/never-written.gguf"), StatusCode::kInvalidArgument,
                         {"i32"}));
  spec.weight_type = hal::DType::kF32;
  spec.config.vocab = 100;  // too small to synthesize
  EXPECT_TRUE(fails_with(write_random_qwen2_gguf(spec, "/tmp/never-written.gguf"), StatusCode::kInvalidArgument,
                         {"100"}));
  spec.config = tiny_config();
  spec.config.n_kv_heads = 3;
  EXPECT_TRUE(fails_with(write_random_qwen2_gguf(spec, "/tmp/never-written.gguf"), StatusCode::kInvalidArgument,
                         {"kv heads"}));
}

TEST(RandomModel, Qwen25HalfShapedLayer) {
  // The real 0.5B shapes (one layer, smaller vocab to stay fast), Q8_0.
  testing::TempDir dir;
  RandomModelSpec spec;
  spec.config = qwen2_5_config("0.5b");
  spec.config.n_layers = 1;
  spec.config.vocab = 4096;
  spec.weight_type = hal::DType::kQ8_0;
  const std::string path = dir.file("half.gguf");
  ASSERT_TRUE(write_random_qwen2_gguf(spec, path).ok());
  auto f = GgufFile::open(path);
  ASSERT_TRUE(f.ok()) << f.status().to_string();
  auto cfg = model_config_from_gguf(**f);
  ASSERT_TRUE(cfg.ok()) << cfg.status().to_string();
  EXPECT_EQ(cfg->hidden, 896);
  EXPECT_EQ(cfg->n_kv_heads, 2);
  EXPECT_EQ(cfg->ffn, 4864);
  EXPECT_TRUE(cfg->tied_embeddings);
  EXPECT_TRUE(check_qwen2_tensors(**f, *cfg).ok());
  EXPECT_EQ((*f)->tensors().size(), 14u);
  EXPECT_EQ((*f)->find_tensor("blk.0.ffn_down.weight")->n_bytes, 4864u / 32 * 34 * 896);
}

TEST(RandomModel, Qwen3Shapes) {
  // The published Qwen/Qwen3-*/config.json values: layers, hidden, heads, KV heads, intermediate
  // size, tie_word_embeddings (head_dim 128, vocab 151936, 40960 positions for all).
  struct Want {
    std::string_view size;
    std::int64_t layers, hidden, heads, kv_heads, ffn;
    bool tied;
  };
  const Want want[] = {
      {"0.6b", 28, 1024, 16, 8, 3072, true},   {"1.7b", 28, 2048, 16, 8, 6144, true},
      {"4b", 36, 2560, 32, 8, 9728, true},     {"8b", 36, 4096, 32, 8, 12288, false},
      {"14b", 40, 5120, 40, 8, 17408, false},  {"32b", 64, 5120, 64, 8, 25600, false},
  };
  ASSERT_EQ(qwen3_sizes().size(), std::size(want));
  for (std::size_t i = 0; i < std::size(want); ++i) {
    const Want& w = want[i];
    EXPECT_EQ(qwen3_sizes()[i], w.size);
    const ModelConfig c = qwen3_config(w.size);
    EXPECT_EQ(c.architecture, "qwen3");
    EXPECT_EQ(c.n_layers, w.layers) << w.size;
    EXPECT_EQ(c.hidden, w.hidden) << w.size;
    EXPECT_EQ(c.n_heads, w.heads) << w.size;
    EXPECT_EQ(c.n_kv_heads, w.kv_heads) << w.size;
    EXPECT_EQ(c.head_dim, 128) << w.size;
    EXPECT_EQ(c.ffn, w.ffn) << w.size;
    EXPECT_EQ(c.tied_embeddings, w.tied) << w.size;
    EXPECT_EQ(c.vocab, 151936);
    EXPECT_EQ(c.context_length, 40960);
    EXPECT_FALSE(c.qkv_bias);
    EXPECT_EQ(c.rms_eps, 1e-6);
    EXPECT_EQ(c.rope_theta, 1e6);
  }
  EXPECT_NE(qwen3_config("0.6b").q_dim(), qwen3_config("0.6b").hidden);  // 16 x 128 = 2048 vs 1024
  EXPECT_NE(qwen3_config("32b").q_dim(), qwen3_config("32b").hidden);    // 64 x 128 = 8192 vs 5120
  EXPECT_EQ(find_qwen3_config("8B")->hidden, 4096);
  EXPECT_TRUE(fails_with(find_qwen3_config("7b"), StatusCode::kInvalidArgument, {"7b", "0.6b, 1.7b"}));
  // Writable (issue 40): one layer of the 0.6B shape with a small vocabulary reads back as qwen3,
  // with its head norms and a head size of its own.
  RandomModelSpec spec;
  spec.config = qwen3_config("0.6b");
  spec.config.n_layers = 1;
  spec.config.vocab = 512;
  const std::string path = ::testing::TempDir() + "/sx_random_qwen3.gguf";
  ASSERT_TRUE(write_random_qwen2_gguf(spec, path).ok());
  auto f = GgufFile::open(path);
  ASSERT_TRUE(f.ok()) << f.status().to_string();
  auto back = model_config_from_gguf(**f);
  ASSERT_TRUE(back.ok()) << back.status().to_string();
  EXPECT_EQ(back->architecture, "qwen3");
  EXPECT_EQ(back->head_dim, 128);
  EXPECT_EQ(back->hidden, 1024);
  EXPECT_TRUE(has_qk_norm(*back));
  ASSERT_NE((*f)->find_tensor("blk.0.attn_q_norm.weight"), nullptr);
  EXPECT_EQ((*f)->find_tensor("blk.0.attn_k_norm.weight")->dims, (std::vector<std::int64_t>{128}));
  EXPECT_EQ((*f)->find_tensor("blk.0.attn_q.bias"), nullptr);
  EXPECT_TRUE(check_model_tensors(**f, *back).ok());
  std::remove(path.c_str());
}

}  // namespace
}  // namespace sx::model
