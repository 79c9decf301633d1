// The endpoints that render and count without generating: vLLM's POST /tokenize and /detokenize,
// and llama.cpp's POST /apply-template. Each takes the request body and returns the response body
// (JSON), or nullopt with the error (400 naming the field, 404 for another model) in `error`.
//
//   /tokenize        {"prompt": TEXT} or {"messages": [...], "tools": [...], "add_generation_prompt":
//                    true, "chat_template_kwargs": {...}}, with "add_special_tokens" (prompt: true, chat:
//                    false; adds the tokenizer's BOS where it asks for one), "return_token_strs"
//                    (false), "model" (optional)
//                    -> {"count", "max_model_len", "tokens": [ids], "token_strs": [..] or null}
//   /detokenize      {"tokens": [ids], "model"} -> {"prompt": TEXT}
//   /apply-template  a chat request ({"messages": [...], "tools", "chat_template_kwargs", ...}; fields of
//                    generation are ignored) -> {"prompt": TEXT}, the generation prompt added
// Pure; thread-safe (run on libuv's thread pool).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "daemon/chat/chat_template.h"
#include "daemon/openai/request.h"
#include "runtime/tokenizer/tokenizer.h"

namespace sx::daemon::openai {

struct UtilityContext {
  const tokenizer::Tokenizer* tokenizer = nullptr;
  const chat::ChatTemplate* chat_template = nullptr;  // null: ChatML
  std::string model_name;
  std::int64_t max_model_len = 0;
  ParseLimits limits;
};

enum class UtilityEndpoint { kTokenize, kDetokenize, kApplyTemplate };

std::optional<std::string> run_utility(UtilityEndpoint endpoint, std::string_view body, const UtilityContext& ctx,
                                       ApiError* error);

}  // namespace sx::daemon::openai
