// The engine on real models: 16 concurrent requests of different lengths arriving at random steps
// give exactly the greedy outputs of the same requests run one at a time; prefix caching changes
// nothing but the work done; cancellation, stop strings and logprobs behave.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <mutex>
#include <thread>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <random>
#include <span>
#include <string>
#include <vector>

#include "backends/registry.h"
#include "runtime/engine/engine.h"
#include "runtime/engine/model_loader.h"
#include "runtime/model/random_model.h"

namespace sx::engine {
namespace {

std::string models_dir() {
  const char* d = std::getenv("SX_MODELS_DIR");
  return d != nullptr ? d : "models/memorise";
}

struct Loaded {
  OpenedModel opened;
  std::unique_ptr<hal::Device> device;
  std::unique_ptr<Model> model;
};

Loaded open(const std::string& path, std::int64_t blocks) {
  Loaded s;
  auto o = open_model(path);
  EXPECT_TRUE(o.ok()) << o.status().to_string();
  s.opened = std::move(*o);
  hal::DeviceOptions d;
  d.set("threads", 2);
  s.device = *(*backends::default_registry().find("cpu"))->create_device(0, d);
  ModelOptions mo;
  mo.kv.num_blocks = blocks;
  mo.max_batch_tokens = 256;
  mo.max_logit_rows = 16;
  auto m = Model::load(*s.opened.weights, s.opened.config, *s.device, mo);
  EXPECT_TRUE(m.ok()) << m.status().to_string();
  s.model = std::move(*m);
  return s;
}

struct Result1 {
  std::vector<std::int32_t> tokens;
  std::string text;
  RequestFinish finish = RequestFinish::kNone;
  std::int64_t cached = 0;
  std::vector<TokenLogprob> logprobs;
};

EngineConfig engine_config(std::int64_t max_seqs, bool prefix) {
  EngineConfig c;
  c.scheduler.max_num_batched_tokens = 256;
  c.scheduler.max_num_seqs = max_seqs;
  c.scheduler.max_model_len = 512;
  c.prefix_caching = prefix;
  return c;
}

RequestOptions greedy(std::int64_t n) {
  RequestOptions o;
  o.sampling.temperature = 0.0f;
  o.max_tokens = n;
  o.ignore_eos = true;
  return o;
}

// Runs the prompts through one engine; request i is submitted at step arrive[i].
std::vector<Result1> run_batch(Model& m, const tokenizer::Tokenizer& tok,
                               const std::vector<std::vector<std::int32_t>>& prompts, const std::vector<int>& arrive,
                               std::int64_t max_seqs, bool prefix, std::int64_t n_new, EngineStats* stats = nullptr) {
  auto engine = Engine::create(m, tok, engine_config(max_seqs, prefix));
  EXPECT_TRUE(engine.ok()) << engine.status().to_string();
  std::vector<Result1> out(prompts.size());
  std::map<std::uint64_t, std::size_t> index;
  std::size_t submitted = 0;
  for (int step = 0; submitted < prompts.size() || (*engine)->has_work(); ++step) {
    for (std::size_t i = 0; i < prompts.size(); ++i) {
      if (arrive[i] != step) continue;
      auto id = (*engine)->submit(prompts[i], greedy(n_new), [&out, &index](const RequestEvent& e) {
        Result1& r = out[index.at(e.id)];
        r.tokens.insert(r.tokens.end(), e.tokens.begin(), e.tokens.end());
        r.text += e.text;
        if (e.finished) {
          r.finish = e.finish;
          r.cached = e.cached_prompt_tokens;
        }
      });
      EXPECT_TRUE(id.ok()) << id.status().to_string();
      index[*id] = i;
      ++submitted;
    }
    EXPECT_TRUE((*engine)->step().ok());
  }
  if (stats != nullptr) *stats = (*engine)->stats();
  return out;
}

void expect_batched_equals_alone(const std::string& path, const std::vector<std::vector<std::int32_t>>& prompts,
                                 std::int64_t n_new, std::int64_t blocks) {
  Loaded s = open(path, blocks);
  std::mt19937 rng(7);
  std::vector<int> arrive(prompts.size());
  for (int& a : arrive) a = static_cast<int>(rng() % 12);
  EngineStats stats;
  const auto batched = run_batch(*s.model, *s.opened.tokenizer, prompts, arrive, 16, true, n_new, &stats);
  int same = 0;
  for (std::size_t i = 0; i < prompts.size(); ++i) {
    const auto alone = run_batch(*s.model, *s.opened.tokenizer, {prompts[i]}, {0}, 1, false, n_new);
    EXPECT_EQ(batched[i].tokens, alone[0].tokens) << path << " request " << i;
    EXPECT_EQ(batched[i].finish, RequestFinish::kLength);
    EXPECT_EQ(static_cast<std::int64_t>(batched[i].tokens.size()), n_new);
    same += batched[i].tokens == alone[0].tokens ? 1 : 0;
  }
  std::printf("%s: %d of %zu batched requests identical to running alone (%llu steps for the batch)\n", path.c_str(), same,
              prompts.size(), static_cast<unsigned long long>(stats.steps));
}

// Block tables are as wide as the next power of two of the longest sequence's blocks (at least 8,
// at most the model's capacity), so decode steps keep one width for many tokens.
TEST(Engine, BlockTableWidthIsBucketed) {
  EXPECT_EQ(block_table_width(1, 4096), 8);
  EXPECT_EQ(block_table_width(8, 4096), 8);
  EXPECT_EQ(block_table_width(9, 4096), 16);
  EXPECT_EQ(block_table_width(129, 4096), 256);
  EXPECT_EQ(block_table_width(129, 200), 200);  // capped at the capacity
  EXPECT_EQ(block_table_width(3, 4), 4);
  EXPECT_EQ(block_table_width(5, 4), 5);  // never below what is needed (the model refuses it then)
}

TEST(Engine, BundledModelBatchedEqualsAlone) {
  for (const char* fmt : {"f32", "q8_0"}) {
    auto o = open_model(models_dir() + "/memorise-" + fmt + ".gguf");
    ASSERT_TRUE(o.ok());
    std::ifstream in(models_dir() + "/text.txt");
    const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    const auto ids = o->tokenizer->encode(text);
    std::vector<std::vector<std::int32_t>> prompts;
    std::mt19937 rng(3);
    for (int i = 0; i < 16; ++i) {
      const std::size_t start = rng() % 600, len = 4 + rng() % 120;
      prompts.emplace_back(ids.begin() + static_cast<std::ptrdiff_t>(start),
                           ids.begin() + static_cast<std::ptrdiff_t>(start + len));
    }
    expect_batched_equals_alone(models_dir() + "/memorise-" + fmt + ".gguf", prompts, 48, 16 * 12 + 1);
  }
}

TEST(Engine, Qwen05ShapedModelBatchedEqualsAlone) {
  model::RandomModelSpec spec;
  spec.config = model::qwen2_5_config("0.5b");
  spec.config.n_layers = 4;
  spec.config.context_length = 1024;
  spec.weight_type = hal::DType::kQ8_0;
  spec.seed = 11;
  const std::string path = (std::filesystem::temp_directory_path() / ("sx_engine_q05_" + std::to_string(::getpid()) + ".gguf")).string();
  ASSERT_TRUE(model::write_random_gguf(spec, path).ok());
  std::mt19937 rng(5);
  std::vector<std::vector<std::int32_t>> prompts;
  for (int i = 0; i < 16; ++i) {
    std::vector<std::int32_t> p(2 + rng() % 150);
    for (auto& t : p) t = static_cast<std::int32_t>(rng() % 151000);
    prompts.push_back(std::move(p));
  }
  expect_batched_equals_alone(path, prompts, 24, 16 * 12 + 1);
  std::filesystem::remove(path);
}

TEST(Engine, PrefixCachingChangesOnlyTheWork) {
  Loaded s = open(models_dir() + "/memorise-f32.gguf", 64);
  const auto ids = s.opened.tokenizer->encode(
      "Alice was beginning to get very tired of sitting by her sister on the bank, and of having nothing to do");
  std::vector<std::vector<std::int32_t>> prompts;
  for (int i = 0; i < 6; ++i) {
    std::vector<std::int32_t> p(ids.begin(), ids.end() - i);  // shared prefixes of different lengths
    prompts.push_back(p);
  }
  const std::vector<int> arrive = {0, 3, 6, 9, 12, 15};
  EngineStats with_stats, without_stats;
  const auto with = run_batch(*s.model, *s.opened.tokenizer, prompts, arrive, 16, true, 20, &with_stats);
  const auto without = run_batch(*s.model, *s.opened.tokenizer, prompts, arrive, 16, false, 20, &without_stats);
  std::int64_t cached = 0;
  for (std::size_t i = 0; i < prompts.size(); ++i) {
    EXPECT_EQ(with[i].tokens, without[i].tokens) << i;
    cached += with[i].cached;
    EXPECT_EQ(without[i].cached, 0);
  }
  EXPECT_GT(cached, 0);
  EXPECT_GT(with_stats.prefix_hits, 0u);
  EXPECT_LT(with_stats.prompt_tokens, without_stats.prompt_tokens);
}

TEST(Engine, CancelStopStringsAndLogprobs) {
  Loaded s = open(models_dir() + "/memorise-f32.gguf", 64);
  auto engine = Engine::create(*s.model, *s.opened.tokenizer, engine_config(4, true));
  ASSERT_TRUE(engine.ok());
  const auto prompt = s.opened.tokenizer->encode("Alice was beginning to get very tired");
  std::map<std::uint64_t, Result1> got;
  auto cb = [&got](const RequestEvent& e) {
    Result1& r = got[e.id];
    r.tokens.insert(r.tokens.end(), e.tokens.begin(), e.tokens.end());
    r.text += e.text;
    r.logprobs.insert(r.logprobs.end(), e.logprobs.begin(), e.logprobs.end());
    if (e.finished) r.finish = e.finish;
  };
  RequestOptions stop = greedy(100);
  stop.stop_strings = {"sister"};
  RequestOptions lp = greedy(5);
  lp.top_logprobs = 3;
  const auto a = *(*engine)->submit(prompt, greedy(200), cb);
  const auto b = *(*engine)->submit(prompt, stop, cb);
  const auto c = *(*engine)->submit(prompt, lp, cb);
  for (int i = 0; i < 4; ++i) ASSERT_TRUE((*engine)->step().ok());
  (*engine)->cancel(a);
  ASSERT_TRUE((*engine)->run_until_idle().ok());
  EXPECT_EQ(got[a].finish, RequestFinish::kCancelled);
  EXPECT_LT(got[a].tokens.size(), 200u);
  EXPECT_EQ(got[b].finish, RequestFinish::kStop);
  EXPECT_EQ(got[b].text, " of sitting by her ");  // the memorised continuation, cut before "sister"
  ASSERT_EQ(got[c].logprobs.size(), 5u);
  for (std::size_t i = 0; i < 5; ++i) {
    const TokenLogprob& l = got[c].logprobs[i];
    EXPECT_EQ(l.token, got[c].tokens[i]);
    ASSERT_EQ(l.top.size(), 3u);
    EXPECT_EQ(l.top[0].first, l.token);  // greedy picks the most likely
    EXPECT_FLOAT_EQ(l.top[0].second, l.logprob);
    EXPECT_LE(l.logprob, 0.0f);
    EXPECT_GE(l.top[0].second, l.top[1].second);
    EXPECT_GE(l.top[1].second, l.top[2].second);
  }
  // Bad requests are refused at submission.
  EXPECT_FALSE((*engine)->submit({}, greedy(4), cb).ok());
  EXPECT_FALSE((*engine)->submit(std::vector<std::int32_t>(600, 5), greedy(4), cb).ok());
  EXPECT_FALSE((*engine)->submit(prompt, greedy(0), cb).ok());
  EXPECT_FALSE((*engine)->submit({1 << 20}, greedy(4), cb).ok());
}

// A constraint that allows a fixed cycle of tokens, one at a time, and records what it was told.
class CycleConstraint final : public TokenConstraint {
 public:
  explicit CycleConstraint(std::vector<std::int32_t> cycle) : cycle_(std::move(cycle)) {}
  void fill_mask(std::span<std::uint32_t> words) override {
    for (const std::uint32_t w : words) EXPECT_EQ(w, 0u);  // the engine hands it zeroed
    const std::int32_t t = cycle_[accepted.size() % cycle_.size()];
    words[static_cast<std::size_t>(t) / 32] |= 1u << (t % 32);
    ++masks;
  }
  void accept(std::int32_t token) override { accepted.push_back(token); }
  std::vector<std::int32_t> accepted;
  int masks = 0;

