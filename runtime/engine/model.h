// A model's forward pass on a group of devices, written once against the HAL op set (DESIGN.md
// §3 step 5, §4, §5) for every architecture the engine runs (runtime/engine/models/).
//
// Model runs a model on one device or on a TP x PP group of devices. Each rank holds the part
// of the weights its shard plan assigns (runtime/parallel), a paged KV cache for its layers and KV
// heads (slots = blocks x block_size, the same block ids on every rank) and the activation
// workspace for up to max_batch_tokens tokens per step (see shard.h). forward() runs one
// step for a batch of sequences described by a ForwardBatch (token ids, positions, KV slots, block
// tables) and returns the logits of the requested rows. With more than one rank, every rank has a
// runner thread; the caller's thread (rank 0's host side, which owns sampling) hands each step's
// batch to all of them, waits, and assembles the vocab-split logits.
//
// Threading: one thread drives a Model at a time.
// Lifetime: the devices (and backend) must outlive the model.
// Errors: bad batches (ids outside the vocabulary, slots outside the cache, too many tokens) and
// device errors come back as Status; nothing aborts. When a rank fails mid-step, the step fails
// with an error naming that rank (its peers are released at once through the Channel), and the
// group stays failed: every later forward() returns the same error (load the model again).
#pragma once

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "runtime/base/status.h"
#include "runtime/hal/channel.h"
#include "runtime/hal/device.h"
#include "runtime/hal/registry.h"
#include "runtime/model/gguf.h"
#include "runtime/model/model_config.h"

namespace sx::engine {

struct ForwardBatch {
  std::vector<std::int32_t> tokens;           // new tokens of all sequences, grouped by sequence
  std::vector<std::int32_t> positions;        // absolute position of each token
  std::vector<std::int32_t> slot_mapping;     // KV slot of each token
  std::vector<std::int32_t> seq_token_start;  // n_seqs + 1 offsets into tokens
  std::vector<std::int32_t> seq_context_len;  // context length of each sequence after this step
  std::vector<std::int32_t> block_table;      // n_seqs x max_blocks_per_seq block ids
  std::int32_t max_blocks_per_seq = 0;
  std::vector<std::int32_t> logit_rows;       // token indices whose logits are wanted
  // A hybrid model's (Gated DeltaNet) state slot of each sequence, in [0, ModelOptions::
  // state_slots()), distinct; empty: sequence s uses slot s. A sequence whose context equals its
  // new tokens starts from a zero state whatever its slot held.
  std::vector<std::int32_t> seq_state_slot;
  // State copies (a hybrid's prefix cache): each (from, to) copies every DeltaNet layer's conv and
  // recurrent state of slot `from` into slot `to` on every rank, slots in [0, ModelOptions::
  // total_state_slots()) (the running ones, then the snapshots). `restores` run before the step's
  // layers, `snapshots` after them (the states the step left).
  std::vector<std::pair<std::int32_t, std::int32_t>> restores, snapshots;
};

// The width of a batch's block table (ForwardBatch::max_blocks_per_seq) for sequences of at most
// `needed` blocks: the next power of two, at least 8, at most `capacity` (the model's
// blocks_per_seq()), the rest of each row padded with the null block. Steps of one batch size
// then issue identical ops for many tokens in a row (every 16 tokens otherwise), which a backend
// that replays steps as graphs (CUDA) keys its graphs by.
inline std::int32_t block_table_width(std::size_t needed, std::int64_t capacity) {
  std::int64_t w = 8;
  while (w < static_cast<std::int64_t>(needed)) w *= 2;
  return static_cast<std::int32_t>(std::max<std::int64_t>(std::min(w, capacity), static_cast<std::int64_t>(needed)));
}

struct KvCacheOptions {
  std::int64_t num_blocks = 0;  // including the null block (block 0, never holds KV)
  std::int64_t block_size = 16;
  hal::DType dtype = hal::DType::kF32;
  // Tokens the usable blocks hold.
  std::int64_t usable_tokens() const { return (num_blocks - 1) * block_size; }
};

struct ModelOptions {
  std::int64_t max_batch_tokens = 512;  // tokens per forward step (prefill chunk size)
  std::int64_t max_logit_rows = 64;     // sequences per step (each may ask for one row's logits)
  KvCacheOptions kv;
  // Blocks one sequence of a step may use (its block-table row), allocated at load: 0 = the whole
  // pool (kv.num_blocks). The engine sets ceil(max_model_len / block_size).
  std::int64_t max_blocks_per_seq = 0;
  std::int64_t blocks_per_seq() const { return max_blocks_per_seq > 0 ? max_blocks_per_seq : kv.num_blocks; }
  // Checked before each layer is loaded: once it reads true, load() stops with CANCELLED (a
  // daemon asked to stop while loading). Null: never. Read from the loading thread.
  const std::atomic<bool>* cancel = nullptr;
  // A hybrid model's DeltaNet state slots (conv + recurrent state of each of its layers per
  // running sequence): 0 = max_logit_rows.
  std::int64_t max_state_slots = 0;
  std::int64_t state_slots() const { return max_state_slots > 0 ? max_state_slots : max_logit_rows; }
  // A hybrid's state snapshots (its prefix cache): slots beside the running ones, after them in
  // the same state buffers, that hold copies of a sequence's states at a block boundary.
  std::int64_t state_snapshots = 0;
  std::int64_t total_state_slots() const { return state_slots() + state_snapshots; }
};

struct ParallelOptions {
  int tp = 1;
  int pp = 1;
  bool requantize_unaligned = false;  // parallel::PlanOptions::requantize_unaligned
  hal::ChannelOptions channel;  // collective timeout
};

class Shard;

class Model {
 public:
  // Checks every tensor against the config, uploads the weights and allocates the cache and
  // workspace on `device`.
  static Result<std::unique_ptr<Model>> load(const model::TensorSource& file, const model::ModelConfig& config,
                                                   hal::Device& device, const ModelOptions& options);
  // The same on tp x pp devices of `backend` (rank order: stage * tp + tp rank), joined by the
  // backend's Channels. The shard plan comes from runtime/parallel for the file's weight types.
  static Result<std::unique_ptr<Model>> load(const model::TensorSource& file, const model::ModelConfig& config,
                                                   hal::Backend& backend, std::span<hal::Device* const> devices,
                                                   const ParallelOptions& parallel, const ModelOptions& options);
  ~Model();

