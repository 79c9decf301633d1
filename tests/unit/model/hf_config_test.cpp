// Hugging Face config.json -> ModelConfig: the published Qwen2.5-7B and Qwen3-8B configs, an AWQ
// checkpoint's quantization_config, and every kind of error naming the file and the key.
#include <fstream>
#include <string>
#include <utility>
#include <vector>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "runtime/model/hf_config.h"
#include "runtime/model/random_model.h"
#include "tests/unit/model/gguf_test_util.h"

namespace sx::model {
namespace {

using testing::fails_with;
using testing::TempDir;

// A config.json as (key, raw JSON value) pairs, in file order.
using Keys = std::vector<std::pair<std::string, std::string>>;

// Qwen/Qwen2.5-7B/config.json as published.
Keys qwen2_5_7b() {
  return {{"architectures", R"(["Qwen2ForCausalLM"])"},
          {"attention_dropout", "0.0"},
          {"bos_token_id", "151643"},
          {"eos_token_id", "151643"},
          {"hidden_act", R"("silu")"},
          {"hidden_size", "3584"},
          {"initializer_range", "0.02"},
          {"intermediate_size", "18944"},
          {"max_position_embeddings", "131072"},
          {"max_window_layers", "28"},
          {"model_type", R"("qwen2")"},
          {"num_attention_heads", "28"},
          {"num_hidden_layers", "28"},
          {"num_key_value_heads", "4"},
          {"rms_norm_eps", "1e-06"},
          {"rope_theta", "1000000.0"},
          {"sliding_window", "131072"},
          {"tie_word_embeddings", "false"},
          {"torch_dtype", R"("bfloat16")"},
          {"transformers_version", R"("4.40.1")"},
          {"use_cache", "true"},
          {"use_mrope", "false"},
          {"use_sliding_window", "false"},
          {"vocab_size", "152064"}};
}

// Qwen/Qwen3-8B/config.json as published (head_dim its own key; rope_theta an integer).
Keys qwen3_8b() {
  return {{"architectures", R"(["Qwen3ForCausalLM"])"},
          {"attention_bias", "false"},
          {"attention_dropout", "0.0"},
          {"bos_token_id", "151643"},
          {"eos_token_id", "151645"},
          {"head_dim", "128"},
          {"hidden_act", R"("silu")"},
          {"hidden_size", "4096"},
          {"initializer_range", "0.02"},
          {"intermediate_size", "12288"},
          {"max_position_embeddings", "40960"},
          {"max_window_layers", "36"},
          {"model_type", R"("qwen3")"},
          {"num_attention_heads", "32"},
          {"num_hidden_layers", "36"},
          {"num_key_value_heads", "8"},
          {"rms_norm_eps", "1e-06"},
          {"rope_scaling", "null"},
          {"rope_theta", "1000000"},
          {"sliding_window", "null"},
          {"tie_word_embeddings", "false"},
          {"torch_dtype", R"("bfloat16")"},
          {"transformers_version", R"("4.51.0")"},
          {"use_cache", "true"},
          {"use_sliding_window", "false"},
          {"vocab_size", "151936"}};
}

Keys with(Keys keys, const std::string& key, const std::string& value) {
  for (auto& [k, v] : keys) {
    if (k == key) {
      v = value;
      return keys;
    }
  }
  keys.emplace_back(key, value);
  return keys;
}

Keys without(Keys keys, const std::string& key) {
  std::erase_if(keys, [&](const auto& kv) { return kv.first == key; });
  return keys;
}

std::string to_json(const Keys& keys) {
  std::string out = "{\n";
  for (std::size_t i = 0; i < keys.size(); ++i) {
    out += "  \"" + keys[i].first + "\": " + keys[i].second + (i + 1 < keys.size() ? ",\n" : "\n");
  }
  return out + "}\n";
}

std::string write_file(const TempDir& dir, const std::string& text, const std::string& name = "config.json") {
  const std::string path = dir.file(name);
  std::ofstream(path, std::ios::binary) << text;
  return path;
}

ModelConfig without_name(ModelConfig c) {
  c.name.clear();
  return c;
}

TEST(HfConfig, Qwen2_5_7bMatchesThePreset) {
  TempDir dir;
  const std::string path = write_file(dir, to_json(qwen2_5_7b()));
  auto c = model_config_from_hf_json(path);
  ASSERT_TRUE(c.ok()) << c.status().to_string();
  EXPECT_EQ(*c, without_name(qwen2_5_config("7b")));
  EXPECT_EQ(c->architecture, "qwen2");
  EXPECT_EQ(c->head_dim, 128);  // 3584 / 28
  EXPECT_TRUE(c->qkv_bias);
  EXPECT_FALSE(c->tied_embeddings);
  EXPECT_EQ(c->context_length, 131072);
  auto full = read_hf_config(path);
  ASSERT_TRUE(full.ok());
  EXPECT_EQ(full->torch_dtype, "bfloat16");
  EXPECT_TRUE(full->quant_method.empty());
}

TEST(HfConfig, Qwen3_8bMatchesThePreset) {
  TempDir dir;
  auto c = model_config_from_hf_json(write_file(dir, to_json(qwen3_8b())));
  ASSERT_TRUE(c.ok()) << c.status().to_string();
  EXPECT_EQ(*c, without_name(qwen3_config("8b")));
  EXPECT_FALSE(c->qkv_bias);
  EXPECT_EQ(c->rope_theta, 1e6);
}

TEST(HfConfig, Qwen3HeadDimNeedNotBeHiddenOverHeads) {
  // Qwen3-0.6B: hidden 1024, 16 heads of 128 (q_dim 2048).
  Keys k = with(with(with(with(qwen3_8b(), "hidden_size", "1024"), "num_attention_heads", "16"),
                     "num_hidden_layers", "28"),
                "intermediate_size", "3072");
  k = with(with(k, "tie_word_embeddings", "true"), "max_position_embeddings", "40960");
  TempDir dir;
  auto c = model_config_from_hf_json(write_file(dir, to_json(k)));
  ASSERT_TRUE(c.ok()) << c.status().to_string();
  EXPECT_EQ(*c, without_name(qwen3_config("0.6b")));
  EXPECT_EQ(c->q_dim(), 2048);
  // Without head_dim a qwen3 config falls back to hidden / heads.
  auto d = model_config_from_hf_json(write_file(dir, to_json(without(k, "head_dim")), "nohd.json"));
  ASSERT_TRUE(d.ok()) << d.status().to_string();
  EXPECT_EQ(d->head_dim, 64);
}

// Qwen/Qwen3.5-27B/config.json's shape: the multimodal class, the language model's keys in
// text_config (rope_parameters, layer_types), the vision tower's in vision_config (not read).
std::string qwen3_5_27b(const Keys& text_changes = {}) {
  std::string types;
  for (int i = 0; i < 64; ++i) types += fmt::format("{}\"{}\"", i ? ", " : "", i % 4 == 3 ? "full_attention" : "linear_attention");
  Keys text = {{"attention_bias", "false"},
               {"attn_output_gate", "true"},
               {"dtype", R"("bfloat16")"},
               {"eos_token_id", "248044"},
               {"full_attention_interval", "4"},
               {"head_dim", "256"},
               {"hidden_act", R"("silu")"},
               {"hidden_size", "5120"},
               {"intermediate_size", "17408"},
               {"layer_types", "[" + types + "]"},
               {"linear_conv_kernel_dim", "4"},
               {"linear_key_head_dim", "128"},
               {"linear_num_key_heads", "16"},
               {"linear_num_value_heads", "48"},
               {"linear_value_head_dim", "128"},
               {"max_position_embeddings", "262144"},
               {"mlp_only_layers", "[]"},
               {"model_type", R"("qwen3_5_text")"},
               {"mtp_num_hidden_layers", "1"},
               {"num_attention_heads", "24"},
               {"num_hidden_layers", "64"},
               {"num_key_value_heads", "4"},
               {"rms_norm_eps", "1e-06"},
               {"rope_parameters", R"({"mrope_interleaved": true, "mrope_section": [11, 11, 10], "rope_type": "default", )"
                                   R"("rope_theta": 10000000, "partial_rotary_factor": 0.25})"},
               {"vocab_size", "248320"}};
  for (const auto& [k, v] : text_changes) text = v.empty() ? without(text, k) : with(text, k, v);
  return to_json({{"architectures", R"(["Qwen3_5ForConditionalGeneration"])"},
                  {"image_token_id", "248056"},
                  {"model_type", R"("qwen3_5")"},
                  {"text_config", to_json(text)},
                  {"tie_word_embeddings", "false"},
                  {"transformers_version", R"("4.57.0.dev0")"},
                  {"vision_config", R"({"depth": 27, "hidden_size": 1152, "model_type": "qwen3_5"})"}});
}

ModelConfig grouped(ModelConfig c) {
  c.name.clear();
  c.ssm_v_grouped = true;  // Hugging Face's order of V heads
  return c;
}

TEST(HfConfig, Qwen3_5_27bMatchesThePreset) {
  auto c = parse_hf_config(qwen3_5_27b(), "q35.json");
  ASSERT_TRUE(c.ok()) << c.status().to_string();
  auto preset = find_qwen35_config("27b");
  ASSERT_TRUE(preset.ok());
  EXPECT_EQ(c->config, grouped(*preset));
  EXPECT_EQ(c->config.architecture, "qwen35");
  EXPECT_EQ(c->config.rot_dim, 64);
  EXPECT_EQ(c->config.rope_sections, (std::vector<std::int64_t>{11, 11, 10, 0}));
  EXPECT_EQ(c->config.rope_theta, 1e7);
  EXPECT_TRUE(c->config.is_recurrent(0));
  EXPECT_FALSE(c->config.is_recurrent(3));
  EXPECT_EQ(c->torch_dtype, "bfloat16");
  // The text-only class with the keys at the top level, the pattern from full_attention_interval and
  // the rope keys as transformers 4 spelt them.
  Keys flat = {{"architectures", R"(["Qwen3_5ForCausalLM"])"}, {"model_type", R"("qwen3_5_text")"},
               {"head_dim", "256"}, {"hidden_size", "5120"}, {"intermediate_size", "17408"},
               {"linear_key_head_dim", "128"}, {"linear_num_key_heads", "16"}, {"linear_num_value_heads", "48"},
               {"max_position_embeddings", "262144"}, {"num_attention_heads", "24"}, {"num_hidden_layers", "64"},
               {"num_key_value_heads", "4"}, {"rope_theta", "10000000"}, {"partial_rotary_factor", "0.25"},
               {"rope_scaling", R"({"type": "mrope", "mrope_section": [11, 11, 10]})"}, {"vocab_size", "248320"}};
  auto f = parse_hf_config(to_json(flat), "flat.json");
  ASSERT_TRUE(f.ok()) << f.status().to_string();
  EXPECT_EQ(f->config, grouped(*preset));
}

TEST(HfConfig, Qwen3_5Moe35bA3bMatchesThePreset) {
  const std::string text = qwen3_5_27b({{"hidden_size", "2048"}, {"num_hidden_layers", "40"},
                                        {"num_attention_heads", "16"}, {"num_key_value_heads", "2"},
                                        {"linear_num_value_heads", "32"}, {"intermediate_size", ""},
                                        {"layer_types", ""}, {"model_type", R"("qwen3_5_moe_text")"},
                                        {"num_experts", "256"}, {"num_experts_per_tok", "8"},
                                        {"moe_intermediate_size", "512"}, {"shared_expert_intermediate_size", "512"},
                                        {"norm_topk_prob", "true"}});
  std::string moe = text;
  moe.replace(moe.find("Qwen3_5ForConditionalGeneration"), 31, "Qwen3_5MoeForConditionalGeneration");
  moe.replace(moe.find(R"("qwen3_5")"), 9, R"("qwen3_5_moe")");
  auto c = parse_hf_config(moe, "moe.json");
  ASSERT_TRUE(c.ok()) << c.status().to_string();
  auto preset = find_qwen35moe_config("35b-a3b");
  ASSERT_TRUE(preset.ok());
  EXPECT_EQ(c->config, grouped(*preset));
  EXPECT_EQ(c->config.shared_expert_ffn, 512);
  EXPECT_EQ(c->config.ffn, 512);  // no dense width: the experts' (as qwen35moe GGUF files)
}

TEST(HfConfig, Qwen3_5ErrorsNameTheKey) {
  const std::pair<Keys, std::vector<std::string>> cases[] = {
      {{{"layer_types", R"(["linear_attention"])"}}, {"'text_config.layer_types'", "64 layer types"}},
      {{{"layer_types", "[" + [] {
           std::string t;
           for (int i = 0; i < 63; ++i) t += R"("linear_attention", )";
           return t;
         }() + R"("mamba"])"}},
       {"'text_config.layer_types'", "\"mamba\""}},
      {{{"linear_value_head_dim", "64"}}, {"'text_config.linear_value_head_dim'", "not supported"}},
      {{{"linear_num_value_heads", "40"}}, {"'text_config.linear_num_value_heads' 40", "multiple"}},
      {{{"linear_num_key_heads", ""}}, {"'text_config.linear_num_key_heads'", "missing"}},
      {{{"attn_output_gate", "false"}}, {"'text_config.attn_output_gate'", "output gate"}},
      {{{"rope_parameters", R"({"rope_theta": 1e7, "partial_rotary_factor": 0.3})"}},
       {"'text_config.rope_parameters.partial_rotary_factor'", "even"}},
      {{{"rope_parameters", R"({"mrope_section": [11, 11, "10"]})"}}, {"mrope_section", "\"10\""}},
      {{{"rope_parameters", "7"}}, {"'text_config.rope_parameters'", "an object"}},
  };
  for (const auto& [changes, words] : cases) {
    auto r = parse_hf_config(qwen3_5_27b(changes), "q35.json");
    ASSERT_FALSE(r.ok()) << changes.front().first;
    for (const std::string& w : words) {
      EXPECT_NE(r.status().to_string().find(w), std::string::npos) << r.status().to_string() << " lacks " << w;
    }
  }
  std::string broken = qwen3_5_27b();
  broken.replace(broken.find(R"("text_config": {)"), 16, R"("text_config": 5, "x": {)");
  EXPECT_TRUE(fails_with(parse_hf_config(broken, "b.json"), StatusCode::kInvalidArgument,
                         {"b.json", "'text_config'", "an object"}));
}

TEST(HfConfig, AwqCheckpointReportsItsQuantization) {
  // Qwen/Qwen2.5-72B-Instruct-AWQ's quantization_config, on the 72B shape.
  Keys k = qwen2_5_7b();
  for (auto [key, v] : std::vector<std::pair<std::string, std::string>>{
           {"hidden_size", "8192"}, {"intermediate_size", "29568"}, {"num_attention_heads", "64"},
           {"num_hidden_layers", "80"}, {"num_key_value_heads", "8"}, {"torch_dtype", R"("float16")"},
           {"_name_or_path", R"("Qwen/Qwen2.5-72B-Instruct-AWQ")"},
           {"quantization_config",
            R"({"bits": 4, "group_size": 128, "modules_to_not_convert": null, "quant_method": "awq", "version": "gemm", "zero_point": true})"}}) {
    k = with(k, key, v);
  }
  TempDir dir;
  auto c = read_hf_config(write_file(dir, to_json(k)));
  ASSERT_TRUE(c.ok()) << c.status().to_string();
  EXPECT_EQ(without_name(c->config), without_name(qwen2_5_config("72b")));
  EXPECT_EQ(c->config.name, "Qwen/Qwen2.5-72B-Instruct-AWQ");
  EXPECT_EQ(c->torch_dtype, "float16");
  EXPECT_EQ(c->quant_method, "awq");
  EXPECT_EQ(c->quant_bits, 4);
  EXPECT_EQ(c->quant_group_size, 128);
  // GPTQ's "one group per row".
  auto g = parse_hf_config(to_json(with(k, "quantization_config", R"({"bits": 4, "group_size": -1, "quant_method": "gptq"})")),
                           "gptq.json");
  ASSERT_TRUE(g.ok()) << g.status().to_string();
  EXPECT_EQ(g->quant_group_size, -1);
  EXPECT_TRUE(fails_with(parse_hf_config(to_json(with(k, "quantization_config", "4")), "q.json"),
                         StatusCode::kInvalidArgument, {"q.json", "'quantization_config'", "an object"}));
  EXPECT_TRUE(fails_with(parse_hf_config(to_json(with(k, "quantization_config", R"({"bits": "4"})")), "q.json"),
                         StatusCode::kInvalidArgument, {"q.json", "'quantization_config.bits'", "an integer"}));
}

TEST(HfConfig, ArchitectureFromEitherKey) {
  auto by_type = parse_hf_config(to_json(without(qwen2_5_7b(), "architectures")), "a.json");
  ASSERT_TRUE(by_type.ok()) << by_type.status().to_string();
  EXPECT_EQ(by_type->config.architecture, "qwen2");
  auto by_class = parse_hf_config(to_json(without(qwen3_8b(), "model_type")), "b.json");
  ASSERT_TRUE(by_class.ok()) << by_class.status().to_string();
  EXPECT_EQ(by_class->config.architecture, "qwen3");
  // Defaults as transformers has them: KV heads = heads, rope_theta 10000, no tying.
  auto d = parse_hf_config(
      to_json(without(without(without(qwen2_5_7b(), "num_key_value_heads"), "rope_theta"), "tie_word_embeddings")),
      "d.json");
  ASSERT_TRUE(d.ok()) << d.status().to_string();
  EXPECT_EQ(d->config.n_kv_heads, 28);
  EXPECT_EQ(d->config.rope_theta, 10000.0);
  EXPECT_FALSE(d->config.tied_embeddings);
}

TEST(HfConfig, UnsupportedArchitectureNamesTheSupportedOnes) {
  Keys llama = with(with(qwen2_5_7b(), "model_type", R"("llama")"), "architectures", R"(["LlamaForCausalLM"])");
  EXPECT_TRUE(fails_with(parse_hf_config(to_json(llama), "llama.json"), StatusCode::kUnimplemented,
                         {"llama.json", "'llama'", "LlamaForCausalLM", "qwen2 (Qwen2ForCausalLM)",
                          "qwen3 (Qwen3ForCausalLM)"}));
  EXPECT_TRUE(fails_with(parse_hf_config(to_json(with(qwen2_5_7b(), "model_type", R"("qwen2_moe")")), "moe.json"),
                         StatusCode::kUnimplemented, {"moe.json", "qwen2_moe", "supported: qwen2"}));
  Keys next = with(with(qwen2_5_7b(), "model_type", R"("qwen3_next")"), "architectures",
                   R"(["Qwen3NextForCausalLM"])");
  EXPECT_TRUE(fails_with(parse_hf_config(to_json(next), "next.json"), StatusCode::kUnimplemented,
                         {"next.json", "Qwen3NextForCausalLM", "qwen3_5 (Qwen3_5ForConditionalGeneration)"}));
  EXPECT_TRUE(fails_with(parse_hf_config(to_json(with(qwen2_5_7b(), "model_type", R"("qwen3")")), "mix.json"),
                         StatusCode::kInvalidArgument, {"mix.json", "'model_type' is 'qwen3'", "Qwen2ForCausalLM"}));
  EXPECT_TRUE(fails_with(parse_hf_config(to_json(without(without(qwen2_5_7b(), "model_type"), "architectures")),
                                         "none.json"),
                         StatusCode::kNotFound, {"none.json", "model_type", "architectures"}));
  EXPECT_TRUE(fails_with(parse_hf_config(to_json(with(qwen2_5_7b(), "architectures", R"("Qwen2ForCausalLM")")), "a.json"),
                         StatusCode::kInvalidArgument, {"a.json", "'architectures'", "an array"}));
}

TEST(HfConfig, MissingAndMistypedKeysNameFileAndKey) {
  for (const char* key : {"num_hidden_layers", "hidden_size", "num_attention_heads", "intermediate_size", "vocab_size",
                          "max_position_embeddings"}) {
    EXPECT_TRUE(fails_with(parse_hf_config(to_json(without(qwen2_5_7b(), key)), "cfg.json"), StatusCode::kNotFound,
                           {"cfg.json", fmt::format("'{}'", key), "missing"}))
        << key;
  }
  const std::pair<const char*, const char*> wrong[] = {
      {"hidden_size", R"("3584")"}, {"hidden_size", "3584.5"},      {"num_hidden_layers", "true"},
      {"vocab_size", "[152064]"},   {"rope_theta", R"("1e6")"},     {"rms_norm_eps", "{}"},
      {"tie_word_embeddings", R"("false")"}, {"torch_dtype", "16"},
  };
  for (const auto& [key, value] : wrong) {
    EXPECT_TRUE(fails_with(parse_hf_config(to_json(with(qwen2_5_7b(), key, value)), "cfg.json"),
                           StatusCode::kInvalidArgument, {"cfg.json", fmt::format("'{}'", key), "expected"}))
        << key << " = " << value;
  }
  for (const char* bad : {"0", "-4", "4294967296"}) {
    EXPECT_TRUE(fails_with(parse_hf_config(to_json(with(qwen2_5_7b(), "num_key_value_heads", bad)), "cfg.json"),
                           StatusCode::kInvalidArgument, {"cfg.json", "'num_key_value_heads'", bad, "1..2147483647"}))
        << bad;
  }
  for (const char* bad : {"0", "-1.5"}) {
    EXPECT_TRUE(fails_with(parse_hf_config(to_json(with(qwen2_5_7b(), "rms_norm_eps", bad)), "cfg.json"),
                           StatusCode::kInvalidArgument, {"cfg.json", "'rms_norm_eps'", "positive"}))
        << bad;
  }
}

TEST(HfConfig, InconsistentKeys) {
  EXPECT_TRUE(fails_with(parse_hf_config(to_json(with(qwen2_5_7b(), "num_key_value_heads", "5")), "cfg.json"),
                         StatusCode::kInvalidArgument,
                         {"cfg.json", "'num_attention_heads' 28", "not a multiple of 'num_key_value_heads' 5"}));
  EXPECT_TRUE(fails_with(parse_hf_config(to_json(with(qwen2_5_7b(), "hidden_size", "3585")), "cfg.json"),
                         StatusCode::kInvalidArgument, {"cfg.json", "'hidden_size' 3585", "'num_attention_heads' 28"}));
  EXPECT_TRUE(fails_with(parse_hf_config(to_json(with(qwen2_5_7b(), "head_dim", "64")), "cfg.json"),
                         StatusCode::kInvalidArgument, {"cfg.json", "'head_dim' is 64", "3584 / 28 = 128"}));
  EXPECT_TRUE(fails_with(parse_hf_config(to_json(with(qwen3_8b(), "head_dim", "127")), "cfg.json"),
                         StatusCode::kInvalidArgument, {"cfg.json", "127", "odd"}));
}

TEST(HfConfig, FileErrors) {
  TempDir dir;
  EXPECT_TRUE(fails_with(model_config_from_hf_json(dir.file("absent.json")), StatusCode::kNotFound, {"absent.json"}));
  EXPECT_TRUE(fails_with(model_config_from_hf_json(write_file(dir, "{\"hidden_size\": 3584,", "cut.json")),
                         StatusCode::kInvalidArgument, {"cut.json", "not valid JSON"}));
  EXPECT_TRUE(fails_with(model_config_from_hf_json(write_file(dir, "[1, 2]", "array.json")),
                         StatusCode::kInvalidArgument, {"array.json", "one JSON object", "an array"}));
}

}  // namespace
}  // namespace sx::model
