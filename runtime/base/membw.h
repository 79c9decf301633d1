// Measured memory read bandwidth: the yardstick for memory-bound kernels (decode GEMV, DESIGN.md §8).
//
// measure_read_bandwidth streams a buffer much larger than the last-level cache with every thread
// of `pool` and returns bytes per second. The buffer is written once first (so its pages exist),
// then read `reps` times in rounds: in each round every thread reads its own 4 MiB segment with
// wide loads as four prefetched streams (the fastest pattern measured; the sums are consumed, so
// nothing is optimised away), and the round is timed. The
// result is the fastest round: rounds are short (~0.1-0.3 ms), so on a shared machine some run
// undisturbed by time-slicing, while one long timed pass would count the time other processes
// held the cores. Kernel benchmarks compare against it with the same best-of rule;
// measure_read_bandwidth_rounds also gives the median round, for a yardstick that meets the same
// disturbances as a longer run (sextant bench pairs each decode run with one).
//
// Threading: uses `pool` (one job at a time per pool, like every kernel); blocks for about
// (reps + 1) * bytes / bandwidth seconds. Errors: none (allocation failure aborts, as std::vector
// does).
#pragma once

#include <cstddef>

#include "runtime/base/thread_pool.h"

namespace sx {

// Default size: 1 GiB, over 8x the LLC of the machines we target (32 MiB L3 on the dev box).
inline constexpr std::size_t kMembwDefaultBytes = std::size_t{1} << 30;

double measure_read_bandwidth(ThreadPool& pool, std::size_t bytes = kMembwDefaultBytes, int reps = 3);

// The same measurement, with the median and slowest rounds next to the fastest (bytes/s; all 0 if no round
// could be timed). The median is the machine as a longer kernel run meets it, time-slicing and
// other tenants' memory traffic included; the fastest is the machine undisturbed.
// slowest is the slowest round: (best - slowest) / median is the probe's own spread, how much the
// machine moved under it.
struct ReadBandwidth {
  double best = 0.0;
  double median = 0.0;
  double slowest = 0.0;
  int rounds = 0;
};
ReadBandwidth measure_read_bandwidth_rounds(ThreadPool& pool, std::size_t bytes = kMembwDefaultBytes, int reps = 3);

}  // namespace sx
