// The memory planner (DESIGN.md §6): per device, weights + KV pool + activation workspace + runtime
// overhead against capacity x utilisation; the KV pool it leaves, how many full-length requests fit,
// and, when the plan cannot fit, a refusal naming the device and the numbers with alternatives
// computed from the same numbers.
//
// The model, for rank r of a TP x PP shard plan on device r (one device per rank):
//   usable_r     = floor(capacity_r x memory_utilization)
//   weights_r    = the shard plan's weight bytes of the rank
//   workspace_r  = activations + logits + step I/O + matmul scratch for the largest step, as the
//                  engine allocates them (shard.cpp), with T = max_num_batched_tokens,
//                  S = max_num_seqs, H = hidden, q / kv = the rank's query / KV heads x head_dim,
//                  f = its FFN rows, V = ceil(vocab / tp) (the largest vocab shard),
//                  B = ceil(max_model_len / block_size), r(n) = n rounded up to 256:
//       activations = 4 T (3H + 2q + 2kv + 2f)
//                     (F32 h, normed x, residual delta; q, attention out; k, v; gate, up)
//       logits      = last stage only: 4 S 3H + 4 S V (1 + tp when tp > 1)
//                     (the S selected rows, their delta and norm; the rank's logits and, with TP,
//                     the all-gathered copy)
//       io          = Shard::step_io_bytes: 2 (3 r(4T) + r(4(S + 1)) + r(4S) + r(4 S B))
//                     (token ids, positions, KV slots, sequence starts, lengths and the block
//                     table, in device memory and in upload staging), + on the last stage
//                     c = r(4 S 64) + 4 S 64 (top-64 values and ids of S rows), tp c more when
//                     tp > 1, and on its tp rank 0 the readback max(4 S V, c) tp. Staging and
//                     readback are host-visible: a discrete GPU holds them in host memory, so
//                     the plan over-counts its device memory by their size (39 MB for the
//                     readback of 64 rows of a 152k vocab at tp 1, 1.1 MB for the staging).
//       scratch     = an estimate of the matmul kernels' scratch: with K = max(H, q, f), the widest
//                     matmul input, 1.125 T K (int8 activations + one f32 scale per 32) + 4 T K
//                     (packed activation panels, the F32 GEMM's, the widest) + 32 MiB (per-thread
//                     packed weight panels: at most 272 KiB a thread in the CPU kernels)
//       states      = a hybrid (qwen35*) only: its DeltaNet state pool, S slots of every DeltaNet
//                     layer of the rank (conv and recurrent state of its heads, F32), and the
//                     layers' activations 4 T (2 C + 2 i + 2 v + q) (C its conv channels, i its V
//                     heads x d, v its V heads; q the attention's gate), + 4 T (2 s + H + 1) for
//                     a shared expert of s rows on the rank
//   overhead_r   = the device's runtime overhead (DeviceBudget::overhead_bytes)
//   snapshots_r  = a hybrid only: its prefix cache's state snapshots, N copies of one state slot
//                  (snapshot_bytes_r: the rank's DeltaNet layers' conv and recurrent states). N is
//                  state_snapshots, or when that is -1 (auto) min(256, the most that fit in a
//                  quarter of usable - weights - workspace - overhead on every rank, and in what
//                  that leaves beyond one full-length request's KV blocks)
//   kv budget_r  = usable_r - weights_r - workspace_r - overhead_r - snapshots_r
// Every rank holds the same number of KV blocks (block ids are shared by the ranks), so
//   num_blocks   = min over r of floor(kv budget_r / (block_size x kv_bytes_per_token_r))
//   kv_pool_r    = num_blocks x block_size x kv_bytes_per_token_r;  free_r = kv budget_r - kv_pool_r
//   kv_tokens    = num_blocks x block_size
//   full_length_requests = floor(num_blocks / ceil(max_model_len / block_size))
//   all_seqs_reach_full_length = full_length_requests >= max_num_seqs
// The plan fits when weights + workspace + overhead fit in usable memory on every device and at
// least one request of max_model_len fits in the pool; otherwise `refusal` says why (the device,
// its numbers) and `suggestions` list alternatives, each computed by planning it: the largest
// max_model_len one request can reach (a multiple of block_size) and the largest all max_num_seqs
// can reach, the max_num_seqs that can all reach max_model_len, the model in a 4-bit format
// (awq-int4 and q4_k_m; its size and whether it fits here), the smallest TP (or else PP) that fits
// on more devices like the smallest one given, and the memory_utilization that would fit. A plan
// that fits but cannot take max_num_seqs full-length requests at once gets the concurrency
// suggestions too (the scheduler would preempt).
//
// Errors (INVALID_ARGUMENT, naming the value): memory_utilization outside (0, 1], max_model_len
// above the model's context length or negative, max_num_seqs / max_num_batched_tokens / block_size
// outside 1..2^24, a device capacity or overhead above 2^56 bytes, a device count other than the
// shard plan's rank count, a shard plan with no ranks.
// Threading: pure functions over immutable inputs.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "runtime/base/status.h"
#include "runtime/hal/dtype.h"
#include "runtime/hal/device.h"
#include "runtime/model/model_config.h"
#include "runtime/parallel/shard_plan.h"

