// Embedding gather: one table row per token, converted to F32.
#include "backends/cpu/ops/cpu_ops.h"

#include <vector>

#include "backends/cpu/kernels/layouts.h"

namespace sx::cpu {

void embedding(ThreadPool& pool, const void* table, hal::DType type, std::int64_t rows, const std::int32_t* ids,
               float* out, std::int64_t n_tokens, std::int64_t dim) {
  if (interleaved_rows(type) > 1) {  // a row is spread over its group
    pool.parallel_for(n_tokens,
                      [&](std::int64_t t) { dequantize_tensor_row(type, table, dim, ids[t], rows, out + t * dim); });
    return;
  }
  const std::size_t row = cpu::row_bytes(type, dim);
  pool.parallel_for(n_tokens, [&](std::int64_t t) {
    const auto* src = static_cast<const std::byte*>(table) + static_cast<std::size_t>(ids[t]) * row;
    load_row_f32(type, src, out + t * dim, dim);
  });
}

}  // namespace sx::cpu
