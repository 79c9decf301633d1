// The scheduler and KV manager against a fake model, without a device (DESIGN.md §7.7).
//
// The fake model keeps a "KV store": for every slot the token written there. A step writes each
// scheduled token into the slot its block table gives, and a sampled token is a hash of the whole
// context read back through the block table, after checking that every position holds the right
// token. So wrong paging, a prefix-cache block with other tokens, a lost block or a wrong recompute
// after preemption all change outputs or fail the check; the reference output of a request is the
// same hash chain computed directly.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <random>
#include <vector>

#include "runtime/sched/scheduler.h"

namespace sx::sched {
namespace {

constexpr std::int32_t kVocab = 50;
constexpr std::int32_t kStopId = 0;

std::int32_t next_token(std::span<const std::int32_t> context) {
  std::uint64_t h = 1469598103934665603ull;
  for (std::int32_t t : context) h = (h ^ static_cast<std::uint64_t>(t)) * 1099511628211ull;
  return static_cast<std::int32_t>((h >> 17) % kVocab);
}

// What a request must produce when run alone.
std::vector<std::int32_t> reference_output(const std::vector<std::int32_t>& prompt, std::int64_t max_tokens,
                                           std::int64_t cap) {
  std::vector<std::int32_t> ctx = prompt, out;
  while (true) {
    const std::int32_t t = next_token(ctx);
    out.push_back(t);
    ctx.push_back(t);
    if (t == kStopId || static_cast<std::int64_t>(out.size()) >= max_tokens || static_cast<std::int64_t>(ctx.size()) >= cap) {
      return out;
    }
  }
}

struct FakeModel {
  kv::KvCacheManager& kv;
  std::vector<std::int32_t> store;  // slot -> token (-1: never written)

  explicit FakeModel(kv::KvCacheManager& m)
      : kv(m), store(static_cast<std::size_t>(m.pool().num_blocks() * m.block_size()), -1) {}

