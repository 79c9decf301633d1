// CPU matmul benchmarks: GEMV GB/s (vs measured read bandwidth) and GEMM GFLOP/s (vs FMA peak)
// for every weight format on the Qwen2.5-0.5B shapes, plus a whole-model prefill estimate.
//
// Decode (m small) reads W from DRAM as it does in a real forward (0.5 GB of weights per token),
// so each call uses the next of several copies of W whose total exceeds the last-level cache.
// With SX_BENCH_HOT=1 in the environment the GEMV cases use one copy instead, read from cache:
// the kernel's arithmetic ceiling, to tell a compute-bound kernel from a memory-bound one.
// Counters: GB_s (W bytes / mean time), GFLOP_s (2 m n k / mean time), and from the fastest call
// (the dev box is shared; the bandwidth yardstick is a best-of too): GB_s_best, bw_frac (GB_s_best /
// measured streaming read bandwidth with the same thread count), GFLOP_s_best, peak_frac
// (GFLOP_s_best / (threads x 32 flop/cycle x clock), the clock from a dependent-FMA loop); and
// *_cpu: from the call with the least process CPU time per thread (immune to time-slicing by other
// processes; our own spin-waits count, so it errs low); for the int8 GEMMs l1_frac (GFLOP_s_best
// against the same microkernel run on panels that stay in L1, printed at the start with the floor
// of its arithmetic; the yardstick is re-measured right before each call, so both bests come from
// the same minutes: what is lost to memory, packing and threads rather than to the instructions).
#include <benchmark/benchmark.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <map>
#include <memory>
#include <string>
#include <vector>


#include "backends/cpu/kernels/matmul.h"
#include "runtime/base/membw.h"
#include "runtime/base/thread_pool.h"
#include "runtime/hal/dtype.h"
#include "tests/bench/bench_weights.h"

#if defined(__FMA__) || defined(__AVX2__)
#include <immintrin.h>
#endif

