// Random-weight Qwen2 models: determinism, every weight format, statistics, the synthesized
// tokenizer, validation of the spec, and a Qwen2.5-0.5B-shaped layer.
#include <algorithm>
#include <cmath>
#include <set>
#include <tuple>
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
  ASSERT_TRUE(write_random_gguf(spec, path).ok());
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
  ASSERT_TRUE(add_random_model(spec, a).ok());
  ASSERT_TRUE(add_random_model(spec, b).ok());
  EXPECT_EQ(*a.to_bytes(), *b.to_bytes());
  EXPECT_EQ(*a.to_bytes(), *a.to_bytes());  // producers can run again
  spec.seed = 8;
  GgufWriter c;
  ASSERT_TRUE(add_random_model(spec, c).ok());
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
  ASSERT_TRUE(add_random_model(spec, w).ok());
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
  EXPECT_TRUE(fails_with(write_random_gguf(spec, "/tmp/never-written.gguf"), StatusCode::kInvalidArgument,
                         {"hidden 48", "q8_0", "32"}));
  EXPECT_FALSE(std::filesystem::exists("/tmp/never-written.gguf"));
  spec.weight_type = hal::DType::kI32;
  spec.config = tiny_config();
  EXPECT_TRUE(fails_with(write_random_gguf(spec, "/tmp/never-written.gguf"), StatusCode::kInvalidArgument,
                         {"i32"}));
  spec.weight_type = hal::DType::kF32;
  spec.config.vocab = 100;  // too small to synthesize
  EXPECT_TRUE(fails_with(write_random_gguf(spec, "/tmp/never-written.gguf"), StatusCode::kInvalidArgument,
                         {"100"}));
  spec.config = tiny_config();
  spec.config.n_kv_heads = 3;
  EXPECT_TRUE(fails_with(write_random_gguf(spec, "/tmp/never-written.gguf"), StatusCode::kInvalidArgument,
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
  ASSERT_TRUE(write_random_gguf(spec, path).ok());
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
  ASSERT_TRUE(write_random_gguf(spec, path).ok());
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

TEST(RandomModel, Qwen35Shapes) {
  // docs/research/qwen35-shapes.md: layers, hidden, heads / KV heads, FFN, DeltaNet V heads, tied.
  struct Want {
    std::string_view size;
    std::int64_t layers, hidden, heads, kv_heads, ffn, v_heads;
    bool tied;
  };
  const Want dense[] = {
      {"0.8b", 24, 1024, 8, 2, 3584, 16, true},  {"2b", 24, 2048, 8, 2, 6144, 16, true},
      {"4b", 32, 2560, 16, 4, 9216, 32, true},   {"9b", 32, 4096, 16, 4, 12288, 32, false},
      {"27b", 64, 5120, 24, 4, 17408, 48, false},
  };
  ASSERT_EQ(qwen35_sizes().size(), std::size(dense));
  for (const Want& w : dense) {
    auto c = find_qwen35_config(w.size);
    ASSERT_TRUE(c.ok()) << w.size;
    EXPECT_EQ(c->architecture, "qwen35");
    EXPECT_EQ(std::tuple(c->n_layers, c->hidden, c->n_heads, c->n_kv_heads, c->ffn, c->ssm_v_heads, c->tied_embeddings),
              std::tuple(w.layers, w.hidden, w.heads, w.kv_heads, w.ffn, w.v_heads, w.tied))
        << w.size;
    EXPECT_EQ(std::tuple(c->head_dim, c->rot_dim, c->ssm_k_heads, c->ssm_head_dim, c->ssm_conv_kernel, c->vocab),
              std::tuple(256, 64, 16, 128, 4, 248320));
    // Three DeltaNet layers, then one full attention, all the way.
    const auto full = std::count(c->recurrent_layers.begin(), c->recurrent_layers.end(), false);
    EXPECT_EQ(full, w.layers / 4) << w.size;
    EXPECT_TRUE(c->is_recurrent(0) && c->is_recurrent(2) && !c->is_recurrent(3)) << w.size;
    EXPECT_TRUE(validate_model_config(*c, "preset").ok()) << w.size;
  }
  // Qwen3.8-27B (= the 27b shape): 24 / 4 heads and 16 QK / 48 V DeltaNet heads, as issue 42 says.
  const ModelConfig moe = *find_qwen35moe_config("35B-A3B");
  EXPECT_EQ(std::tuple(moe.n_layers, moe.hidden, moe.n_heads, moe.n_kv_heads, moe.n_experts, moe.n_experts_used,
                       moe.expert_ffn, moe.shared_expert_ffn, moe.ssm_v_heads),
            std::tuple(40, 2048, 16, 2, 256, 8, 512, 512, 32));
  EXPECT_EQ(find_qwen35moe_config("397b-a17b")->n_experts, 512);
  EXPECT_EQ(find_qwen35moe_config("397b-a17b")->n_experts_used, 10);
  EXPECT_TRUE(fails_with(find_qwen35_config("7b"), StatusCode::kInvalidArgument, {"7b", "0.8b, 2b"}));
}

// A written qwen35 / qwen35moe file reads back as the config it was written from (the keys
// llama.cpp 11434 reads: ssm.*, full_attention_interval and attention.recurrent_layers,
// rope.dimension_count / sections, expert_shared_feed_forward_length) and passes the tensor check;
// a DeltaNet layer with an attention tensor, or a pattern of the wrong length, does not.
TEST(RandomModel, Qwen35FilesReadBackAndCheck) {
  for (const char* arch : {"qwen35", "qwen35moe"}) {
    SCOPED_TRACE(arch);
    RandomModelSpec spec;
    spec.config = std::string_view(arch) == "qwen35" ? *find_qwen35_config("27b") : *find_qwen35moe_config("35b-a3b");
    ModelConfig& c = spec.config;
    set_hybrid_layers(c, 5);  // DeltaNet, DeltaNet, DeltaNet, attention, DeltaNet
    c.hidden = 64, c.head_dim = 32, c.rot_dim = 8, c.rope_sections = {2, 1, 1, 0}, c.ssm_head_dim = 16;
    c.vocab = 300, c.ffn = 48;
    if (c.is_moe()) c.n_experts = 12, c.expert_ffn = 16, c.shared_expert_ffn = 24, c.ffn = 16;
    spec.weight_type = hal::DType::kF32;
    const std::string path = ::testing::TempDir() + "/sx_random_" + arch + ".gguf";
    ASSERT_TRUE(write_random_gguf(spec, path).ok());
    auto f = GgufFile::open(path);
    ASSERT_TRUE(f.ok()) << f.status().to_string();
    auto back = model_config_from_gguf(**f);
    ASSERT_TRUE(back.ok()) << back.status().to_string();
    ModelConfig want = c;
    want.name = back->name;
    EXPECT_NEAR(back->rms_eps, c.rms_eps, 1e-12);  // stored as float32
    want.rms_eps = back->rms_eps;
    EXPECT_TRUE(*back == want);
    EXPECT_EQ(back->recurrent_layers, (std::vector<bool>{true, true, true, false, true}));
    EXPECT_EQ(back->rope_sections, (std::vector<std::int64_t>{2, 1, 1, 0}));
    EXPECT_EQ(std::tuple(back->rot_dim, back->ssm_k_heads, back->ssm_v_heads, back->ssm_head_dim, back->ssm_conv_kernel,
                         back->shared_expert_ffn, back->ffn),
              std::tuple(c.rot_dim, c.ssm_k_heads, c.ssm_v_heads, c.ssm_head_dim, c.ssm_conv_kernel,
                         c.shared_expert_ffn, c.ffn));
    EXPECT_EQ((*f)->get_uint(std::string(arch) + ".full_attention_interval").value(), 4u);
    EXPECT_EQ((*f)->find(std::string(arch) + ".feed_forward_length") == nullptr, c.is_moe());
    EXPECT_TRUE(check_model_tensors(**f, *back).ok()) << check_model_tensors(**f, *back).to_string();
    // The attention layer's query projection holds [query | gate] per head.
    EXPECT_EQ((*f)->find_tensor("blk.3.attn_q.weight")->dims, (std::vector<std::int64_t>{64, 2 * c.n_heads * 32}));
    EXPECT_EQ((*f)->find_tensor("blk.0.attn_q.weight"), nullptr);
    EXPECT_EQ((*f)->find_tensor("blk.0.ssm_conv1d.weight")->dims,
              (std::vector<std::int64_t>{4, (2 * 16 + c.ssm_v_heads) * 16}));
    // Every ssm_a is a decay rate (-exp(A_log) < 0).
    const TensorInfo* a = (*f)->find_tensor("blk.1.ssm_a");
    ASSERT_NE(a, nullptr);
    for (float x : dequantized(*a)) EXPECT_LT(x, 0.0f);
    // Read as if layer 0 were attention: its DeltaNet tensors are unexpected and its attention ones missing.
    ModelConfig wrong = *back;
    wrong.recurrent_layers[0] = false;
    const Status s = check_model_tensors(**f, wrong);
    EXPECT_TRUE(fails_with(s, StatusCode::kNotFound, {"blk.0.attn_q.weight", "is missing"})) << s.to_string();
    wrong.recurrent_layers.pop_back();
    EXPECT_TRUE(fails_with(validate_model_config(wrong, "x"), StatusCode::kInvalidArgument,
                           {"the layer pattern names 4 layers but the model has 5"}));
    std::remove(path.c_str());
  }
}

}  // namespace
}  // namespace sx::model
