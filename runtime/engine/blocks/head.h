// The vocabulary's two ends: the token embedding (this rank's rows of token_embd: with tp > 1
// each rank writes its vocab shard's rows and zeros elsewhere, summed by the all-reduce) and the
// logits head (the final norm of the rows asked for, with the last layer's pending residual, and
// this rank's vocab shard of the LM head, which is token_embd when the embeddings are tied).
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "runtime/engine/blocks/step.h"

namespace sx::engine {

class TokenEmbedding {
 public:
  // This rank's vocab shard of token_embd (loaded where the rank embeds or its head is tied).
  static Result<TokenEmbedding> load(Uploader& up, const parallel::RankPlan& rp);
  // ids -> h.
  Status run(const Step& step, const Workspace& ws, int tp) const;
  static void ops(const OpsSite& site, const parallel::WeightTypes& types, std::vector<hal::Op>& ops);
  const DeviceTensor& table() const { return table_; }

 private:
  DeviceTensor table_;
};

class LogitsHead {
 public:
  // output_norm, and this rank's shard of output.weight unless the embeddings are tied.
  static Result<LogitsHead> load(Uploader& up, const model::ModelConfig& c, const parallel::RankPlan& rp);
  // norm(h + delta) of the rows `rows` (delta only when `pending_delta`) -> ws.logits, rows x this
  // rank's vocab shard; `tied`: token_embd's table, the head when the embeddings are tied.
  Status run(const Step& step, const Workspace& ws, std::span<const std::int32_t> rows, bool pending_delta,
             const DeviceTensor* tied) const;
  static void ops(const OpsSite& site, const parallel::WeightTypes& types, std::vector<hal::Op>& ops);

 private:
  DeviceTensor output_norm, lm_head;  // lm_head empty when it is token_embd's table
};

}  // namespace sx::engine
