// HfModel (a Hugging Face safetensors directory as a TensorSource), write_hf_model, the ModelCheck
// report and the model-level corruption matrix: each case asserts the status code and the message,
// which must name the file and the tensor or key at fault in Hugging Face terms.
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "runtime/base/half.h"
#include "runtime/base/sha256.h"
#include "runtime/model/hf_model.h"
#include "runtime/model/hf_writer.h"
#include "runtime/model/model_check.h"
#include "runtime/model/random_model.h"
#include "runtime/model/safetensors_writer.h"
#include "tests/unit/model/gguf_test_util.h"

namespace sx::model {
namespace {

using testing::fails_with;
using testing::TempDir;
namespace fs = std::filesystem;

void write_text(const std::string& path, const std::string& s) {
  std::ofstream out(path, std::ios::binary);
  out << s;
}

// A tiny random qwen2 model as an F32 GGUF file in `dir`.
struct Source {
  std::unique_ptr<GgufFile> gguf;
  ModelConfig config;
};

Source make_source(const TempDir& dir, bool tied = false) {
  RandomModelSpec spec;
  spec.config = testing::tiny_qwen2_config(300, tied);
  spec.weight_type = hal::DType::kF32;
  spec.seed = 7;
  const std::string path = dir.file("source.gguf");
  EXPECT_TRUE(write_random_gguf(spec, path).ok());
  Source s;
  s.gguf = std::move(GgufFile::open(path)).value();
  s.config = model_config_from_gguf(*s.gguf).value();
  return s;
}

// Writes `src` as dir/model.safetensors + config.json, letting `edit` rename, retype, reshape or
// drop (return false) each tensor first.
struct Entry {
  std::string name;
  std::string dtype;
  std::vector<std::int64_t> shape;
  std::vector<std::uint8_t> bytes;
};
void write_variant(const Source& src, const std::string& dir, const std::function<bool(Entry&)>& edit,
                   std::vector<Entry> extra = {}) {
  fs::create_directories(dir);
  SafetensorsWriter w;
  for (const ExpectedTensor& e : expected_tensors(src.config)) {
    const TensorInfo* t = src.gguf->find_tensor(e.name);
    Entry en{*gguf_to_hf_name(e.name), "F32", {t->dims.rbegin(), t->dims.rend()}, {t->data.begin(), t->data.end()}};
    if (!edit(en)) continue;
    ASSERT_TRUE(w.add_tensor(en.name, en.dtype, en.shape, en.bytes).ok()) << en.name;
  }
  for (Entry& en : extra) ASSERT_TRUE(w.add_tensor(en.name, en.dtype, en.shape, en.bytes).ok());
  ASSERT_TRUE(w.write(dir + "/model.safetensors").ok());
  write_text(dir + "/config.json", hf_config_json(src.config, hal::DType::kF32));
}

std::string messages(const ModelCheck& c) {
  std::string s;
  for (const CheckFinding& f : c.errors) s += f.message + "\n";
  return s;
}

TEST(HfNames, MapBothWays) {
  const ModelConfig c = testing::tiny_qwen2_config(300, false);
  for (const ExpectedTensor& e : expected_tensors(c)) {
    const auto hf = gguf_to_hf_name(e.name);
    ASSERT_TRUE(hf.has_value()) << e.name;
    EXPECT_EQ(hf_to_gguf_name(*hf), e.name);
  }
  EXPECT_EQ(hf_to_gguf_name("model.layers.12.self_attn.q_proj.weight"), "blk.12.attn_q.weight");
  EXPECT_EQ(hf_to_gguf_name("model.layers.3.mlp.down_proj.weight"), "blk.3.ffn_down.weight");
  EXPECT_EQ(hf_to_gguf_name("model.embed_tokens.weight"), "token_embd.weight");
  EXPECT_EQ(hf_to_gguf_name("lm_head.weight"), "output.weight");
  // Qwen3.5: every tensor but the stacked experts (fused in the checkpoint) has a name both ways;
  // post_attention_layernorm is the post-attention norm, not ffn_norm.
  const ModelConfig q35 = find_qwen35moe_config("35b-a3b").value();
  for (const ExpectedTensor& e : expected_tensors(q35)) {
    if (e.dims.size() == 3) continue;
    const auto hf = gguf_to_hf_name(e.name);
    ASSERT_TRUE(hf.has_value()) << e.name;
    EXPECT_EQ(hf_to_gguf_name(*hf, true), e.name);
    if (hf->starts_with("model.")) {
      EXPECT_EQ(hf_to_gguf_name("model.language_model." + hf->substr(6), true), e.name);
    }
  }
  EXPECT_EQ(hf_to_gguf_name("model.language_model.layers.2.linear_attn.A_log", true), "blk.2.ssm_a");
  EXPECT_EQ(hf_to_gguf_name("model.layers.2.post_attention_layernorm.weight", true), "blk.2.post_attention_norm.weight");
  EXPECT_EQ(hf_to_gguf_name("model.layers.2.post_attention_layernorm.weight"), "blk.2.ffn_norm.weight");
  for (const char* bad : {"model.layers.01.mlp.up_proj.weight", "model.layers..mlp.up_proj.weight",
                          "model.layers.3.rotary_emb.inv_freq", "model.layers.-1.mlp.up_proj.weight",
                          "model.layers.99999999999.mlp.up_proj.weight", "embed_tokens.weight", ""}) {
    EXPECT_FALSE(hf_to_gguf_name(bad).has_value()) << bad;
  }
}

TEST(HfGenerationConfig, ReadsEosAndSampling) {
  auto g = parse_generation_config(R"({"eos_token_id": [151645, 151643], "bos_token_id": 151643,
      "temperature": 0.7, "top_p": 0.8, "top_k": 20, "repetition_penalty": 1.05})", "gen.json");
  ASSERT_TRUE(g.ok()) << g.status().to_string();
  EXPECT_EQ(g->eos_ids, (std::vector<std::int32_t>{151645, 151643}));
  EXPECT_EQ(g->bos_id, 151643);
  EXPECT_DOUBLE_EQ(*g->temperature, 0.7);
  EXPECT_EQ(*g->top_k, 20);
  auto one = parse_generation_config(R"({"eos_token_id": 2})", "gen.json");
  ASSERT_TRUE(one.ok());
  EXPECT_EQ(one->eos_ids, std::vector<std::int32_t>{2});
  EXPECT_TRUE(fails_with(parse_generation_config(R"({"eos_token_id": "2"})", "gen.json"), StatusCode::kInvalidArgument,
                         {"gen.json", "'eos_token_id'", "a string"}));
  EXPECT_TRUE(fails_with(parse_generation_config(R"({"eos_token_id": [1, -3]})", "gen.json"),
                         StatusCode::kInvalidArgument, {"gen.json", "'eos_token_id'", "-3"}));
  EXPECT_TRUE(fails_with(parse_generation_config(R"({"top_p": 2})", "gen.json"), StatusCode::kInvalidArgument,
                         {"gen.json", "'top_p'"}));
  EXPECT_TRUE(fails_with(parse_generation_config("{", "gen.json"), StatusCode::kInvalidArgument, {"gen.json", "JSON"}));
  EXPECT_TRUE(fails_with(parse_generation_config(R"({"top_k": 18446744073709551615})", "gen.json"),
                         StatusCode::kInvalidArgument, {"gen.json", "'top_k'", "18446744073709551615"}));
  TempDir dir;
  auto absent = read_generation_config(dir.file("generation_config.json"));
  ASSERT_TRUE(absent.ok());
  EXPECT_FALSE(absent->present);
}

// The same bytes, names mapped and shapes reversed, for a single file and for 4 shards.
TEST(HfModel, WrittenDirectoryHoldsTheGgufTensors) {
  TempDir dir;
  const Source src = make_source(dir);
  for (int shards : {1, 4}) {
    HfWriteOptions o;
    o.shards = shards;
    o.eos_ids = {299};
    const std::string out = dir.file("hf" + std::to_string(shards));
    ASSERT_TRUE(write_hf_model(*src.gguf, src.config, o, out).ok());
    EXPECT_EQ(fs::exists(out + "/model.safetensors.index.json"), shards > 1);
    auto m = HfModel::open(out);
    ASSERT_TRUE(m.ok()) << m.status().to_string();
    EXPECT_EQ((*m)->weight_files().size(), static_cast<std::size_t>(shards));
    EXPECT_EQ((*m)->config(), src.config);
    EXPECT_EQ((*m)->generation().eos_ids, std::vector<std::int32_t>{299});
    EXPECT_EQ((*m)->tensors().size(), src.gguf->tensors().size());
    for (const TensorInfo& t : src.gguf->tensors()) {
      const TensorInfo* h = (*m)->find_tensor(t.name);
      ASSERT_NE(h, nullptr) << t.name;
      EXPECT_EQ(h->dims, t.dims) << t.name;
      EXPECT_EQ(h->dtype, hal::DType::kF32);
      ASSERT_EQ(h->n_bytes, t.n_bytes);
      EXPECT_TRUE(std::equal(h->data.begin(), h->data.end(), t.data.begin())) << t.name;
    }
    const ModelCheck check = check_model(**m, (*m)->config());
    EXPECT_TRUE(check.ok()) << messages(check);
    EXPECT_TRUE((*m)->warnings().empty());
  }
}

// A Qwen3.5-MoE checkpoint as Hugging Face publishes them (write_hf_model undoes llama.cpp's
// converter: grouped V heads, (1 + w) norms stored as w, A_log, conv1d [channels][1][kernel], fused
// experts, the language model under model.language_model., a vision tower and an MTP layer) reads
// back as the GGUF's tensors, the V heads left grouped (ssm_v_grouped) and said so.
TEST(HfModel, Qwen3_5CheckpointReadsAsTheGgufTensors) {
  TempDir dir;
  RandomModelSpec spec;
  spec.config = find_qwen35moe_config("35b-a3b").value();
  ModelConfig& c = spec.config;
  c.hidden = 64, c.n_heads = 4, c.n_kv_heads = 2, c.head_dim = 16, c.rot_dim = 4, c.vocab = 300;
  c.ssm_k_heads = 2, c.ssm_v_heads = 6, c.ssm_head_dim = 8;
  c.n_experts = 4, c.n_experts_used = 2, c.expert_ffn = 16, c.ffn = 16, c.shared_expert_ffn = 16;
  set_hybrid_layers(c, 4);
  spec.seed = 35;
  spec.init_std = 0.3f;
  const std::string path = dir.file("q35.gguf");
  ASSERT_TRUE(write_random_gguf(spec, path).ok());
  Source src;
  src.gguf = std::move(GgufFile::open(path)).value();
  src.config = model_config_from_gguf(*src.gguf).value();
  HfWriteOptions o;
  o.shards = 2;
  o.skipped_stand_ins = true;
  const std::string out = dir.file("hf");
  ASSERT_TRUE(write_hf_model(*src.gguf, src.config, o, out).ok());
  auto m = HfModel::open(out);
  ASSERT_TRUE(m.ok()) << m.status().to_string();
  ModelConfig want = src.config;
  want.ssm_v_grouped = true;
  EXPECT_EQ((*m)->config(), want);
  const ModelCheck check = check_model(**m, (*m)->config());
  EXPECT_TRUE(check.ok()) << messages(check);
  ASSERT_EQ((*m)->warnings().size(), 2u);
  EXPECT_NE((*m)->warnings()[0].find("vision tower's 2 tensors (model.visual.*) are not loaded"), std::string::npos);
  EXPECT_NE((*m)->warnings()[1].find("multi-token-prediction layer's 1 tensors (mtp.*)"), std::string::npos);
  EXPECT_EQ((*m)->tensors().size(), src.gguf->tensors().size());
  // Row (or, for ssm_out, column) r of the grouped tensor: tiled V head m * k + g is grouped head
  // g * (v / k) + m; `first` rows (q and k channels) and `unit` rows per head.
  const std::int64_t k = c.ssm_k_heads, per = c.ssm_v_heads / c.ssm_k_heads, d = c.ssm_head_dim;
  auto tiled_of = [&](std::int64_t i, std::int64_t first, std::int64_t unit) {
    if (i < first) return i;
    const std::int64_t head = (i - first) / unit, g = head / per, mm = head % per;
    return first + (mm * k + g) * unit + (i - first) % unit;
  };
  auto f32 = [](const TensorInfo& t) {
    std::vector<float> v(static_cast<std::size_t>(t.n_elements));
    hal::dequantize_row(*t.dtype, t.data.data(), v.data(), t.n_elements);
    return v;
  };
  for (const TensorInfo& t : src.gguf->tensors()) {
    SCOPED_TRACE(t.name);
    const TensorInfo* h = (*m)->find_tensor(t.name);
    ASSERT_NE(h, nullptr);
    EXPECT_EQ(h->dims, t.dims);
    const std::vector<float> g = f32(t), r = f32(*h);
    ASSERT_EQ(g.size(), r.size());
    const std::string_view suffix = parse_layer_tensor_name(t.name) ? parse_layer_tensor_name(t.name)->suffix : "";
    auto is = [&](LayerTensor l) { return suffix == layer_tensor_suffix(l); };
    const std::int64_t cols = t.dims[0], rows = static_cast<std::int64_t>(g.size()) / cols;
    std::int64_t first = 0, unit = 0;  // unit 0: not regrouped
    bool by_column = false;
    if (is(LayerTensor::kAttnQkv) || is(LayerTensor::kSsmConv1d)) first = 2 * k * d, unit = d;
    if (is(LayerTensor::kAttnGate)) unit = d;
    if (is(LayerTensor::kSsmAlpha) || is(LayerTensor::kSsmBeta)) unit = 1;
    if (is(LayerTensor::kSsmA) || is(LayerTensor::kSsmDt)) unit = 1, by_column = true;
    if (is(LayerTensor::kSsmOut)) unit = d, by_column = true;
    for (std::int64_t row = 0; row < rows; ++row) {
      for (std::int64_t col = 0; col < cols; ++col) {
        const std::int64_t src_row = unit > 0 && !by_column ? tiled_of(row, first, unit) : row;
        const std::int64_t src_col = unit > 0 && by_column ? tiled_of(col, 0, unit) : col;
        const float want_v = g[static_cast<std::size_t>(src_row * cols + src_col)];
        const float got = r[static_cast<std::size_t>(row * cols + col)];
        ASSERT_NEAR(got, want_v, 2e-6f * std::fabs(want_v)) << row << ", " << col;
      }
    }
  }
}

// BF16 checkpoints keep norms in BF16; the source widens them to F32 for the forward.
TEST(HfModel, Bf16NormsAreWidened) {
  TempDir dir;
  const Source src = make_source(dir);
  HfWriteOptions o;
  o.dtype = hal::DType::kBF16;
  ASSERT_TRUE(write_hf_model(*src.gguf, src.config, o, dir.file("bf16")).ok());
  auto m = HfModel::open(dir.file("bf16"));
  ASSERT_TRUE(m.ok()) << m.status().to_string();
  const TensorInfo* q = (*m)->find_tensor("blk.0.attn_q.weight");
  ASSERT_NE(q, nullptr);
  EXPECT_EQ(q->dtype, hal::DType::kBF16);
  const TensorInfo* norm = (*m)->find_tensor("blk.1.ffn_norm.weight");
  ASSERT_NE(norm, nullptr);
  EXPECT_EQ(norm->dtype, hal::DType::kF32);
  const TensorInfo* ref = src.gguf->find_tensor("blk.1.ffn_norm.weight");
  const float* got = reinterpret_cast<const float*>(norm->data.data());
  const float* want = reinterpret_cast<const float*>(ref->data.data());
  for (std::int64_t i = 0; i < ref->n_elements; ++i) {
    std::uint16_t b;
    hal::quantize_row(hal::DType::kBF16, &want[i], &b, 1);
    float back;
    hal::dequantize_row(hal::DType::kBF16, &b, &back, 1);
    EXPECT_EQ(got[i], back) << i;
    EXPECT_NEAR(got[i], want[i], std::fabs(want[i]) / 128) << i;
  }
}

// ---- the corruption matrix, at the level of a model directory ----

TEST(HfModelCorruption, MissingTensorNamesItInHfTerms) {
  TempDir dir;
  const Source src = make_source(dir);
  write_variant(src, dir.file("m"), [](Entry& e) { return e.name != "model.layers.1.mlp.up_proj.weight"; });
  auto m = HfModel::open(dir.file("m"));
  ASSERT_TRUE(m.ok()) << m.status().to_string();
  const ModelCheck c = check_model(**m, (*m)->config());
  EXPECT_TRUE(fails_with(c.status(), StatusCode::kNotFound,
                         {dir.file("m"), "tensor 'model.layers.1.mlp.up_proj.weight' is missing",
                          "model.safetensors does not hold it"}));
}

TEST(HfModelCorruption, MissingFromEveryShardNamesTheIndex) {
  TempDir dir;
  const Source src = make_source(dir);
  HfWriteOptions o;
  o.shards = 3;
  const std::string out = dir.file("m");
  ASSERT_TRUE(write_hf_model(*src.gguf, src.config, o, out).ok());
  // Rewrite the last shard without model.norm.weight and drop it from the index.
  nlohmann::json index = nlohmann::json::parse(std::ifstream(out + "/model.safetensors.index.json"));
  const std::string shard = index["weight_map"]["model.norm.weight"];
  index["weight_map"].erase("model.norm.weight");
  write_text(out + "/model.safetensors.index.json", index.dump());
  auto st = SafetensorsFile::open(out + "/" + shard);
  ASSERT_TRUE(st.ok());
  SafetensorsWriter w;
  for (const SafetensorsTensor& t : st->tensors()) {
    if (t.name != "model.norm.weight") {
      ASSERT_TRUE(w.add_tensor(t.name, t.dtype_name, t.shape, t.data).ok());
    }
  }
  std::vector<std::uint8_t> bytes = w.to_bytes();
  st = Result<SafetensorsFile>(not_found_error("closed"));
  write_text(out + "/" + shard, std::string(bytes.begin(), bytes.end()));
  auto m = HfModel::open(out);
  ASSERT_TRUE(m.ok()) << m.status().to_string();
  EXPECT_TRUE(fails_with(check_model(**m, (*m)->config()).status(), StatusCode::kNotFound,
                         {"tensor 'model.norm.weight' is missing",
                          "model.safetensors.index.json does not name it and none of the 3 shards holds it"}));
}

TEST(HfModelCorruption, WrongShapeShowsRowMajorShapes) {
  TempDir dir;
  const Source src = make_source(dir);
  write_variant(src, dir.file("m"), [](Entry& e) {
    if (e.name == "model.layers.0.mlp.gate_proj.weight") std::swap(e.shape[0], e.shape[1]);  // [64, 96]
    return true;
  });
  auto m = HfModel::open(dir.file("m"));
  ASSERT_TRUE(m.ok());
  EXPECT_TRUE(fails_with(check_model(**m, (*m)->config()).status(), StatusCode::kInvalidArgument,
                         {"tensor 'model.layers.0.mlp.gate_proj.weight' in model.safetensors has shape [64, 96] but "
                          "the config expects [96, 64]"}));
}

TEST(HfModelCorruption, WrongDtype) {
  TempDir dir;
  const Source src = make_source(dir);
  write_variant(src, dir.file("m"), [](Entry& e) {
    if (e.name == "model.layers.1.self_attn.o_proj.weight") e.dtype = "I32";  // same byte count as F32
    return true;
  });
  auto m = HfModel::open(dir.file("m"));
  ASSERT_TRUE(m.ok());
  EXPECT_TRUE(fails_with(check_model(**m, (*m)->config()).status(), StatusCode::kInvalidArgument,
                         {"tensor 'model.layers.1.self_attn.o_proj.weight' in model.safetensors has type I32"}));
}

TEST(HfModelCorruption, EveryProblemIsReportedAtOnce) {
  TempDir dir;
  const Source src = make_source(dir);
  write_variant(
      src, dir.file("m"),
      [](Entry& e) {
        if (e.name == "model.layers.0.self_attn.k_proj.bias") return false;
        if (e.name == "model.layers.1.mlp.down_proj.weight") e.shape = {64, 95}, e.bytes.resize(64 * 95 * 4);
        return true;
      },
      {Entry{"model.layers.2.mlp.up_proj.weight", "F32", {2}, std::vector<std::uint8_t>(8)},
       Entry{"model.rotary_emb.inv_freq", "F32", {2}, std::vector<std::uint8_t>(8)}});
  auto m = HfModel::open(dir.file("m"));
  ASSERT_TRUE(m.ok()) << m.status().to_string();
  const ModelCheck c = check_model(**m, (*m)->config());
  ASSERT_EQ(c.errors.size(), 3u) << messages(c);
  EXPECT_NE(c.errors[0].message.find("'model.layers.0.self_attn.k_proj.bias' is missing"), std::string::npos);
  EXPECT_NE(c.errors[1].message.find("'model.layers.1.mlp.down_proj.weight' in model.safetensors has shape [64, 95]"),
            std::string::npos);
  EXPECT_NE(c.errors[2].message.find("belongs to layer 2 but the model has 2 layers"), std::string::npos);
  EXPECT_NE(c.status().message().find("(and 2 more problems)"), std::string::npos);
  ASSERT_EQ((*m)->warnings().size(), 1u);
  EXPECT_NE((*m)->warnings()[0].find("'model.rotary_emb.inv_freq' in model.safetensors is not used"), std::string::npos);
}

TEST(HfModelCorruption, TiedModelWithLmHeadIsAWarning) {
  TempDir dir;
  const Source src = make_source(dir, /*tied=*/true);
  const TensorInfo* embd = src.gguf->find_tensor("token_embd.weight");
  write_variant(src, dir.file("m"), [](Entry&) { return true; },
                {Entry{"lm_head.weight", "F32", {300, 64}, {embd->data.begin(), embd->data.end()}}});
  auto m = HfModel::open(dir.file("m"));
  ASSERT_TRUE(m.ok());
  EXPECT_TRUE(check_model(**m, (*m)->config()).ok());
  ASSERT_EQ((*m)->warnings().size(), 1u);
  EXPECT_NE((*m)->warnings()[0].find("'lm_head.weight' is ignored"), std::string::npos);
}

TEST(HfModelCorruption, ConfigMissingAFieldOrAbsent) {
  TempDir dir;
  const Source src = make_source(dir);
  write_variant(src, dir.file("m"), [](Entry&) { return true; });
  nlohmann::json cfg = nlohmann::json::parse(std::ifstream(dir.file("m/config.json")));
  cfg.erase("intermediate_size");
  write_text(dir.file("m/config.json"), cfg.dump());
  EXPECT_TRUE(fails_with(HfModel::open(dir.file("m")), StatusCode::kNotFound,
                         {"config.json", "'intermediate_size' is missing"}));
  fs::remove(dir.file("m/config.json"));
  EXPECT_TRUE(fails_with(HfModel::open(dir.file("m")), StatusCode::kNotFound, {dir.file("m"), "config.json is missing"}));
}

TEST(HfModelCorruption, FileGivenWhereADirectoryIsExpected) {
  TempDir dir;
  const Source src = make_source(dir);
  EXPECT_TRUE(fails_with(HfModel::open(dir.file("source.gguf")), StatusCode::kInvalidArgument,
                         {"source.gguf is a file, not a Hugging Face model directory"}));
  EXPECT_TRUE(fails_with(HfModel::open(dir.file("nothing-here")), StatusCode::kNotFound, {"nothing-here"}));
  // And a directory handed to the GGUF reader.
  EXPECT_FALSE(GgufFile::open(dir.path().string()).ok());
}

TEST(HfModelCorruption, TruncatedShardIsCaughtAtOpen) {
  TempDir dir;
  const Source src = make_source(dir);
  HfWriteOptions o;
  o.shards = 2;
  ASSERT_TRUE(write_hf_model(*src.gguf, src.config, o, dir.file("m")).ok());
  const std::string shard = dir.file("m/model-00002-of-00002.safetensors");
  const auto size = fs::file_size(shard);
  fs::resize_file(shard, size - 1);
  EXPECT_TRUE(fails_with(HfModel::open(dir.file("m")), StatusCode::kDataLoss,
                         {"model-00002-of-00002.safetensors is truncated"}));
  fs::resize_file(shard, size / 2);
  EXPECT_TRUE(fails_with(HfModel::open(dir.file("m")), StatusCode::kDataLoss,
                         {"model-00002-of-00002.safetensors is truncated"}));
}

// A GPTQ checkpoint (write_hf_model's AutoGPTQ packing) of a model whose layer inputs are whole
// groups of 128, read back: each repacked weight equals scale * (q - (zero + 1)) decoded straight
// from the safetensors bytes in AutoGPTQ's layout; gptq_v2 drops the +1; what cannot be read
// (act-order g_idx, other bit widths, unknown checkpoint formats) is UNIMPLEMENTED naming the cause.
struct GptqCheckpoint {
  TempDir dir;
  Source src;
  GptqCheckpoint() {
    RandomModelSpec spec;
    spec.config = testing::tiny_qwen2_config(300, false);
    spec.config.hidden = 128;
    spec.config.n_heads = 2;
    spec.config.n_kv_heads = 1;
    spec.config.head_dim = 64;
    spec.config.ffn = 256;
    spec.weight_type = hal::DType::kF32;
    spec.seed = 11;
    const std::string path = dir.file("source.gguf");
    EXPECT_TRUE(write_random_gguf(spec, path).ok());
    src.gguf = std::move(GgufFile::open(path)).value();
    src.config = model_config_from_gguf(*src.gguf).value();
    HfWriteOptions o;
    o.dtype = hal::DType::kF16;
    o.int4 = Int4Checkpoint::kGptq;
    EXPECT_TRUE(write_hf_model(*src.gguf, src.config, o, dir.file("m")).ok());
  }
  // Overwrites 32-bit word `index` of tensor `name` in m/model.safetensors.
  void patch_u32(const std::string& name, std::uint64_t index, std::uint32_t value) const {
    std::fstream f(dir.file("m/model.safetensors"), std::ios::in | std::ios::out | std::ios::binary);
    std::uint64_t header_len = 0;
    f.read(reinterpret_cast<char*>(&header_len), 8);
    std::string header(header_len, '\0');
    f.read(header.data(), static_cast<std::streamsize>(header_len));
    const auto begin = nlohmann::json::parse(header)[name]["data_offsets"][0].get<std::uint64_t>();
    f.seekp(static_cast<std::streamoff>(8 + header_len + begin + 4 * index));
    f.write(reinterpret_cast<const char*>(&value), 4);
  }
  void edit_config(const std::function<void(nlohmann::json&)>& edit) const {
    nlohmann::json cfg = nlohmann::json::parse(std::ifstream(dir.file("m/config.json")));
    edit(cfg["quantization_config"]);
    write_text(dir.file("m/config.json"), cfg.dump());
  }
};

TEST(HfModelGptq, ScalesWithoutQweightAreAWarning) {
  GptqCheckpoint c;
  // Rename one projection's qweight in the header (same length, so the offsets stay valid).
  const std::string file = c.dir.file("m/model.safetensors");
  std::string raw;
  {
    std::ifstream in(file, std::ios::binary);
    raw.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  }
  const std::string from = "model.layers.0.self_attn.o_proj.qweight", to = "model.layers.0.self_attn.o_proj.qweigh_";
  const std::size_t at = raw.find(from);
  ASSERT_NE(at, std::string::npos);
  raw.replace(at, from.size(), to);
  write_text(file, raw);
  auto m = HfModel::open(c.dir.file("m"));
  ASSERT_TRUE(m.ok()) << m.status().to_string();
  std::string all;
  for (const std::string& w : (*m)->warnings()) all += w + "\n";
  for (const char* part : {"o_proj.qzeros", "o_proj.scales", "o_proj.g_idx"}) {
    EXPECT_NE(all.find(std::string("tensor 'model.layers.0.self_attn.") + part +
                       "' in model.safetensors is not used: there is no 'model.layers.0.self_attn.o_proj.qweight'"),
              std::string::npos)
        << all;
  }
  // And the check names the matrix that is now missing.
  EXPECT_TRUE(fails_with(check_model(**m, (*m)->config()).status(), StatusCode::kNotFound,
                         {"model.layers.0.self_attn.o_proj.weight"}));
}

// Row n of a kAwqInt4 tensor as F32.
std::vector<float> int4_row(const TensorInfo& t, std::int64_t n) {
  std::vector<float> row(static_cast<std::size_t>(t.dims[0]));
  hal::dequantize_row(hal::DType::kAwqInt4, t.data.data() + hal::row_bytes(hal::DType::kAwqInt4, t.dims[0]) * n,
                      row.data(), t.dims[0]);
  return row;
}

TEST(HfModelGptq, RepacksAutoGptqTensors) {
  GptqCheckpoint c;
  auto m = HfModel::open(c.dir.file("m"));
  ASSERT_TRUE(m.ok()) << m.status().to_string();
  EXPECT_TRUE(check_model(**m, (*m)->config()).ok());
  const TensorInfo* t = (*m)->find_tensor("blk.1.ffn_down.weight");  // in 256, out 128
  ASSERT_NE(t, nullptr);
  EXPECT_EQ(t->dtype, hal::DType::kAwqInt4);
  EXPECT_EQ(t->type_name, "GPTQ");
  EXPECT_EQ(t->dims, (std::vector<std::int64_t>{256, 128}));
  const SafetensorsModel& st = (*m)->weights();
  const SafetensorsTensor* qw = st.find("model.layers.1.mlp.down_proj.qweight");
  const SafetensorsTensor* qz = st.find("model.layers.1.mlp.down_proj.qzeros");
  const SafetensorsTensor* sc = st.find("model.layers.1.mlp.down_proj.scales");
  ASSERT_TRUE(qw && qz && sc && st.find("model.layers.1.mlp.down_proj.g_idx"));
  EXPECT_EQ(qw->shape, (std::vector<std::int64_t>{32, 128}));  // [in / 8, out]
  EXPECT_EQ(qz->shape, (std::vector<std::int64_t>{2, 16}));    // [in / 128, out / 8]
  auto u32 = [](const std::vector<std::uint8_t>& bytes, std::int64_t i) {
    std::uint32_t v;
    std::memcpy(&v, bytes.data() + i * 4, 4);
    return v;
  };
  const std::vector<std::uint8_t> qwb(qw->data.begin(), qw->data.end()), qzb(qz->data.begin(), qz->data.end());
  for (std::int64_t n : {0, 5, 77, 127}) {
    const std::vector<float> row = int4_row(*t, n);
    for (std::int64_t k : {0, 1, 7, 8, 127, 128, 200, 255}) {
      const std::int64_t g = k / 128;
      const auto q = static_cast<int>((u32(qwb, (k / 8) * 128 + n) >> (4 * (k % 8))) & 15);
      const auto z = static_cast<int>((u32(qzb, g * 16 + n / 8) >> (4 * (n % 8))) & 15) + 1;
      std::uint16_t s;
      std::memcpy(&s, sc->data.data() + (g * 128 + n) * 2, 2);
      EXPECT_EQ(row[static_cast<std::size_t>(k)], f16_to_f32(s) * static_cast<float>(q - z)) << "k " << k << " n " << n;
      EXPECT_EQ(z, 8);  // symmetric: the zero point is the middle of 0..15
    }
  }
  // Column n of a qzeros word is nibble n % 8 (AutoGPTQ's plain order, unlike AWQ's): zeros 0..7
  // (stored minus one) for columns 0..7 of group 0.
  c.patch_u32("model.layers.1.mlp.down_proj.qzeros", 0, 0x76543210u);
  auto patched = HfModel::open(c.dir.file("m"));
  ASSERT_TRUE(patched.ok()) << patched.status().to_string();
  for (std::int64_t n = 0; n < 8; ++n) {
    const std::vector<float> was = int4_row(*t, n), now = int4_row(*(*patched)->find_tensor("blk.1.ffn_down.weight"), n);
    std::uint16_t s;
    std::memcpy(&s, sc->data.data() + n * 2, 2);
    for (std::size_t k = 0; k < 128; ++k) {
      EXPECT_EQ(now[k] - was[k], f16_to_f32(s) * static_cast<float>(8 - (n + 1))) << "n " << n << " k " << k;
    }
  }
  // gptq_v2 stores the zeros as they are: every weight moves up by one step.
  c.edit_config([](nlohmann::json& q) { q["checkpoint_format"] = "gptq_v2"; });
  auto v2 = HfModel::open(c.dir.file("m"));
  ASSERT_TRUE(v2.ok()) << v2.status().to_string();
  const std::vector<float> a = int4_row(*t, 20), b = int4_row(*(*v2)->find_tensor("blk.1.ffn_down.weight"), 20);
  std::uint16_t s;
  std::memcpy(&s, sc->data.data() + 20 * 2, 2);  // column 20, group 0 (its zeros were not patched)
  for (std::size_t k = 0; k < 128; ++k) EXPECT_EQ(b[k] - a[k], f16_to_f32(s)) << k;
}

TEST(HfModelGptq, WhatCannotBeReadIsUnimplemented) {
  GptqCheckpoint c;
  c.edit_config([](nlohmann::json& q) { q["checkpoint_format"] = "marlin"; });
  EXPECT_TRUE(fails_with(HfModel::open(c.dir.file("m")), StatusCode::kUnimplemented,
                         {"config.json", "checkpoint_format 'marlin' is not supported"}));
  c.edit_config([](nlohmann::json& q) { q["checkpoint_format"] = "gptq", q["bits"] = 8; });
  EXPECT_TRUE(fails_with(HfModel::open(c.dir.file("m")), StatusCode::kUnimplemented,
                         {"GPTQ with 8 bits in groups of 128 is not supported"}));
  c.edit_config([](nlohmann::json& q) { q["bits"] = 4, q["quant_method"] = "exl2"; });
  EXPECT_TRUE(fails_with(HfModel::open(c.dir.file("m")), StatusCode::kUnimplemented,
                         {"quant_method 'exl2' is not supported (supported: awq, gptq)"}));
  c.edit_config([](nlohmann::json& q) { q["quant_method"] = "gptq"; });
  auto ok = HfModel::open(c.dir.file("m"));
  ASSERT_TRUE(ok.ok()) << ok.status().to_string();
  EXPECT_TRUE((*ok)->warnings().empty()) << (*ok)->warnings()[0];
  // Act-order: input 5 of one projection moved to group 1.
  c.patch_u32("model.layers.0.mlp.up_proj.g_idx", 5, 1);
  EXPECT_TRUE(fails_with(HfModel::open(c.dir.file("m")), StatusCode::kUnimplemented,
                         {"'model.layers.0.mlp.up_proj.g_idx' puts input 5 in group 1, not 0",
                          "act-order (desc_act) checkpoints are not supported"}));
}

TEST(ModelCheck, ChecksumsAndValueScan) {
  TempDir dir;
  const Source src = make_source(dir);
  ASSERT_TRUE(write_hf_model(*src.gguf, src.config, HfWriteOptions{}, dir.file("m")).ok());
  const std::string file = dir.file("m/model.safetensors");
  auto digest = sha256_file(file);
  ASSERT_TRUE(digest.ok());
  {
    auto m = HfModel::open(dir.file("m"));
    ModelCheck c;
    verify_checksums(**m, c);
    EXPECT_TRUE(c.ok());
    ASSERT_EQ(c.warnings.size(), 1u);  // nothing to compare with yet
    EXPECT_NE(c.warnings[0].find("no checksum"), std::string::npos);
    write_text(dir.file("m/SHA256SUMS"), *digest + "  model.safetensors\n");
    ModelCheck good;
    std::uint64_t seen = 0;
    verify_checksums(**m, good, [&](const std::string&, std::uint64_t done, std::uint64_t) { seen = done; });
    EXPECT_TRUE(good.ok()) << messages(good);
    EXPECT_TRUE(good.warnings.empty());
    EXPECT_EQ(seen, fs::file_size(file));
  }
  // One flipped bit in a weight: same size, same header, different digest.
  {
    std::fstream f(file, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(-3, std::ios::end);
    const char x = 0x40;
    f.write(&x, 1);
  }
  auto m = HfModel::open(dir.file("m"));
  ASSERT_TRUE(m.ok());
  ModelCheck bad;
  verify_checksums(**m, bad);
  EXPECT_TRUE(fails_with(bad.status(), StatusCode::kDataLoss, {"model.safetensors: SHA-256 is ", "SHA256SUMS says " + *digest}));
  ModelCheck clean;
  scan_values(**m, clean);
  EXPECT_TRUE(clean.ok()) << messages(clean);
  // A NaN in a norm weight.
  write_variant(src, dir.file("nan"), [](Entry& e) {
    if (e.name == "model.norm.weight") {
      const float nan = std::nanf("");
      std::memcpy(e.bytes.data() + 8, &nan, 4);
    }
    return true;
  });
  auto n = HfModel::open(dir.file("nan"));
  ASSERT_TRUE(n.ok());
  ModelCheck scanned;
  scan_values(**n, scanned);
  EXPECT_TRUE(fails_with(scanned.status(), StatusCode::kDataLoss,
                         {"tensor 'model.norm.weight' in model.safetensors holds 1 NaN or Inf values (the first at "
                          "element 2)"}));
}

// A Hugging Face hub cache: snapshots/<revision>/model.safetensors is a relative symlink to
// blobs/<sha256>, so the blob's name is the checksum (no SHA256SUMS needed).
TEST(ModelCheck, HfCacheBlobNameIsTheChecksum) {
  TempDir dir;
  const Source src = make_source(dir);
  ASSERT_TRUE(write_hf_model(*src.gguf, src.config, HfWriteOptions{}, dir.file("src")).ok());
  auto digest = sha256_file(dir.file("src/model.safetensors"));
  ASSERT_TRUE(digest.ok());
  const fs::path cache = dir.file("models--tiny");
  const fs::path snapshot = cache / "snapshots" / "0123abcd";
  fs::create_directories(cache / "blobs");
  fs::create_directories(snapshot);
  for (const auto& entry : fs::directory_iterator(dir.file("src"))) {
    const std::string name = entry.path().filename().string();
    if (name == "model.safetensors") {
      fs::rename(entry.path(), cache / "blobs" / *digest);
      fs::create_symlink(fs::path("..") / ".." / "blobs" / *digest, snapshot / name);
    } else {
      fs::copy_file(entry.path(), snapshot / name);
    }
  }
  {
    auto m = HfModel::open(snapshot.string());
    ASSERT_TRUE(m.ok()) << m.status().to_string();
    ModelCheck c;
    verify_checksums(**m, c);
    EXPECT_TRUE(c.ok()) << messages(c);
    EXPECT_TRUE(c.warnings.empty()) << c.warnings[0];
  }
  {  // One flipped bit in the blob.
    std::fstream f(cache / "blobs" / *digest, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(-3, std::ios::end);
    const char x = 0x40;
    f.write(&x, 1);
  }
  auto m = HfModel::open(snapshot.string());
  ASSERT_TRUE(m.ok()) << m.status().to_string();
  ModelCheck bad;
  verify_checksums(**m, bad);
  EXPECT_TRUE(fails_with(bad.status(), StatusCode::kDataLoss,
                         {"model.safetensors: SHA-256 is ", "its Hugging Face cache blob name says " + *digest,
                          "download it again"}));
}

TEST(Sha256, KnownDigests) {
  auto hex = [](std::string_view s) {
    Sha256 h;
    h.update({reinterpret_cast<const std::uint8_t*>(s.data()), s.size()});
    return h.finish_hex();
  };
  // FIPS 180-2 appendix B examples.
  EXPECT_EQ(hex(""), "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  EXPECT_EQ(hex("abc"), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  EXPECT_EQ(hex("abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq"),
            "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
  // Split updates give the same digest as one.
  std::string million(1000000, 'a');
  Sha256 parts;
  for (std::size_t i = 0; i < million.size(); i += 997) {
    const std::size_t n = std::min<std::size_t>(997, million.size() - i);
    parts.update({reinterpret_cast<const std::uint8_t*>(million.data()) + i, n});
  }
  EXPECT_EQ(parts.finish_hex(), "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
}

}  // namespace
}  // namespace sx::model
