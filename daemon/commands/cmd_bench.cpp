// `sextant bench`: prefill and decode tokens/s (median of repetitions, with spread) and decode as
// a fraction of the memory-bandwidth bound measured in the same run.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <random>
#include <string>

#include "backends/registry.h"
#include "daemon/commands/bench_serving.h"
#include "daemon/commands/commands.h"
#include "daemon/commands/model_session.h"
#include "runtime/base/membw.h"
#include "runtime/base/thread_pool.h"
#include "runtime/engine/generator.h"

namespace sx::daemon {

namespace {

// What the session's backend says about its kernels (the CPU: "cpu: using avx2 kernels"), or
// nothing; the daemon names no backend (hal::Backend::kernel_report).
void print_kernel_line(const ModelSession& session) {
  if (session.devices.devices.empty()) return;
  auto backend = backends::default_registry().find(session.devices.devices[0]->info().backend);
  if (!backend.ok()) return;
  if (const auto k = (*backend)->kernel_report(); k && !k->line.empty()) std::printf("%s\n", k->line.c_str());
}

struct Spread {
  double median = 0, min = 0, max = 0;
};

Spread spread_of(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  Spread s;
  s.min = v.front();
  s.max = v.back();
  const std::size_t n = v.size();
  s.median = n % 2 == 1 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
  return s;
}

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

int cmd_bench(int argc, char** argv) {
  std::vector<Args::Spec> specs = model_session_specs();
  std::vector<Args::Spec> own = {
      {{"-p", "--prompt-tokens"}, true, false, "prefill length (default 512; 0 = skip)", "N"},
      {{"-n", "--gen-tokens"}, true, false, "decode steps (default 128; 0 = skip)", "N"},
      {{"-r", "--repetitions"}, true, false, "repetitions (default 3)", "N"},
      {{"--seed"}, true, false, "seed of the random prompt (default 1)", "N"},
      {{"--concurrency"}, true, false,
       "serve N requests at once (prompts of -p tokens, -n new tokens each) and report aggregate decode "
       "tokens/s, TTFT and inter-token latency against one request alone", "N"},
      {{"--peak-bandwidth"}, true, false,
       "the device's peak memory bandwidth in GB/s (e.g. 4800 for an H200): decode is also reported as a fraction "
       "of the bound it gives, for GPUs, whose memory the host's read bandwidth does not measure", "GBPS"},
      {{"--prefix-tokens"}, true, false,
       "prefix-cache benchmark: TTFT of a second chat turn sharing an N-token prefix, cache warm vs cold", "N"},
  };
  specs.insert(specs.end(), own.begin(), own.end());
  Args args("bench", "Measure prefill and decode speed against the memory-bandwidth bound.", specs);
  if (Status s = args.parse(argc, argv); !s.ok()) return report_error("bench", s);
  if (args.has("--help")) {
    std::fputs(args.usage().c_str(), stdout);
    return 0;
  }
  auto run = [&]() -> Status {
    SX_ASSIGN_OR_RETURN(std::int64_t n_prompt, args.get_int("--prompt-tokens", 512, 0, 1 << 20));
    SX_ASSIGN_OR_RETURN(std::int64_t n_gen, args.get_int("--gen-tokens", 128, 0, 1 << 20));
    SX_ASSIGN_OR_RETURN(std::int64_t reps, args.get_int("--repetitions", 3, 1, 1000));
    SX_ASSIGN_OR_RETURN(std::int64_t seed, args.get_int("--seed", 1, 0, INT64_MAX));
    SX_ASSIGN_OR_RETURN(std::int64_t threads, args.get_int("--threads", 0, 0, 1024));
    if (n_prompt + n_gen == 0) return invalid_argument_error("nothing to measure: -p and -n are both 0");
    SX_ASSIGN_OR_RETURN(std::int64_t concurrency, args.get_int("--concurrency", 0, 0, 4096));
    SX_ASSIGN_OR_RETURN(std::int64_t prefix_tokens, args.get_int("--prefix-tokens", 0, 0, 1 << 24));
    SX_ASSIGN_OR_RETURN(std::int64_t peak_gbs, args.get_int("--peak-bandwidth", 0, 0, 1000000));
    SX_ASSIGN_OR_RETURN(engine::OpenedModel opened, open_model_arg(args));
    if (concurrency > 0 || prefix_tokens > 0) {
      if (n_gen < 1 || (concurrency > 0 && n_prompt < 1)) {
        return invalid_argument_error("serving benchmarks need -p >= 1 and -n >= 1");
      }
      // Room for every request at full length (a second prefix-cache turn: prefix + answers + questions).
      const std::int64_t ctx = concurrency > 0 ? n_prompt + n_gen : prefix_tokens + 2 * n_gen + 32;
      const std::int64_t seqs = std::max<std::int64_t>(concurrency, 1);
      if (ctx > opened.config.context_length) {
        return invalid_argument_error("requests of {} tokens exceed the model's context length {}", ctx,
                                      opened.config.context_length);
      }
      SX_ASSIGN_OR_RETURN(ModelSession session, open_session(args, std::move(opened), ctx, seqs));
      std::printf("model: %s; device: %s\n", args.get("--model")->c_str(), session.devices_summary().c_str());
      print_kernel_line(session);
      if (concurrency > 0) {
        SX_RETURN_IF_ERROR(bench_concurrency(*session.model, *session.opened.tokenizer, concurrency, n_prompt, n_gen,
                                             static_cast<std::uint64_t>(seed)));
      }
      if (prefix_tokens > 0) {
        SX_RETURN_IF_ERROR(bench_prefix_cache(*session.model, *session.opened.tokenizer, prefix_tokens, n_gen,
                                              static_cast<std::uint64_t>(seed)));
      }
      return ok_status();
    }
    const model::ModelConfig cfg = opened.config;
    // Decode starts after a prompt of max(n_prompt, 1) tokens.
    const std::int64_t ctx = std::max<std::int64_t>(n_prompt, 1) + n_gen;
    if (ctx > cfg.context_length) {
      return invalid_argument_error("-p {} + -n {} exceed the model's context length {}", n_prompt, n_gen,
                                    cfg.context_length);
    }
    SX_ASSIGN_OR_RETURN(ModelSession session, open_session(args, std::move(opened), ctx));
    engine::Model& model = *session.model;
    const engine::ModelOptions& mo = model.options();

    std::mt19937 rng(static_cast<std::uint32_t>(seed));
    std::uniform_int_distribution<std::int32_t> pick(0, static_cast<std::int32_t>(cfg.vocab - 1));
    std::vector<std::int32_t> prompt(static_cast<std::size_t>(std::max<std::int64_t>(n_prompt, 1)));
    for (auto& t : prompt) t = pick(rng);

    std::printf("model: %s (%s, %lld layers, hidden %lld, %lld/%lld heads, %.1f MB of weights)\n",
                args.get("--model")->c_str(), cfg.architecture.c_str(), static_cast<long long>(cfg.n_layers),
                static_cast<long long>(cfg.hidden), static_cast<long long>(cfg.n_heads),
                static_cast<long long>(cfg.n_kv_heads), static_cast<double>(model.weight_bytes()) / 1e6);
    std::printf("device: %s\n", session.devices_summary().c_str());
    print_kernel_line(session);

    std::vector<float> logits;
    auto prefill = [&]() { return engine::prefill(model, prompt, logits); };
    // Warm-up (first touch of the weights and workspace).
    SX_RETURN_IF_ERROR(prefill());

    if (n_prompt > 0) {
      std::vector<double> rates;
      for (std::int64_t r = 0; r < reps; ++r) {
        const auto t0 = std::chrono::steady_clock::now();
        SX_RETURN_IF_ERROR(prefill());
        rates.push_back(static_cast<double>(n_prompt) / seconds_since(t0));
      }
      const Spread s = spread_of(rates);
      std::printf("prefill %lld tokens: %.1f tokens/s (median of %lld; min %.1f, max %.1f)\n",
                  static_cast<long long>(n_prompt), s.median, static_cast<long long>(reps), s.min, s.max);
    }
    if (n_gen > 0) {
      // Each decode run is followed at once by a bandwidth measurement with the same thread count,
      // so the two meet the same machine (on a shared host the read bandwidth moves by half within
      // minutes). Two pairings, each like with like: the run's mean rate against the median
      // bandwidth round (the machine as it was, disturbances included), and the run's fastest
      // token against the fastest round (the machine undisturbed).
      ThreadPool pool(threads > 0 ? static_cast<int>(threads) : hardware_threads());
      const double weights = static_cast<double>(model.weight_bytes_per_token());
      std::vector<double> rates, fastest, bw_median, bw_best, bw_within, frac_typical, frac_quiet, frac_strict;
      for (std::int64_t r = 0; r < reps; ++r) {
        SX_RETURN_IF_ERROR(prefill());
        auto pos = static_cast<std::int32_t>(prompt.size());
        std::int32_t next = engine::argmax(logits);
        double total = 0.0, min_step = 1e30;
        // Greedy as serving does it: the device selects, one candidate comes back.
        std::vector<float> top_value;
        std::vector<std::int32_t> top_id;
        for (std::int64_t i = 0; i < n_gen; ++i) {
          const auto t0 = std::chrono::steady_clock::now();
          const std::int32_t one[1] = {next};
          SX_RETURN_IF_ERROR(
              model.forward_top_k(engine::single_sequence_batch(one, pos++, mo.blocks_per_seq()), 1, top_value, top_id));
          next = top_id[0];
          const double dt = seconds_since(t0);
          total += dt;
          min_step = std::min(min_step, dt);
        }
        const ReadBandwidth bw = measure_read_bandwidth_rounds(pool);
        rates.push_back(static_cast<double>(n_gen) / total);
        fastest.push_back(1.0 / min_step);
        bw_median.push_back(bw.median);
        bw_best.push_back(bw.best);
        bw_within.push_back(bw.median > 0 ? (bw.best - bw.slowest) / bw.median : 0.0);
        frac_typical.push_back(rates.back() * weights / bw.median);
        frac_quiet.push_back(fastest.back() * weights / bw.best);
        frac_strict.push_back(rates.back() * weights / bw.best);
      }
      const Spread s = spread_of(rates);
      std::printf("decode %lld tokens: %.2f tokens/s (median of %lld; min %.2f, max %.2f; fastest token %.2f/s)\n",
                  static_cast<long long>(n_gen), s.median, static_cast<long long>(reps), s.min, s.max,
                  spread_of(fastest).median);

      // The bound: bytes a decode step must read / measured read bandwidth, same thread count.
      const double mean_ctx = static_cast<double>(prompt.size()) + 0.5 * static_cast<double>(n_gen);
      const double kv = static_cast<double>(model.kv_bytes_per_token()) * mean_ctx;
      const double bw_typical = spread_of(bw_median).median, bw_quiet = spread_of(bw_best).median;
      std::printf("memory bandwidth (streaming read, %d threads, after each run): median round %.2f GB/s, "
                  "fastest round %.2f GB/s\n",
                  pool.size(), bw_typical / 1e9, bw_quiet / 1e9);
      // The probe's own spread: how far its rounds lie apart within one probe, and how far the
      // median round moved from one run to the next. Past kMaxSpread the machine moved more during
      // the measurement than the fractions below can tell apart.
      constexpr double kMaxSpread = 0.15;
      const Spread across = spread_of(bw_median);
      const double moved = across.median > 0 ? (across.max - across.min) / across.median : 0.0;
      const double within = spread_of(bw_within).median;
      std::printf("bandwidth probe spread: rounds within a probe %.0f%% apart (fastest - slowest over median, median "
                  "of %lld probes); the median round moved %.0f%% across runs (min %.2f, max %.2f GB/s)\n",
                  100 * within, static_cast<long long>(reps), 100 * moved, across.min / 1e9, across.max / 1e9);
      if (reps < 2) {
        std::printf("bandwidth spread: one run, so no spread across runs: rerun with -r 3 or more to judge the "
                    "fractions below\n");
      } else if (moved > kMaxSpread) {
        std::printf("bandwidth spread: %.0f%% across runs, beyond %.0f%%: the machine moved too much to judge the "
                    "fractions below closer than that; rerun with more repetitions (-r) on a quieter machine\n",
                    100 * moved, 100 * kMaxSpread);
      } else {
        std::printf("bandwidth spread: within %.0f%% across runs: steady enough to judge\n", 100 * kMaxSpread);
      }
      std::printf("bytes per decode token: %.1f MB of weights (+ %.2f MB of KV cache at the mean context)\n",
                  weights / 1e6, kv / 1e6);
      std::printf("decode bound: %.2f tokens/s at the median round; decode reaches %.2f of the memory-bandwidth "
                  "bound (each run against the bandwidth right after it, median of %lld)\n",
                  bw_typical / weights, spread_of(frac_typical).median, static_cast<long long>(reps));
      std::printf("  undisturbed, fastest token against fastest round: %.2f; mean rate against fastest round: %.2f\n",
                  spread_of(frac_quiet).median, spread_of(frac_strict).median);
      if (peak_gbs > 0) {
        // A device's own memory: the bound is the stated peak, bytes = weights + KV read per token.
        const double peak = static_cast<double>(peak_gbs) * 1e9, bytes = weights + kv;
        std::printf("device peak bandwidth (stated): %lld GB/s; bytes per decode token %.1f MB; bound %.2f tokens/s; "
                    "decode (median %.2f tokens/s) reaches %.2f of the device bound (fastest token: %.2f)\n",
                    static_cast<long long>(peak_gbs), bytes / 1e6, peak / bytes, s.median, s.median * bytes / peak,
                    spread_of(fastest).median * bytes / peak);
      }
    }
    return ok_status();
  };
  Status st = run();
  if (!st.ok()) return report_error("bench", st);
  return 0;
}

}  // namespace sx::daemon
