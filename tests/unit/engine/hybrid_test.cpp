// Hybrid (Qwen3.5: Gated DeltaNet + gated attention) models on the CPU, through Model and the
// engine: a prompt prefilled in one step, in uneven chunks and a token at a time gives the same
// logits at every position, bit for bit (the DeltaNet states carry across steps in the recurrent
// form); 200 requests, batched, preempted and cancelled at random, each give the ids and logprob
// bits they give alone (whole and in prefill chunks of 16) and leave every state slot and KV block
// free; without state snapshots prefix caching is off for them and says so; with them (issue 55) an
// agent conversation, a branch and a prompt that parts before its predecessor's end are served
// from snapshots with the ids and logprob bits of an engine without a cache, and so are 80
// requests over shared prefixes under preemption and cancellation. qwen35 and qwen35moe (routed
// experts + the gated shared expert).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <map>
#include <random>
#include <string>
#include <unistd.h>
#include <vector>

#include "backends/registry.h"
#include "runtime/engine/engine.h"
#include "runtime/engine/model_loader.h"
#include "runtime/model/random_model.h"

namespace sx::engine {
namespace {

struct Hybrid {
  std::string path;
  OpenedModel opened;
  std::unique_ptr<hal::Device> device;
  std::unique_ptr<Model> model;
  ~Hybrid() { std::filesystem::remove(path); }
};

// A small random qwen35 / qwen35moe: 8 layers (3 and 7 full attention), 8 / 2 heads of 32, 4 QK /
// 12 V DeltaNet heads of 16 (V heads tiled over K heads as in llama.cpp's files).
// `backend`: "cpu", "vulkan" or "cuda" (null when it has no device here).
std::unique_ptr<Hybrid> make_hybrid(bool moe, std::int64_t blocks, std::int64_t snapshots = 0,
                                    const std::string& backend = "cpu", hal::DType weights = hal::DType::kF32) {
  static int made = 0;  // a file each: two models of one spec may be alive at once
  auto h = std::make_unique<Hybrid>();
  model::RandomModelSpec spec;
  spec.config = moe ? *model::find_qwen35moe_config("35b-a3b") : *model::find_qwen35_config("27b");
  model::ModelConfig& c = spec.config;
  model::set_hybrid_layers(c, 8);
  c.hidden = 128, c.n_heads = 8, c.n_kv_heads = 2, c.head_dim = 32, c.rot_dim = 8, c.rope_sections = {1, 1, 2, 0};
  c.ssm_k_heads = 4, c.ssm_v_heads = 12, c.ssm_head_dim = 16;
  c.vocab = 512, c.context_length = 2048, c.ffn = 192;
  if (moe) c.n_experts = 16, c.n_experts_used = 4, c.expert_ffn = 32, c.shared_expert_ffn = 48, c.ffn = 32;
  spec.weight_type = weights;
  spec.init_std = 0.1f;
  spec.seed = moe ? 8 : 7;
  h->path = (std::filesystem::temp_directory_path() /
             ("sx_hybrid_" + std::string(moe ? "moe_" : "") + std::to_string(::getpid()) + "_" +
              std::to_string(made++) + ".gguf"))
                .string();
  EXPECT_TRUE(model::write_random_gguf(spec, h->path).ok());
  auto o = open_model(h->path);
  EXPECT_TRUE(o.ok()) << o.status().to_string();
  h->opened = std::move(*o);
  hal::DeviceOptions d;
  if (backend == "cpu") d.set("threads", 2);
  auto b = backends::default_registry().find(backend);
  if (!b.ok()) return nullptr;
  auto device = (*b)->create_device(0, d);
  if (!device.ok()) return nullptr;
  h->device = std::move(*device);
  ModelOptions mo;
  mo.kv.num_blocks = blocks;
  mo.max_batch_tokens = 256;
  mo.max_logit_rows = 160;  // every position's logits of a 150-token prompt
  mo.max_state_slots = 16;
  mo.state_snapshots = snapshots;
  auto m = Model::load(*h->opened.weights, h->opened.config, *h->device, mo);
  EXPECT_TRUE(m.ok()) << m.status().to_string();
  h->model = std::move(*m);
  return h;
}

std::vector<std::int32_t> random_prompt(std::size_t n, unsigned seed) {
  std::mt19937 rng(seed);
  std::vector<std::int32_t> p(n);
  for (auto& t : p) t = static_cast<std::int32_t>(rng() % 500);
  return p;
}

// The logits of every position of `prompt` when it is fed in pieces of the given sizes.
std::vector<float> logits_in_pieces(Model& m, const std::vector<std::int32_t>& prompt,
                                    const std::vector<std::int32_t>& pieces) {
  std::vector<float> all, step;
  std::int32_t done = 0;
  for (const std::int32_t n : pieces) {
    ForwardBatch b = single_sequence_batch(std::span(prompt).subspan(static_cast<std::size_t>(done),
                                                                     static_cast<std::size_t>(n)),
                                           done, 16);
    b.logit_rows.clear();
    for (std::int32_t i = 0; i < n; ++i) b.logit_rows.push_back(i);
    b.seq_state_slot = {3};
    const Status st = m.forward(b, step);
    EXPECT_TRUE(st.ok()) << st.to_string();
    all.insert(all.end(), step.begin(), step.end());
    done += n;
  }
  return all;
}

TEST(Hybrid, OneChunkManyChunksAndTokenByTokenGiveTheSameLogits) {
  for (const bool moe : {false, true}) {
    SCOPED_TRACE(moe ? "qwen35moe" : "qwen35");
    auto h = make_hybrid(moe, 64);
    const auto prompt = random_prompt(150, moe ? 2 : 1);
    const auto whole = logits_in_pieces(*h->model, prompt, {150});
    const auto chunks = logits_in_pieces(*h->model, prompt, {37, 64, 1, 48});
    std::vector<std::int32_t> ones(150, 1);
    const auto tokens = logits_in_pieces(*h->model, prompt, ones);
    ASSERT_EQ(whole.size(), 150u * 512u);
    ASSERT_EQ(chunks.size(), whole.size());
    ASSERT_EQ(tokens.size(), whole.size());
    double scale = 0, d_chunks = 0, d_tokens = 0;
    for (std::size_t i = 0; i < whole.size(); ++i) {
      scale = std::max(scale, static_cast<double>(std::abs(whole[i])));
      d_chunks = std::max(d_chunks, static_cast<double>(std::abs(chunks[i] - whole[i])));
      d_tokens = std::max(d_tokens, static_cast<double>(std::abs(tokens[i] - whole[i])));
    }
    std::printf("%s: 150 positions' logits (max |logit| %.3g): chunks of 37, 64, 1, 48 within %.2g, a token at a "
                "time within %.2g of one step (both must be 0)\n",
                moe ? "qwen35moe" : "qwen35", scale, d_chunks, d_tokens);
    // Not just close: the same bits, however the prompt is split into steps (issue 53).
    EXPECT_EQ(d_chunks, 0.0);
    EXPECT_EQ(d_tokens, 0.0);
  }
}

RequestOptions greedy(std::int64_t n) {
  RequestOptions o;
  o.sampling.temperature = 0.0f;
  o.max_tokens = n;
  o.ignore_eos = true;
  o.top_logprobs = 0;  // the chosen token's logprob: compared bit for bit
  return o;
}

struct Outcome {
  std::vector<std::int32_t> tokens;
  std::vector<float> logprobs;
  RequestFinish finish = RequestFinish::kNone;
  std::int64_t cached = 0;
};

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

// Runs the prompts through one engine of max_seqs sequences: request i arrives at step arrive[i]
// and, when cancel_at[i] >= 0, is cancelled at that step.
std::vector<Outcome> run(Model& m, const tokenizer::Tokenizer& tok,
                         const std::vector<std::vector<std::int32_t>>& prompts, const std::vector<int>& arrive,
                         const std::vector<int>& cancel_at, std::int64_t max_seqs, std::int64_t n_new,
                         EngineStats* stats, std::int64_t max_batched_tokens = 256,
                         const std::vector<std::vector<std::int64_t>>* hints = nullptr) {
  EngineConfig c;
  c.snapshot_interval = 48;
  c.scheduler.max_num_batched_tokens = max_batched_tokens;
  c.scheduler.max_num_seqs = max_seqs;
  c.scheduler.max_model_len = 512;
  c.prefix_caching = true;  // asked for; a hybrid turns it off
  auto engine = Engine::create(m, tok, c);
  EXPECT_TRUE(engine.ok()) << engine.status().to_string();
  std::vector<Outcome> out(prompts.size());
  std::map<std::uint64_t, std::size_t> index;
  std::vector<std::uint64_t> ids(prompts.size());
  std::size_t submitted = 0;
  for (int step = 0; submitted < prompts.size() || (*engine)->has_work(); ++step) {
    for (std::size_t i = 0; i < prompts.size(); ++i) {
      if (arrive[i] == step) {
        RequestOptions o = greedy(n_new);
        if (hints != nullptr) o.snapshot_hints = (*hints)[i];
        auto id = (*engine)->submit(prompts[i], o, [&out, &index](const RequestEvent& e) {
          Outcome& r = out[index.at(e.id)];
          r.tokens.insert(r.tokens.end(), e.tokens.begin(), e.tokens.end());
          for (const TokenLogprob& l : e.logprobs) r.logprobs.push_back(l.logprob);
          if (e.finished) r.finish = e.finish;
          if (e.finished) r.cached = e.cached_prompt_tokens;
        });
        EXPECT_TRUE(id.ok()) << id.status().to_string();
        index[*id] = i;
        ids[i] = *id;
        ++submitted;
      }
      if (cancel_at[i] == step && arrive[i] <= step) (*engine)->cancel(ids[i]);
    }
    EXPECT_TRUE((*engine)->step().ok());
  }
  *stats = (*engine)->stats();
  return out;
}

TEST(Hybrid, TwoHundredRequestsBatchedPreemptedAndCancelledLeaveEverySlotFree) {
  for (const bool moe : {false, true}) {
    SCOPED_TRACE(moe ? "qwen35moe" : "qwen35");
    // 24 blocks of 16 tokens for up to 16 sequences of up to ~70 tokens: the pool runs out and
    // the scheduler preempts.
    auto h = make_hybrid(moe, 25);
    std::mt19937 rng(moe ? 12 : 11);
    const std::size_t n = 200;
    std::vector<std::vector<std::int32_t>> prompts;
    std::vector<int> arrive(n), cancel_at(n, -1);
    for (std::size_t i = 0; i < n; ++i) {
      prompts.push_back(random_prompt(3 + rng() % 60, static_cast<unsigned>(100 + i)));
      arrive[i] = static_cast<int>(rng() % 150);
      if (rng() % 4 == 0) cancel_at[i] = arrive[i] + static_cast<int>(rng() % 12);
    }
    EngineStats stats;
    const auto batched = run(*h->model, *h->opened.tokenizer, prompts, arrive, cancel_at, 16, 10, &stats);
    EXPECT_FALSE(stats.prefix_caching);
    EXPECT_EQ(stats.state_slots_total, 16);
    EXPECT_EQ(stats.state_slots_free, 16);
    EXPECT_EQ(stats.kv_free_blocks, stats.kv_total_blocks);
    EXPECT_GT(stats.preemptions, 0u);
    int cancelled = 0, compared = 0;
    for (std::size_t i = 0; i < n; ++i) {
      if (batched[i].finish == RequestFinish::kCancelled) {
        ++cancelled;
        continue;
      }
      EXPECT_EQ(batched[i].finish, RequestFinish::kLength) << i;
      if (i % 10 != 0) continue;  // every tenth against running alone (the rest as the same code runs)
      // Alone, with the whole prompt in one step and with a budget of 16 tokens a step (prefill
      // chunks of 16): the same ids and the same logprob bits as in the batch.
      for (const std::int64_t budget : {256, 16}) {
        EngineStats alone_stats;
        const auto alone =
            run(*h->model, *h->opened.tokenizer, {prompts[i]}, {0}, {-1}, 1, 10, &alone_stats, budget);
        EXPECT_EQ(batched[i].tokens, alone[0].tokens) << "request " << i << ", budget " << budget;
        EXPECT_TRUE(same_bits(batched[i].logprobs, alone[0].logprobs)) << "request " << i << ", budget " << budget;
      }
      ++compared;
    }
    std::printf("%s: 200 requests, %d cancelled, %llu preemptions; %d compared with running alone (budgets 256 and "
                "16), equal ids and logprob bits; state "
                "slots free %lld of %lld, KV blocks free %lld of %lld\n",
                moe ? "qwen35moe" : "qwen35", cancelled, static_cast<unsigned long long>(stats.preemptions), compared,
                static_cast<long long>(stats.state_slots_free), static_cast<long long>(stats.state_slots_total),
                static_cast<long long>(stats.kv_free_blocks), static_cast<long long>(stats.kv_total_blocks));
    EXPECT_GT(cancelled, 0);
  }
}

// One engine kept across requests run one after the other (an agent's turns): each request's
// outcome, with or without the prefix cache.
struct Sequential {
  std::unique_ptr<Engine> engine;
  Sequential(Model& m, const tokenizer::Tokenizer& tok, bool cache, const std::string& dir = "") {
    EngineConfig c;
    c.prefix_cache_dir = dir;
    c.scheduler.max_num_batched_tokens = 256;
    c.scheduler.max_num_seqs = 4;
    c.scheduler.max_model_len = 1024;
    c.prefix_caching = cache;
    c.snapshot_interval = 64;
    engine = std::move(*Engine::create(m, tok, c));
  }
  Outcome run(const std::vector<std::int32_t>& prompt, const std::vector<std::int64_t>& hints, std::int64_t n) {
    Outcome r;
    RequestOptions o = greedy(n);
    o.snapshot_hints = hints;
    auto id = engine->submit(prompt, o, [&r](const RequestEvent& e) {
      r.tokens.insert(r.tokens.end(), e.tokens.begin(), e.tokens.end());
      for (const TokenLogprob& l : e.logprobs) r.logprobs.push_back(l.logprob);
      if (e.finished) r.finish = e.finish, r.cached = e.cached_prompt_tokens;
    });
    EXPECT_TRUE(id.ok()) << id.status().to_string();
    EXPECT_TRUE(engine->run_until_idle().ok());
    return r;
  }
};

std::int64_t common_prefix(const std::vector<std::int32_t>& a, const std::vector<std::int32_t>& b) {
  std::size_t n = 0;
  while (n < a.size() && n < b.size() && a[n] == b[n]) ++n;
  return static_cast<std::int64_t>(n);
}

TEST(Hybrid, AnAgentConversationIsServedFromStateSnapshotsWithTheSameBits) {
  // Every backend here (the snapshot copies are its stream's), each against itself without a cache.
  for (const std::string backend : {"cpu", "vulkan", "cuda"}) for (const bool moe : {false, true}) {
    SCOPED_TRACE((moe ? "qwen35moe on " : "qwen35 on ") + backend);
    // Two models of one file: engines on one model would share its KV cache and states.
    auto h = make_hybrid(moe, 200, 12, backend), reference = make_hybrid(moe, 200, 0, backend);
    if (!h || !reference) {
      std::printf("%s: no device here, skipped\n", backend.c_str());
      continue;
    }
    Sequential cached(*h->model, *h->opened.tokenizer, true), plain(*reference->model, *reference->opened.tokenizer, false);
    // A system prompt, then turns: each prompt is the last one, its answer and a new message
    // (hints: where the messages start). Then a branch from the system prompt, and a turn that
    // parts 3 tokens before the end of the last prompt (a template that drops what followed the
    // last assistant header), its header hinted.
    const auto system = random_prompt(70, moe ? 31 : 30);
    std::vector<std::int32_t> prompt = system, previous;
    std::vector<std::int64_t> hints = {0};
    int turn = 0;
    std::int64_t cached_total = 0, prompt_total = 0;
    auto check = [&](const std::string& what, std::int64_t expect_at_least) {
      const Outcome a = cached.run(prompt, hints, 12), b = plain.run(prompt, hints, 12);
      EXPECT_EQ(a.tokens, b.tokens) << what;
      EXPECT_TRUE(same_bits(a.logprobs, b.logprobs)) << what;
      EXPECT_EQ(b.cached, 0) << what;
      EXPECT_GE(a.cached, expect_at_least) << what;
      std::printf("%s on %s %s: %zu prompt tokens, %lld cached (at least %lld expected), same ids and logprob bits "
                  "as without the cache: %s\n",
                  moe ? "qwen35moe" : "qwen35", backend.c_str(), what.c_str(), prompt.size(), static_cast<long long>(a.cached),
                  static_cast<long long>(expect_at_least),
                  a.tokens == b.tokens && same_bits(a.logprobs, b.logprobs) ? "yes" : "NO");
      cached_total += a.cached;
      prompt_total += static_cast<std::int64_t>(prompt.size());
      return a;
    };
    for (; turn < 4; ++turn) {
      hints.push_back(static_cast<std::int64_t>(prompt.size()));
      const auto user = random_prompt(20 + 7 * static_cast<std::size_t>(turn), static_cast<unsigned>(40 + turn));
      prompt.insert(prompt.end(), user.begin(), user.end());
      const std::int64_t shared = common_prefix(prompt, previous);
      const Outcome a = check("turn " + std::to_string(turn), turn == 0 ? 0 : (shared - 1) / 16 * 16);
      previous = prompt;
      previous.insert(previous.end(), a.tokens.begin(), a.tokens.end() - 1);  // the last one is not computed
      prompt.insert(prompt.end(), a.tokens.begin(), a.tokens.end());
    }
    // A branch from the system prompt (the cache holds the turns' snapshots too).
    std::vector<std::int32_t> saved = prompt;
    prompt = system;
    const auto other = random_prompt(25, 99);
    prompt.insert(prompt.end(), other.begin(), other.end());
    check("branch", 64);
    // Parting 3 tokens before the end of the last turn's prompt (its last 3 tokens replaced).
    prompt = saved;
    const std::size_t header = previous.size() - 12 + 1 - 3;  // before the answer, 3 tokens back
    prompt.resize(header);
    hints.push_back(static_cast<std::int64_t>(header));
    const auto tail = random_prompt(30, 77);
    prompt.insert(prompt.end(), tail.begin(), tail.end());
    check("parting early", static_cast<std::int64_t>(header) / 16 * 16);
    const EngineStats st = cached.engine->stats();
    EXPECT_TRUE(st.prefix_caching);
    EXPECT_EQ(st.snapshots_restored, 5u);  // turns 1-3, the branch, the early parting
    EXPECT_EQ(st.snapshots_total, 12);
    EXPECT_GT(st.snapshot_bytes, 0u);
    EXPECT_EQ(st.state_slots_free, st.state_slots_total);
    std::printf("%s on %s: %lld of %lld prompt tokens from the cache; snapshots: %lld held of %lld (%llu bytes each), "
                "%llu taken, %llu restored, %llu evicted\n",
                moe ? "qwen35moe" : "qwen35", backend.c_str(), static_cast<long long>(cached_total), static_cast<long long>(prompt_total),
                static_cast<long long>(st.snapshots_held), static_cast<long long>(st.snapshots_total),
                static_cast<unsigned long long>(st.snapshot_bytes), static_cast<unsigned long long>(st.snapshots_taken),
                static_cast<unsigned long long>(st.snapshots_restored),
                static_cast<unsigned long long>(st.snapshots_evicted));
  }
}

TEST(Hybrid, SharedPrefixesUnderPreemptionAndCancellationGiveTheBitsOfRunningAlone) {
  for (const bool moe : {false, true}) {
    SCOPED_TRACE(moe ? "qwen35moe" : "qwen35");
    // 32 blocks for up to 8 sequences of up to ~110 tokens, and 6 snapshots: both pools run out.
    auto h = make_hybrid(moe, 33, 6);
    std::mt19937 rng(moe ? 22 : 21);
    const std::size_t n = 80;
    std::vector<std::vector<std::int32_t>> prefixes;
    for (unsigned k = 0; k < 4; ++k) prefixes.push_back(random_prompt(20 + 17 * k, 500 + k));
    std::vector<std::vector<std::int32_t>> prompts;
    std::vector<std::vector<std::int64_t>> hints;
    std::vector<int> arrive(n), cancel_at(n, -1);
    for (std::size_t i = 0; i < n; ++i) {
      std::vector<std::int32_t> p = prefixes[rng() % prefixes.size()];
      hints.push_back({static_cast<std::int64_t>(p.size())});
      const auto tail = random_prompt(1 + rng() % 40, static_cast<unsigned>(700 + i));
      p.insert(p.end(), tail.begin(), tail.end());
      prompts.push_back(std::move(p));
      arrive[i] = static_cast<int>(rng() % 120);
      if (rng() % 5 == 0) cancel_at[i] = arrive[i] + static_cast<int>(rng() % 10);
    }
    EngineStats stats;
    const auto batched = run(*h->model, *h->opened.tokenizer, prompts, arrive, cancel_at, 8, 10, &stats, 64, &hints);
    EXPECT_TRUE(stats.prefix_caching);
    EXPECT_GT(stats.preemptions, 0u);
    EXPECT_GT(stats.snapshots_restored, 0u);
    EXPECT_GT(stats.snapshots_evicted, 0u);
    EXPECT_EQ(stats.state_slots_free, stats.state_slots_total);
    EXPECT_EQ(stats.kv_free_blocks, stats.kv_total_blocks);
    // Every request that finished, against itself alone on a model without snapshots (no cache).
    auto reference = make_hybrid(moe, 33, 0);
    int compared = 0, from_cache = 0;
    for (std::size_t i = 0; i < n; ++i) {
      if (batched[i].finish == RequestFinish::kCancelled) continue;
      EngineStats alone_stats;
      const auto alone = run(*reference->model, *reference->opened.tokenizer, {prompts[i]}, {0}, {-1}, 1, 10,
                             &alone_stats);
      EXPECT_EQ(batched[i].tokens, alone[0].tokens) << "request " << i;
      EXPECT_TRUE(same_bits(batched[i].logprobs, alone[0].logprobs)) << "request " << i;
      ++compared;
      from_cache += batched[i].cached > 0 ? 1 : 0;
    }
    EXPECT_GT(from_cache, 10);
    std::printf("%s: %zu requests over 4 shared prefixes, %llu preemptions; %d compared with running alone without a "
                "cache (%d of them served from the cache); snapshots %llu taken, %llu restored, %llu evicted\n",
                moe ? "qwen35moe" : "qwen35", n, static_cast<unsigned long long>(stats.preemptions), compared, from_cache,
                static_cast<unsigned long long>(stats.snapshots_taken),
                static_cast<unsigned long long>(stats.snapshots_restored),
                static_cast<unsigned long long>(stats.snapshots_evicted));
  }
}

// The persistent tier: a conversation's turns on one engine and model, then its next turn on a
// new model and engine (a reload, an upgrade) with the same engine.prefix_cache_dir: read back
// (blocks and the snapshot), with the bits of an engine without a cache. F32 and Q8_0 weights.
TEST(Hybrid, AConversationOutlivesItsEngineThroughThePrefixCacheDir) {
  const std::string dir = (std::filesystem::temp_directory_path() / ("sx_hybrid_store_" + std::to_string(::getpid()))).string();
  for (const hal::DType weights : {hal::DType::kF32, hal::DType::kQ8_0}) {
    SCOPED_TRACE(hal::dtype_name(weights));
    std::filesystem::remove_all(dir);
    auto reference = make_hybrid(false, 200, 0, "cpu", weights);
    Sequential plain(*reference->model, *reference->opened.tokenizer, false);
    std::vector<std::int32_t> prompt = random_prompt(90, 61);
    std::vector<std::int64_t> hints = {0, 70};
    std::vector<std::int32_t> answer;
    {
      auto first = make_hybrid(false, 200, 8, "cpu", weights);
      Sequential cached(*first->model, *first->opened.tokenizer, true, dir);
      const Outcome a = cached.run(prompt, hints, 12);
      EXPECT_EQ(a.tokens, plain.run(prompt, hints, 12).tokens);
      answer = a.tokens;
      const EngineStats st = cached.engine->stats();
      EXPECT_TRUE(st.prefix_store);
      EXPECT_GT(st.store_snapshots, 0u);
    }  // the store's writes end with its engine
    hints.push_back(static_cast<std::int64_t>(prompt.size() + answer.size()));
    prompt.insert(prompt.end(), answer.begin(), answer.end());
    const auto user = random_prompt(30, 62);
    prompt.insert(prompt.end(), user.begin(), user.end());
    auto second = make_hybrid(false, 200, 8, "cpu", weights);
    Sequential cached(*second->model, *second->opened.tokenizer, true, dir);
    const Outcome a = cached.run(prompt, hints, 12), b = plain.run(prompt, hints, 12);
    const std::int64_t expect = (90 + 12 - 1) / 16 * 16;  // the answer's last block boundary
    EXPECT_GE(a.cached, expect);
    EXPECT_EQ(a.tokens, b.tokens);
    EXPECT_TRUE(same_bits(a.logprobs, b.logprobs));
    const EngineStats st = cached.engine->stats();
    EXPECT_GT(st.store_read, 0u);
    std::printf("%s: the next turn on a new model and engine: %lld of %zu prompt tokens read back from the prefix "
                "cache dir (%llu files read; %llu blocks and %llu snapshots there, %llu bytes), same ids and logprob "
                "bits as without a cache: %s\n",
                hal::dtype_name(weights).data(), static_cast<long long>(a.cached), prompt.size(),
                static_cast<unsigned long long>(st.store_read), static_cast<unsigned long long>(st.store_blocks),
                static_cast<unsigned long long>(st.store_snapshots), static_cast<unsigned long long>(st.store_bytes),
                a.tokens == b.tokens && same_bits(a.logprobs, b.logprobs) ? "yes" : "NO");
  }
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace sx::engine