 private:
  std::vector<std::int32_t> cycle_;
};

// Structured output's hook: a constrained request samples only what its mask allows, the
// constraint is told every token, and the unconstrained requests of the same steps (greedy, on
// their best candidates) are untouched; a test script overrides sampling the same way.
TEST(Engine, AConstraintMasksEveryTokenAndTheOthersRunAsBefore) {
  Loaded s = open(models_dir() + "/memorise-f32.gguf", 64);
  const auto prompt = s.opened.tokenizer->encode("Alice was beginning to get very tired");
  const auto free_alone = run_batch(*s.model, *s.opened.tokenizer, {prompt}, {0}, 1, false, 12);
  auto engine = Engine::create(*s.model, *s.opened.tokenizer, engine_config(4, false));
  ASSERT_TRUE(engine.ok());
  std::map<std::uint64_t, Result1> got;
  auto cb = [&got](const RequestEvent& e) {
    Result1& r = got[e.id];
    r.tokens.insert(r.tokens.end(), e.tokens.begin(), e.tokens.end());
    if (e.finished) r.finish = e.finish;
  };
  const std::vector<std::int32_t> cycle = {17, 242, 99};
  auto constraint = std::make_shared<CycleConstraint>(cycle);
  RequestOptions held = greedy(12);
  held.sampling.temperature = 0.8f;  // sampled, yet only the allowed token can come
  held.sampling.seed = 5;
  held.constraint = constraint;
  RequestOptions scripted = greedy(12);
  scripted.script = {11, 12, 13};
  const auto a = *(*engine)->submit(prompt, held, cb);
  const auto b = *(*engine)->submit(prompt, greedy(12), cb);
  const auto c = *(*engine)->submit(prompt, scripted, cb);
  ASSERT_TRUE((*engine)->run_until_idle().ok());
  ASSERT_EQ(got[a].tokens.size(), 12u);
  for (std::size_t i = 0; i < 12; ++i) EXPECT_EQ(got[a].tokens[i], cycle[i % cycle.size()]) << i;
  EXPECT_EQ(constraint->accepted, got[a].tokens);
  EXPECT_EQ(constraint->masks, 12);
  EXPECT_EQ(got[b].tokens, free_alone[0].tokens);
  ASSERT_EQ(got[c].tokens.size(), 12u);
  EXPECT_EQ(std::vector<std::int32_t>(got[c].tokens.begin(), got[c].tokens.begin() + 3),
            (std::vector<std::int32_t>{11, 12, 13}));
}

TEST(Engine, ADeviceErrorFailsTheStepsRequestsAndKeepsCancelledOnesCancelled) {
  auto o = open_model(models_dir() + "/memorise-f32.gguf");
  ASSERT_TRUE(o.ok());
  hal::DeviceOptions d;
  d.set("threads", 1);
  d.set("fail_at_op", 3);  // inside the first forward
  auto device = *(*backends::default_registry().find("cpu"))->create_device(0, d);
  ModelOptions mo;
  mo.kv.num_blocks = 9;
  mo.max_batch_tokens = 256;
  mo.max_logit_rows = 16;
  auto m = Model::load(*o->weights, o->config, *device, mo);
  ASSERT_TRUE(m.ok());
  auto engine = Engine::create(**m, *o->tokenizer, engine_config(4, true));
  ASSERT_TRUE(engine.ok());
  std::map<std::uint64_t, RequestEvent> last;
  auto cb = [&last](const RequestEvent& e) { last[e.id] = e; };
  const auto prompt = o->tokenizer->encode("Alice was beginning");
  const auto a = *(*engine)->submit(prompt, greedy(4), cb);
  const auto b = *(*engine)->submit(prompt, greedy(4), cb);
  const auto c = *(*engine)->submit(prompt, greedy(4), cb);
  (*engine)->cancel(c);
  const Status st = (*engine)->step();
  ASSERT_EQ(st.code(), StatusCode::kInternal);
  for (auto id : {a, b}) {
    ASSERT_TRUE(last[id].finished);
    EXPECT_EQ(last[id].finish, RequestFinish::kError);
    EXPECT_NE(last[id].error.message().find("injected failure"), std::string::npos) << last[id].error.to_string();
  }
  ASSERT_TRUE(last[c].finished);
  EXPECT_EQ(last[c].finish, RequestFinish::kCancelled);
  EXPECT_FALSE((*engine)->has_work());
}

TEST(Engine, RequestsFromAnotherThreadWhileTheEngineSteps) {
  Loaded s = open(models_dir() + "/memorise-q8_0.gguf", 16 * 8 + 1);
  auto engine = Engine::create(*s.model, *s.opened.tokenizer, engine_config(16, true));
  ASSERT_TRUE(engine.ok());
  const auto prompt = s.opened.tokenizer->encode("Alice was beginning to get very tired of sitting");
  std::mutex mu;
  std::map<std::uint64_t, Result1> got;
  std::atomic<int> finished{0};
  constexpr int kRequests = 24;
  std::thread client([&] {
    std::mt19937 rng(9);
    for (int i = 0; i < kRequests; ++i) {
      std::vector<std::int32_t> p(prompt.begin(), prompt.begin() + 3 + static_cast<std::ptrdiff_t>(rng() % 8));
      auto id = (*engine)->submit(p, greedy(6 + static_cast<std::int64_t>(rng() % 10)), [&](const RequestEvent& e) {
        std::lock_guard<std::mutex> lock(mu);
        Result1& r = got[e.id];
        r.tokens.insert(r.tokens.end(), e.tokens.begin(), e.tokens.end());
        if (e.finished) {
          r.finish = e.finish;
          ++finished;
        }
      });
      ASSERT_TRUE(id.ok());
      if (i % 5 == 4) (*engine)->cancel(*id);
      std::this_thread::sleep_for(std::chrono::microseconds(rng() % 2000));
    }
  });
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (finished.load() < kRequests && std::chrono::steady_clock::now() < deadline) {
    if ((*engine)->has_work()) {
      ASSERT_TRUE((*engine)->step().ok());
    } else {
      std::this_thread::yield();
    }
  }
  client.join();
  ASSERT_EQ(finished.load(), kRequests);
  int cancelled = 0;
  for (auto& [id, r] : got) {
    EXPECT_NE(r.finish, RequestFinish::kNone) << id;
    cancelled += r.finish == RequestFinish::kCancelled ? 1 : 0;
  }
  EXPECT_LE(cancelled, kRequests / 5);
  const EngineStats st = (*engine)->stats();
  EXPECT_EQ(st.running, 0);
  EXPECT_EQ(st.waiting, 0);
  EXPECT_FALSE((*engine)->has_work());
}

}  // namespace
}  // namespace sx::engine
