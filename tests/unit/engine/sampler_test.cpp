// Sampler and StopMatcher behaviour.
#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <numeric>
#include <random>
#include <vector>

#include "runtime/engine/sampler.h"
#include "runtime/engine/stop_matcher.h"
#include "runtime/hal/ops.h"

namespace sx::engine {
namespace {

std::vector<float> logits_of(std::vector<float> v) { return v; }

TEST(Sampler, GreedyPicksLowestIndexOfMax) {
  SamplingParams p;
  p.temperature = 0.0f;
  Sampler s(p, {});
  auto l = logits_of({0.1f, 2.0f, 2.0f, -1.0f});
  EXPECT_EQ(s.sample(l), 1);
}

TEST(Sampler, SameSeedSameTokens) {
  SamplingParams p;
  p.temperature = 1.0f;
  p.seed = 1234;
  std::vector<std::int32_t> a, b;
  Sampler s1(p, {}), s2(p, {});
  for (int i = 0; i < 50; ++i) {
    std::vector<float> l(100);
    for (int j = 0; j < 100; ++j) l[j] = std::sin(static_cast<float>(j * (i + 1)));
    auto l2 = l;
    a.push_back(s1.sample(l));
    b.push_back(s2.sample(l2));
  }
  EXPECT_EQ(a, b);
  p.seed = 99;
  Sampler s3(p, {});
  std::vector<std::int32_t> c;
  for (int i = 0; i < 50; ++i) {
    std::vector<float> l(100);
    for (int j = 0; j < 100; ++j) l[j] = std::sin(static_cast<float>(j * (i + 1)));
    c.push_back(s3.sample(l));
  }
  EXPECT_NE(a, c);
}

std::map<int, int> histogram(SamplingParams p, const std::vector<float>& logits, int n) {
  p.seed = 7;
  Sampler s(p, {});
  std::map<int, int> h;
  for (int i = 0; i < n; ++i) {
    auto l = logits;
    ++h[s.sample(l)];
  }
  return h;
}

TEST(Sampler, TopKTopPMinPRestrictTheSet) {
  const std::vector<float> l = {std::log(0.5f), std::log(0.3f), std::log(0.15f), std::log(0.05f)};
  SamplingParams p;
  p.top_k = 2;
  auto h = histogram(p, l, 2000);
  EXPECT_EQ(h.count(2) + h.count(3), 0u);
  EXPECT_NEAR(h[0] / 2000.0, 0.5 / 0.8, 0.05);
  p = SamplingParams{};
  p.top_p = 0.85f;  // 0.5 + 0.3 + 0.15 reaches 0.95 >= 0.85 at the third token
  h = histogram(p, l, 2000);
  EXPECT_EQ(h.count(3), 0u);
  EXPECT_GT(h[2], 0);
  p = SamplingParams{};
  p.min_p = 0.2f;  // drop tokens below 0.2 * 0.5 = 0.1
  h = histogram(p, l, 2000);
  EXPECT_EQ(h.count(3), 0u);
  EXPECT_GT(h[2], 0);
  // Temperature sharpens: at T = 0.1 token 0 dominates.
  p = SamplingParams{};
  p.temperature = 0.1f;
  h = histogram(p, l, 500);
  EXPECT_GT(h[0], 490);
}

TEST(Sampler, Penalties) {
  SamplingParams p;
  p.temperature = 0.0f;
  p.repetition_penalty = 2.0f;
  const std::vector<std::int32_t> prompt = {0};
  Sampler s(p, prompt);
  auto l = logits_of({3.0f, 2.0f, -1.0f});
  EXPECT_EQ(s.sample(l), 1);  // 3 / 2 = 1.5 < 2
  EXPECT_FLOAT_EQ(l[0], 1.5f);
  p = SamplingParams{};
  p.temperature = 0.0f;
  p.frequency_penalty = 1.0f;
  p.presence_penalty = 0.5f;
  Sampler f(p, {});
  f.accept(0);
  f.accept(0);
  auto l2 = logits_of({5.0f, 3.0f});
  EXPECT_EQ(f.sample(l2), 1);  // 5 - 0.5 - 2 = 2.5 < 3
  EXPECT_FLOAT_EQ(l2[0], 2.5f);
}

// A device that selects the best candidates (hal::TopKArgs order) hands sample_top what sample()
// would find in the whole row: the same seed then draws the same tokens, for top-k with top-p and
// min-p too; greedy takes the first. Penalties or an unbounded set need the whole row.
TEST(Sampler, CandidatesFromTheDeviceDrawWhatTheWholeRowDraws) {
  std::mt19937 gen(3);
  std::normal_distribution<float> n(0.0f, 2.0f);
  std::vector<float> row(5000);
  for (float& v : row) v = std::round(n(gen) * 4.0f) / 4.0f;  // ties between candidates
  std::vector<std::int32_t> order(row.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](std::int32_t a, std::int32_t b) {
    return hal::top_k_before(row[static_cast<std::size_t>(a)], a, row[static_cast<std::size_t>(b)], b);
  });
  const int limit = 64;
  std::vector<float> values;
  std::vector<std::int32_t> ids(order.begin(), order.begin() + limit);
  for (std::int32_t id : ids) values.push_back(row[static_cast<std::size_t>(id)]);
  struct Case {
    float temperature, top_p, min_p;
    int top_k;
  };
  for (const Case c : {Case{0.0f, 1.0f, 0.0f, 0}, Case{0.8f, 1.0f, 0.0f, 40}, Case{1.3f, 0.9f, 0.0f, 64},
                       Case{1.0f, 1.0f, 0.05f, 7}, Case{0.5f, 1.0f, 0.0f, 1}}) {
    SamplingParams p;
    p.temperature = c.temperature;
    p.top_p = c.top_p;
    p.min_p = c.min_p;
    p.top_k = c.top_k;
    p.seed = 11;
    Sampler whole(p, {}), narrowed(p, {});
    int k = 0;
    ASSERT_TRUE(narrowed.on_device_candidates(limit, &k));
    EXPECT_EQ(k, c.temperature == 0.0f || c.top_k == 1 ? 1 : c.top_k);
    for (int i = 0; i < 200; ++i) {
      std::vector<float> copy = row;
      ASSERT_EQ(whole.sample(copy), narrowed.sample_top(values, ids)) << "draw " << i << " top_k " << c.top_k;
    }
  }
  int k = 0;
  SamplingParams open;  // temperature 1, no top-k: the whole vocabulary
  EXPECT_FALSE(Sampler(open, {}).on_device_candidates(limit, &k));
  SamplingParams wide;
  wide.top_k = limit + 1;
  EXPECT_FALSE(Sampler(wide, {}).on_device_candidates(limit, &k));
  SamplingParams penalised;
  penalised.temperature = 0.0f;
  penalised.presence_penalty = 0.5f;
  EXPECT_FALSE(Sampler(penalised, {}).on_device_candidates(limit, &k));
}

TEST(Sampler, ValidateNamesTheField) {
  SamplingParams p;
  p.top_p = 0.0f;
  EXPECT_NE(p.validate().message().find("top_p"), std::string::npos);
  p = SamplingParams{};
  p.temperature = -1.0f;
  EXPECT_NE(p.validate().message().find("temperature"), std::string::npos);
}

TEST(StopMatcher, HoldsBackPrefixesAndCutsAtTheStop) {
  StopMatcher m({"END", "\n\n"});
  std::string out;
  out += m.push("hello E");
  EXPECT_EQ(out, "hello ");
  out += m.push("N");
  EXPECT_EQ(out, "hello ");
  out += m.push("x more\n");
  EXPECT_EQ(out, "hello ENx more");
  out += m.push("\nrest");
  EXPECT_TRUE(m.stopped());
  EXPECT_EQ(out, "hello ENx more");
  EXPECT_EQ(m.matched(), "\n\n");
  EXPECT_EQ(m.flush(), "");
}

TEST(StopMatcher, FlushReleasesAHeldPrefix) {
  StopMatcher m({"STOP"});
  EXPECT_EQ(m.push("abcST"), "abc");
  EXPECT_FALSE(m.stopped());
  EXPECT_EQ(m.flush(), "ST");
}

}  // namespace
}  // namespace sx::engine
