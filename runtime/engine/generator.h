// Single-request generation on a Model: prefill in chunks, then decode token by token with
// the sampler, streaming text through a callback, until a stop condition.
//
// Threading: runs on the calling thread; the model must not be used by anyone else meanwhile.
// Errors: a prompt longer than the cache or the model context is INVALID_ARGUMENT / OUT_OF_RANGE
// naming the lengths; device errors are returned as they come.
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "runtime/engine/model.h"
#include "runtime/engine/sampler.h"
#include "runtime/tokenizer/tokenizer.h"

namespace sx::engine {

enum class FinishReason { kStop, kLength };
std::string_view finish_reason_name(FinishReason r);

struct GenerateOptions {
  SamplingParams sampling;
  std::int64_t max_tokens = 128;
  std::vector<std::int32_t> stop_ids;      // in addition to the tokenizer's EOS unless ignore_eos
  std::vector<std::int32_t> eos_ids;       // the model's EOS ids beyond the tokenizer's (EngineConfig::eos_ids)
  std::vector<std::string> stop_strings;
  bool ignore_eos = false;
};

struct GenerateResult {
  std::vector<std::int32_t> tokens;  // generated ids (including a final stop token, if any)
  std::string text;                  // emitted text (stop strings and special tokens excluded)
  FinishReason finish = FinishReason::kLength;
  double prefill_seconds = 0.0;
  double decode_seconds = 0.0;       // from the first generated token to the last
};

// on_text receives text pieces as they become final (may be empty-never-called).
Result<GenerateResult> generate(Model& model, const tokenizer::Tokenizer& tok,
                                std::span<const std::int32_t> prompt, const GenerateOptions& options,
                                const std::function<void(std::string_view)>& on_text = {});

// Runs the prompt through the model from position 0 in chunks of max_batch_tokens (one sequence,
// identity block table); logits receives the last token's logits.
Status prefill(Model& model, std::span<const std::int32_t> prompt, std::vector<float>& logits);

// Default stop ids for a tokenizer: EOS plus <|im_end|> and <|endoftext|> when present.
// The tokenizer's EOS, <|im_end|> and <|endoftext|> when the vocabulary has them, and `eos_ids`.
std::vector<std::int32_t> default_stop_ids(const tokenizer::Tokenizer& tok, std::span<const std::int32_t> eos_ids = {});

}  // namespace sx::engine
