// Host-side decisions of the CUDA backend that do not need a device, kept apart so they are
// unit-tested here (tests/unit/cuda): which matmul path a shape takes and how it is chunked, how
// kernels are shaped, and when a sequence of ops becomes a CUDA graph.
//
// Pure functions and value types; thread-safe unless noted.
#pragma once

#include <cstddef>
#include <cstdint>
#include <list>
#include <optional>
#include <string>
#include <string_view>

#include "runtime/hal/ops.h"

namespace sx::cuda {

// ---- matmul ----------------------------------------------------------------------------------
// Decode-sized products (m <= kMaxGemvRows) run as matrix-vector kernels that read each weight
// row once for all m rows of x; larger m (prefill) dequantise row chunks of W to F32 in the
// stream's workspace and multiply with cuBLAS SGEMM (F32 weights need no dequantisation).
inline constexpr std::int64_t kMaxGemvRows = 8;
enum class MatmulPath { kGemv, kGemm };
struct MatmulPlan {
  MatmulPath path = MatmulPath::kGemv;
  std::int64_t chunk_rows = 0;  // kGemm: rows of W dequantised per SGEMM (0: W used in place, F32)
  // kGemv: threads per block and output rows per block (one warp per row).
  int threads = 0;
  std::int64_t rows_per_block = 0;
  std::int64_t blocks = 0;
};
// INVALID_ARGUMENT-worthy shapes are checked by the stream before this is asked; `workspace_bytes`
// is the stream's dequantisation workspace. chunk_rows is a multiple of 64 where n allows, never 0
// for a quantised kGemm (a workspace too small for one row is refused by the stream at creation).
MatmulPlan plan_matmul(hal::DType w_type, std::int64_t m, std::int64_t n, std::int64_t k,
                       std::size_t workspace_bytes);
// The smallest workspace that lets plan_matmul chunk rows of k columns.
std::size_t min_workspace_bytes(std::int64_t k);
// Q8_0 weights take 8-bit activations at every m, as on the CPU (kernels/matmul_q8.cu): rows of x
// quantised per pass into the workspace (k bytes and k / 32 floats a row); at most
// kMaxQ8RowsPerPass a pass (the kernel's grid), 0 when not even one row fits.
inline constexpr std::int64_t kMaxQ8RowsPerPass = 65535 * 8;
std::int64_t q8_rows_per_pass(std::int64_t k, std::size_t workspace_bytes);

// ---- elementwise and attention launch shapes -------------------------------------------------
inline constexpr int kThreads = 256;
// Blocks for `n` independent items at `per_block` items a block (at least 1, at most
// kMaxGridX: kernels loop over the rest with a grid stride).
inline constexpr std::int64_t kMaxGridX = 2147483647;
std::int64_t grid_blocks(std::int64_t n, std::int64_t per_block);
// Paged attention: one block per (token, query head), kAttentionThreads threads over head_dim
// (head_dim <= kMaxAttentionHeadDim: at most 2 dims a thread), positions in tiles of
// kAttentionTile scores.
inline constexpr int kAttentionThreads = 128;
inline constexpr std::int64_t kMaxAttentionHeadDim = 256;
inline constexpr int kAttentionTile = 32;
// Attention runs one block per (token, KV head): decode-sized batches have too few of them to fill
// the GPU (7B at batch 1: 4), so each one's context is split over `splits` blocks of `chunk`
// positions (a multiple of the tile), whose partial softmax states (accumulators, max, sum: one per
// token, query head and split) a second kernel combines. Splits: enough blocks for two per
// multiprocessor, each at least kMinSplitPositions of the largest possible context (`ctx_bound`,
// max_blocks_per_seq x block_size: the lengths themselves are on the device), as many as
// `partial_floats` of workspace hold, at most kMaxSplits; 1 means no split.
inline constexpr std::int64_t kMinSplitPositions = 256;
inline constexpr std::int64_t kMaxSplits = 64;
struct AttentionPlan {
  std::int64_t splits = 1;
  std::int64_t chunk = 0;  // positions per split (0 when splits == 1)
};
AttentionPlan plan_attention(std::int64_t n_tokens, std::int64_t n_heads, std::int64_t n_kv_heads,
                             std::int64_t head_dim, std::int64_t ctx_bound, int multiprocessors,
                             std::size_t partial_floats);

// ---- mixtures of experts ---------------------------------------------------------------------
// The workspace of one moe_ffn (kernels/moe.cu): byte offsets of its parts, each aligned to
// kMoeAlign, and the bytes in all. routes [n_local][n_tokens] and counts [n_local] int32; gate and
// up [n_tokens * k][ffn], down [n_tokens * k][dim] F32. The kernels' grid bounds: at most
// kMaxMoeLocalExperts local experts and kMaxMoeTokens tokens a call.
inline constexpr std::size_t kMoeAlign = 256;
inline constexpr std::int64_t kMaxMoeLocalExperts = 65535;
inline constexpr std::int64_t kMaxMoeTokens = 65535LL * 8;
struct MoeWorkspace {
  std::size_t routes = 0, counts = 0, gate = 0, up = 0, down = 0, bytes = 0;
};
MoeWorkspace plan_moe_workspace(std::int64_t n_tokens, std::int64_t k, std::int64_t dim, std::int64_t ffn,
                                std::int64_t n_local);

// ---- CUDA graphs -----------------------------------------------------------------------------
// A stream defers its ops until the next non-op call (upload, download, sync, ...) and then
// launches the pending sequence. A sequence of decode-sized ops (every matmul m and attention
// n_tokens at most `max_tokens`) that was launched eagerly before, identically (the same ops with
// the same buffers and values), is captured as a CUDA graph the second time and replayed from
// then on; graphs are kept per distinct sequence, least recently used dropped past `max_graphs`.
// Batch sizes are the buckets: each batch size of decode has its own sequence and graph.
struct GraphPolicy {
  bool enabled = true;
  std::int64_t max_tokens = 64;
  std::size_t max_graphs = 64;
  int capture_after = 1;  // eager launches of a sequence before it is captured
};
// The key of one op (its kind, buffers, offsets and every scalar), appended to `key`.
void append_op_key(std::string& key, const hal::Op& op);
// The tokens an op processes (matmul m, attention/rope/kv_write n_tokens, rows of the others).
std::int64_t op_tokens(const hal::Op& op);

// Which sequences to capture and which graphs to keep: the bookkeeping of GraphPolicy without
// the CUDA objects (the stream holds those by the id returned here). One stream's; not
// thread-safe.
class GraphCache {
 public:
  explicit GraphCache(GraphPolicy policy) : policy_(policy) {}
  enum class Action { kEager, kCapture, kReplay };
  struct Decision {
    Action action = Action::kEager;
    std::uint64_t id = 0;          // kReplay: the graph to launch; kCapture: the id to store it under
    std::optional<std::uint64_t> evict;  // a graph to destroy first (kCapture past max_graphs)
  };
  // What to do with a pending sequence of `key` whose largest op processes `max_tokens` tokens.
  Decision decide(const std::string& key, std::int64_t max_tokens);
  // The capture of `id` failed or was given up: launch eagerly from now on for its key.
  void forget(std::uint64_t id);
  std::size_t graphs() const { return lru_.size(); }
  const GraphPolicy& policy() const { return policy_; }

 private:
  struct Entry {
    std::string key;  // tens of kilobytes for a whole model's step: compared after the hash
    std::size_t hash = 0;
    int seen = 0;
    std::uint64_t id = 0;  // 0: not captured
    bool refused = false;
  };
  GraphPolicy policy_;
  std::list<Entry> lru_;       // captured graphs, most recent first
  std::list<Entry> pending_;   // seen, not captured yet, most recent first (bounded)
  std::uint64_t next_id_ = 1;
};

}  // namespace sx::cuda
