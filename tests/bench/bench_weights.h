// The weight buffers of the CPU matmul benchmarks (bench_matmul, bench_decode).
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <memory>

#include <sys/mman.h>

namespace sx::bench {

// Weights for one shape/format: `copies` identical copies laid end to end, in memory like the CPU
// device's weight buffers (2 MiB-aligned, transparent huge pages asked for with madvise): how W is
// paged changes how the hardware prefetchers follow the streams.
struct Weights {
  struct Free {
    void operator()(std::byte* p) const { std::free(p); }
  };
  std::unique_ptr<std::byte, Free> data;
  std::size_t bytes = 0;
  int copies = 1;
  void allocate(std::size_t total) {
    constexpr std::size_t kHuge = std::size_t{2} << 20;
    const std::size_t rounded = (total + kHuge - 1) / kHuge * kHuge;
    data.reset(static_cast<std::byte*>(std::aligned_alloc(kHuge, rounded)));
    if (!data) std::abort();
    madvise(data.get(), rounded, MADV_HUGEPAGE);  // a hint, as in CpuDevice::alloc
  }
  const void* copy(std::int64_t i) const { return data.get() + bytes * static_cast<std::size_t>(i % copies); }
};

}  // namespace sx::bench
