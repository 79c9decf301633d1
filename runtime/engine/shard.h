// One rank's part of a model of any architecture the engine runs (DESIGN.md §3 step 5, §5): the
// weights its RankPlan assigns (query heads, the KV heads they use, DeltaNet heads, FFN rows or
// experts, vocab rows, the stage's layers), its paged KV cache for those layers and KV heads, its
// DeltaNet states, its activation workspace, and the op sequence of one step on its device's
// stream, joined to the other ranks by Channels. The layers are built from the blocks of
// runtime/engine/blocks/ as the model's architecture (runtime/engine/models/) says; what every
// architecture shares is here: the step's inputs, the embedding, the layer loop with its
// residuals and collectives, and the logits:
//   all-reduce after the vocab-split embedding, after o and after down (tensor parallelism),
//   all-gather of the vocab-split logits, and a send / recv of the hidden state between stages
//   (pipeline parallelism). With one rank there are no collectives at all.
//
// Threading: one thread drives a shard (its rank's runner). Lifetime: the device and channels
// must outlive it. Errors: device and channel errors come back as Status (the caller validates
// batches before any rank runs them).
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "runtime/base/status.h"
#include "runtime/engine/model.h"
#include "runtime/hal/channel.h"
#include "runtime/hal/device.h"
#include "runtime/model/gguf.h"
#include "runtime/model/model_config.h"
#include "runtime/parallel/shard_plan.h"

namespace sx::engine {

struct ShardContext {
  hal::Device* device = nullptr;
  hal::Channel* tp = nullptr;     // the stage's TP group (null when tp == 1)
  hal::Channel* world = nullptr;  // every rank, rank order of the plan (null when pp == 1)
  const parallel::ShardPlan* plan = nullptr;
  int rank = 0;
};

class Shard {
 public:
  static Result<std::unique_ptr<Shard>> load(const model::TensorSource& file, const model::ModelConfig& config,
                                                  const ShardContext& ctx, const ModelOptions& options);
  ~Shard();

  // This rank's part of one step; top_k = 0 reads back logits, top_k in [1, hal::kMaxTopK] the
  // top_k candidates of each row instead (hal::TopKArgs over each rank's vocab shard).
  Status run(const ForwardBatch& batch, int top_k);
  // After run(), on the last stage's tp rank 0 (empty elsewhere, and when no row asked for
  // logits), what it read back for every tp rank j, in tp chunks: with top_k = 0, logit_rows x
  // max_vocab_shard floats (rank j's rows x its vocab-shard columns, row-major, then padding);
  // otherwise top_k_bytes(logit_rows, top_k) bytes: logit_rows x top_k values (rows in order,
  // best first), then from top_k_ids_offset the same rows' token ids. Host memory of the shard's
  // readback buffer: valid until the next run().
  std::span<const std::byte> result() const;
  static std::size_t top_k_ids_offset(std::int64_t rows, std::int64_t k);  // 256-byte aligned
  static std::size_t top_k_bytes(std::int64_t rows, std::int64_t k);
  // Bytes of the buffers a step's inputs and results pass through on rank `rp` of a stage of `tp`
  // ranks, as load() allocates them: the step's integer inputs (token ids, positions, KV slots,
  // sequence starts and lengths, the block table of max_logit_rows x blocks_per_seq(), each
  // 256-byte aligned) in device memory and again in upload staging; on the last stage the top-k
  // candidates for kMaxTopK (and their all-gathered copy when tp > 1), and on its tp rank 0 the
  // readback buffer (the larger of all ranks' logit rows and all ranks' candidates).
  // max_vocab_shard: the widest vocab shard of the stage. For the memory planner.
  static std::uint64_t step_io_bytes(const ModelOptions& o, const parallel::RankPlan& rp, int tp,
                                     std::int64_t max_vocab_shard);

  // Fails this rank's channels (called when run() failed here, so that no peer waits).
  void abort_channels(const Status& why);

  std::uint64_t weight_bytes() const { return weight_bytes_; }
  // Bytes of one state slot of this rank: its DeltaNet layers' conv and recurrent states.
  std::uint64_t state_slot_bytes() const;
  // Bytes of one KV block of this rank: each attention layer's K rows, then its V rows.
  std::uint64_t kv_block_bytes() const;
  // Host copies (a prefix cache's second tier), between steps, through this rank's stream: the KV
  // of `blocks` (block after block, kv_block_bytes() each) and the states of one slot (each
  // DeltaNet layer's conv, then recurrent state).
  Status save_blocks(std::span<const std::int32_t> blocks, std::span<std::byte> out);
  Status load_blocks(std::span<const std::int32_t> blocks, std::span<const std::byte> in);
  Status save_state(std::int32_t slot, std::span<std::byte> out);
  Status load_state(std::int32_t slot, std::span<const std::byte> in);
  // Bytes of the embedding table held only as an embedding (a step reads just its rows).
  std::uint64_t embedding_only_bytes() const { return embedding_only_bytes_; }
  std::int64_t max_vocab_shard() const { return max_vocab_shard_; }

  // Every op a step of rank `rp` can issue, with its formats and its largest shapes (a batch of
  // max_batch_tokens tokens, max_logit_rows logit rows) and null buffers: what load() puts to
  // Device::supports before it uploads anything, failing with the op, format and shape of the
  // first refusal. A step issues no op whose kind and formats are not here, at no larger shape
  // (tests/unit/engine/capability_test.cpp checks every op a step runs against this list).
  static std::vector<hal::Op> step_ops(const model::ModelConfig& config, const parallel::RankPlan& rp,
                                       const parallel::WeightTypes& types, const ModelOptions& options, int tp);

 private:
  struct Impl;
  Shard();
  Status run_step(const ForwardBatch& batch, int top_k);

  std::unique_ptr<Impl> impl_;
  std::uint64_t weight_bytes_ = 0;
  std::uint64_t embedding_only_bytes_ = 0;
  std::int64_t max_vocab_shard_ = 0;
};

}  // namespace sx::engine
