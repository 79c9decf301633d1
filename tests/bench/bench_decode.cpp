// Decode microbenchmark (issue 44): where each weight format's decode time goes on each ISA level.
//
// For every ISA level this machine runs (kernels_for), every weight format in the layout the CPU
// device keeps it in at that level, the two shapes of a Qwen2.5-0.5B FFN (up 4864x896, down
// 896x4864; the 256-blocks of the K-quants only fit down) and m = 1, 4, 16 tokens, and its
// attention's q / o (896x896) and k / v (128x896) at m = 1 (small matrices: how much of a decode
// step's reading is lost to starting streams and to the fork-join), one case:
//   GB_s        bytes of W per second, each call reading the next of several copies of W whose
//               total is far beyond the last-level cache (decode: W comes from DRAM), mean of calls
//   bw_GB_s     the streaming read bandwidth measured right after the case's calls, same threads
//               (median round), and bw_spread: (fastest round - slowest) / median of that probe
//   bw_frac     GB_s / bw_GB_s: how close the kernel comes to the memory bound
//   cache_GB_s  the same kernel on one copy of W that stays in the cache (no DRAM wait): its
//               arithmetic ceiling, and cache_frac = cache_GB_s / bw_GB_s
// and a label: "memory" where the kernel runs at least 1.25x faster from cache than DRAM allows
// (so DRAM is what holds it), "compute" where it does not (its instructions are the limit, by the
// factor 1 / cache_frac), then the matmul path taken.
//
// And a decode step's attention on each level ("attention/LEVEL/f32/ctxN"): one token of a
// Qwen2.5-0.5B layer (14 query heads, 2 KV heads of 64) over N positions of an F32 paged KV cache
// (blocks of 16), the same counters with the K and V rows read as the bytes.
//
// SX_BENCH_THREADS=N sets the thread count (default: all hardware threads). Filter with
// --benchmark_filter, e.g. 'decode/avx512-vnni/q8_0' or '/m1$'.
#include <benchmark/benchmark.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "backends/cpu/kernels/isa.h"
#include "backends/cpu/kernels/kernel_table.h"
#include "backends/cpu/kernels/matmul.h"
#include "backends/cpu/ops/cpu_ops.h"
#include "runtime/base/membw.h"
#include "runtime/base/thread_pool.h"
#include "runtime/hal/dtype.h"
#include "tests/bench/bench_weights.h"

