// OpenAI request bodies -> validated GenerateRequest (DESIGN.md §3 step 1).
//
// POST /v1/chat/completions and POST /v1/completions bodies are checked field by field: a wrong
// type, an out-of-range value, an unknown field or a feature Sextant does not have is an
// ApiError naming the field (`messages[2].role`, `stop[1]`, `temperature`), which the handler
// answers as 400 in OpenAI's error shape. Nothing here throws (nlohmann's parse errors are caught).
//
// Threading: pure functions.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "daemon/chat/chatml.h"
#include "daemon/chat/structured.h"
#include "daemon/chat/tool_calls.h"
#include "runtime/base/json_parse.h"
#include "runtime/base/status.h"
#include "runtime/engine/sampler.h"

namespace sx::daemon::openai {

enum class Endpoint { kChat, kCompletion };

// tool_choice: none (the tools are not shown and no call is parsed), auto, required (at least one
// call), named (a call of that function).
enum class ToolChoice { kNone, kAuto, kRequired, kNamed };

// What the handler needs to run a request (limits are checked later, against the model).
struct GenerateRequest {
  Endpoint endpoint = Endpoint::kChat;
  std::string model;
  std::vector<chat::ChatMessage> messages;  // chat
  // chat: passed to the model's chat template beside messages (enable_thinking, preserve_thinking,
  // any key the template reads): an object, empty when not given.
  nlohmann::ordered_json chat_template_kwargs = nlohmann::ordered_json::object();
  // chat: the functions the model may call (the request's `tools`, checked, in the client's key
  // order; null when none), tool_choice and parallel_tool_calls.
  nlohmann::ordered_json tools;
  ToolChoice tool_choice = ToolChoice::kNone;
  std::string tool_choice_name;  // kNamed
  bool parallel_tool_calls = true;
  // What the answer must be (response_format, vLLM's structured_outputs); kText: free.
  chat::OutputFormat output_format;
  // Test hooks only (ParseLimits::test_hooks): the answer's text, which the engine writes instead of
  // sampling (engine::RequestOptions::script); the rest of the pipeline runs as for any answer.
  std::string test_script;
  // chat, set by the server after rendering: the model thinks (its template names </think>), so
  // answers are split into reasoning_content and content (daemon/chat/reasoning.h), and whether
  // the prompt already opened <think>.
  bool split_reasoning = false;
  bool prompt_in_thinking = false;
  // chat, set by the server after rendering: the syntax the model's calls are parsed in (kNone:
  // no tools, tool_choice none, or a template that shows no calls).
  chat::ToolSyntax tool_syntax = chat::ToolSyntax::kNone;
  std::string prompt_text;                       // completion: a string prompt
  std::vector<std::int32_t> prompt_ids;          // completion: token ids
  bool prompt_is_ids = false;
  std::optional<std::int64_t> max_tokens;        // max_tokens / max_completion_tokens
  engine::SamplingParams sampling;
  std::vector<std::string> stop;
  std::int64_t n = 1;
  std::int32_t top_logprobs = -1;  // -1: none; chat: logprobs=true gives 0 unless top_logprobs
  bool echo = false;               // completion: prepend the prompt to the text
  bool stream = false;
  bool include_usage = false;      // stream_options.include_usage
  bool ignore_eos = false;         // vLLM's extension
  std::string user;
};

// An error for the client: HTTP status, OpenAI error type and code, the offending parameter.
struct ApiError {
  int status = 400;
  std::string type = "invalid_request_error";
  std::string code;   // e.g. "model_not_found"; empty for none
  std::string param;  // e.g. "messages[0].content"; empty for none
  std::string message;
};

// Parses a body. limits: the most stop strings and choices (n) a request may ask for, and the
// size of the JSON tree a body may have (checked in one pass over the bytes before the body is
// parsed, so a hostile body costs neither memory nor time in proportion to its nesting): no
// OpenAI request nests more than a few levels, and a prompt of token ids longer than any context
// is useless.
struct ParseLimits {
  std::int64_t max_stop_strings = 16;
  std::int64_t max_n = 8;
  std::size_t max_json_depth = JsonLimits{}.max_depth;  // 32; JSON held in strings gets them too
  std::size_t max_json_values = JsonLimits{}.max_values;  // 2^20
  // Accepts `sextant_test_script` (serve's SEXTANT_TEST_HOOKS=1): end-to-end tests of tool calls
  // make a model "write" a call. Never on in a served deployment by default.
  bool test_hooks = false;
};
std::optional<GenerateRequest> parse_request(Endpoint endpoint, std::string_view body, const ParseLimits& limits,
                                             ApiError* error);

// The 404 for a request naming another model than the one served.
ApiError model_not_found(std::string_view asked, std::string_view served);
// The 400 for a conversation the chat prompt could not be made of (chat::render_chat_prompt's
// error): no ChatML tokens (code no_chat_template), or the template's message (param messages).
ApiError chat_prompt_error(const Status& status);

// The body as a JSON object within `limits`' tree size, or nullopt with the 400 in `error`.
std::optional<nlohmann::ordered_json> parse_body_object(std::string_view body, const ParseLimits& limits, ApiError* error);
// A chat request's `messages` (the rules of /v1/chat/completions), or false with the 400 naming the
// message at fault in `error`.
bool parse_chat_messages(const nlohmann::ordered_json& v, std::vector<chat::ChatMessage>& out, ApiError* error);
// A chat request's `tools` (checked as /v1/chat/completions checks them, kept as sent), or false
// with the 400 naming the tool at fault.
bool parse_chat_tools(const nlohmann::ordered_json& v, nlohmann::ordered_json& out, ApiError* error);

}  // namespace sx::daemon::openai
