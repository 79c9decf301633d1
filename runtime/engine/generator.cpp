// generate(): prefill + decode loop for one request.
#include "runtime/engine/generator.h"

#include <algorithm>
#include <chrono>

#include "runtime/engine/stop_matcher.h"

namespace sx::engine {

std::string_view finish_reason_name(FinishReason r) { return r == FinishReason::kStop ? "stop" : "length"; }

std::vector<std::int32_t> default_stop_ids(const tokenizer::Tokenizer& tok) {
  std::vector<std::int32_t> ids;
  if (auto e = tok.eos_id()) ids.push_back(*e);
  for (std::string_view name : {"<|im_end|>", "<|endoftext|>"}) {
    if (auto id = tok.token_id(name)) ids.push_back(*id);
  }
  std::sort(ids.begin(), ids.end());
  ids.erase(std::unique(ids.begin(), ids.end()), ids.end());
  return ids;
}

Status prefill(Qwen2Model& model, std::span<const std::int32_t> prompt, std::vector<float>& logits) {
  const ModelOptions& mo = model.options();
  const auto n_prompt = static_cast<std::int64_t>(prompt.size());
  // Only the last chunk asks for logits.
  for (std::int64_t start = 0; start < n_prompt; start += mo.max_batch_tokens) {
    const std::int64_t len = std::min(mo.max_batch_tokens, n_prompt - start);
    ForwardBatch b = single_sequence_batch(prompt.subspan(static_cast<std::size_t>(start), static_cast<std::size_t>(len)),
                                           static_cast<std::int32_t>(start), mo.kv.num_blocks);
    if (start + len < n_prompt) b.logit_rows.clear();
    SX_RETURN_IF_ERROR(model.forward(b, logits));
  }
  return ok_status();
}

Result<GenerateResult> generate(Qwen2Model& model, const tokenizer::Tokenizer& tok,
                                std::span<const std::int32_t> prompt, const GenerateOptions& options,
                                const std::function<void(std::string_view)>& on_text) {
  using Clock = std::chrono::steady_clock;
  SX_RETURN_IF_ERROR(options.sampling.validate());
  if (prompt.empty()) return invalid_argument_error("the prompt is empty (no tokens)");
  if (options.max_tokens < 0) return invalid_argument_error("max_tokens must be >= 0, got {}", options.max_tokens);
  const ModelOptions& mo = model.options();
  const std::int64_t capacity = std::min<std::int64_t>(mo.kv.num_blocks * mo.kv.block_size, model.config().context_length);
  const auto n_prompt = static_cast<std::int64_t>(prompt.size());
  if (n_prompt + 1 > capacity) {
    return invalid_argument_error("the prompt has {} tokens but the context holds {} (prompt + at least one new token)",
                                  n_prompt, capacity);
  }
  const std::int64_t max_new = std::min(options.max_tokens, capacity - n_prompt);

  std::vector<std::int32_t> stops = options.stop_ids;
  if (!options.ignore_eos) {
    auto d = default_stop_ids(tok);
    stops.insert(stops.end(), d.begin(), d.end());
  }
  auto is_stop = [&](std::int32_t t) { return std::find(stops.begin(), stops.end(), t) != stops.end(); };

  GenerateResult result;
  Sampler sampler(options.sampling, prompt);
  tokenizer::StreamDecoder decoder(tok, /*skip_special=*/true);
  StopMatcher matcher(options.stop_strings);
  auto emit = [&](const std::string& piece) {
    if (piece.empty()) return;
    result.text += piece;
    if (on_text) on_text(piece);
  };

  std::vector<float> logits;
  const auto t0 = Clock::now();
  SX_RETURN_IF_ERROR(prefill(model, prompt, logits));
  const auto t1 = Clock::now();
  result.prefill_seconds = std::chrono::duration<double>(t1 - t0).count();

  if (max_new == 0) {
    result.finish = FinishReason::kLength;
    return result;
  }
  auto pos = static_cast<std::int32_t>(n_prompt);
  for (std::int64_t i = 0;; ++i) {
    const std::int32_t next = sampler.sample(logits);
    result.tokens.push_back(next);
    if (is_stop(next)) {
      result.finish = FinishReason::kStop;
      break;
    }
    emit(matcher.push(decoder.push(next)));
    if (matcher.stopped()) {
      result.finish = FinishReason::kStop;
      break;
    }
    if (i + 1 >= max_new) {
      result.finish = FinishReason::kLength;
      break;
    }
    const std::int32_t one[1] = {next};
    ForwardBatch b = single_sequence_batch(one, pos, mo.kv.num_blocks);
    SX_RETURN_IF_ERROR(model.forward(b, logits));
    ++pos;
  }
  if (!matcher.stopped()) {
    emit(matcher.push(decoder.flush()));
    emit(matcher.flush());
  }
  result.decode_seconds = std::chrono::duration<double>(Clock::now() - t1).count();
  return result;
}

}  // namespace sx::engine