namespace {

using sx::bench::path_name;
using sx::bench::Weights;
using sx::hal::DType;

constexpr std::size_t kColdBytes = std::size_t{512} << 20;   // W copies: far beyond any L3 we meet
constexpr std::size_t kProbeBytes = std::size_t{256} << 20;  // bandwidth probe after each case

int bench_threads() {
  static const int n = [] {
    const char* v = std::getenv("SX_BENCH_THREADS");
    const int t = v != nullptr ? std::atoi(v) : 0;
    return t > 0 ? t : sx::hardware_threads();
  }();
  return n;
}

sx::ThreadPool& pool() {
  static sx::ThreadPool p(bench_threads());
  return p;
}

double seconds(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// The counters of one case whose call(copy) reads `bytes`: each iteration times the call on the next
// of `copies` copies (after one warm-up pass over all of them: scratch, page tables), then the
// bandwidth probe runs, then call(0) in batches of per_batch on the one copy that stays in cache
// (best of 12: the machine may be shared). True where memory is what holds the kernel (it runs at
// least 1.25x faster from cache than the bandwidth allows).
template <typename Call>
bool measure(benchmark::State& state, sx::ThreadPool& tp, int copies, double bytes, int per_batch, Call call) {
  for (int c = 0; c < copies; ++c) call(c);
  std::int64_t i = 0;
  double total = 0;
  for (auto _ : state) {
    const auto t0 = std::chrono::steady_clock::now();
    call(++i);
    total += seconds(t0);
  }
  const sx::ReadBandwidth bw = sx::measure_read_bandwidth_rounds(tp, kProbeBytes, 3);
  double cache_best = 1e30;
  call(0);
  for (int batch = 0; batch < 12; ++batch) {
    const auto t0 = std::chrono::steady_clock::now();
    for (int c = 0; c < per_batch; ++c) call(0);
    cache_best = std::min(cache_best, seconds(t0) / per_batch);
  }
  const double rate = bytes * static_cast<double>(state.iterations()) / total;
  const double cache_rate = bytes / cache_best;
  state.counters["GB_s"] = rate / 1e9;
  state.counters["bw_GB_s"] = bw.median / 1e9;
  state.counters["bw_spread"] = bw.median > 0 ? (bw.best - bw.slowest) / bw.median : 0;
  state.counters["bw_frac"] = bw.median > 0 ? rate / bw.median : 0;
  state.counters["cache_GB_s"] = cache_rate / 1e9;
  state.counters["cache_frac"] = bw.median > 0 ? cache_rate / bw.median : 0;
  return cache_rate >= 1.25 * bw.median;
}

void run_case(benchmark::State& state, const sx::cpu::KernelTable& kt, DType layout, std::int64_t n, std::int64_t k,
              std::int64_t m) {
  sx::ThreadPool& tp = pool();
  const std::size_t w_bytes = sx::cpu::tensor_bytes(layout, n, k);
  const int copies = static_cast<int>(std::max<std::size_t>(2, (kColdBytes + w_bytes - 1) / w_bytes));
  const Weights w = sx::bench::make_weights(layout, n, k, copies);
  const std::vector<float> x = sx::bench::random_x(m, k);
  std::vector<float> y(static_cast<std::size_t>(m * n));
  sx::cpu::Scratch scratch;
  sx::cpu::MatmulProblem p;
  p.w_type = layout;
  p.x = x.data();
  p.y = y.data();
  p.m = m;
  p.n = n;
  p.k = k;
  auto call = [&](std::int64_t copy) {
    p.w = w.copy(copy);
    kt.matmul(tp, scratch, p, sx::cpu::MatmulPath::kAuto);
    benchmark::DoNotOptimize(y.data());
  };
  const bool memory = measure(state, tp, w.copies, static_cast<double>(w.bytes),
                              std::max(4, static_cast<int>(2e6 / static_cast<double>(w.bytes))), call);
  state.SetLabel(std::string(memory ? "memory" : "compute") + " " + path_name(sx::cpu::select_matmul_path(p)));
}

// One decode token's attention over ctx positions, each call on the next of several copies of the
// KV cache (beyond the last-level cache, as a long context's are).
void run_attention(benchmark::State& state, const sx::cpu::KernelTable& kt, std::int64_t ctx) {
  sx::ThreadPool& tp = pool();
  constexpr std::int64_t kHeads = 14, kKvHeads = 2, kHd = 64, kBlock = 16;
  const std::int64_t kv_row = kKvHeads * kHd, blocks = (ctx + kBlock - 1) / kBlock;
  const std::size_t copy_bytes = static_cast<std::size_t>(blocks * kBlock * kv_row) * sizeof(float) * 2;
  const int copies = static_cast<int>(std::max<std::size_t>(2, (kColdBytes + copy_bytes - 1) / copy_bytes));
  const std::vector<float> q = sx::bench::random_x(1, kHeads * kHd);
  std::vector<float> k_cache(static_cast<std::size_t>(copies * blocks * kBlock * kv_row)), v_cache(k_cache.size());
  const std::vector<float> fill = sx::bench::random_x(1, 4096);
  for (std::size_t i = 0; i < k_cache.size(); ++i) k_cache[i] = fill[i % 4096], v_cache[i] = fill[(i + 77) % 4096];
  std::vector<std::int32_t> table(static_cast<std::size_t>(copies * blocks));
  for (std::size_t i = 0; i < table.size(); ++i) table[i] = static_cast<std::int32_t>(i);
  std::vector<float> out(static_cast<std::size_t>(kHeads * kHd));
  const std::int32_t starts[2] = {0, 1}, lens[1] = {static_cast<std::int32_t>(ctx)};
  sx::cpu::AttentionShape sh{DType::kF32, 1, 1, kHeads, kKvHeads, kHd, kBlock, blocks, 0, 0, kHeads / kKvHeads,
                             0.125f};
  auto call = [&](std::int64_t copy) {
    const sx::cpu::AttentionPtrs ptrs{q.data(), k_cache.data(), v_cache.data(), out.data(), starts, lens,
                                      table.data() + (copy % copies) * blocks};
    kt.paged_attention(tp, ptrs, sh);
    benchmark::DoNotOptimize(out.data());
  };
  const double bytes = static_cast<double>(ctx * kv_row) * sizeof(float) * 2;
  state.SetLabel(measure(state, tp, copies, bytes, 8, call) ? "memory" : "compute");
}

// The layout the CPU device keeps `format` in when `kt` is the level in use (layouts.h weight_layout).
DType layout_at(const sx::cpu::KernelTable& kt, DType format) {
  if (!kt.vector_interleaved) return format;
  if (format == DType::kQ8_0) return sx::cpu::kQ8_0R16;
  if (format == DType::kQ5_0) return sx::cpu::kQ5_0R8;
  if (format == DType::kQ4_0) return sx::cpu::kQ4_0R8;
  if (format == DType::kQ4_1) return sx::cpu::kQ4_1R8;
  if (format == DType::kQ5_1) return sx::cpu::kQ5_1R8;
  if (format == DType::kQ4_K) return sx::cpu::kQ4_KR8;
  if (format == DType::kQ5_K) return sx::cpu::kQ5_KR8;
  if (format == DType::kF32) return sx::cpu::kF32R16;
  if (format == DType::kF16) return sx::cpu::kF16R16;
  if (format == DType::kBF16) return sx::cpu::kBF16R16;
  return format;
}

void register_all() {
  const DType formats[] = {DType::kF32,  DType::kF16,  DType::kBF16, DType::kQ8_0, DType::kQ4_0,
                           DType::kQ4_1, DType::kQ5_0, DType::kQ5_1, DType::kQ2_K, DType::kQ3_K,
                           DType::kQ4_K, DType::kQ5_K, DType::kQ6_K, DType::kAwqInt4};
  const struct {
    const char* name;
    std::int64_t n, k;
    bool one_token_only;
  } shapes[] = {{"up_4864x896", 4864, 896, false},
                {"down_896x4864", 896, 4864, false},
                {"q_896x896", 896, 896, true},
                {"kv_128x896", 128, 896, true}};
  for (std::string_view level : sx::cpu::isa_levels()) {
    const sx::cpu::KernelTable* kt = sx::cpu::kernels_for(level);
    if (kt == nullptr) continue;
    for (std::int64_t ctx : {512, 2048, 8192}) {
      const std::string name = "attention/" + std::string(level) + "/f32/ctx" + std::to_string(ctx);
      benchmark::RegisterBenchmark(name.c_str(), [=](benchmark::State& st) { run_attention(st, *kt, ctx); })
          ->UseRealTime()
          ->MinTime(0.2);
    }
    for (DType f : formats) {
      for (const auto& s : shapes) {
        if (s.k % sx::hal::dtype_info(f).block_elems != 0) continue;
        for (std::int64_t m : {1, 4, 16}) {
          if (m > 1 && s.one_token_only) continue;
          const DType layout = layout_at(*kt, f);
          const std::string name = "decode/" + std::string(level) + "/" + std::string(sx::hal::dtype_name(f)) + "/" +
                                   s.name + "/m" + std::to_string(m);
          benchmark::RegisterBenchmark(name.c_str(), [=](benchmark::State& st) {
            run_case(st, *kt, layout, s.n, s.k, m);
          })->UseRealTime()->MinTime(0.2);
        }
      }
    }
  }
}

}  // namespace

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  const sx::cpu::CpuFeatures& f = sx::cpu::detected_features();
  std::printf("cpu: %s; %d threads; %s\n", f.model.empty() ? "unknown" : f.model.c_str(), bench_threads(),
              sx::cpu::cpu_isa_line().c_str());
  register_all();
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
