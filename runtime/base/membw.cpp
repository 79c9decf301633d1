// Multi-threaded streaming read benchmark (see membw.h).
#include "runtime/base/membw.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <vector>

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>
#define SX_MEMBW_AVX2 1
#endif

namespace sx {

namespace {

// Sums a slice of n 64-bit words (n a multiple of 32) as four interleaved streams (its quarters)
// with a software prefetch 512 bytes ahead: on Zen 3 this reads ~40% faster per core than one
// plain stream, as the GEMV kernels do (several rows in flight, prefetched).
#if defined(SX_MEMBW_AVX2)
__attribute__((target("avx2"))) std::uint64_t read_slice_avx2(const std::uint64_t* p, std::size_t n) {
  constexpr std::size_t kStreams = 4;
  const std::size_t part = n / kStreams;  // a multiple of 8 words (one 64-byte line)
  __m256i a[kStreams][2];
  for (auto& s : a) s[0] = s[1] = _mm256_setzero_si256();
  for (std::size_t i = 0; i < part; i += 8) {
    for (std::size_t s = 0; s < kStreams; ++s) {
      const std::uint64_t* q = p + s * part + i;
      _mm_prefetch(reinterpret_cast<const char*>(q) + 512, _MM_HINT_T0);
      a[s][0] = _mm256_add_epi64(a[s][0], _mm256_load_si256(reinterpret_cast<const __m256i*>(q)));
      a[s][1] = _mm256_add_epi64(a[s][1], _mm256_load_si256(reinterpret_cast<const __m256i*>(q + 4)));
    }
  }
  __m256i sum = _mm256_setzero_si256();
  for (auto& s : a) sum = _mm256_add_epi64(sum, _mm256_add_epi64(s[0], s[1]));
  alignas(32) std::uint64_t lanes[4];
  _mm256_store_si256(reinterpret_cast<__m256i*>(lanes), sum);
  return lanes[0] + lanes[1] + lanes[2] + lanes[3];
}
#endif

std::uint64_t read_slice(const std::uint64_t* p, std::size_t n) {
#if defined(SX_MEMBW_AVX2)
  static const bool avx2 = __builtin_cpu_supports("avx2");
  if (avx2) return read_slice_avx2(p, n);
#endif
  constexpr std::size_t kStreams = 4;
  const std::size_t part = n / kStreams;  // a multiple of 8 words (one 64-byte line)
  std::uint64_t a[kStreams] = {0, 0, 0, 0};
  for (std::size_t i = 0; i < part; ++i) {
    for (std::size_t s = 0; s < kStreams; ++s) a[s] += p[s * part + i];
  }
  return a[0] + a[1] + a[2] + a[3];
}

}  // namespace

ReadBandwidth measure_read_bandwidth_rounds(ThreadPool& pool, std::size_t bytes, int reps) {
  constexpr std::size_t kChunkWords = 32;                  // four streams of whole lines
  constexpr std::size_t kSegmentWords = (4u << 20) / 8;    // 4 MiB per thread and round
  const std::size_t n_threads = static_cast<std::size_t>(pool.size());
  const std::size_t words_wanted = std::max<std::size_t>(bytes / sizeof(std::uint64_t), kChunkWords * n_threads);
  std::size_t seg = std::min(kSegmentWords, words_wanted / n_threads);
  seg -= seg % kChunkWords;
  const std::size_t rounds = words_wanted / (seg * n_threads);
  const std::size_t words = rounds * seg * n_threads;

  // 64-byte aligned view into an over-allocated vector (no raw new/delete).
  std::vector<std::uint64_t> storage(words + 8);
  std::uint64_t* base = storage.data();
  base += ((64 - reinterpret_cast<std::uintptr_t>(base) % 64) % 64) / sizeof(std::uint64_t);

  // First touch by the thread that reads each segment (page placement; page faults untimed).
  pool.run_on_all([&](int t, int) {
    for (std::size_t r = 0; r < rounds; ++r) {
      std::uint64_t* p = base + (r * n_threads + static_cast<std::size_t>(t)) * seg;
      for (std::size_t i = 0; i < seg; ++i) p[i] = i ^ r;
    }
  });

  std::vector<std::uint64_t> sums(n_threads * 8, 0);  // one cache line per thread
  std::atomic<std::uint64_t> sink{0};
  std::vector<double> rates;  // bytes/s of each round
  for (int rep = 0; rep < std::max(reps, 1); ++rep) {
    for (std::size_t r = 0; r < rounds; ++r) {
      const std::uint64_t* round_base = base + r * n_threads * seg;
      const auto t0 = std::chrono::steady_clock::now();
      pool.run_on_all([&](int t, int) {
        sums[static_cast<std::size_t>(t) * 8] = read_slice(round_base + static_cast<std::size_t>(t) * seg, seg);
      });
      const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      std::uint64_t total = 0;
      for (std::size_t t = 0; t < n_threads; ++t) total += sums[t * 8];
      sink.fetch_add(total, std::memory_order_relaxed);  // consumed: the reads cannot be elided
      if (s > 0) rates.push_back(static_cast<double>(seg * n_threads * sizeof(std::uint64_t)) / s);
    }
  }
  ReadBandwidth out;
  if (rates.empty()) return out;
  std::sort(rates.begin(), rates.end());
  out.best = rates.back();
  out.median = rates[rates.size() / 2];
  out.slowest = rates.front();
  out.rounds = static_cast<int>(rates.size());
  return out;
}

double measure_read_bandwidth(ThreadPool& pool, std::size_t bytes, int reps) {
  return measure_read_bandwidth_rounds(pool, bytes, reps).best;
}

}  // namespace sx
