// The weights and inputs of the CPU matmul benchmarks (bench_matmul, bench_decode).
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <random>
#include <vector>

#include <sys/mman.h>

#include "backends/cpu/kernels/layouts.h"
#include "backends/cpu/kernels/matmul.h"
#include "runtime/hal/dtype.h"

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

// `copies` copies of a random [n][k] W in CPU weight type t (a file format, or an interleaved
// layout made from the plain rows of its source format): values ~ N(0, 0.05) through the format's
// quantiser; AWQ int4, which has none (checkpoints bring it), uniform nibbles with scale 0.01 and
// zero 8.
inline Weights make_weights(hal::DType t, std::int64_t n, std::int64_t k, int copies) {
  Weights w;
  w.bytes = cpu::tensor_bytes(t, n, k);
  w.copies = copies;
  w.allocate(w.bytes * static_cast<std::size_t>(copies));
  std::mt19937 rng(1);
  const hal::DType plain = cpu::layout_source(t);
  const std::size_t rb = hal::row_bytes(plain, k);
  std::vector<std::byte> rows(rb * static_cast<std::size_t>(n));
  if (plain == hal::DType::kAwqInt4) {
    std::uniform_int_distribution<int> byte(0, 255);
    for (std::int64_t j = 0; j < n; ++j) {
      for (std::int64_t g = 0; g < k / hal::kAwqInt4Group; ++g) {
        std::byte* b = rows.data() + rb * static_cast<std::size_t>(j) + g * hal::kAwqInt4BlockBytes;
        for (int i = 0; i < hal::kAwqInt4Group / 2; ++i) b[i] = static_cast<std::byte>(byte(rng));
        const std::uint16_t scale = 0x211F, zero = 0x4800;  // fp16 0.01, 8
        std::memcpy(b + hal::kAwqInt4Group / 2, &scale, 2);
        std::memcpy(b + hal::kAwqInt4Group / 2 + 2, &zero, 2);
      }
    }
  } else {
    std::normal_distribution<float> nd(0.0f, 0.05f);
    std::vector<float> row(static_cast<std::size_t>(k));
    for (std::int64_t j = 0; j < n; ++j) {
      for (float& v : row) v = nd(rng);
      hal::quantize_row(plain, row.data(), rows.data() + rb * static_cast<std::size_t>(j), k);
    }
  }
  if (plain != t) {
    cpu::repack_rows(t, rows.data(), n, k, w.data.get());
  } else {
    std::memcpy(w.data.get(), rows.data(), rows.size());
  }
  for (int c = 1; c < copies; ++c) std::memcpy(w.data.get() + w.bytes * c, w.data.get(), w.bytes);
  return w;
}

// m rows of k activations ~ N(0, 1).
inline std::vector<float> random_x(std::int64_t m, std::int64_t k) {
  std::mt19937 rng(2);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<float> x(static_cast<std::size_t>(m * k));
  for (float& v : x) v = nd(rng);
  return x;
}

inline const char* path_name(cpu::MatmulPath p) {
  switch (p) {
    case cpu::MatmulPath::kGemv:
      return "gemv";
    case cpu::MatmulPath::kGemmF32:
      return "gemm_f32";
    case cpu::MatmulPath::kGemmQ8:
      return "gemm_q8";
    default:
      return "auto";
  }
}

}  // namespace sx::bench
