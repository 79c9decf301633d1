// ModelConfig from GGUF metadata and the tensor shape checks; tensor names; Qwen2.5 presets.
#include <functional>

#include <gtest/gtest.h>

#include "runtime/model/gguf.h"
#include "runtime/model/model_config.h"
#include "runtime/model/random_model.h"
#include "runtime/model/tensor_names.h"
#include "tests/unit/model/gguf_test_util.h"

namespace sx::model {
namespace {

using testing::fails_with;

constexpr const char* kFile = "tiny.gguf";

ModelConfig tiny_config() { return testing::tiny_qwen2_config(300, /*tied=*/true); }

// A model file with zero-filled F32 tensors; the hooks may edit the tensor list and metadata.
std::vector<std::uint8_t> model_bytes(const ModelConfig& c,
                                      const std::function<void(std::vector<ExpectedTensor>&)>& edit_tensors = {},
                                      const std::function<void(GgufWriter&)>& edit_meta = {}) {
  GgufWriter w;
  set_model_config_metadata(w, c);
  auto tok = synthesize_tokenizer(c.vocab);
  EXPECT_TRUE(tok.ok());
  set_tokenizer_metadata(w, *tok, static_cast<std::int64_t>(tok->tokens.size()));
  if (edit_meta) edit_meta(w);
  std::vector<ExpectedTensor> tensors = expected_tensors(c);
  if (edit_tensors) edit_tensors(tensors);
  for (const ExpectedTensor& t : tensors) {
    std::int64_t n = 1;
    for (std::int64_t d : t.dims) n *= d;
    EXPECT_TRUE(w.add_tensor(t.name, t.dims, hal::DType::kF32, std::vector<std::uint8_t>(n * 4)).ok()) << t.name;
  }
  auto b = w.to_bytes();
  EXPECT_TRUE(b.ok()) << b.status().to_string();
  return *b;
}

struct Parsed {
  std::vector<std::uint8_t> bytes;
  std::unique_ptr<GgufFile> file;
};
Parsed parsed(std::vector<std::uint8_t> bytes) {
  Parsed p{std::move(bytes), nullptr};
  auto f = GgufFile::parse(p.bytes, kFile);
  EXPECT_TRUE(f.ok()) << f.status().to_string();
  if (f.ok()) p.file = std::move(f).value();
  return p;
}

void replace_dims(std::vector<ExpectedTensor>& ts, std::string_view name, std::vector<std::int64_t> dims) {
  for (ExpectedTensor& t : ts) {
    if (t.name == name) t.dims = std::move(dims);
  }
}

TEST(TensorNames, LlamaCppConvention) {
  EXPECT_EQ(kTokenEmbdName, "token_embd.weight");
  EXPECT_EQ(kOutputNormName, "output_norm.weight");
  EXPECT_EQ(kOutputName, "output.weight");
  EXPECT_EQ(attn_norm_name(3), "blk.3.attn_norm.weight");
  EXPECT_EQ(attn_q_name(0), "blk.0.attn_q.weight");
  EXPECT_EQ(attn_q_bias_name(0), "blk.0.attn_q.bias");
  EXPECT_EQ(attn_k_name(1), "blk.1.attn_k.weight");
  EXPECT_EQ(attn_k_bias_name(1), "blk.1.attn_k.bias");
  EXPECT_EQ(attn_v_name(2), "blk.2.attn_v.weight");
  EXPECT_EQ(attn_v_bias_name(2), "blk.2.attn_v.bias");
  EXPECT_EQ(attn_output_name(23), "blk.23.attn_output.weight");
  EXPECT_EQ(ffn_norm_name(4), "blk.4.ffn_norm.weight");
  EXPECT_EQ(ffn_gate_name(4), "blk.4.ffn_gate.weight");
  EXPECT_EQ(ffn_up_name(4), "blk.4.ffn_up.weight");
  EXPECT_EQ(ffn_down_name(4), "blk.4.ffn_down.weight");
  EXPECT_EQ(layer_tensor_name(7, LayerTensor::kAttnQNorm), "blk.7.attn_q_norm.weight");
  auto p = parse_layer_tensor_name("blk.12.ffn_up.weight");
  ASSERT_TRUE(p.has_value());
  EXPECT_EQ(p->layer, 12);
  EXPECT_EQ(p->suffix, "ffn_up.weight");
  EXPECT_FALSE(parse_layer_tensor_name("token_embd.weight").has_value());
  EXPECT_FALSE(parse_layer_tensor_name("blk.x.a").has_value());
  EXPECT_FALSE(parse_layer_tensor_name("blk.1").has_value());
  EXPECT_FALSE(parse_layer_tensor_name("blk..a").has_value());
}

TEST(ModelConfig, FromWrittenQwen2File) {
  const ModelConfig c = tiny_config();
  Parsed p = parsed(model_bytes(c));
  ASSERT_NE(p.file, nullptr);
  auto r = model_config_from_gguf(*p.file);
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  ModelConfig got = *r;
  EXPECT_NEAR(got.rms_eps, 1e-6, 1e-12);  // stored as float32
  got.rms_eps = c.rms_eps;
  EXPECT_EQ(got, c);
  EXPECT_TRUE(check_qwen2_tensors(*p.file, got).ok());
  EXPECT_TRUE(check_model_tensors(*p.file, got).ok());
}

TEST(ModelConfig, UntiedAndNoBias) {
  ModelConfig c = tiny_config();
  c.tied_embeddings = false;
  c.qkv_bias = false;
  Parsed p = parsed(model_bytes(c));
  auto r = model_config_from_gguf(*p.file);
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_FALSE(r->tied_embeddings);
  EXPECT_FALSE(r->qkv_bias);
  EXPECT_TRUE(check_qwen2_tensors(*p.file, *r).ok());
}

TEST(ModelConfig, ExplicitKeyLength) {
  Parsed p = parsed(model_bytes(tiny_config(), {}, [](GgufWriter& w) {
    w.set_uint32("qwen2.attention.key_length", 16);
    w.set_uint32("qwen2.attention.value_length", 16);
  }));
  auto r = model_config_from_gguf(*p.file);
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_EQ(r->head_dim, 16);
  Parsed q = parsed(model_bytes(tiny_config(), {}, [](GgufWriter& w) {
    w.set_uint32("qwen2.attention.key_length", 16);
    w.set_uint32("qwen2.attention.value_length", 32);
  }));
  EXPECT_TRUE(fails_with(model_config_from_gguf(*q.file), StatusCode::kUnimplemented,
                         {kFile, "qwen2.attention.value_length"}));
}

TEST(ModelConfig, UnknownArchitectureNamesItAndTheSupportedOnes) {
  Parsed p = parsed(model_bytes(tiny_config(), {}, [](GgufWriter& w) { w.set_string("general.architecture", "llama"); }));
  EXPECT_TRUE(fails_with(model_config_from_gguf(*p.file), StatusCode::kUnimplemented, {kFile, "'llama'", "qwen2"}));
}

TEST(ModelConfig, MissingArchitecture) {
  Parsed p = parsed(model_bytes(tiny_config(), {}, [](GgufWriter& w) { w.remove("general.architecture"); }));
  EXPECT_TRUE(fails_with(model_config_from_gguf(*p.file), StatusCode::kNotFound, {kFile, "general.architecture"}));
}

TEST(ModelConfig, EveryRequiredKeyIsNamedWhenMissing) {
  for (const char* key : {"qwen2.block_count", "qwen2.context_length", "qwen2.embedding_length",
                          "qwen2.feed_forward_length", "qwen2.attention.head_count", "qwen2.attention.head_count_kv",
                          "qwen2.rope.freq_base", "qwen2.attention.layer_norm_rms_epsilon"}) {
    Parsed p = parsed(model_bytes(tiny_config(), {}, [&](GgufWriter& w) { ASSERT_TRUE(w.remove(key)); }));
    EXPECT_TRUE(fails_with(model_config_from_gguf(*p.file), StatusCode::kNotFound, {kFile, key}));
  }
}

TEST(ModelConfig, WrongKeyTypeAndRange) {
  Parsed p = parsed(
      model_bytes(tiny_config(), {}, [](GgufWriter& w) { w.set_string("qwen2.block_count", "two"); }));
  EXPECT_TRUE(fails_with(model_config_from_gguf(*p.file), StatusCode::kInvalidArgument,
                         {kFile, "qwen2.block_count", "string"}));
  Parsed q = parsed(model_bytes(tiny_config(), {}, [](GgufWriter& w) { w.set_uint32("qwen2.block_count", 0); }));
  EXPECT_TRUE(fails_with(model_config_from_gguf(*q.file), StatusCode::kInvalidArgument, {kFile, "qwen2.block_count"}));
  Parsed r = parsed(
      model_bytes(tiny_config(), {}, [](GgufWriter& w) { w.set_float32("qwen2.rope.freq_base", -1.0f); }));
  EXPECT_TRUE(fails_with(model_config_from_gguf(*r.file), StatusCode::kInvalidArgument, {kFile, "qwen2.rope.freq_base"}));
}

TEST(ModelConfig, HiddenNotMultipleOfHeads) {
  Parsed p = parsed(model_bytes(tiny_config(), {}, [](GgufWriter& w) { w.set_uint32("qwen2.attention.head_count", 6); }));
  EXPECT_TRUE(fails_with(model_config_from_gguf(*p.file), StatusCode::kInvalidArgument,
                         {kFile, "qwen2.embedding_length", "64", "qwen2.attention.head_count", "6"}));
}

TEST(ModelConfig, HeadsNotMultipleOfKvHeads) {
  Parsed p = parsed(
      model_bytes(tiny_config(), {}, [](GgufWriter& w) { w.set_uint32("qwen2.attention.head_count_kv", 3); }));
  EXPECT_TRUE(fails_with(model_config_from_gguf(*p.file), StatusCode::kInvalidArgument,
                         {kFile, "qwen2.attention.head_count", "qwen2.attention.head_count_kv", "3"}));
}

TEST(ModelConfig, OddHeadDim) {
  // hidden 36 with 4 heads: head_dim 9.
  ModelConfig c = tiny_config();
  c.hidden = 36;
  c.head_dim = 9;
  Parsed p = parsed(model_bytes(c));
  EXPECT_TRUE(fails_with(model_config_from_gguf(*p.file), StatusCode::kInvalidArgument, {kFile, "head_dim 9", "odd"}));
}

TEST(ModelConfig, MissingTokenEmbedding) {
  Parsed p = parsed(model_bytes(tiny_config(), [](std::vector<ExpectedTensor>& ts) { ts.erase(ts.begin()); }));
  EXPECT_TRUE(fails_with(model_config_from_gguf(*p.file), StatusCode::kNotFound, {kFile, "token_embd.weight"}));
}

TEST(ModelConfig, TokenizerLargerThanEmbedding) {
  Parsed p = parsed(model_bytes(tiny_config(), {}, [](GgufWriter& w) {
    std::vector<std::string> tokens(301, "t");
    w.set_string_array("tokenizer.ggml.tokens", tokens);
  }));
  EXPECT_TRUE(fails_with(model_config_from_gguf(*p.file), StatusCode::kInvalidArgument, {kFile, "301 tokens", "300"}));
}

TEST(CheckTensors, WrongShapeNamesTensorExpectedAndActual) {
  const ModelConfig c = tiny_config();
  Parsed p = parsed(model_bytes(c, [](std::vector<ExpectedTensor>& ts) {
    replace_dims(ts, "blk.1.ffn_down.weight", {96, 32});
  }));
  auto cfg = model_config_from_gguf(*p.file);
  ASSERT_TRUE(cfg.ok()) << cfg.status().to_string();
  EXPECT_TRUE(fails_with(check_qwen2_tensors(*p.file, *cfg), StatusCode::kInvalidArgument,
                         {kFile, "blk.1.ffn_down.weight", "[96, 32]", "expects [96, 64]"}));
}

TEST(CheckTensors, EveryTensorOfEveryLayerIsChecked) {
  const ModelConfig c = tiny_config();
  for (const ExpectedTensor& victim : expected_tensors(c)) {
    if (victim.name == kTokenEmbdName) continue;  // vocab is derived from it
    std::vector<std::int64_t> wrong = victim.dims;
    wrong.back() += 32;
    Parsed p = parsed(model_bytes(c, [&](std::vector<ExpectedTensor>& ts) { replace_dims(ts, victim.name, wrong); }));
    auto cfg = model_config_from_gguf(*p.file);
    ASSERT_TRUE(cfg.ok()) << victim.name << ": " << cfg.status().to_string();
    EXPECT_TRUE(fails_with(check_qwen2_tensors(*p.file, *cfg), StatusCode::kInvalidArgument,
                           {kFile, victim.name, dims_to_string(wrong), dims_to_string(victim.dims)}));
  }
}

TEST(CheckTensors, MissingTensorIsNamed) {
  const ModelConfig c = tiny_config();
  Parsed p = parsed(model_bytes(c, [](std::vector<ExpectedTensor>& ts) {
    std::erase_if(ts, [](const ExpectedTensor& t) { return t.name == "blk.1.attn_v.bias"; });
  }));
  auto cfg = model_config_from_gguf(*p.file);
  ASSERT_TRUE(cfg.ok());
  EXPECT_TRUE(fails_with(check_qwen2_tensors(*p.file, *cfg), StatusCode::kNotFound, {kFile, "blk.1.attn_v.bias"}));
}

TEST(CheckTensors, ExtraLayerAndUnexpectedTensors) {
  const ModelConfig c = tiny_config();
  Parsed p = parsed(model_bytes(c, [](std::vector<ExpectedTensor>& ts) {
    ts.push_back({"blk.2.attn_norm.weight", {64}});
  }));
  auto cfg = model_config_from_gguf(*p.file);
  ASSERT_TRUE(cfg.ok());
  EXPECT_TRUE(fails_with(check_qwen2_tensors(*p.file, *cfg), StatusCode::kInvalidArgument,
                         {kFile, "blk.2.attn_norm.weight", "2 layers"}));
  Parsed q = parsed(model_bytes(c, [](std::vector<ExpectedTensor>& ts) {
    ts.push_back({"blk.0.attn_q_norm.weight", {16}});
  }));
  EXPECT_TRUE(fails_with(check_qwen2_tensors(*q.file, *cfg), StatusCode::kInvalidArgument,
                         {kFile, "unexpected tensor 'blk.0.attn_q_norm.weight'"}));
}

TEST(CheckTensors, BiasOnlyOnSomeLayers) {
  ModelConfig c = tiny_config();
  c.qkv_bias = false;
  Parsed p = parsed(model_bytes(c, [](std::vector<ExpectedTensor>& ts) {
    ts.push_back({"blk.1.attn_k.bias", {32}});
  }));
  auto cfg = model_config_from_gguf(*p.file);
  ASSERT_TRUE(cfg.ok());
  EXPECT_FALSE(cfg->qkv_bias);
  EXPECT_TRUE(fails_with(check_qwen2_tensors(*p.file, *cfg), StatusCode::kInvalidArgument,
                         {kFile, "blk.1.attn_k.bias", "blk.0.attn_q.bias is absent"}));
}

TEST(ModelConfig, AbsurdBlockCountIsCaughtEarly) {
  Parsed p = parsed(
      model_bytes(tiny_config(), {}, [](GgufWriter& w) { w.set_uint32("qwen2.block_count", 2000000000); }));
  EXPECT_TRUE(fails_with(model_config_from_gguf(*p.file), StatusCode::kInvalidArgument,
                         {kFile, "qwen2.block_count", "2000000000", "only"}));
  // A config from elsewhere with a huge layer count fails fast on the first missing tensor.
  ModelConfig c = tiny_config();
  c.n_layers = 2000000000;
  Parsed q = parsed(model_bytes(tiny_config()));
  EXPECT_TRUE(fails_with(check_qwen2_tensors(*q.file, c), StatusCode::kNotFound, {kFile, "blk.2.attn_norm.weight"}));
}

TEST(CheckTensors, ExpectedTensorsOfQwen25Half) {
  const ModelConfig c = qwen2_5_config("0.5b");
  const auto ts = expected_tensors(c);
  EXPECT_EQ(ts.size(), 290u);  // token_embd + 24 x 12 + output_norm (tied: no output.weight)
  EXPECT_EQ(ts.front().name, "token_embd.weight");
  EXPECT_EQ(ts.front().dims, (std::vector<std::int64_t>{896, 151936}));
  EXPECT_EQ(ts[1].name, "blk.0.attn_norm.weight");
  EXPECT_EQ(ts[2].name, "blk.0.attn_q.weight");
  EXPECT_EQ(ts[3].name, "blk.0.attn_q.bias");
  EXPECT_EQ(layer_tensor_dims(c, LayerTensor::kAttnK), (std::vector<std::int64_t>{896, 128}));
  EXPECT_EQ(layer_tensor_dims(c, LayerTensor::kFfnDown), (std::vector<std::int64_t>{4864, 896}));
  EXPECT_EQ(ts.back().name, "output_norm.weight");
  EXPECT_EQ(expected_tensors(qwen2_5_config("7b")).back().name, "output.weight");
}

TEST(Qwen25Presets, Shapes) {
  struct Row {
    const char* size;
    std::int64_t layers, hidden, heads, kv, ffn, vocab;
    bool tied;
  };
  const Row rows[] = {
      {"0.5b", 24, 896, 14, 2, 4864, 151936, true},   {"1.5b", 28, 1536, 12, 2, 8960, 151936, true},
      {"3b", 36, 2048, 16, 2, 11008, 151936, true},   {"7b", 28, 3584, 28, 4, 18944, 152064, false},
      {"14b", 48, 5120, 40, 8, 13824, 152064, false}, {"32b", 64, 5120, 40, 8, 27648, 152064, false},
      {"72b", 80, 8192, 64, 8, 29568, 152064, false},
  };
  for (const Row& r : rows) {
    const ModelConfig c = qwen2_5_config(r.size);
    EXPECT_EQ(c.architecture, "qwen2");
    EXPECT_EQ(c.n_layers, r.layers) << r.size;
    EXPECT_EQ(c.hidden, r.hidden) << r.size;
    EXPECT_EQ(c.n_heads, r.heads) << r.size;
    EXPECT_EQ(c.n_kv_heads, r.kv) << r.size;
    EXPECT_EQ(c.head_dim, r.hidden / r.heads) << r.size;
    EXPECT_EQ(c.ffn, r.ffn) << r.size;
    EXPECT_EQ(c.vocab, r.vocab) << r.size;
    EXPECT_EQ(c.tied_embeddings, r.tied) << r.size;
    EXPECT_TRUE(c.qkv_bias);
    EXPECT_EQ(c.rope_theta, 1e6);
    EXPECT_EQ(c.rms_eps, 1e-6);
    EXPECT_TRUE(validate_model_config(c, r.size).ok()) << r.size;
  }
  EXPECT_EQ(qwen2_5_config("0.5b").name, "Qwen2.5-0.5B (random weights)");
  EXPECT_EQ(qwen2_5_config("0.5B").hidden, 896);
  EXPECT_TRUE(fails_with(find_qwen2_5_config("2b"), StatusCode::kInvalidArgument, {"'2b'", "0.5b", "72b"}));
  EXPECT_EQ(qwen2_5_sizes().size(), 7u);
}

TEST(TokenizerMetadata, RoundTrip) {
  auto tok = synthesize_tokenizer(300);
  ASSERT_TRUE(tok.ok());
  GgufWriter w;
  set_tokenizer_metadata(w, *tok, static_cast<std::int64_t>(tok->tokens.size()));
  auto bytes = w.to_bytes();
  auto f = GgufFile::parse(*bytes, kFile);
  ASSERT_TRUE(f.ok());
  auto back = tokenizer_metadata_from_gguf(**f);
  ASSERT_TRUE(back.ok()) << back.status().to_string();
  EXPECT_EQ(*back, *tok);
}

TEST(TokenizerMetadata, BadIdsAndLengths) {
  auto tok = synthesize_tokenizer(300);
  GgufWriter w;
  set_tokenizer_metadata(w, *tok, static_cast<std::int64_t>(tok->tokens.size()));
  w.set_uint32("tokenizer.ggml.eos_token_id", 300);
  auto bytes = w.to_bytes();  // parse() borrows: keep the bytes alive
  auto f = GgufFile::parse(*bytes, kFile);
  ASSERT_TRUE(f.ok());
  EXPECT_TRUE(fails_with(tokenizer_metadata_from_gguf(**f), StatusCode::kInvalidArgument,
                         {kFile, "tokenizer.ggml.eos_token_id", "300"}));
  GgufWriter w2;
  set_tokenizer_metadata(w2, *tok, static_cast<std::int64_t>(tok->tokens.size()));
  w2.set_int32_array("tokenizer.ggml.token_type", {1, 1});
  auto bytes2 = w2.to_bytes();
  auto f2 = GgufFile::parse(*bytes2, kFile);
  ASSERT_TRUE(f2.ok());
  EXPECT_TRUE(fails_with(tokenizer_metadata_from_gguf(**f2), StatusCode::kInvalidArgument,
                         {kFile, "tokenizer.ggml.token_type", "2 items"}));
}

}  // namespace
}  // namespace sx::model