namespace sx::engine {

struct DeviceBudget {
  std::string name;
  std::uint64_t capacity_bytes = 0;
  std::uint64_t overhead_bytes = 0;  // runtime / context per device (CPU: 0; a CUDA context ~0.5 GiB)
};

inline constexpr std::uint64_t kMatmulThreadScratchBytes = std::uint64_t{32} << 20;

struct MemoryPlanOptions {
  double memory_utilization = 0.9;
  std::int64_t max_model_len = 0;  // 0: the model's context length
  std::int64_t max_num_seqs = 64;
  std::int64_t max_num_batched_tokens = 2048;
  std::int64_t block_size = 16;
  // A hybrid's state snapshots (its prefix cache): -1 auto (see above), 0 none, else that many.
  std::int64_t state_snapshots = -1;
};

// The workspace of one rank, in bytes (the formula above).
struct Workspace {
  std::uint64_t activations = 0;
  std::uint64_t logits = 0;
  std::uint64_t io = 0;
  std::uint64_t scratch = 0;
  // A hybrid's DeltaNet state pool: max_num_seqs slots x the rank's DeltaNet layers x (conv state
  // (kernel - 1) x its channels + recurrent state of its V heads x d x d), F32.
  std::uint64_t states = 0;
  std::uint64_t total() const { return activations + logits + io + scratch + states; }
};

struct DeviceMemory {
  std::string name;
  int rank = 0, stage = 0, tp_rank = 0;
  parallel::Range layers;
  std::int64_t kv_heads = 0;
  std::uint64_t capacity = 0;
  std::uint64_t usable = 0;  // floor(capacity x memory_utilization)
  std::uint64_t weights = 0;
  Workspace workspace_parts;
  std::uint64_t workspace = 0;
  std::uint64_t overhead = 0;
  std::uint64_t snapshot_bytes = 0;  // one state snapshot of the rank (a hybrid)
  std::uint64_t snapshots = 0;       // the rank's snapshot pool: state_snapshots x snapshot_bytes
  std::uint64_t kv_budget = 0;  // usable - weights - workspace - overhead - snapshots (0 when those exceed usable)
  std::uint64_t kv_pool = 0;
  std::uint64_t free = 0;       // usable memory left after the KV pool
  std::uint64_t kv_bytes_per_token = 0;        // all the rank's layers
  std::uint64_t kv_bytes_per_token_layer = 0;  // one layer: 2 x kv_heads x head_dim x element size
  std::int64_t max_blocks = 0;  // blocks its own KV budget would hold
  bool weights_fit = false;     // weights + workspace + overhead <= usable
};

struct MemoryPlan {
  std::vector<DeviceMemory> devices;  // one per rank, rank order
  MemoryPlanOptions options;          // as planned (max_model_len resolved)
  hal::DType kv_dtype = hal::DType::kF32;
  int tp = 1, pp = 1;
  std::uint64_t model_weight_bytes = 0;  // the model held once
  std::int64_t context_length = 0;       // the model's
  std::int64_t num_blocks = 0;
  std::int64_t state_snapshots = 0;  // a hybrid's snapshot pool, in snapshots (0: none)
  std::int64_t kv_tokens = 0;
  std::int64_t blocks_per_request = 0;    // ceil(max_model_len / block_size)
  std::int64_t full_length_requests = 0;  // requests of max_model_len the pool holds at once
  bool all_seqs_reach_full_length = false;
  int limiting_rank = -1;  // the rank that sets num_blocks (or, when the weights do not fit, the worst one)
  // The largest max_model_len (a multiple of block_size, at most the context length) one request /
  // all max_num_seqs requests can reach with this pool; 0 when not even one block fits.
  std::int64_t longest_request = 0;
  std::int64_t longest_for_all_seqs = 0;
  bool fits = false;
  std::string refusal;                   // empty when it fits
  std::vector<std::string> suggestions;  // alternatives (refused), or ways to let every sequence reach full length
};

Result<MemoryPlan> plan_memory(const model::ModelConfig& config, const parallel::WeightTypes& types,
                               const parallel::ShardPlan& shards, std::span<const DeviceBudget> devices,
                               const MemoryPlanOptions& options);

// The workspace of rank r (exposed for tests and `sextant plan --verbose`).
Workspace rank_workspace(const model::ModelConfig& config, const parallel::ShardPlan& shards, int rank,
                         const MemoryPlanOptions& options);

// `ranks` logical devices sharing one memory of `total_bytes` (the CPU: a configured budget or the
// system memory), split evenly (the remainder unused); named "<prefix>:0", ...
std::vector<DeviceBudget> shared_memory_budgets(std::uint64_t total_bytes, int ranks, std::string_view prefix,
                                                std::uint64_t overhead_bytes = 0);
// One budget per rank from the devices a backend reports (their own memory each): the first
// `ranks` devices, each planned against its free memory where it reports one (free_bytes > 0),
// else its total; INVALID_ARGUMENT when there are fewer.
Result<std::vector<DeviceBudget>> device_budgets(std::span<const hal::DeviceInfo> devices, int ranks,
                                                 std::uint64_t overhead_bytes);
// The budgets of `ranks` ranks on `devices` of one backend, whatever it is: shared_memory_budgets
// of the first device's memory when the backend's devices share one (DeviceInfo::shared_memory),
// else device_budgets. INVALID_ARGUMENT when there is no device.
Result<std::vector<DeviceBudget>> group_budgets(std::span<const hal::DeviceInfo> devices, int ranks,
                                                std::uint64_t overhead_bytes);

// OK when `plan` fits; else RESOURCE_EXHAUSTED "memory plan: <its refusal>" (what a load refuses).
Status memory_plan_status(const MemoryPlan& plan);

// The memory table (per device: capacity, usable, weights, workspace, overhead, KV pool, free, in
// GiB), then the KV summary lines, then the refusal or the suggestions. `verbose` adds each
// device's workspace parts and a per-layer table of KV bytes per token and pool bytes.
std::string format_memory_plan(const MemoryPlan& plan, bool verbose);

// "22.89 GiB"
std::string gib(std::uint64_t bytes);

}  // namespace sx::engine