namespace {

using sx::bench::path_name;
using sx::bench::random_x;
using sx::bench::Weights;
using sx::hal::DType;

constexpr std::size_t kColdBytes = std::size_t{384} << 20;  // > 8x the 32 MiB L3 of the dev box

bool cold_gemv() {
  static const bool cold = std::getenv("SX_BENCH_HOT") == nullptr;
  return cold;
}

std::map<int, double> g_bandwidth;  // threads -> bytes/s
double g_clock_hz = 0;

// Clock from a chain of dependent FMAs (latency 4 cycles on Zen 2/3/4 and recent Intel cores):
// the best of many short runs, so time-slicing on a shared machine does not lower it.
double measure_clock_hz() {
#if defined(__FMA__)
  double best = 0;
  for (int rep = 0; rep < 200; ++rep) {
    __m256 a = _mm256_set1_ps(1.0f);
    const __m256 b = _mm256_set1_ps(0.999999f), c = _mm256_set1_ps(1e-7f);
    const long n = 250'000;
    const auto t0 = std::chrono::steady_clock::now();
    for (long i = 0; i < n; ++i) {
      a = _mm256_fmadd_ps(a, b, c);
      __asm__ volatile("" : "+x"(a));
    }
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    benchmark::DoNotOptimize(a);
    best = std::max(best, n * 4.0 / s);
  }
  return best;
#else
  return 0;
#endif
}

// CPU seconds of the whole process (all pool threads). On a shared machine wall time counts the
// time other processes held our cores; work / (CPU time / threads) does not (it does count our own
// spin-waits, so it errs low).
double process_cpu_seconds() {
  timespec ts;
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + static_cast<double>(ts.tv_nsec) * 1e-9;
}

sx::ThreadPool& pool_for(int threads) {
  static std::map<int, std::unique_ptr<sx::ThreadPool>> pools;
  auto& p = pools[threads];
  if (!p) p = std::make_unique<sx::ThreadPool>(threads);
  return *p;
}

const Weights& weights(DType t, std::int64_t n, std::int64_t k, bool cold) {
  static std::map<std::string, std::unique_ptr<Weights>> cache;
  const std::string key = std::string(sx::cpu::type_name(t)) + std::to_string(n) + "x" + std::to_string(k) + (cold ? "c" : "h");
  auto& w = cache[key];
  if (w) return *w;
  if (cache.size() > 1) {  // keep memory bounded: drop the other shapes
    for (auto it = cache.begin(); it != cache.end();) it = it->first == key ? std::next(it) : cache.erase(it);
  }
  const std::size_t bytes = sx::cpu::tensor_bytes(t, n, k);
  const int copies = cold ? static_cast<int>(std::max<std::size_t>(1, (kColdBytes + bytes - 1) / bytes)) : 1;
  w = std::make_unique<Weights>(sx::bench::make_weights(t, n, k, copies));
  return *w;
}

// The int8 GEMM microkernel with its panels in L1, `calls` calls timed: flop/s (0 where it is
// not built). What the kernel does when memory never waits.
double q8_microkernel_l1_flops(std::int64_t calls) {
  const auto t0 = std::chrono::steady_clock::now();
  const std::int64_t macs = sx::cpu::run_q8_microkernel_in_l1(calls);
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return macs > 0 && s > 0 ? 2.0 * static_cast<double>(macs) / s : 0.0;
}

// Its best of many short runs (printed at the start; l1_frac re-measures it next to each call).
double measure_q8_microkernel_l1_flops() {
  double best = 0;
  for (int rep = 0; rep < 200; ++rep) best = std::max(best, q8_microkernel_l1_flops(2000));
  return best;
}

// The floor of that kernel's arithmetic on AVX2 without VNNI: one k-pair of 6 tokens x 16 rows is
// 12 vpmaddwd (16 multiply-adds each) and 12 vpaddd; here they run on registers alone, no loads,
// no widening, no broadcasts. Cycles per k-pair (192 multiply-adds), best of many short runs.
double measure_madd_add_floor_cycles() {
#if defined(__AVX2__)
  if (g_clock_hz <= 0) return 0;
  double best = 1e30;
  constexpr long kIters = 20000;
  for (int rep = 0; rep < 200; ++rep) {
    __m256i a0 = _mm256_set1_epi32(rep), a1 = a0, a2 = a0, a3 = a0, a4 = a0, a5 = a0, a6 = a0, a7 = a0, a8 = a0,
            a9 = a0, a10 = a0, a11 = a0, w0 = _mm256_set1_epi16(3), w1 = _mm256_set1_epi16(5), t0, t1;
    const auto start = std::chrono::steady_clock::now();
    for (long i = 0; i < kIters; ++i) {
#define SX_MADD_ADD(A, B)                         \
  "vpmaddwd %[w1], %[w0], %[t0]\n\t"              \
  "vpmaddwd %[w0], %[w1], %[t1]\n\t"              \
  "vpaddd %[t0], %[" A "], %[" A "]\n\t"           \
  "vpaddd %[t1], %[" B "], %[" B "]\n\t"
      __asm__ volatile(SX_MADD_ADD("a0", "a1") SX_MADD_ADD("a2", "a3") SX_MADD_ADD("a4", "a5")
                           SX_MADD_ADD("a6", "a7") SX_MADD_ADD("a8", "a9") SX_MADD_ADD("a10", "a11")
                       : [a0] "+x"(a0), [a1] "+x"(a1), [a2] "+x"(a2), [a3] "+x"(a3), [a4] "+x"(a4), [a5] "+x"(a5),
                         [a6] "+x"(a6), [a7] "+x"(a7), [a8] "+x"(a8), [a9] "+x"(a9), [a10] "+x"(a10),
                         [a11] "+x"(a11), [t0] "=&x"(t0), [t1] "=&x"(t1)
                       : [w0] "x"(w0), [w1] "x"(w1));
#undef SX_MADD_ADD
    }
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    best = std::min(best, s * g_clock_hz / kIters);
    __m256i sum = _mm256_add_epi32(_mm256_add_epi32(_mm256_add_epi32(a0, a1), _mm256_add_epi32(a2, a3)),
                                   _mm256_add_epi32(_mm256_add_epi32(a4, a5), _mm256_add_epi32(a6, a7)));
    sum = _mm256_add_epi32(sum, _mm256_add_epi32(_mm256_add_epi32(a8, a9), _mm256_add_epi32(a10, a11)));
    benchmark::DoNotOptimize(sum);
  }
  return best;
#else
  return 0;
#endif
}

void run_matmul(benchmark::State& state, DType t, std::int64_t m, std::int64_t n, std::int64_t k, int threads,
                sx::cpu::MatmulPath path, bool cold) {
  sx::ThreadPool& pool = pool_for(threads);
  const Weights& w = weights(t, n, k, cold);
  const std::vector<float> x = random_x(m, k);
  std::vector<float> bias(static_cast<std::size_t>(n), 0.5f);
  std::vector<float> y(static_cast<std::size_t>(m * n));
  sx::cpu::Scratch scratch;
  sx::cpu::MatmulProblem p;
  p.w_type = t;
  p.x = x.data();
  p.bias = bias.data();
  p.y = y.data();
  p.m = m;
  p.n = n;
  p.k = k;
  int i = 0;
  double seconds = 0, best = 1e30, best_cpu = 1e30;
  const bool int8 = t == sx::cpu::kQ8_0R16 || (t == DType::kQ8_0 && path == sx::cpu::MatmulPath::kGemmQ8);
  double l1_flops = 0;  // the microkernel in L1 just before each call: the best, paired with `best`
  for (auto _ : state) {
    if (int8 && m > 16) {
      state.PauseTiming();
      l1_flops = std::max(l1_flops, q8_microkernel_l1_flops(300));
      state.ResumeTiming();
    }
    p.w = w.copy(i++);
    const double c0 = process_cpu_seconds();
    const auto t0 = std::chrono::steady_clock::now();
    sx::cpu::matmul(pool, scratch, p, path);
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    best_cpu = std::min(best_cpu, (process_cpu_seconds() - c0) / threads);
    seconds += s;
    best = std::min(best, s);
    benchmark::DoNotOptimize(y.data());
  }
  // Rates from the mean and from the fastest call (the machine is shared: the fastest call is the
  // one least disturbed; the bandwidth yardstick is also a best-of).
  const double calls = static_cast<double>(state.iterations());
  const double bytes = static_cast<double>(w.bytes), flops = 2.0 * m * n * k;
  state.counters["GB_s"] = bytes * calls / seconds / 1e9;
  state.counters["GFLOP_s"] = flops * calls / seconds / 1e9;
  state.counters["us_best"] = best * 1e6;
  if (m <= 16) {
    state.counters["GB_s_best"] = bytes / best / 1e9;
    if (g_bandwidth.count(threads) != 0) state.counters["bw_frac"] = bytes / best / g_bandwidth[threads];
    state.counters["GB_s_cpu"] = bytes / best_cpu / 1e9;
  } else {
    state.counters["GFLOP_s_best"] = flops / best / 1e9;
    state.counters["GFLOP_s_cpu"] = flops / best_cpu / 1e9;
    if (g_clock_hz > 0) state.counters["peak_frac_cpu"] = flops / best_cpu / (threads * 32.0 * g_clock_hz);
    if (g_clock_hz > 0) state.counters["peak_frac"] = flops / best / (threads * 32.0 * g_clock_hz);
    if (l1_flops > 0) state.counters["l1_frac"] = flops / best / (threads * l1_flops);
  }
}

// One Qwen2.5-0.5B layer's matmuls for m tokens (q, k, v, o, gate, up, down), all in format t.
struct Shape {
  const char* name;
  std::int64_t n, k;
};
constexpr Shape kLayer[] = {{"q", 896, 896},     {"k", 128, 896},    {"v", 128, 896},  {"o", 896, 896},
                            {"gate", 4864, 896}, {"up", 4864, 896}, {"down", 896, 4864}};
constexpr Shape kLmHead = {"lm_head", 151936, 896};
constexpr int kLayers = 24;

// Prefill estimate: 24 x (one layer at m tokens) + LM head for the last token -> tokens/s.
void run_prefill_model(benchmark::State& state, DType t, std::int64_t m, int threads) {
  sx::ThreadPool& pool = pool_for(threads);
  sx::cpu::Scratch scratch;
  const std::vector<float> x = random_x(m, 4864);
  std::vector<float> y(static_cast<std::size_t>(m * 151936 / 64 + m * 4864));
  struct Prepared {
    std::vector<std::byte> w;
    Shape s;
  };
  std::vector<Prepared> mats;
  for (const Shape& s : kLayer) {
    Prepared pr{std::vector<std::byte>(sx::cpu::tensor_bytes(t, s.n, s.k)), s};
    const Weights& w = weights(t, s.n, s.k, false);
    std::memcpy(pr.w.data(), w.data.get(), pr.w.size());
    mats.push_back(std::move(pr));
  }
  const Weights& head_w = weights(t, kLmHead.n, kLmHead.k, false);  // generated before timing
  auto run_layer = [&] {
    for (const Prepared& pr : mats) {
      sx::cpu::MatmulProblem p;
      p.w = pr.w.data();
      p.w_type = t;
      p.x = x.data();
      p.y = y.data();
      p.m = m;
      p.n = pr.s.n;
      p.k = pr.s.k;
      sx::cpu::matmul(pool, scratch, p);
    }
  };
  auto run_head = [&] {
    sx::cpu::MatmulProblem p;
    p.w = head_w.data.get();
    p.w_type = t;
    p.x = x.data();
    p.y = y.data();
    p.m = 1;
    p.n = kLmHead.n;
    p.k = kLmHead.k;
    sx::cpu::matmul(pool, scratch, p);
  };
  run_layer();  // warm-up: scratch allocation, first touch of y
  run_head();
  double layer_s = 0, head_s = 0, layer_best = 1e30, head_best = 1e30, layer_cpu = 1e30, head_cpu = 1e30;
  for (auto _ : state) {
    double c0 = process_cpu_seconds();
    auto t0 = std::chrono::steady_clock::now();
    run_layer();
    auto t1 = std::chrono::steady_clock::now();
    layer_s += std::chrono::duration<double>(t1 - t0).count();
    layer_best = std::min(layer_best, std::chrono::duration<double>(t1 - t0).count());
    layer_cpu = std::min(layer_cpu, process_cpu_seconds() - c0);
    c0 = process_cpu_seconds();
    t0 = std::chrono::steady_clock::now();
    run_head();
    const double hs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    head_cpu = std::min(head_cpu, process_cpu_seconds() - c0);
    head_s += hs;
    head_best = std::min(head_best, hs);
    benchmark::DoNotOptimize(y.data());
  }
  const double it = static_cast<double>(state.iterations());
  const double per_layer = layer_s / it, head = head_s / it;
  double flops = 0;
  for (const Shape& s : kLayer) flops += 2.0 * m * s.n * s.k;
  state.counters["layer_ms"] = per_layer * 1e3;
  state.counters["lm_head_ms"] = head * 1e3;
  state.counters["GFLOP_s"] = flops / per_layer / 1e9;
  state.counters["prefill_tok_s"] = static_cast<double>(m) / (kLayers * per_layer + head);
  state.counters["prefill_tok_s_best"] = static_cast<double>(m) / (kLayers * layer_best + head_best);
  const double layer_c = layer_cpu / threads, head_c = head_cpu / threads;  // best iteration
  state.counters["GFLOP_s_cpu"] = flops / layer_c / 1e9;
  state.counters["prefill_tok_s_cpu"] = static_cast<double>(m) / (kLayers * layer_c + head_c);
}

void register_all() {
  const DType types[] = {sx::cpu::kQ8_0R16, DType::kQ8_0,     DType::kF16,      DType::kF32,
                         DType::kBF16,      sx::cpu::kF16R16, sx::cpu::kF32R16, sx::cpu::kBF16R16};
  const Shape shapes[] = {{"896x896", 896, 896}, {"4864x896", 4864, 896}, {"896x4864", 896, 4864},
                          {"151936x896", 151936, 896}};
  using sx::cpu::MatmulPath;
  for (DType t : types) {
    for (const Shape& s : shapes) {
      for (int threads : {1, 2}) {
        for (std::int64_t m : {1, 4, 16, 32, 40, 64}) {
          if (m != 1 && threads == 1) continue;
          if (m > 16 && t != sx::cpu::kQ8_0R16) continue;  // the rows of a paced mixed step (issue 24)
          const std::string name = std::string("gemv/") + std::string(sx::cpu::type_name(t)) + "/" + s.name +
                                   "/m" + std::to_string(m) + "/t" + std::to_string(threads);
          benchmark::RegisterBenchmark(name.c_str(), [=](benchmark::State& st) {
            run_matmul(st, t, m, s.n, s.k, threads, MatmulPath::kAuto, cold_gemv());
          })->UseRealTime()->MinTime(0.3);
        }
      }
    }
  }
  for (DType t : types) {
    for (const Shape& s : shapes) {
      if (s.n > 100000) continue;  // the LM head runs for one token per prefill
      for (MatmulPath path : {MatmulPath::kGemmF32, MatmulPath::kGemmQ8}) {
        if (path == MatmulPath::kGemmQ8 && t != DType::kQ8_0 && t != sx::cpu::kQ8_0R16) continue;
        if (t == sx::cpu::kQ8_0R16 && path != MatmulPath::kGemmQ8) continue;  // one kernel family
        for (int threads : {1, 2}) {
          const std::string name = std::string("gemm/") + std::string(sx::cpu::type_name(t)) + "/" + s.name +
                                   "/m512/t" + std::to_string(threads) + "/" + path_name(path);
          benchmark::RegisterBenchmark(name.c_str(), [=](benchmark::State& st) {
            run_matmul(st, t, 512, s.n, s.k, threads, path, false);
          })->UseRealTime()->MinTime(0.5);
        }
      }
    }
  }
  // GGML block formats of a Q4_K_M file at the 0.5B shapes whose k fits their block: K-quants need k
  // a multiple of 256 (only ffn_down, 896x4864), Q5_0 takes the 896-wide ones (llama.cpp's fallback).
  const struct {
    DType t;
    Shape s;
  } block_cases[] = {
      {DType::kQ4_K, {"896x4864", 896, 4864}},   {DType::kQ6_K, {"896x4864", 896, 4864}},
      {DType::kQ5_0, {"896x896", 896, 896}},     {DType::kQ5_0, {"4864x896", 4864, 896}},
      {DType::kQ5_0, {"151936x896", 151936, 896}}, {sx::cpu::kQ5_0R8, {"896x896", 896, 896}},
      {sx::cpu::kQ5_0R8, {"4864x896", 4864, 896}}, {DType::kQ4_0, {"4864x896", 4864, 896}},
      {DType::kQ5_K, {"896x4864", 896, 4864}},
  };
  for (const auto& c : block_cases) {
    for (int threads : {1, 2}) {
      for (std::int64_t m : {1, 4}) {
        if (m != 1 && threads == 1) continue;
        const std::string name = std::string("gemv/") + std::string(sx::cpu::type_name(c.t)) + "/" + c.s.name + "/m" +
                                 std::to_string(m) + "/t" + std::to_string(threads);
        benchmark::RegisterBenchmark(name.c_str(), [=](benchmark::State& st) {
          run_matmul(st, c.t, m, c.s.n, c.s.k, threads, MatmulPath::kAuto, cold_gemv());
        })->UseRealTime()->MinTime(0.3);
      }
    }
    if (c.s.n > 100000) continue;
    for (int threads : {1, 2}) {
      const std::string name = std::string("gemm/") + std::string(sx::cpu::type_name(c.t)) + "/" + c.s.name +
                               "/m512/t" + std::to_string(threads) + "/gemm_f32";
      benchmark::RegisterBenchmark(name.c_str(), [=](benchmark::State& st) {
        run_matmul(st, c.t, 512, c.s.n, c.s.k, threads, MatmulPath::kGemmF32, false);
      })->UseRealTime()->MinTime(0.5);
    }
  }
  for (DType t : types) {
    const std::string name = std::string("prefill_model_0.5b/") + std::string(sx::cpu::type_name(t)) + "/m512/t2";
    benchmark::RegisterBenchmark(name.c_str(), [=](benchmark::State& st) { run_prefill_model(st, t, 512, 2); })
        ->UseRealTime()
        ->MinTime(1.0);
  }
}

}  // namespace

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  g_clock_hz = measure_clock_hz();
  for (int threads : {1, 2}) g_bandwidth[threads] = sx::measure_read_bandwidth(pool_for(threads), std::size_t{1} << 30, 5);
  std::printf("clock (dependent FMA): %.2f GHz; FMA peak: %.1f GFLOP/s per thread\n", g_clock_hz / 1e9, 32.0 * g_clock_hz / 1e9);
  for (auto& [t, bw] : g_bandwidth) std::printf("read bandwidth, %d thread(s): %.2f GB/s\n", t, bw / 1e9);
  if (const double l1 = measure_q8_microkernel_l1_flops(); l1 > 0 && g_clock_hz > 0) {
    const double floor = measure_madd_add_floor_cycles();
    const double cycles = 192.0 * 2.0 / (l1 / g_clock_hz);  // per k-pair of 6 tokens x 16 rows
    std::printf("int8 microkernel, panels in L1, 1 thread: %.1f GFLOP/s, %.2f cycles per 192 multiply-adds "
                "(its vpmaddwd + vpaddd alone, on registers: %.2f cycles)\n",
                l1 / 1e9, cycles, floor);
  }
  register_all();
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
