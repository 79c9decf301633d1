// generate(): prefill + decode loop for one request.
#include "runtime/engine/generator.h"

#include <algorithm>
#include <chrono>

#include "runtime/engine/engine.h"

namespace sx::engine {

std::string_view finish_reason_name(FinishReason r) { return r == FinishReason::kStop ? "stop" : "length"; }

std::vector<std::int32_t> default_stop_ids(const tokenizer::Tokenizer& tok, std::span<const std::int32_t> eos_ids) {
  std::vector<std::int32_t> ids(eos_ids.begin(), eos_ids.end());
  if (auto e = tok.eos_id()) ids.push_back(*e);
  for (std::string_view name : {"<|im_end|>", "<|endoftext|>"}) {
    if (auto id = tok.token_id(name)) ids.push_back(*id);
  }
  std::sort(ids.begin(), ids.end());
  ids.erase(std::unique(ids.begin(), ids.end()), ids.end());
  return ids;
}

Status prefill(Model& model, std::span<const std::int32_t> prompt, std::vector<float>& logits) {
  const ModelOptions& mo = model.options();
  const auto n_prompt = static_cast<std::int64_t>(prompt.size());
  // Only the last chunk asks for logits.
  for (std::int64_t start = 0; start < n_prompt; start += mo.max_batch_tokens) {
    const std::int64_t len = std::min(mo.max_batch_tokens, n_prompt - start);
    ForwardBatch b = single_sequence_batch(prompt.subspan(static_cast<std::size_t>(start), static_cast<std::size_t>(len)),
                                           static_cast<std::int32_t>(start), mo.blocks_per_seq());
    if (start + len < n_prompt) b.logit_rows.clear();
    SX_RETURN_IF_ERROR(model.forward(b, logits));
  }
  return ok_status();
}

Result<GenerateResult> generate(Model& model, const tokenizer::Tokenizer& tok,
                                std::span<const std::int32_t> prompt, const GenerateOptions& options,
                                const std::function<void(std::string_view)>& on_text) {
  using Clock = std::chrono::steady_clock;
  SX_RETURN_IF_ERROR(options.sampling.validate());
  if (prompt.empty()) return invalid_argument_error("the prompt is empty (no tokens)");
  if (options.max_tokens < 0) return invalid_argument_error("max_tokens must be >= 0, got {}", options.max_tokens);
  const ModelOptions& mo = model.options();
  const std::int64_t capacity = model.max_request_tokens();
  const auto n_prompt = static_cast<std::int64_t>(prompt.size());
  if (n_prompt + 1 > capacity) {
    return invalid_argument_error("the prompt has {} tokens but the context holds {} (prompt + at least one new token)",
                                  n_prompt, capacity);
  }
  GenerateResult result;
  if (options.max_tokens == 0) return result;

  // One request through the engine (the same path as batched serving, with a batch of one).
  EngineConfig ec;
  ec.scheduler.max_num_batched_tokens = mo.max_batch_tokens;
  ec.scheduler.max_num_seqs = 1;
  ec.scheduler.max_model_len = capacity;
  ec.prefix_caching = false;
  ec.eos_ids = options.eos_ids;
  SX_ASSIGN_OR_RETURN(std::unique_ptr<Engine> engine, Engine::create(model, tok, ec));
  RequestOptions ro;
  ro.sampling = options.sampling;
  ro.max_tokens = std::min(options.max_tokens, capacity - n_prompt);
  ro.stop_ids = options.stop_ids;
  ro.stop_strings = options.stop_strings;
  ro.ignore_eos = options.ignore_eos;
  const auto t0 = Clock::now();
  auto t1 = t0;
  RequestFinish finish = RequestFinish::kNone;
  Status error;
  SX_RETURN_IF_ERROR(engine
                         ->submit(std::vector<std::int32_t>(prompt.begin(), prompt.end()), ro,
                                  [&](const RequestEvent& e) {
                                    if (result.tokens.empty() && !e.tokens.empty()) t1 = Clock::now();
                                    result.tokens.insert(result.tokens.end(), e.tokens.begin(), e.tokens.end());
                                    if (!e.text.empty()) {
                                      result.text += e.text;
                                      if (on_text) on_text(e.text);
                                    }
                                    if (e.finished) {
                                      finish = e.finish;
                                      error = e.error;
                                    }
                                  })
                         .status());
  SX_RETURN_IF_ERROR(engine->run_until_idle());
  if (!error.ok()) return error;
  if (finish != RequestFinish::kStop && finish != RequestFinish::kLength) {
    return internal_error("generation ended without a finish reason ({})", request_finish_name(finish));
  }
  result.finish = finish == RequestFinish::kStop ? FinishReason::kStop : FinishReason::kLength;
  result.prefill_seconds = std::chrono::duration<double>(t1 - t0).count();
  result.decode_seconds = std::chrono::duration<double>(Clock::now() - t1).count();
  return result;
}

}  // namespace sx::engine
