// The token embedding and the logits head (head.h).
#include "runtime/engine/blocks/head.h"

#include "runtime/model/tensor_names.h"

namespace sx::engine {

Result<TokenEmbedding> TokenEmbedding::load(Uploader& up, const parallel::RankPlan& rp) {
  TokenEmbedding e;
  SX_ASSIGN_OR_RETURN(e.table_, up.tensor(model::kTokenEmbdName, true, rp.vocab.begin, rp.vocab.size()));
  return e;
}

Status TokenEmbedding::run(const Step& step, const Workspace& ws, int tp) const {
  hal::EmbeddingArgs e{table_.view(), table_.type, step.in.ids, view_of(ws.h), step.T, step.config.hidden,
                       step.rp.vocab.size()};
  e.shard = tp > 1;
  e.vocab_offset = step.rp.vocab.begin;
  return step.stream.run(e);
}

void TokenEmbedding::ops(const OpsSite& site, const parallel::WeightTypes& types, std::vector<hal::Op>& ops) {
  hal::EmbeddingArgs e;
  e.table_type = types.token_embd;
  e.n_tokens = site.T();
  e.dim = site.config.hidden;
  e.vocab = site.rp.vocab.size();
  e.shard = site.tp > 1;
  e.vocab_offset = site.rp.vocab.begin;
  ops.emplace_back(e);
}

Result<LogitsHead> LogitsHead::load(Uploader& up, const model::ModelConfig& c, const parallel::RankPlan& rp) {
  LogitsHead head;
  SX_ASSIGN_OR_RETURN(head.output_norm, up.tensor(model::kOutputNormName, true));
  if (!c.tied_embeddings) {
    SX_ASSIGN_OR_RETURN(head.lm_head, up.tensor(model::kOutputName, true, rp.vocab.begin, rp.vocab.size()));
  }
  if (head.output_norm.type != hal::DType::kF32) {
    return invalid_argument_error("{}: {} must be f32", up.file().path(), model::kOutputNormName);
  }
  return head;
}

Status LogitsHead::run(const Step& step, const Workspace& ws, std::span<const std::int32_t> rows, bool pending_delta,
                       const DeviceTensor* tied) const {
  hal::Stream& s = step.stream;
  const std::int64_t H = step.config.hidden, R = static_cast<std::int64_t>(rows.size());
  // Gather the rows that need logits, then the final norm (with the last residual add) and the head.
  for (std::int64_t i = 0; i < R; ++i) {
    const auto row = static_cast<std::size_t>(rows[static_cast<std::size_t>(i)]);
    SX_RETURN_IF_ERROR(s.copy(*ws.sel, f32_bytes(i * H), *ws.h, row * f32_bytes(H), f32_bytes(H)));
  }
  hal::BufView add{};
  if (pending_delta) {
    for (std::int64_t i = 0; i < R; ++i) {
      const auto row = static_cast<std::size_t>(rows[static_cast<std::size_t>(i)]);
      SX_RETURN_IF_ERROR(s.copy(*ws.sel_delta, f32_bytes(i * H), *ws.delta, row * f32_bytes(H), f32_bytes(H)));
    }
    add = view_of(ws.sel_delta);
  }
  const auto eps = static_cast<float>(step.config.rms_eps);
  SX_RETURN_IF_ERROR(
      s.run(hal::RmsNormArgs{view_of(ws.sel), add, output_norm.view(), view_of(ws.sel_norm), R, H, eps}));
  const DeviceTensor& head = lm_head ? lm_head : *tied;
  return step.matmul(head, nullptr, view_of(ws.sel_norm), view_of(ws.logits), R, step.rp.vocab.size(), H);
}

void LogitsHead::ops(const OpsSite& site, const parallel::WeightTypes& types, std::vector<hal::Op>& ops) {
  const model::ModelConfig& c = site.config;
  const std::int64_t R = site.R(), H = c.hidden, vn = site.rp.vocab.size();
  ops.emplace_back(hal::RmsNormArgs{{}, {}, {}, {}, R, H, static_cast<float>(c.rms_eps)});
  site.matmul(ops, c.tied_embeddings ? types.token_embd : types.output, R, vn, H);
  hal::TopKArgs top;
  top.n_rows = R;
  top.n_cols = vn;
  top.k = std::min<std::int64_t>(hal::kMaxTopK, vn);
  top.id_offset = site.rp.vocab.begin;
  ops.emplace_back(top);
}

}  // namespace sx::engine
