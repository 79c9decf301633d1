// Embedding gather: one table row per token, converted to F32.
#include "backends/cpu/ops/cpu_ops.h"

#include <vector>

namespace sx::cpu {

void embedding(ThreadPool& pool, const void* table, hal::DType type, const std::int32_t* ids, float* out,
               std::int64_t n_tokens, std::int64_t dim) {
  if (type == hal::DType::kQ8_0R16) {  // a row is spread over its group of 16: gather it first
    pool.parallel_for(n_tokens, [&](std::int64_t t) {
      std::vector<hal::BlockQ8_0> row(static_cast<std::size_t>(dim / hal::kQ8_0Block));
      hal::unpack_row_q8_0_r16(static_cast<const hal::BlockQ8_0x16*>(table), dim, ids[t], row.data());
      hal::dequantize_row(hal::DType::kQ8_0, row.data(), out + t * dim, dim);
    });
    return;
  }
  const std::size_t row = hal::row_bytes(type, dim);
  pool.parallel_for(n_tokens, [&](std::int64_t t) {
    const auto* src = static_cast<const std::byte*>(table) + static_cast<std::size_t>(ids[t]) * row;
    load_row_f32(type, src, out + t * dim, dim);
  });
}

}  // namespace sx::cpu
