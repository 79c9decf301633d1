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
};

class SchedulerStress : public ::testing::TestWithParam<Stress> {};

TEST_P(SchedulerStress, EveryRequestFinishesWithItsOwnOutputAndThePoolEmpties) {
  const Stress p = GetParam();
  kv::KvCacheManager kv({p.num_blocks, p.block_size, p.prefix_caching, 5, 0.05});
  SchedulerConfig sc;
  sc.max_num_batched_tokens = p.budget;
  sc.max_num_seqs = p.max_seqs;
  sc.max_model_len = 96;
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
                      Stress{2'000, 20, 4, 16, 8, false, 0.1}));     // no prefix cache, tiny budget

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

}  // namespace
}  // namespace sx::sched