  // Runs a step; returns the sampled tokens (in scheduled order) or fails the test.
  std::vector<std::int32_t> run(const SchedulerOutput& out) {
    std::vector<std::int32_t> sampled;
    const std::int64_t bs = kv.block_size();
    for (const ScheduledRequest& s : out.scheduled) {
      const Request& r = *s.request;
      const auto& table = kv.block_table(r.id);
      EXPECT_GE(static_cast<std::int64_t>(table.size()) * bs, s.start + s.num_tokens) << "request " << r.id;
      for (std::int64_t i = s.start; i < s.start + s.num_tokens; ++i) {
        const std::int64_t slot = table[static_cast<std::size_t>(i / bs)] * bs + i % bs;
        EXPECT_NE(table[static_cast<std::size_t>(i / bs)], kv::kNullBlock);
        store[static_cast<std::size_t>(slot)] = r.token_at(i);
      }
      if (!s.sample) continue;
      // Read the whole context back through the block table.
      const std::int64_t n = s.start + s.num_tokens;
      std::vector<std::int32_t> ctx;
      for (std::int64_t i = 0; i < n; ++i) {
        const std::int64_t slot = table[static_cast<std::size_t>(i / bs)] * bs + i % bs;
        const std::int32_t t = store[static_cast<std::size_t>(slot)];
        if (t != r.token_at(i)) {
          ADD_FAILURE() << "request " << r.id << " position " << i << " reads token " << t << ", expected "
                        << r.token_at(i);
          return {};
        }
        ctx.push_back(t);
      }
      sampled.push_back(next_token(ctx));
    }
    return sampled;
  }
};

struct Stress {
  int requests;
  std::int64_t num_blocks, block_size, budget, max_seqs;
  bool prefix_caching;
  double cancel_rate;
  double max_step_ms = 0;  // paced steps, timed by fake_step_seconds
};

// A device whose step takes 1 ms + 0.1 ms a decode token + 1 ms a prefill token.
double fake_step_seconds(const SchedulerOutput& out) {
  return 0.001 + 0.0001 * static_cast<double>(out.num_decode_tokens) + 0.001 * static_cast<double>(out.num_prefill_tokens);
}

class SchedulerStress : public ::testing::TestWithParam<Stress> {};

TEST_P(SchedulerStress, EveryRequestFinishesWithItsOwnOutputAndThePoolEmpties) {
  const Stress p = GetParam();
  kv::KvCacheManager kv({p.num_blocks, p.block_size, p.prefix_caching, 5, 0.05});
  SchedulerConfig sc;
  sc.max_num_batched_tokens = p.budget;
  sc.max_num_seqs = p.max_seqs;
  sc.max_model_len = 96;
  sc.max_step_ms = p.max_step_ms;
  Scheduler s(sc, kv);
  FakeModel model(kv);
  std::mt19937 rng(1234);
  const std::int64_t cap = std::min<std::int64_t>(sc.max_model_len, (p.num_blocks - 1) * p.block_size);
  // Prompts share prefixes drawn from a few stems, so the prefix cache is exercised.
  std::vector<std::vector<std::int32_t>> stems(8);
  for (auto& stem : stems) {
    stem.resize(40);
    for (auto& t : stem) t = 1 + static_cast<std::int32_t>(rng() % (kVocab - 1));
  }
  std::map<std::uint64_t, std::vector<std::int32_t>> expected;
  std::map<std::uint64_t, bool> cancelled;
  std::map<std::uint64_t, std::unique_ptr<Request>> done;
  std::uint64_t next_id = 1;
  int submitted = 0;
  std::vector<std::uint64_t> live;
  std::uint64_t steps = 0, preempted_seen = 0;
  while (submitted < p.requests || s.has_work()) {
    // Random arrivals.
    for (int k = static_cast<int>(rng() % 4); k > 0 && submitted < p.requests; --k, ++submitted) {
      auto r = std::make_unique<Request>();
      r->id = next_id++;
      const auto& stem = stems[rng() % stems.size()];
      const auto shared = static_cast<std::size_t>(rng() % 40);
      r->prompt.assign(stem.begin(), stem.begin() + static_cast<std::ptrdiff_t>(shared));
      const int extra = 1 + static_cast<int>(rng() % 30);
      for (int i = 0; i < extra; ++i) r->prompt.push_back(1 + static_cast<std::int32_t>(rng() % (kVocab - 1)));
      r->max_tokens = 1 + static_cast<std::int64_t>(rng() % 40);
      r->stop_ids = {kStopId};
      expected[r->id] = reference_output(r->prompt, r->max_tokens, cap);
      live.push_back(r->id);
      ASSERT_TRUE(s.add(std::move(r)).ok());
    }
    // Random cancellations.
    if (!live.empty() && std::uniform_real_distribution<double>(0, 1)(rng) < p.cancel_rate) {
      const std::uint64_t id = live[rng() % live.size()];
      s.cancel(id);
      cancelled[id] = true;
    }
    const SchedulerOutput out = s.schedule();
    preempted_seen += out.preempted.size();
    EXPECT_LE(out.num_batched_tokens, p.budget);
    EXPECT_LE(static_cast<std::int64_t>(out.scheduled.size()), p.max_seqs);
    const auto sampled = model.run(out);
    if (HasFailure()) return;
    s.observe_step(out, fake_step_seconds(out));
    s.update(out, sampled);
    for (auto& r : s.take_finished()) {
      live.erase(std::remove(live.begin(), live.end(), r->id), live.end());
      done[r->id] = std::move(r);
    }
    ASSERT_LT(++steps, 2'000'000u) << "no progress";
  }
  ASSERT_EQ(done.size(), static_cast<std::size_t>(p.requests));
  std::uint64_t preempted_requests = 0;
  int checked = 0;
  for (auto& [id, r] : done) {
    ASSERT_NE(r->finish, FinishReason::kNone) << id;
    preempted_requests += r->num_preemptions > 0 ? 1 : 0;
    if (r->finish == FinishReason::kCancelled) {
      EXPECT_TRUE(cancelled[id]) << id;
      // A cancelled request's output is a prefix of what it would have produced.
      const auto& e = expected[id];
      ASSERT_LE(r->output.size(), e.size());
      EXPECT_TRUE(std::equal(r->output.begin(), r->output.end(), e.begin())) << id;
      continue;
    }
    EXPECT_EQ(r->output, expected[id]) << "request " << id << " (preempted " << r->num_preemptions << " times)";
    EXPECT_EQ(r->finish, r->output.back() == kStopId ? FinishReason::kStop : FinishReason::kLength) << id;
    ++checked;
  }
  EXPECT_EQ(kv.num_free_blocks(), kv.pool().usable_blocks());
  EXPECT_EQ(s.stats().preemptions, preempted_seen);
  std::printf("%d requests (%d compared in full, %zu cancelled), %llu steps, %llu preemptions of %llu requests, "
              "prefix hits %llu of %llu tokens\n",
              p.requests, checked, cancelled.size(), static_cast<unsigned long long>(steps),
              static_cast<unsigned long long>(preempted_seen), static_cast<unsigned long long>(preempted_requests),
              static_cast<unsigned long long>(kv.stats().prefix_hits),
              static_cast<unsigned long long>(kv.stats().prefix_queries));
  if (p.num_blocks < 40) {
    EXPECT_GT(preempted_seen, 0u) << "the small pool should force preemptions";
  }
}

INSTANTIATE_TEST_SUITE_P(
    Pools, SchedulerStress,
    ::testing::Values(Stress{10'000, 24, 8, 64, 16, true, 0.05},    // tight pool: many preemptions
                      Stress{10'000, 400, 16, 256, 32, true, 0.05},  // roomy pool: batching + prefix reuse
                      Stress{2'000, 20, 4, 16, 8, false, 0.1},       // no prefix cache, tiny budget
                      // Paced steps (a 10 ms target on the fake device): the same outputs.
                      Stress{10'000, 24, 8, 64, 16, true, 0.05, 10.0},
                      Stress{10'000, 400, 16, 256, 32, true, 0.05, 10.0}));

TEST(Scheduler, RefusesPromptsThatCannotFitWithClearErrors) {
  kv::KvCacheManager kv({5, 4, true, 0, 0.0});  // 16 tokens of pool
  SchedulerConfig sc;
  sc.max_model_len = 64;
  Scheduler s(sc, kv);
  auto r = std::make_unique<Request>();
  r->id = 1;
  r->prompt.assign(16, 3);
  const Status st = s.add(std::move(r));
  ASSERT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("16 tokens"), std::string::npos) << st.to_string();
  auto empty = std::make_unique<Request>();
  empty->id = 2;
  EXPECT_EQ(s.add(std::move(empty)).code(), StatusCode::kInvalidArgument);
}

TEST(Scheduler, ARequestThatFillsThePoolAloneStillRuns) {
  // 9 usable blocks of 16: a 130-token prompt needs all of them; the admission watermark (here 20%)
  // must not keep a request out when nothing else runs, or the engine would spin forever.
  kv::KvCacheManager kv({10, 16, true, 0, 0.2});
  SchedulerConfig sc;
  sc.max_num_batched_tokens = 512;
  sc.max_model_len = 1024;
  Scheduler s(sc, kv);
  auto r = std::make_unique<Request>();
  r->id = 1;
  r->prompt.assign(130, 3);
  r->max_tokens = 50;
  ASSERT_TRUE(s.add(std::move(r)).ok());
  int steps = 0;
  while (s.has_work() && steps < 100) {
    const SchedulerOutput out = s.schedule();
    ASSERT_FALSE(out.scheduled.empty()) << "no progress at step " << steps;
    std::vector<std::int32_t> sampled;
    for (const auto& x : out.scheduled) {
      if (x.sample) sampled.push_back(7);
    }
    s.update(out, sampled);
    ++steps;
  }
  auto done = s.take_finished();
  ASSERT_EQ(done.size(), 1u);
  EXPECT_EQ(done[0]->finish, FinishReason::kLength);
  EXPECT_EQ(done[0]->num_tokens(), 144);  // stopped at the pool's 9 x 16 tokens
  EXPECT_EQ(kv.num_free_blocks(), 9);
}

TEST(Scheduler, ChunkedPrefillRunsDecodesFirst) {
  kv::KvCacheManager kv({64, 4, false, 0, 0.0});
  SchedulerConfig sc;
  sc.max_num_batched_tokens = 8;
  Scheduler s(sc, kv);
  auto a = std::make_unique<Request>();
  a->id = 1;
  a->prompt = {1, 2, 3};
  a->max_tokens = 10;
  ASSERT_TRUE(s.add(std::move(a)).ok());
  SchedulerOutput o1 = s.schedule();
  ASSERT_EQ(o1.scheduled.size(), 1u);
  EXPECT_TRUE(o1.scheduled[0].sample);
  s.update(o1, std::vector<std::int32_t>{5});
  auto b = std::make_unique<Request>();
  b->id = 2;
  b->prompt.assign(20, 4);
  ASSERT_TRUE(s.add(std::move(b)).ok());
  SchedulerOutput o2 = s.schedule();
  ASSERT_EQ(o2.scheduled.size(), 2u);
  EXPECT_EQ(o2.scheduled[0].request->id, 1u);  // the decode first
  EXPECT_EQ(o2.scheduled[0].num_tokens, 1);
  EXPECT_EQ(o2.scheduled[1].num_tokens, 7);  // the rest of the budget
  EXPECT_FALSE(o2.scheduled[1].sample);
}

TEST(Scheduler, PrefillChunksEndAtSnapshotPositions) {
  // A hybrid's prefix cache keeps states where chunks end: a 50-token prompt with snapshot
  // positions 16 and 48 runs as 16 + 32 + 2 with a budget of 40, unpaced and paced alike.
  for (const double pace : {0.0, 100.0}) {
    kv::KvCacheManager kv({64, 4, false, 0, 0.0});
    SchedulerConfig sc;
    sc.max_num_batched_tokens = 40;
    sc.max_step_ms = pace;
    Scheduler s(sc, kv);
    auto a = std::make_unique<Request>();
    a->id = 1;
    a->prompt.assign(50, 3);
    a->max_tokens = 2;
    a->snapshot_at = {16, 48};
    ASSERT_TRUE(s.add(std::move(a)).ok());
    std::vector<std::int64_t> chunks;
    for (int i = 0; i < 3; ++i) {
      SchedulerOutput o = s.schedule();
      ASSERT_EQ(o.scheduled.size(), 1u);
      chunks.push_back(o.scheduled[0].num_tokens);
      s.update(o, o.scheduled[0].sample ? std::vector<std::int32_t>{7} : std::vector<std::int32_t>{});
    }
    EXPECT_EQ(chunks, (std::vector<std::int64_t>{16, 32, 2})) << "paced " << pace;
  }
}

// ---- Paced steps (issue 24) ------------------------------------------------------------------

TEST(StepCostModel, FitsTheStepsItSawAndSaysWhatFitsTheTarget) {
  StepCostModel m;
  EXPECT_FALSE(m.coefficients().ready);
  EXPECT_EQ(m.prefill_budget(4, 0.5, 16, 2048), 64);  // cold: a small first chunk
  EXPECT_EQ(m.prefill_budget(4, 0.5, 16, 2048, 8), 16);  // never below the minimum
  std::mt19937 rng(7);
  for (int i = 0; i < 40; ++i) {
    const std::int64_t d = static_cast<std::int64_t>(rng() % 8);
    const std::int64_t p = i % 3 == 0 ? 0 : static_cast<std::int64_t>(rng() % 200);
    m.observe(d, p, 0.2 + 0.01 * static_cast<double>(d) + 0.02 * static_cast<double>(p));
  }
  const auto& c = m.coefficients();
  ASSERT_TRUE(c.ready);
  EXPECT_NEAR(c.fixed, 0.2, 1e-6);
  EXPECT_NEAR(c.per_decode, 0.01, 1e-6);
  EXPECT_NEAR(c.per_prefill, 0.02, 1e-6);
  EXPECT_EQ(m.prefill_budget(4, 0.51, 8, 2048), 13);    // (0.51 - 0.24) / 0.02 = 13.5
  EXPECT_EQ(m.prefill_budget(40, 0.5, 16, 2048), 16);   // the decodes alone exceed it: the minimum
  EXPECT_EQ(m.prefill_budget(0, 100.0, 16, 512), 512);  // the token cap
  // The pace of d decodes alone: what such steps took where seen (d < 8 here), else the fit.
  EXPECT_NEAR(m.decode_step(3), 0.23, 1e-9);
  EXPECT_NEAR(m.decode_step(12), 0.32, 1e-6);
}

// A device whose steps also pay for the rows each prefill token attends to (2 us a row): the fit
// finds that term once chunks from several places in a prompt were seen, and a chunk far into a
// long prompt gets fewer tokens, so that its step still ends within the target.
TEST(StepCostModel, LearnsThatLateChunksOfALongPromptCostMore) {
  auto cost = [](std::int64_t d, std::int64_t n, std::int64_t start) {
    return 0.02 + 0.0005 * static_cast<double>(d) + 0.001 * static_cast<double>(n) +
           2e-6 * prefill_context_rows(start, n);
  };
  StepCostModel m;
  std::int64_t start = 0;
  for (int i = 0; i < 60; ++i) {
    const std::int64_t n = 8 + (i * 7) % 33;
    m.observe(4, n, cost(4, n, start), prefill_context_rows(start, n));
    start = (start + n) % 2000;
  }
  const auto& c = m.coefficients();
  ASSERT_TRUE(c.ready);
  EXPECT_NEAR(c.per_context, 2e-6, 1e-9);
  EXPECT_NEAR(c.per_prefill, 0.001, 1e-6);
  for (const std::int64_t at : {0, 500, 1500}) {
    const std::int64_t n = m.prefill_budget(4, 0.1, 4, 2048, 64, at);
    EXPECT_LE(cost(4, n, at), 0.1 + 1e-9) << "at " << at;
    EXPECT_GT(cost(4, n + 1, at), 0.1) << "at " << at << ": one more token would still fit";
    std::printf("a 100 ms step beside 4 decodes: %lld prompt tokens from position %lld\n", static_cast<long long>(n),
                static_cast<long long>(at));
  }
  EXPECT_LT(m.prefill_budget(4, 0.1, 4, 2048, 64, 1500), m.prefill_budget(4, 0.1, 4, 2048, 64, 0));
}

TEST(StepCostModel, ThePaceOfDecodesAloneIsPerCount) {
  StepCostModel m;
  EXPECT_EQ(m.decode_step(1), 0.0);  // nothing seen
  for (int i = 0; i < 10; ++i) m.observe(1, 0, 0.020);
  EXPECT_NEAR(m.decode_step(9), 0.020, 1e-12);  // not ready: the only pace there is
  for (int i = 0; i < 12; ++i) m.observe(1, 8 + 8 * (i % 3), 0.020 + 0.001 * (8 + 8 * (i % 3)) + 0.002 * 8);
  ASSERT_TRUE(m.coefficients().ready);
  EXPECT_NEAR(m.decode_step(1), 0.020, 1e-12);  // measured
  // Nine streams never decoded alone: the fit says 9 decodes cost more than one stream's pace.
  EXPECT_GT(m.decode_step(9), 0.020);
  EXPECT_NEAR(m.decode_step(9), m.predict(9, 0), 1e-12);
  for (int i = 0; i < 30; ++i) m.observe(9, 0, 0.040);
  EXPECT_NEAR(m.decode_step(9), 0.040, 1e-9);
  EXPECT_NEAR(m.decode_step(1), 0.020, 1e-12);
}

TEST(StepCostModel, FollowsADeviceThatGetsSlower) {
  StepCostModel m;
  auto feed = [&](double scale, int steps) {
    for (int i = 0; i < steps; ++i) {
      const std::int64_t p = (i % 4) * 40;
      m.observe(4, p, scale * (0.1 + 0.005 * static_cast<double>(p)));
    }
  };
  feed(1.0, 64);
  const std::int64_t fast = m.prefill_budget(4, 0.5, 16, 2048);
  EXPECT_NEAR(static_cast<double>(fast), 80.0, 1.0);  // (0.5 - 0.1) / 0.005
  feed(2.0, 64);        // every step now takes twice as long
  const std::int64_t slow = m.prefill_budget(4, 0.5, 16, 2048);
  EXPECT_NEAR(static_cast<double>(slow), 30.0, 1.0);  // (0.5 - 0.2) / 0.01
  std::printf("prefill budget at a 500 ms target: %lld tokens, then %lld once steps took twice as long\n",
              static_cast<long long>(fast), static_cast<long long>(slow));
}

// A scheduler whose steps are timed by fake_step_seconds, and the fake model under it.
struct Paced {
  kv::KvCacheManager kv{{4096, 16, false, 0, 0.0}};
  Scheduler s;
  FakeModel model{kv};
  std::uint64_t next_id = 1;
  explicit Paced(double max_step_ms, double ratio = 0, std::int64_t budget = 2048)
      : s(config(max_step_ms, ratio, budget), kv) {}
  static SchedulerConfig config(double max_step_ms, double ratio, std::int64_t budget) {
    SchedulerConfig c;
    c.max_num_batched_tokens = budget;
    c.max_model_len = 8192;
    c.max_step_ms = max_step_ms;
    c.max_step_ratio = ratio;
    return c;
  }
  std::uint64_t add(std::int64_t prompt, std::int64_t max_tokens) {
    auto r = std::make_unique<Request>();
    r->id = next_id++;
    for (std::int64_t i = 0; i < prompt; ++i) r->prompt.push_back(1 + static_cast<std::int32_t>((i * 7 + r->id) % 40));
    r->max_tokens = max_tokens;
    const std::uint64_t id = r->id;
    EXPECT_TRUE(s.add(std::move(r)).ok());
    return id;
  }
  // One step: its output, after the model ran it and the scheduler learnt its time.
  SchedulerOutput step() {
    SchedulerOutput out = s.schedule();
    const auto sampled = model.run(out);
    s.observe_step(out, fake_step_seconds(out));
    s.update(out, sampled);
    return out;
  }
  // One stream (an 8-token prompt, 1,000 tokens to generate) decoding while the cost model sees
  // decode steps, then a few with prefill of two sizes; the stream's id.
  std::uint64_t add_stream_and_learn_costs() {
    const std::uint64_t stream = add(8, 1000);
    for (int i = 0; i < 20; ++i) step();
    for (int i = 0; i < 8; ++i) {
      add(4 + 8 * (i % 2), 1);
      step();
      step();
    }
    return stream;
  }
  static bool has(const SchedulerOutput& out, std::uint64_t id) {
    return std::any_of(out.scheduled.begin(), out.scheduled.end(),
                       [id](const ScheduledRequest& r) { return r.request->id == id; });
  }
};

// Four streams decode; a 2,000-token prompt arrives. Unpaced, its first step carries 2,044 tokens
// (the streams wait ~2 s of fake time for their next token); paced at 100 ms, every step carries
// every stream's decode and at most what fits (the target, after the cost model's first steps),
// and the prompt still gets its first token.
TEST(PacedScheduler, DecodesAreInEveryStepAndAStepStaysNearTheTarget) {
  for (const double target : {0.0, 100.0, 1000.0}) {
    SCOPED_TRACE(::testing::Message() << "max_step_ms " << target);
    // 1000 ms with max_step_ratio 2.5: the target is 2.5 decode-only steps (1.4 ms each) instead.
    Paced p(target, target == 1000.0 ? 2.5 : 0.0);
    std::vector<std::uint64_t> streams;
    for (int i = 0; i < 4; ++i) streams.push_back(p.add(8, 1000));
    for (int i = 0; i < 20; ++i) p.step();  // the streams decode; the cost model sees decode steps
    const std::uint64_t big = p.add(2000, 4);
    double longest = 0;
    int steps = 0;
    bool first_token = false;
    while (!first_token) {
      const SchedulerOutput out = p.step();
      ++steps;
      for (std::uint64_t id : streams) EXPECT_TRUE(Paced::has(out, id)) << "a stream missed step " << steps;
      longest = std::max(longest, fake_step_seconds(out));
      for (const ScheduledRequest& r : out.scheduled) first_token |= r.request->id == big && r.sample;
      ASSERT_LT(steps, 1000);
    }
    if (target == 0) {
      EXPECT_EQ(steps, 1);
      EXPECT_GT(longest, 1.9);
    } else if (target == 1000.0) {
      // 3.5 ms leave no room for prefill on this device: each step takes the minimum chunk.
      const std::int64_t chunk = SchedulerConfig{}.min_prefill_chunk;
      EXPECT_NEAR(p.s.stats().max_step_ms, 3.5, 0.01);
      EXPECT_LE(longest, 0.001 + 4 * 0.0001 + static_cast<double>(chunk) * 0.001 + 1e-9);
      EXPECT_EQ(steps, (2000 + chunk - 1) / chunk);
    } else {
      EXPECT_LE(longest, 0.1 * 1.01) << "a step beyond the target";
      EXPECT_GT(steps, 20);
    }
    std::printf("max_step_ms %g: the 2000-token prompt took %d steps; the longest step %.3f s\n", target, steps,
                longest);
  }
}

// Two long prompts arrive, then a short one: the short one is prefilled at once (shortest remaining
// first), and neither long one waits more than max_prefill_skips steps in a row for its turn.
TEST(PacedScheduler, AShortPromptIsNotStuckBehindLongOnesAndNoneStarves) {
  Paced p(30.0);
  for (int i = 0; i < 8; ++i) p.step();
  const std::uint64_t a = p.add(600, 2), b = p.add(600, 2);
  p.step();
  const std::uint64_t shorter = p.add(20, 2);
  const SchedulerOutput next = p.step();
  EXPECT_TRUE(Paced::has(next, shorter)) << "the short prompt waited behind the long ones";
  std::map<std::uint64_t, int> since;  // steps since each long prompt last got prefill
  int worst = 0;
  for (int i = 0; i < 400 && p.s.has_work(); ++i) {
    const SchedulerOutput out = p.step();
    for (const std::uint64_t id : {a, b}) {
      since[id] = Paced::has(out, id) ? 0 : since[id] + 1;
      worst = std::max(worst, since[id]);
    }
  }
  EXPECT_FALSE(p.s.has_work()) << "the long prompts did not finish";
  EXPECT_LE(worst, p.s.config().max_prefill_skips + 1);
  const SchedulerStats st = p.s.stats();
  EXPECT_DOUBLE_EQ(st.max_step_ms, 30.0);
  EXPECT_TRUE(st.cost.ready);
  EXPECT_NEAR(st.cost.per_prefill, 0.001, 1e-9);
}

// One stream decodes; then either 15 prompts of 64 tokens arrive together (a burst: more users wait
// for a first token than stream) or one prompt of the same 960 tokens. The burst's target grows by
// the 15 waiting per stream, so all 15 get their first token within two steps; the single prompt
// keeps the stream's pace: ~10 steps, none beyond the 100 ms target.
TEST(PacedScheduler, ABurstOfArrivalsIsNotHeldToThePaceOfOneStream) {
  for (const int prompts : {15, 1}) {
    SCOPED_TRACE(::testing::Message() << prompts << " prompt(s)");
    Paced p(100.0);
    const std::uint64_t stream = p.add_stream_and_learn_costs();
    ASSERT_TRUE(p.s.stats().cost.ready);
    std::vector<std::uint64_t> ids;
    for (int i = 0; i < prompts; ++i) ids.push_back(p.add(960 / prompts, 2));
    std::map<std::uint64_t, bool> started;
    int steps = 0;
    double longest = 0;
    while (started.size() < ids.size()) {
      const SchedulerOutput out = p.step();
      ++steps;
      EXPECT_TRUE(Paced::has(out, stream)) << "the stream missed step " << steps;
      longest = std::max(longest, fake_step_seconds(out));
      for (const ScheduledRequest& r : out.scheduled) {
        if (r.sample && std::find(ids.begin(), ids.end(), r.request->id) != ids.end()) started[r.request->id] = true;
      }
      ASSERT_LT(steps, 1000);
    }
    if (prompts == 15) {
      EXPECT_LE(steps, 2);
    } else {
      EXPECT_GE(steps, 9);
      EXPECT_LE(longest, 0.1 * 1.01) << "a step beyond the target";
    }
    std::printf("%d prompt(s) of %d tokens beside one stream: first tokens after %d steps, the longest %.3f s\n",
                prompts, 960 / prompts, steps, longest);
  }
}

// The rest of a burst is not paced by the burst's own first part: one stream decodes; 10 prompts
// arrive and start together (the burst rule above); 5 more arrive a step later (the slower
// clients of the same burst). The 10 have just started, so they count with the 5 waiting, not with
// the stream: the 5 get their first tokens within two steps, where the pace of 11 streams would
// spread them over 4 steps of 100 ms; every stream still decodes in every step.
TEST(PacedScheduler, StreamsThatJustStartedCountWithTheBurst) {
  Paced p(100.0);
  const std::uint64_t stream = p.add_stream_and_learn_costs();
  ASSERT_TRUE(p.s.stats().cost.ready);
  auto first_tokens = [&](const std::vector<std::uint64_t>& ids, const std::vector<std::uint64_t>& streams) {
    std::map<std::uint64_t, bool> started;
    int steps = 0;
    while (started.size() < ids.size()) {
      const SchedulerOutput out = p.step();
      ++steps;
      for (std::uint64_t s : streams) EXPECT_TRUE(Paced::has(out, s)) << "stream " << s << " missed step " << steps;
      for (const ScheduledRequest& r : out.scheduled) {
        if (r.sample && std::find(ids.begin(), ids.end(), r.request->id) != ids.end()) started[r.request->id] = true;
      }
      if (steps >= 1000) break;
    }
    return steps;
  };
  std::vector<std::uint64_t> first, rest;
  for (int i = 0; i < 10; ++i) first.push_back(p.add(64, 50));
  EXPECT_LE(first_tokens(first, {stream}), 2);
  for (int i = 0; i < 5; ++i) rest.push_back(p.add(64, 50));
  std::vector<std::uint64_t> streams = first;
  streams.push_back(stream);
  const int steps = first_tokens(rest, streams);
  EXPECT_LE(steps, 2);
  std::printf("the last 5 prompts of a burst beside 10 streams that just started: first tokens after %d step(s)\n", steps);
}

}  // namespace
}  // namespace sx::sched