  // Runs one step. logits receives logit_rows.size() x vocab floats.
  Status forward(const ForwardBatch& batch, std::vector<float>& logits);
  // Runs one step and selects on the devices, so that only k candidates per row come back: for
  // each logit row r, values[r * k + i] and ids[r * k + i] (i < k) are its k largest logits and
  // their token ids, largest first, the lower id first among equal values, NaN below every
  // number (hal::TopKArgs). k in [1, top_k_limit()]; k = 1 is greedy (the host's argmax).
  Status forward_top_k(const ForwardBatch& batch, int k, std::vector<float>& values, std::vector<std::int32_t>& ids);

  // The largest k forward_top_k takes: hal::kMaxTopK, or less when a vocab shard is smaller.
  int top_k_limit() const { return top_k_limit_; }
  const model::ModelConfig& config() const { return config_; }
  int tp() const { return parallel_.tp; }
  // The most tokens one request can hold: the context length, within the KV cache and within
  // the blocks a sequence's block-table row holds.
  std::int64_t max_request_tokens() const {
    return std::min({config_.context_length, options_.kv.usable_tokens(),
                     options_.blocks_per_seq() * options_.kv.block_size});
  }
  int pp() const { return parallel_.pp; }
  const ModelOptions& options() const { return options_; }
  // Bytes of weights read by one decode step (every matrix once, plus one embedding row).
  std::uint64_t weight_bytes_per_token() const { return weight_bytes_per_token_; }
  std::uint64_t weight_bytes() const { return weight_bytes_; }
  // KV bytes per token of context, all layers and ranks (replicated KV heads counted per rank).
  std::uint64_t kv_bytes_per_token() const { return kv_bytes_per_token_; }
  // A hybrid's bytes of one state slot (or snapshot): every DeltaNet layer's conv and recurrent
  // state, all ranks.
  std::uint64_t state_slot_bytes() const { return state_slot_bytes_; }
  // A prefix cache's second tier, between steps (the thread that drives forward()): the KV of
  // `blocks` to and from host memory, kv_block_bytes() a block (each block's record: every rank's
  // part, rank order), and the states of one slot (every rank's, rank order; state_slot_bytes()).
  std::uint64_t kv_block_bytes() const;
  Status save_blocks(std::span<const std::int32_t> blocks, std::vector<std::byte>& out);
  Status load_blocks(std::span<const std::int32_t> blocks, std::span<const std::byte> in);
  Status save_state(std::int32_t slot, std::vector<std::byte>& out);
  Status load_state(std::int32_t slot, std::span<const std::byte> in);
  // What makes one layout's KV and states unlike another's (architecture, shapes, TP x PP, KV
  // format and block size): with the weights' identity, the salt of a persistent cache's entries.
  std::uint64_t layout_salt() const;

 private:
  struct Impl;
  Model(model::ModelConfig config, ModelOptions options, ParallelOptions parallel);
  // Both load()s: `backend` creates the channels and may be null for a group of one.
  static Result<std::unique_ptr<Model>> load_group(const model::TensorSource& file, const model::ModelConfig& config,
                                                        hal::Backend* backend, std::span<hal::Device* const> devices,
                                                        const ParallelOptions& parallel, const ModelOptions& options);
  Status validate(const ForwardBatch& batch) const;
  // Validates the batch and runs every rank's part (top_k as in Shard::run).
  Status run_shards(const ForwardBatch& batch, int top_k);

  model::ModelConfig config_;
  ModelOptions options_;
  ParallelOptions parallel_;
  std::uint64_t kv_bytes_per_token_ = 0;
  std::uint64_t state_slot_bytes_ = 0;
  std::uint64_t weight_bytes_per_token_ = 0;
  std::uint64_t weight_bytes_ = 0;
  int top_k_limit_ = 0;
  std::unique_ptr<Impl> impl_;
};

// A KV layout for one sequence whose blocks are 0..num_blocks-1 in order (single-sequence
// generation; at most the model's ModelOptions::blocks_per_seq()).
ForwardBatch single_sequence_batch(std::span<const std::int32_t> tokens, std::int32_t start_pos,
                                   std::int64_t num_blocks);

}  // namespace sx::engine
