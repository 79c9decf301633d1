// Streaming read bandwidth (runtime/base/membw.h) with 1..N threads: the yardstick of decode.
#include <benchmark/benchmark.h>

#include <memory>

#include "runtime/base/membw.h"
#include "runtime/base/thread_pool.h"

namespace {

void BM_ReadBandwidth(benchmark::State& state) {
  sx::ThreadPool pool(static_cast<int>(state.range(0)));
  double bw = 0;
  for (auto _ : state) bw = sx::measure_read_bandwidth(pool, std::size_t{1} << 30, 5);
  state.counters["GB_s"] = bw / 1e9;
}
BENCHMARK(BM_ReadBandwidth)->DenseRange(1, 4)->Iterations(1)->UseRealTime()->Unit(benchmark::kMillisecond);

}  // namespace

BENCHMARK_MAIN();
