// OpenAI response bodies: errors, whole completions and the chunks of a stream (SSE "data:" lines).
//
// The shapes follow the OpenAI API reference (chat.completion, chat.completion.chunk,
// text_completion), which the official clients parse. JSON is written with invalid UTF-8 replaced
// (a token's bytes may be part of a character), never thrown on.
//
// Threading: pure functions.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "daemon/openai/request.h"
#include "runtime/engine/engine.h"
#include "runtime/tokenizer/tokenizer.h"

namespace sx::daemon::openai {

// {"error": {"message", "type", "param", "code"}}.
std::string error_body(const ApiError& error);

// nlohmann::json -> text, invalid UTF-8 replaced by U+FFFD.
std::string dump_json(const nlohmann::json& j);

// The identity of one response: "chatcmpl-..." / "cmpl-...", its creation time and model id.
struct ResponseId {
  std::string id;
  std::int64_t created = 0;
  std::string model;
};

struct Usage {
  std::int64_t prompt_tokens = 0, completion_tokens = 0, cached_tokens = 0;
};

// A call the model made, as message.tool_calls lists it.
struct ToolCallOut {
  std::string id;  // "call_..."
  std::string name;
  std::string arguments;  // a JSON object's text
};

// One finished choice of a non-streamed response.
struct Choice {
  std::string text;
  std::vector<engine::TokenLogprob> logprobs;  // when asked for
  std::string finish_reason;                   // "stop", "length" or "tool_calls"
  std::optional<std::string> reasoning;        // chat with split_reasoning: the thinking (null: none)
  std::vector<ToolCallOut> tool_calls;         // chat with tools: content is null when only spaces remain
};

// The whole non-streamed response.
std::string completion_body(const GenerateRequest& request, const ResponseId& id, const std::vector<Choice>& choices,
                            const Usage& usage, const tokenizer::Tokenizer& tok);

// The JSON of one stream chunk for choice `index`: new text and logprobs (chat: the first chunk of a
// choice carries the role; `reasoning`, when not empty, goes in delta.reasoning_content), or the
// finish reason (empty = not finished). `usage` is null in every
// chunk when include_usage is set, as OpenAI sends it. `token_bytes_before`: the bytes of this
// choice's tokens sent in earlier chunks (completions logprobs' text_offset continues from there,
// after the echoed prompt).
std::string chunk_json(const GenerateRequest& request, const ResponseId& id, std::int64_t index, bool first,
                       const std::string& text, const std::vector<engine::TokenLogprob>& logprobs,
                       const std::string& finish_reason, const tokenizer::Tokenizer& tok,
                       std::int64_t token_bytes_before = 0, const std::string& reasoning = {});
// A chat stream chunk of choice `index` whose delta is `delta` (an object: content,
// reasoning_content, tool_calls), the role added on the choice's first chunk.
std::string delta_chunk_json(const GenerateRequest& request, const ResponseId& id, std::int64_t index, bool first,
                             nlohmann::json delta, const std::vector<engine::TokenLogprob>& logprobs,
                             const std::string& finish_reason, const tokenizer::Tokenizer& tok);
// A delta's tool_calls entry: a call's first (id, type and name) or one fragment of its arguments.
nlohmann::json tool_call_begin_delta(std::size_t index, const std::string& id, const std::string& name);
nlohmann::json tool_call_arguments_delta(std::size_t index, const std::string& fragment);

// The last chunk when include_usage is set: no choices, the usage of the whole request.
std::string usage_chunk_json(const GenerateRequest& request, const ResponseId& id, const Usage& usage);

// An SSE event: "data: <payload>\n\n".
std::string sse(const std::string& payload);

}  // namespace sx::daemon::openai
