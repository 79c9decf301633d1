// bench_concurrency and bench_prefix_cache (see bench_serving.h).
#include "daemon/commands/bench_serving.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <map>
#include <random>
#include <vector>

#include "runtime/engine/engine.h"

namespace sx::daemon {

namespace {

using Clock = std::chrono::steady_clock;

double percentile(std::vector<double> v, double p) {
  if (v.empty()) return 0.0;
  std::sort(v.begin(), v.end());
  const double pos = p * static_cast<double>(v.size() - 1);
  const auto lo = static_cast<std::size_t>(pos);
  const std::size_t hi = std::min(lo + 1, v.size() - 1);
  return v[lo] + (v[hi] - v[lo]) * (pos - static_cast<double>(lo));
}

struct Timeline {
  Clock::time_point submitted;
  std::vector<Clock::time_point> tokens;  // when each token arrived
  std::vector<std::int32_t> ids;
  std::int64_t cached = 0;
};

struct RunFigures {
  double duration = 0, output_rate = 0, decode_rate = 0;
  std::vector<double> ttft, itl;
  std::vector<Timeline> requests;
};

engine::EngineConfig engine_config(const engine::Model& model, std::int64_t max_seqs, bool prefix) {
  engine::EngineConfig c;
  c.scheduler.max_num_batched_tokens = model.options().max_batch_tokens;
  c.scheduler.max_num_seqs = max_seqs;
  c.scheduler.max_model_len = model.max_request_tokens();
  c.prefix_caching = prefix;
  return c;
}

// Submits every prompt at once and runs the engine until all have finished.
Result<RunFigures> run_requests(engine::Engine& engine, const std::vector<std::vector<std::int32_t>>& prompts,
                                std::int64_t gen_tokens) {
  RunFigures f;
  f.requests.resize(prompts.size());
  std::map<std::uint64_t, std::size_t> index;
  engine::RequestOptions o;
  o.sampling.temperature = 0.0f;
  o.max_tokens = gen_tokens;
  o.ignore_eos = true;
  const auto t0 = Clock::now();
  for (std::size_t i = 0; i < prompts.size(); ++i) {
    f.requests[i].submitted = Clock::now();
    SX_ASSIGN_OR_RETURN(std::uint64_t id, engine.submit(prompts[i], o, [&f, &index](const engine::RequestEvent& e) {
      Timeline& t = f.requests[index.at(e.id)];
      for (std::int32_t tok : e.tokens) {
        t.tokens.push_back(Clock::now());
        t.ids.push_back(tok);
      }
      if (e.finished) t.cached = e.cached_prompt_tokens;
    }));
    index[id] = i;
  }
  SX_RETURN_IF_ERROR(engine.run_until_idle());
  const auto t_end = Clock::now();
  f.duration = std::chrono::duration<double>(t_end - t0).count();
  // Decode phase: from the moment every request has its first token to the end.
  Clock::time_point last_first = t0;
  std::int64_t total = 0;
  for (const Timeline& t : f.requests) {
    if (t.tokens.empty()) return internal_error("a request produced no tokens");
    last_first = std::max(last_first, t.tokens.front());
    total += static_cast<std::int64_t>(t.tokens.size());
    f.ttft.push_back(std::chrono::duration<double>(t.tokens.front() - t.submitted).count());
    for (std::size_t k = 1; k < t.tokens.size(); ++k) f.itl.push_back(std::chrono::duration<double>(t.tokens[k] - t.tokens[k - 1]).count());
  }
  std::int64_t decode_tokens = 0;
  for (const Timeline& t : f.requests) {
    decode_tokens += std::count_if(t.tokens.begin(), t.tokens.end(), [&](Clock::time_point p) { return p > last_first; });
  }
  const double decode_time = std::chrono::duration<double>(t_end - last_first).count();
  f.output_rate = static_cast<double>(total) / f.duration;
  f.decode_rate = decode_time > 0 ? static_cast<double>(decode_tokens) / decode_time : 0.0;
  return f;
}

std::vector<std::int32_t> random_tokens(std::mt19937& rng, std::int64_t n, std::int64_t vocab) {
  std::uniform_int_distribution<std::int32_t> pick(0, static_cast<std::int32_t>(vocab - 1));
  std::vector<std::int32_t> v(static_cast<std::size_t>(n));
  for (auto& t : v) t = pick(rng);
  return v;
}

void print_run(const char* label, std::int64_t n, const RunFigures& f) {
  std::printf("%s: %lld request%s: %.2f s; output %.1f tokens/s; decode (all requests past their first token) "
              "%.1f tokens/s\n",
              label, static_cast<long long>(n), n == 1 ? "" : "s", f.duration, f.output_rate, f.decode_rate);
  std::printf("  TTFT p50 %.1f ms, p99 %.1f ms; inter-token latency p50 %.1f ms, p99 %.1f ms\n",
              1e3 * percentile(f.ttft, 0.5), 1e3 * percentile(f.ttft, 0.99), 1e3 * percentile(f.itl, 0.5),
              1e3 * percentile(f.itl, 0.99));
}

}  // namespace

Status bench_concurrency(engine::Model& model, const tokenizer::Tokenizer& tok, std::int64_t concurrency,
                         std::int64_t prompt_tokens, std::int64_t gen_tokens, std::uint64_t seed) {
  std::mt19937 rng(static_cast<std::uint32_t>(seed));
  const std::int64_t vocab = model.config().vocab;
  std::vector<std::vector<std::int32_t>> prompts;
  for (std::int64_t i = 0; i < concurrency; ++i) prompts.push_back(random_tokens(rng, prompt_tokens, vocab));
  // Warm-up: touch the weights and the workspace once.
  {
    SX_ASSIGN_OR_RETURN(auto engine, engine::Engine::create(model, tok, engine_config(model, 1, false)));
    SX_RETURN_IF_ERROR(run_requests(*engine, {prompts[0]}, 2).status());
  }
  SX_ASSIGN_OR_RETURN(auto single_engine, engine::Engine::create(model, tok, engine_config(model, 1, false)));
  SX_ASSIGN_OR_RETURN(RunFigures one, run_requests(*single_engine, {prompts[0]}, gen_tokens));
  SX_ASSIGN_OR_RETURN(auto engine, engine::Engine::create(model, tok, engine_config(model, concurrency, false)));
  SX_ASSIGN_OR_RETURN(RunFigures many, run_requests(*engine, prompts, gen_tokens));
  std::printf("concurrency: prompts of %lld tokens, %lld new tokens each (greedy)\n",
              static_cast<long long>(prompt_tokens), static_cast<long long>(gen_tokens));
  print_run("alone", 1, one);
  print_run("concurrent", concurrency, many);
  // The same request in both runs: batching must not change it.
  const bool same = many.requests[0].ids == one.requests[0].ids;
  std::printf("aggregate decode: %.2fx the single request (%.1f vs %.1f tokens/s); request 0 identical alone and "
              "batched: %s\n",
              many.decode_rate / one.decode_rate, many.decode_rate, one.decode_rate, same ? "yes" : "NO");
  return ok_status();
}

Status bench_prefix_cache(engine::Model& model, const tokenizer::Tokenizer& tok, std::int64_t prefix_tokens,
                          std::int64_t gen_tokens, std::uint64_t seed) {
  std::mt19937 rng(static_cast<std::uint32_t>(seed));
  const std::int64_t vocab = model.config().vocab;
  // Turn 1: a long shared prefix (system prompt + history) and a question.
  std::vector<std::int32_t> turn1 = random_tokens(rng, prefix_tokens, vocab);
  const auto q1 = random_tokens(rng, 16, vocab);
  turn1.insert(turn1.end(), q1.begin(), q1.end());
  SX_ASSIGN_OR_RETURN(auto warm, engine::Engine::create(model, tok, engine_config(model, 1, true)));
  SX_ASSIGN_OR_RETURN(RunFigures first, run_requests(*warm, {turn1}, gen_tokens));
  // Turn 2: turn 1, its answer and a new question.
  std::vector<std::int32_t> turn2 = turn1;
  turn2.insert(turn2.end(), first.requests[0].ids.begin(), first.requests[0].ids.end());
  const auto q2 = random_tokens(rng, 16, vocab);
  turn2.insert(turn2.end(), q2.begin(), q2.end());
  SX_ASSIGN_OR_RETURN(RunFigures second_warm, run_requests(*warm, {turn2}, gen_tokens));
  SX_ASSIGN_OR_RETURN(auto cold, engine::Engine::create(model, tok, engine_config(model, 1, false)));
  SX_ASSIGN_OR_RETURN(RunFigures second_cold, run_requests(*cold, {turn2}, gen_tokens));
  const double tw = second_warm.ttft[0], tc = second_cold.ttft[0];
  std::printf("prefix cache: second turn of %zu tokens (%lld of them cached from the first turn)\n", turn2.size(),
              static_cast<long long>(second_warm.requests[0].cached));
  std::printf("  TTFT cold cache %.1f ms, warm cache %.1f ms: %.1fx lower; outputs identical: %s\n", 1e3 * tc,
              1e3 * tw, tc / tw, second_warm.requests[0].ids == second_cold.requests[0].ids ? "yes" : "NO");
  return ok_status();
}

}  // namespace sx::daemon
