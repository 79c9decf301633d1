// Embedding gather (hal::EmbeddingArgs) from a table in any weight format (dequant.cuh).
#include "kernels/common.cuh"
#include "kernels/dequant.cuh"

namespace sx::kernels {
namespace {

__global__ void embedding_kernel(const std::uint8_t* table, int type, std::size_t row_bytes, const std::int32_t* ids,
                                 float* out, std::int64_t n_tokens, std::int64_t dim, std::int64_t vocab, bool shard,
                                 std::int64_t vocab_offset, int* err) {
  const std::int64_t n = n_tokens * dim;
  for (std::int64_t idx = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; idx < n;
       idx += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    const std::int64_t t = idx / dim, j = idx % dim;
    const std::int64_t id = ids[t];
    const std::int64_t row = shard ? id - vocab_offset : id;
    if (row < 0 || row >= vocab) {
      out[idx] = 0.0f;
      if (!shard && j == 0) report_error(err, kErrEmbeddingId, static_cast<int>(t), static_cast<int>(id), static_cast<int>(vocab));
      continue;
    }
    out[idx] = dequant_element(type, table + row * row_bytes, j);
  }
}

}  // namespace

cudaError_t launch_embedding(cudaStream_t s, const hal::EmbeddingArgs& a, const std::uint8_t* table,
                             const std::int32_t* ids, float* out, int* err) {
  const std::int64_t n = a.n_tokens * a.dim;
  if (n <= 0) return cudaSuccess;
  const int type = static_cast<int>(a.table_type);
  const std::size_t row_bytes = static_cast<std::size_t>(a.dim / block_elems(type)) * static_cast<std::size_t>(block_bytes(type));
  embedding_kernel<<<grid_for(n, 256), 256, 0, s>>>(table, type, row_bytes, ids, out, a.n_tokens, a.dim, a.vocab,
                                                     a.shard, a.vocab_offset, err);
  return cudaGetLastError();
}

}  // namespace sx::kernels
