// Internal entry points of the CPU matmul kernels, shared by matmul.cpp and the per-path files.
//
// Each function takes a validated MatmulProblem (see matmul.h) and writes all of p.y.
// Scratch slots used: kSlotActs (quantised x, or x as BF16), kSlotPackedX (packed x), kSlotThread0 + t
// (per-thread W panels). Scratch::get is called on the calling thread only, before any dispatch.
#pragma once

#include <algorithm>
#include <atomic>
#include <cstdint>

#include "backends/cpu/kernels/kernel_table.h"
#include "backends/cpu/kernels/matmul.h"

#if !defined(SX_CPU_ISA_NS)
#error "matmul_internal.h belongs to the kernel units, compiled once per ISA level (kernel_table.h)"
#endif

namespace sx::cpu::SX_CPU_ISA_NS::detail {

inline constexpr int kSlotActs = 0;
inline constexpr int kSlotPackedX = 1;
inline constexpr int kSlotThread0 = 2;

// Small m, Q8_0: x quantised to int8 blocks, int8 dot products.
void gemv_q8_0(ThreadPool& pool, Scratch& scratch, const MatmulProblem& p);
// Small m, the other GGML block formats (Q4_0 ... Q6_K): int8 kernels for Q4_K, Q6_K and Q5_0
// where has_quant_gemv_kernel says so, else each row dequantised to F32 (gemv_quant.cpp).
void gemv_quant(ThreadPool& pool, Scratch& scratch, const MatmulProblem& p);
bool has_quant_gemv_kernel(hal::DType t);
// Any m for F32, F16 and BF16 (and their 16-row layouts), large m for the other formats: W panels
// dequantised to F32 (or BF16 pairs), packed unless the layout holds them so, register-tiled
// microkernels; below 8 tokens W panel by panel with fewer token accumulators, the same arithmetic.
void gemm_f32(ThreadPool& pool, Scratch& scratch, const MatmulProblem& p);
// Large m, Q8_0: x quantised once, W interleaved into 16-row panels, int8 register-tiled microkernel.
void gemm_q8_0(ThreadPool& pool, Scratch& scratch, const MatmulProblem& p);
// kQ8_0R16 weights, any m: the same microkernels reading W in place.
void matmul_q8_0_r16(ThreadPool& pool, Scratch& scratch, const MatmulProblem& p);

// Quantises rows [r0, r1) of x (row stride k) into qs (row stride k) and d (row stride k / 32).
void quantize_rows_q8(const float* x, std::int64_t r0, std::int64_t r1, std::int64_t k,
                      std::int8_t* qs, float* d);

inline std::int64_t ceil_div(std::int64_t a, std::int64_t b) { return (a + b - 1) / b; }

// Tasks per thread of a GEMV (or a one-token Q8_0 matmul): few, so that each task's row streams
// are long. The hardware prefetchers need a stream to run a while before they are ahead of it:
// with 16 tasks per thread (4 streams of ~27 KiB each for a 4864 x 896 Q5_1 matrix) the Q4_0 and
// Q5_1 GEMVs read 32-37 GB/s from DRAM while the 2-thread bandwidth probe read 50-54 (AMD EPYC,
// 2 vCPUs, bench_decode in alternation); with 1-2 tasks per thread 42-50 GB/s, the same as the
// probe where it read ~34.
inline constexpr int kGemvTasksPerThread = 2;

// Claims the next guided chunk of [0, n) from `next` (the first index not yet handed out) into
// [r0, r1): 1 / parts of what is left, rounded up to a multiple of `align`, at least min_chunk
// (the last chunk: what is left). False when nothing is left.
inline bool claim_guided_chunk(std::atomic<std::int64_t>& next, std::int64_t n, std::int64_t parts,
                               std::int64_t min_chunk, std::int64_t align, std::int64_t& r0, std::int64_t& r1) {
  r0 = next.load(std::memory_order_relaxed);
  do {
    if (r0 >= n) return false;
    const std::int64_t share = ceil_div(ceil_div(n - r0, parts), align) * align;
    r1 = std::min(n, r0 + std::max(min_chunk, share));
  } while (!next.compare_exchange_weak(r0, r1, std::memory_order_relaxed));
  return true;
}

// Runs fn(r0, r1) over [0, n) in chunks of rows (multiples of 4, at least 16, the last one what is
// left), handed out guided: each chunk is 1 / (kGemvTasksPerThread * threads) of the rows not yet
// handed out, so the first ones are long (long streams, above) and the last ones short (a thread
// held up by the machine leaves the others little to wait for: in 3 interleaved pairs against 2
// equal chunks per thread, Q5_K-file decode 70/88/75 -> 82/92/79 tokens/s, Q4_0 105/108/106 ->
// 104/119/110). n <= 16 runs on the calling thread. Used by the GEMVs.
template <typename Fn>
void for_row_chunks(ThreadPool& pool, std::int64_t n, Fn&& fn) {
  constexpr std::int64_t kMinChunk = 16;
  const std::int64_t threads = pool.size();
  if (threads == 1 || n <= kMinChunk) {
    if (n > 0) fn(std::int64_t{0}, n);
    return;
  }
  std::atomic<std::int64_t> next{0};
  pool.run_on_all([&](int, int) {
    std::int64_t r0 = 0, r1 = 0;
    while (claim_guided_chunk(next, n, threads * kGemvTasksPerThread, kMinChunk, 4, r0, r1)) fn(r0, r1);
  });
}

// Rows (or W panels) [r0, r1) of one task, kRowStreams at a time: row q of each of the range's
// kRowStreams equal parts together, then the (< kRowStreams) rows left over together too.
// fn(const std::int64_t (&rows)[R]) is called with R = kRowStreams, and once with R = 1, 2 or 3
// for the rest (a leftover row alone ran ~2x slower per byte than a stream among four: 9% of a
// Q8_0 decode profile went to leftovers when they ran one at a time). A kernel that runs
// the R rows in lockstep reads R streams through W, which keeps more memory requests in flight than
// one (Zen 3, one thread: one stream reads ~10-14 GB/s of the ~20 the core can, as the bandwidth
// measurement's four streams do).
inline constexpr int kRowStreams = 4;

template <typename Fn>
void for_row_streams(std::int64_t r0, std::int64_t r1, Fn&& fn) {
  const std::int64_t part = (r1 - r0) / kRowStreams;
  for (std::int64_t q = 0; q < part; ++q) {
    std::int64_t rows[kRowStreams];
    for (int s = 0; s < kRowStreams; ++s) rows[s] = r0 + s * part + q;
    fn(rows);
  }
  static_assert(kRowStreams == 4);
  const std::int64_t rest = r0 + kRowStreams * part;
  switch (r1 - rest) {
    case 1: {
      const std::int64_t rows[1] = {rest};
      fn(rows);
      return;
    }
    case 2: {
      const std::int64_t rows[2] = {rest, rest + 1};
      fn(rows);
      return;
    }
    case 3: {
      const std::int64_t rows[3] = {rest, rest + 1, rest + 2};
      fn(rows);
      return;
    }
    default:
      return;
  }
}

}  // namespace sx::cpu::SX_CPU_ISA_NS::detail
