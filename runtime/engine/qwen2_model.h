// The Qwen2 forward pass, written once against the HAL op set (DESIGN.md §3 step 5, §4).
//
// Qwen2Model owns the weights (uploaded to one device), a paged KV cache (one K and one V buffer
// per layer, slots = blocks x block_size) and the activation workspace for up to max_batch_tokens
// tokens per step. forward() runs one step for a batch of sequences described by a ForwardBatch
// (token ids, positions, KV slots, block tables) and returns the logits of the requested rows.
//
// Threading: one thread drives a Qwen2Model at a time.
// Lifetime: the device must outlive the model.
// Errors: bad batches (ids outside the vocabulary, slots outside the cache, too many tokens) and
// device errors come back as Status; nothing aborts.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "runtime/base/status.h"
#include "runtime/hal/device.h"
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
};

struct KvCacheOptions {
  std::int64_t num_blocks = 0;
  std::int64_t block_size = 16;
  hal::DType dtype = hal::DType::kF32;
};

struct ModelOptions {
  std::int64_t max_batch_tokens = 512;  // tokens per forward step (prefill chunk size)
  std::int64_t max_logit_rows = 64;     // sequences per step that may ask for logits
  KvCacheOptions kv;
};

class Qwen2Model {
 public:
  // Checks every tensor against the config, uploads the weights and allocates the cache and
  // workspace on `device`.
  static Result<std::unique_ptr<Qwen2Model>> load(const model::GgufFile& file, const model::ModelConfig& config,
                                                   hal::Device& device, const ModelOptions& options);
  ~Qwen2Model();

  // Runs one step. logits receives logit_rows.size() x vocab floats.
  Status forward(const ForwardBatch& batch, std::vector<float>& logits);

  const model::ModelConfig& config() const { return config_; }
  const ModelOptions& options() const { return options_; }
  // Bytes of weights read by one decode step (every matrix once, plus one embedding row).
  std::uint64_t weight_bytes_per_token() const { return weight_bytes_per_token_; }
  std::uint64_t weight_bytes() const { return weight_bytes_; }
  // KV bytes per token of context, all layers.
  std::uint64_t kv_bytes_per_token() const;

 private:
  struct Impl;
  explicit Qwen2Model(model::ModelConfig config, ModelOptions options);
  Status run_step(const ForwardBatch& batch, std::vector<float>& logits);

  model::ModelConfig config_;
  ModelOptions options_;
  std::uint64_t weight_bytes_per_token_ = 0;
  std::uint64_t weight_bytes_ = 0;
  std::unique_ptr<Impl> impl_;
};

// A KV layout for one sequence whose blocks are 0..n-1 in order (single-sequence generation).
ForwardBatch single_sequence_batch(std::span<const std::int32_t> tokens, std::int32_t start_pos,
                                   std::int64_t num_blocks);

}  // namespace sx::engine
