// End to end on the bundled model (models/memorise): the tokenizer reproduces the trainer's ids,
// the F32 logits match PyTorch's within 1e-4, and greedy decoding reproduces the memorised text
// for every stored format.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "backends/registry.h"
#include "runtime/engine/device_group.h"
#include "runtime/engine/generator.h"
#include "runtime/engine/model_loader.h"
#include "runtime/engine/sampler.h"

namespace sx {
namespace {

std::string models_dir() {
  const char* d = std::getenv("SX_MODELS_DIR");
  return d != nullptr ? d : "models/memorise";
}

nlohmann::json reference() {
  std::ifstream in(models_dir() + "/reference.json");
  EXPECT_TRUE(in.good()) << "missing " << models_dir() << "/reference.json";
  return nlohmann::json::parse(in);
}

struct Loaded {
  engine::OpenedModel opened;
  std::unique_ptr<hal::Device> device;
  std::unique_ptr<engine::Model> model;
};

Loaded load(const std::string& file, std::int64_t ctx, int threads) {
  Loaded l;
  auto opened = engine::open_model(models_dir() + "/" + file);
  EXPECT_TRUE(opened.ok()) << opened.status().to_string();
  l.opened = std::move(opened).value();
  auto backend = backends::default_registry().find("cpu");
  EXPECT_TRUE(backend.ok());
  hal::DeviceOptions o;
  o.set("threads", threads);
  l.device = std::move((*backend)->create_device(0, o)).value();
  engine::ModelOptions mo;
  mo.kv.num_blocks = (ctx + 15) / 16 + 1;  // + the null block
  mo.max_batch_tokens = 64;  // several prefill chunks for long prompts
  mo.max_logit_rows = 1;
  auto m = engine::Model::load(*l.opened.weights, l.opened.config, *l.device, mo);
  EXPECT_TRUE(m.ok()) << m.status().to_string();
  l.model = std::move(m).value();
  return l;
}

std::vector<std::int32_t> ids_of(const nlohmann::json& j) { return j.get<std::vector<std::int32_t>>(); }

TEST(Memorise, TokenizerMatchesTrainer) {
  const auto ref = reference();
  auto opened = engine::open_model(models_dir() + "/memorise-f32.gguf");
  ASSERT_TRUE(opened.ok()) << opened.status().to_string();
  std::ifstream in(models_dir() + "/text.txt", std::ios::binary);
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  EXPECT_EQ(opened->tokenizer->encode(text), ids_of(ref["text_token_ids"]));
  EXPECT_EQ(opened->tokenizer->encode(ref["prompt_text"].get<std::string>()), ids_of(ref["prompt_ids"]));
  EXPECT_EQ(opened->tokenizer->decode(ids_of(ref["text_token_ids"])), text);
}

TEST(Memorise, F32LogitsMatchPyTorch) {
  const auto ref = reference();
  const auto prompt = ids_of(ref["prompt_ids"]);
  const auto expect = ref["logits_last"].get<std::vector<double>>();
  for (int threads : {1, 2}) {
    Loaded l = load("memorise-f32.gguf", 64, threads);
    std::vector<float> logits;
    ASSERT_TRUE(l.model->forward(engine::single_sequence_batch(prompt, 0, l.model->options().kv.num_blocks), logits).ok());
    ASSERT_EQ(logits.size(), expect.size());
    // Softmax-invariant shift: compare logits minus their maximum.
    const double mx = *std::max_element(logits.begin(), logits.end());
    const double ex = *std::max_element(expect.begin(), expect.end());
    double worst = 0;
    for (std::size_t i = 0; i < logits.size(); ++i) worst = std::max(worst, std::fabs((logits[i] - mx) - (expect[i] - ex)));
    EXPECT_LT(worst, 1e-4) << "threads " << threads;
    std::printf("f32 logits vs PyTorch (threads %d): max abs diff %.3g\n", threads, worst);
  }
}

class MemoriseFormat : public testing::TestWithParam<const char*> {};

TEST_P(MemoriseFormat, GreedyReproducesTheText) {
  const auto ref = reference();
  const auto prompt = ids_of(ref["prompt_ids"]);
  const auto expect = ids_of(ref["continuation_ids"]);
  ASSERT_GE(expect.size(), 200u);
  Loaded l = load(std::string("memorise-") + GetParam() + ".gguf", static_cast<std::int64_t>(prompt.size() + expect.size()), 2);
  engine::GenerateOptions o;
  o.sampling.temperature = 0.0f;
  o.max_tokens = static_cast<std::int64_t>(expect.size());
  o.ignore_eos = true;
  auto r = engine::generate(*l.model, *l.opened.tokenizer, prompt, o);
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  std::size_t same = 0;
  while (same < expect.size() && same < r->tokens.size() && r->tokens[same] == expect[same]) ++same;
  std::printf("%s: %zu of %zu continuation tokens reproduced\n", GetParam(), same, expect.size());
  EXPECT_EQ(same, expect.size());
  EXPECT_EQ(r->tokens, expect);
}

INSTANTIATE_TEST_SUITE_P(Formats, MemoriseFormat, testing::Values("f32", "f16", "q8_0"));

// The same text from a TP x PP group of strict CPU logical devices (uneven heads: 14 over 6 ranks,
// a GQA group of 7 split across ranks, FFN 608 in uneven row ranges, three layers... two here).
struct ParallelCase {
  const char* format;
  int tp, pp;
};

class MemoriseParallel : public testing::TestWithParam<ParallelCase> {};

TEST_P(MemoriseParallel, GreedyReproducesTheText) {
  const ParallelCase pc = GetParam();
  const auto ref = reference();
  const auto prompt = ids_of(ref["prompt_ids"]);
  const auto expect = ids_of(ref["continuation_ids"]);
  auto opened = engine::open_model(models_dir() + "/memorise-" + pc.format + ".gguf");
  ASSERT_TRUE(opened.ok()) << opened.status().to_string();
  hal::Backend& backend = **backends::default_registry().find("cpu");
  hal::DeviceOptions o;
  o.set("strict", true);
  auto group = engine::create_device_group(backend, pc.tp * pc.pp, o);
  ASSERT_TRUE(group.ok()) << group.status().to_string();
  engine::ModelOptions mo;
  mo.kv.num_blocks = static_cast<std::int64_t>(prompt.size() + expect.size() + 15) / 16 + 1;
  mo.max_batch_tokens = 64;
  mo.max_logit_rows = 1;
  engine::ParallelOptions po;
  po.tp = pc.tp;
  po.pp = pc.pp;
  auto m = engine::Model::load(*opened->weights, opened->config, backend, group->devices, po, mo);
  ASSERT_TRUE(m.ok()) << m.status().to_string();
  engine::GenerateOptions g;
  g.sampling.temperature = 0.0f;
  g.max_tokens = static_cast<std::int64_t>(expect.size());
  g.ignore_eos = true;
  auto r = engine::generate(**m, *opened->tokenizer, prompt, g);
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  std::size_t same = 0;
  while (same < expect.size() && same < r->tokens.size() && r->tokens[same] == expect[same]) ++same;
  std::printf("%s tp %d pp %d (strict): %zu of %zu continuation tokens reproduced\n", pc.format, pc.tp, pc.pp, same,
              expect.size());
  EXPECT_EQ(r->tokens, expect);
}

INSTANTIATE_TEST_SUITE_P(Layouts, MemoriseParallel,
                         testing::Values(ParallelCase{"f32", 6, 1}, ParallelCase{"f16", 6, 1},
                                         ParallelCase{"f32", 3, 2}, ParallelCase{"f16", 3, 2},
                                         ParallelCase{"q8_0", 7, 1}, ParallelCase{"q8_0", 1, 2}),
                         [](const auto& info) {
                           return std::string(info.param.format) + "_tp" + std::to_string(info.param.tp) + "_pp" +
                                  std::to_string(info.param.pp);
                         });

// F32 logits of every layout the bundled model allows (2 layers: pp <= 2) against one device, at
// each of 64 greedy steps, within 1e-4 of the largest logit; identical greedy tokens.
TEST(Memorise, F32EveryLayoutMatchesOneDevice) {
  const auto ref = reference();
  const auto prompt = ids_of(ref["prompt_ids"]);
  auto opened = engine::open_model(models_dir() + "/memorise-f32.gguf");
  ASSERT_TRUE(opened.ok());
  hal::Backend& backend = **backends::default_registry().find("cpu");
  hal::DeviceOptions o;
  o.set("strict", true);
  engine::ModelOptions mo;
  mo.kv.num_blocks = 6;
  mo.max_batch_tokens = 16;
  mo.max_logit_rows = 1;
  auto greedy = [&](engine::Model& m, std::vector<std::vector<float>>& all, std::vector<std::int32_t>& toks) {
    std::vector<float> logits;
    ASSERT_TRUE(m.forward(engine::single_sequence_batch(prompt, 0, mo.kv.num_blocks), logits).ok());
    auto pos = static_cast<std::int32_t>(prompt.size());
    for (int step = 0; step < 64; ++step) {
      all.push_back(logits);
      toks.push_back(engine::argmax(logits));
      const std::int32_t one[1] = {toks.back()};
      ASSERT_TRUE(m.forward(engine::single_sequence_batch(one, pos++, mo.kv.num_blocks), logits).ok());
    }
  };
  std::vector<std::vector<float>> ref_logits;
  std::vector<std::int32_t> ref_tokens;
  {
    auto g = engine::create_device_group(backend, 1, o);
    auto m = engine::Model::load(*opened->weights, opened->config, *g->devices[0], mo);
    ASSERT_TRUE(m.ok());
    greedy(**m, ref_logits, ref_tokens);
  }
  std::vector<std::pair<int, int>> layouts;
  for (int tp = 1; tp <= 8; ++tp) layouts.push_back({tp, 1});
  layouts.push_back({2, 2});
  layouts.push_back({3, 2});
  for (auto [tp, pp] : layouts) {
    auto g = engine::create_device_group(backend, tp * pp, o);
    ASSERT_TRUE(g.ok());
    engine::ParallelOptions po;
    po.tp = tp;
    po.pp = pp;
    auto m = engine::Model::load(*opened->weights, opened->config, backend, g->devices, po, mo);
    ASSERT_TRUE(m.ok()) << m.status().to_string();
    std::vector<std::vector<float>> got;
    std::vector<std::int32_t> toks;
    greedy(**m, got, toks);
    double worst = 0;
    for (std::size_t s = 0; s < got.size(); ++s) {
      float scale = 0;
      for (float v : ref_logits[s]) scale = std::max(scale, std::fabs(v));
      for (std::size_t i = 0; i < got[s].size(); ++i) worst = std::max(worst, std::fabs(double(got[s][i]) - ref_logits[s][i]) / scale);
    }
    EXPECT_LE(worst, 1e-4) << "tp " << tp << " pp " << pp;
    EXPECT_EQ(toks, ref_tokens) << "tp " << tp << " pp " << pp;
    std::printf("bundled f32 tp %d pp %d: 64 greedy tokens identical: %s; max relative logit diff %.2g\n", tp, pp,
                toks == ref_tokens ? "yes" : "NO", worst);
  }
}

TEST(Memorise, Q8_0AtTp8IsAClearPlannerError) {
  // head_dim 16 and 32-column Q8_0 blocks of o: heads move in pairs, 14 heads make 7 units, so TP 6
  // loads and TP 8 is refused naming the largest TP that works.
  auto opened = engine::open_model(models_dir() + "/memorise-q8_0.gguf");
  ASSERT_TRUE(opened.ok());
  hal::Backend& backend = **backends::default_registry().find("cpu");
  engine::ModelOptions mo;
  mo.kv.num_blocks = 4;
  for (const int tp : {6, 8}) {
    auto group = engine::create_device_group(backend, tp, {});
    ASSERT_TRUE(group.ok());
    engine::ParallelOptions po;
    po.tp = tp;
    auto m = engine::Model::load(*opened->weights, opened->config, backend, group->devices, po, mo);
    if (tp == 6) {
      EXPECT_TRUE(m.ok()) << m.status().to_string();
      continue;
    }
    ASSERT_FALSE(m.ok());
    EXPECT_EQ(m.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(m.status().message().find("Q8_0"), std::string::npos) << m.status().to_string();
    EXPECT_NE(m.status().message().find("use tp <= 7"), std::string::npos) << m.status().to_string();
  }
}

TEST(Memorise, ChunkedPrefillEqualsOneShot) {
  // The whole prompt at once vs. in chunks of 7 tokens gives the same logits.
  const auto ref = reference();
  auto text_ids = ids_of(ref["text_token_ids"]);
  text_ids.resize(std::min<std::size_t>(text_ids.size(), 60));
  Loaded a = load("memorise-f32.gguf", 64, 2);
  std::vector<float> one, chunked;
  ASSERT_TRUE(a.model->forward(engine::single_sequence_batch(text_ids, 0, a.model->options().kv.num_blocks), one).ok());
  Loaded b = load("memorise-f32.gguf", 64, 2);
  for (std::size_t start = 0; start < text_ids.size(); start += 7) {
    const std::size_t len = std::min<std::size_t>(7, text_ids.size() - start);
    ASSERT_TRUE(b.model->forward(engine::single_sequence_batch(std::span<const std::int32_t>(text_ids).subspan(start, len),
                                                               static_cast<std::int32_t>(start),
                                                               b.model->options().kv.num_blocks),
                                 chunked).ok());
  }
  ASSERT_EQ(one.size(), chunked.size());
  for (std::size_t i = 0; i < one.size(); ++i) ASSERT_NEAR(one[i], chunked[i], 1e-4);
}

TEST(Memorise, BadBatchesAreErrors) {
  Loaded l = load("memorise-f32.gguf", 32, 1);
  std::vector<float> logits;
  const std::int32_t bad_id[1] = {1 << 30};
  Status s = l.model->forward(engine::single_sequence_batch(bad_id, 0, l.model->options().kv.num_blocks), logits);
  EXPECT_EQ(s.code(), StatusCode::kOutOfRange);
  const std::int32_t ok_id[1] = {1};
  s = l.model->forward(engine::single_sequence_batch(ok_id, 48, l.model->options().kv.num_blocks), logits);
  EXPECT_EQ(s.code(), StatusCode::kOutOfRange);  // a slot beyond the cache
  // A rejected batch leaves the model usable.
  EXPECT_TRUE(l.model->forward(engine::single_sequence_batch(ok_id, 0, l.model->options().kv.num_blocks), logits).ok());
}

}  // namespace
}  // namespace sx
