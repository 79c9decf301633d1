// daemon/openai parse_request: every field chat and completions accept, landed in
// GenerateRequest, and every error (invalid JSON, wrong types, out-of-range values, unknown and
// unsupported fields, inconsistent combinations), each with its exact param and message.
#include <cstdint>
#include <limits>
#include <optional>
#include <string>
#include <string_view>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "daemon/openai/request.h"

namespace sx::daemon::openai {
namespace {

using nlohmann::json;

// A chat body with one user message, merged with `extra` (a null in extra stays as a null field).
std::string chat_with(const json& extra = json::object()) {
  json b{{"model", "qwen"}, {"messages", json::array({json{{"role", "user"}, {"content", "hello"}}})}};
  for (const auto& [k, v] : extra.items()) b[k] = v;
  return b.dump();
}

std::string completion_with(const json& extra = json::object()) {
  json b{{"model", "qwen"}, {"prompt", "Once upon"}};
  for (const auto& [k, v] : extra.items()) b[k] = v;
  return b.dump();
}

// Parses a body that must be accepted.
GenerateRequest accept(Endpoint endpoint, std::string_view body, const ParseLimits& limits = {}) {
  ApiError err;
  std::optional<GenerateRequest> r = parse_request(endpoint, body, limits, &err);
  EXPECT_TRUE(r.has_value()) << "rejected " << body << ": param='" << err.param << "' " << err.message;
  return r.value_or(GenerateRequest{});
}

// Parses a body that must be rejected; the error starts out filled with junk to prove that
// parse_request resets it.
ApiError reject(Endpoint endpoint, std::string_view body, const ParseLimits& limits = {}) {
  ApiError err;
  err.status = 599;
  err.type = "junk";
  err.code = "junk";
  err.param = "junk";
  err.message = "junk";
  std::optional<GenerateRequest> r = parse_request(endpoint, body, limits, &err);
  EXPECT_FALSE(r.has_value()) << "accepted " << body;
  EXPECT_EQ(err.status, 400) << body;
  EXPECT_EQ(err.type, "invalid_request_error") << body;
  EXPECT_EQ(err.code, "") << body;
  return err;
}

#define EXPECT_API_ERROR(err, want_param, want_message) \
  do {                                                  \
    const ApiError e_ = (err);                          \
    EXPECT_EQ(e_.param, want_param);                    \
    EXPECT_EQ(e_.message, want_message);                \
  } while (0)

ApiError reject_chat(const json& extra, const ParseLimits& limits = {}) {
  return reject(Endpoint::kChat, chat_with(extra), limits);
}
ApiError reject_completion(const json& extra, const ParseLimits& limits = {}) {
  return reject(Endpoint::kCompletion, completion_with(extra), limits);
}

// ------------------------------------------------------------------------------------------------
// Accepted fields

TEST(ParseRequest, ChatMinimalHasDefaults) {
  const GenerateRequest r = accept(Endpoint::kChat, chat_with());
  EXPECT_EQ(r.endpoint, Endpoint::kChat);
  EXPECT_EQ(r.model, "qwen");
  ASSERT_EQ(r.messages.size(), 1u);
  EXPECT_EQ(r.messages[0].role, "user");
  EXPECT_EQ(r.messages[0].content, "hello");
  EXPECT_TRUE(r.prompt_text.empty());
  EXPECT_TRUE(r.prompt_ids.empty());
  EXPECT_FALSE(r.prompt_is_ids);
  EXPECT_FALSE(r.max_tokens.has_value());
  EXPECT_FLOAT_EQ(r.sampling.temperature, 1.0f);
  EXPECT_FLOAT_EQ(r.sampling.top_p, 1.0f);
  EXPECT_EQ(r.sampling.top_k, 0);
  EXPECT_FLOAT_EQ(r.sampling.min_p, 0.0f);
  EXPECT_FLOAT_EQ(r.sampling.presence_penalty, 0.0f);
  EXPECT_FLOAT_EQ(r.sampling.frequency_penalty, 0.0f);
  EXPECT_FLOAT_EQ(r.sampling.repetition_penalty, 1.0f);
  EXPECT_FALSE(r.sampling.seed.has_value());
  EXPECT_TRUE(r.stop.empty());
  EXPECT_EQ(r.n, 1);
  EXPECT_EQ(r.top_logprobs, -1);
  EXPECT_FALSE(r.echo);
  EXPECT_FALSE(r.stream);
  EXPECT_FALSE(r.include_usage);
  EXPECT_FALSE(r.ignore_eos);
  EXPECT_EQ(r.user, "");
}

TEST(ParseRequest, ChatEveryField) {
  const json body{
      {"model", "qwen2.5"},
      {"messages", json::array({json{{"role", "system"}, {"content", "be brief"}},
                                json{{"role", "developer"}, {"content", "dev says"}},
                                json{{"role", "user"},
                                     {"content", json::array({json{{"type", "text"}, {"text", "part one, "}},
                                                              json{{"type", "text"}, {"text", "part two"}}})},
                                     {"name", "alice"}},
                                json{{"role", "assistant"}, {"content", nullptr}, {"tool_calls", json::array()},
                                     {"function_call", nullptr}, {"refusal", nullptr}, {"audio", nullptr}},
                                json{{"role", "tool"}, {"content", "42"}, {"tool_call_id", "call_1"}}})},
      {"max_completion_tokens", 77},
      {"temperature", 0.5},
      {"top_p", 0.9},
      {"top_k", 40},
      {"min_p", 0.05},
      {"presence_penalty", 0.5},
      {"frequency_penalty", -0.5},
      {"repetition_penalty", 1.1},
      {"seed", 1234},
      {"stop", "END"},
      {"n", 3},
      {"stream", true},
      {"stream_options", {{"include_usage", true}}},
      {"user", "user-7"},
      {"ignore_eos", true},
      {"logprobs", true},
      {"top_logprobs", 5},
      {"logit_bias", json::object()},
      {"response_format", {{"type", "text"}}},
      {"store", false},
      {"metadata", {{"k", "v"}}},
      {"service_tier", "auto"},
  };
  const GenerateRequest r = accept(Endpoint::kChat, body.dump());
  EXPECT_EQ(r.endpoint, Endpoint::kChat);
  EXPECT_EQ(r.model, "qwen2.5");
  ASSERT_EQ(r.messages.size(), 5u);
  EXPECT_EQ(r.messages[0].role, "system");
  EXPECT_EQ(r.messages[0].content, "be brief");
  EXPECT_EQ(r.messages[1].role, "system");  // developer is OpenAI's newer name for system
  EXPECT_EQ(r.messages[1].content, "dev says");
  EXPECT_EQ(r.messages[2].role, "user");
  EXPECT_EQ(r.messages[2].content, "part one, part two");
  EXPECT_EQ(r.messages[3].role, "assistant");
  EXPECT_EQ(r.messages[3].content, "");
  EXPECT_EQ(r.messages[4].role, "tool");
  EXPECT_EQ(r.messages[4].content, "42");
  ASSERT_TRUE(r.max_tokens.has_value());
  EXPECT_EQ(*r.max_tokens, 77);
  EXPECT_FLOAT_EQ(r.sampling.temperature, 0.5f);
  EXPECT_FLOAT_EQ(r.sampling.top_p, 0.9f);
  EXPECT_EQ(r.sampling.top_k, 40);
  EXPECT_FLOAT_EQ(r.sampling.min_p, 0.05f);
  EXPECT_FLOAT_EQ(r.sampling.presence_penalty, 0.5f);
  EXPECT_FLOAT_EQ(r.sampling.frequency_penalty, -0.5f);
  EXPECT_FLOAT_EQ(r.sampling.repetition_penalty, 1.1f);
  ASSERT_TRUE(r.sampling.seed.has_value());
  EXPECT_EQ(*r.sampling.seed, 1234u);
  ASSERT_EQ(r.stop.size(), 1u);
  EXPECT_EQ(r.stop[0], "END");
  EXPECT_EQ(r.n, 3);
  EXPECT_TRUE(r.stream);
  EXPECT_TRUE(r.include_usage);
  EXPECT_EQ(r.user, "user-7");
  EXPECT_TRUE(r.ignore_eos);
  EXPECT_EQ(r.top_logprobs, 5);
  EXPECT_FALSE(r.echo);
}

TEST(ParseRequest, MaxTokensAndMaxCompletionTokens) {
  EXPECT_EQ(accept(Endpoint::kChat, chat_with({{"max_tokens", 5}})).max_tokens, std::optional<std::int64_t>(5));
  EXPECT_EQ(accept(Endpoint::kChat, chat_with({{"max_completion_tokens", 6}})).max_tokens,
            std::optional<std::int64_t>(6));
  // Both given: max_completion_tokens (the newer name, which replaces max_tokens) wins, as in vLLM.
  EXPECT_EQ(accept(Endpoint::kChat, chat_with({{"max_tokens", 5}, {"max_completion_tokens", 6}})).max_tokens,
            std::optional<std::int64_t>(6));
  EXPECT_EQ(accept(Endpoint::kChat, chat_with({{"max_tokens", 5}, {"max_completion_tokens", nullptr}})).max_tokens,
            std::optional<std::int64_t>(5));
  EXPECT_EQ(accept(Endpoint::kCompletion, completion_with({{"max_tokens", 9}})).max_tokens,
            std::optional<std::int64_t>(9));
  // An integral float is an integer; the bounds are 1 and INT32_MAX.
  EXPECT_EQ(accept(Endpoint::kChat, chat_with({{"max_tokens", 16.0}})).max_tokens, std::optional<std::int64_t>(16));
  EXPECT_EQ(accept(Endpoint::kChat, chat_with({{"max_tokens", 2147483647}})).max_tokens,
            std::optional<std::int64_t>(2147483647));
  // The completions API has only max_tokens.
  EXPECT_API_ERROR(reject_completion({{"max_completion_tokens", 6}}), "max_completion_tokens",
                   "unknown field 'max_completion_tokens'");
}

TEST(ParseRequest, SamplingBoundsAreInclusiveWhereDocumented) {
  GenerateRequest r = accept(Endpoint::kChat, chat_with({{"temperature", 0}, {"top_p", 1}, {"min_p", 1},
                                                          {"presence_penalty", -2}, {"frequency_penalty", 2},
                                                          {"repetition_penalty", 10}, {"top_k", -1}}));
  EXPECT_FLOAT_EQ(r.sampling.temperature, 0.0f);
  EXPECT_FLOAT_EQ(r.sampling.top_p, 1.0f);
  EXPECT_FLOAT_EQ(r.sampling.min_p, 1.0f);
  EXPECT_FLOAT_EQ(r.sampling.presence_penalty, -2.0f);
  EXPECT_FLOAT_EQ(r.sampling.frequency_penalty, 2.0f);
  EXPECT_FLOAT_EQ(r.sampling.repetition_penalty, 10.0f);
  EXPECT_EQ(r.sampling.top_k, -1);
  r = accept(Endpoint::kChat, chat_with({{"temperature", 2.0}, {"top_p", 1e-6}}));
  EXPECT_FLOAT_EQ(r.sampling.temperature, 2.0f);
  EXPECT_FLOAT_EQ(r.sampling.top_p, 1e-6f);
}

TEST(ParseRequest, Seed) {
  EXPECT_EQ(accept(Endpoint::kChat, chat_with({{"seed", 0}})).sampling.seed, std::optional<std::uint64_t>(0));
  // A negative seed keeps its bits.
  EXPECT_EQ(accept(Endpoint::kChat, chat_with({{"seed", -1}})).sampling.seed,
            std::optional<std::uint64_t>(std::numeric_limits<std::uint64_t>::max()));
  EXPECT_EQ(accept(Endpoint::kCompletion, completion_with({{"seed", 99}})).sampling.seed,
            std::optional<std::uint64_t>(99));
  EXPECT_API_ERROR(reject_chat({{"seed", "7"}}), "seed", "'seed' must be an integer, got a string");
  EXPECT_API_ERROR(reject_chat({{"seed", 1.5}}), "seed", "'seed' must be an integer, got a number");
}

TEST(ParseRequest, StopStringOrList) {
  GenerateRequest r = accept(Endpoint::kChat, chat_with({{"stop", "###"}}));
  ASSERT_EQ(r.stop.size(), 1u);
  EXPECT_EQ(r.stop[0], "###");
  r = accept(Endpoint::kChat, chat_with({{"stop", json::array({"a", "bc", "\n"})}}));
  ASSERT_EQ(r.stop.size(), 3u);
  EXPECT_EQ(r.stop[0], "a");
  EXPECT_EQ(r.stop[1], "bc");
  EXPECT_EQ(r.stop[2], "\n");
  r = accept(Endpoint::kCompletion, completion_with({{"stop", json::array()}}));
  EXPECT_TRUE(r.stop.empty());
  // Exactly max_stop_strings is fine.
  ParseLimits limits;
  limits.max_stop_strings = 2;
  r = accept(Endpoint::kChat, chat_with({{"stop", json::array({"x", "y"})}}), limits);
  EXPECT_EQ(r.stop.size(), 2u);
}

TEST(ParseRequest, NChoices) {
  EXPECT_EQ(accept(Endpoint::kChat, chat_with({{"n", 1}})).n, 1);
  EXPECT_EQ(accept(Endpoint::kChat, chat_with({{"n", 8}})).n, 8);  // the default max_n
  ParseLimits limits;
  limits.max_n = 2;
  EXPECT_EQ(accept(Endpoint::kCompletion, completion_with({{"n", 2}}), limits).n, 2);
  EXPECT_API_ERROR(reject_completion({{"n", 3}}, limits), "n", "'n' must be between 1 and 2, got 3");
}

TEST(ParseRequest, StreamAndStreamOptions) {
  GenerateRequest r = accept(Endpoint::kChat, chat_with({{"stream", true}}));
  EXPECT_TRUE(r.stream);
  EXPECT_FALSE(r.include_usage);
  r = accept(Endpoint::kChat, chat_with({{"stream", true}, {"stream_options", {{"include_usage", true}}}}));
  EXPECT_TRUE(r.stream);
  EXPECT_TRUE(r.include_usage);
  r = accept(Endpoint::kChat, chat_with({{"stream", true}, {"stream_options", {{"include_usage", false}}}}));
  EXPECT_FALSE(r.include_usage);
  r = accept(Endpoint::kCompletion, completion_with({{"stream", true}, {"stream_options", json::object()}}));
  EXPECT_TRUE(r.stream);
  EXPECT_FALSE(r.include_usage);
  r = accept(Endpoint::kCompletion,
             completion_with({{"stream", true}, {"stream_options", {{"include_usage", nullptr}}}}));
  EXPECT_FALSE(r.include_usage);
  r = accept(Endpoint::kChat, chat_with({{"stream", false}}));
  EXPECT_FALSE(r.stream);
  // stream_options: null without stream is the same as absent.
  r = accept(Endpoint::kChat, chat_with({{"stream_options", nullptr}}));
  EXPECT_FALSE(r.stream);
  EXPECT_FALSE(r.include_usage);
}

TEST(ParseRequest, UserAndIgnoreEos) {
  GenerateRequest r = accept(Endpoint::kCompletion, completion_with({{"user", "bob"}, {"ignore_eos", true}}));
  EXPECT_EQ(r.user, "bob");
  EXPECT_TRUE(r.ignore_eos);
  r = accept(Endpoint::kChat, chat_with({{"ignore_eos", false}}));
  EXPECT_FALSE(r.ignore_eos);
}

TEST(ParseRequest, ChatLogprobs) {
  EXPECT_EQ(accept(Endpoint::kChat, chat_with({{"logprobs", false}})).top_logprobs, -1);
  EXPECT_EQ(accept(Endpoint::kChat, chat_with({{"logprobs", true}})).top_logprobs, 0);
  EXPECT_EQ(accept(Endpoint::kChat, chat_with({{"logprobs", true}, {"top_logprobs", 0}})).top_logprobs, 0);
  EXPECT_EQ(accept(Endpoint::kChat, chat_with({{"logprobs", true}, {"top_logprobs", 20}})).top_logprobs, 20);
  EXPECT_EQ(accept(Endpoint::kChat, chat_with({{"logprobs", true}, {"top_logprobs", nullptr}})).top_logprobs, 0);
  EXPECT_API_ERROR(reject_chat({{"top_logprobs", 2}}), "top_logprobs", "'top_logprobs' requires \"logprobs\": true");
  EXPECT_API_ERROR(reject_chat({{"logprobs", false}, {"top_logprobs", 2}}), "top_logprobs",
                   "'top_logprobs' requires \"logprobs\": true");
  EXPECT_API_ERROR(reject_chat({{"logprobs", true}, {"top_logprobs", 21}}), "top_logprobs",
                   "'top_logprobs' must be between 0 and 20, got 21");
  EXPECT_API_ERROR(reject_chat({{"logprobs", true}, {"top_logprobs", -1}}), "top_logprobs",
                   "'top_logprobs' must be between 0 and 20, got -1");
  EXPECT_API_ERROR(reject_chat({{"logprobs", 3}}), "logprobs", "'logprobs' must be a boolean, got an integer");
}

TEST(ParseRequest, CompletionLogprobsEchoBestOf) {
  EXPECT_EQ(accept(Endpoint::kCompletion, completion_with()).top_logprobs, -1);
  EXPECT_EQ(accept(Endpoint::kCompletion, completion_with({{"logprobs", 0}})).top_logprobs, 0);
  EXPECT_EQ(accept(Endpoint::kCompletion, completion_with({{"logprobs", 3}})).top_logprobs, 3);
  EXPECT_EQ(accept(Endpoint::kCompletion, completion_with({{"logprobs", 5}})).top_logprobs, 5);
  EXPECT_EQ(accept(Endpoint::kCompletion, completion_with({{"logprobs", nullptr}})).top_logprobs, -1);
  EXPECT_API_ERROR(reject_completion({{"logprobs", 6}}), "logprobs", "'logprobs' must be between 0 and 5, got 6");
  EXPECT_API_ERROR(reject_completion({{"logprobs", true}}), "logprobs",
                   "'logprobs' must be an integer, got a boolean");
  // top_logprobs is a chat field.
  EXPECT_API_ERROR(reject_completion({{"top_logprobs", 2}}), "top_logprobs", "unknown field 'top_logprobs'");

  EXPECT_TRUE(accept(Endpoint::kCompletion, completion_with({{"echo", true}})).echo);
  EXPECT_FALSE(accept(Endpoint::kCompletion, completion_with({{"echo", false}})).echo);
  EXPECT_API_ERROR(reject_completion({{"echo", "yes"}}), "echo", "'echo' must be a boolean, got a string");
  EXPECT_API_ERROR(reject_chat({{"echo", true}}), "echo", "unknown field 'echo'");

  accept(Endpoint::kCompletion, completion_with({{"best_of", 1}}));
  EXPECT_API_ERROR(reject_completion({{"best_of", 2}}), "best_of", "'best_of' must be between 1 and 1, got 2");
  EXPECT_API_ERROR(reject_chat({{"best_of", 1}}), "best_of", "unknown field 'best_of'");
}

TEST(ParseRequest, CompletionPromptForms) {
  GenerateRequest r = accept(Endpoint::kCompletion, completion_with({{"prompt", "Hello there"}}));
  EXPECT_EQ(r.endpoint, Endpoint::kCompletion);
  EXPECT_EQ(r.prompt_text, "Hello there");
  EXPECT_FALSE(r.prompt_is_ids);
  EXPECT_TRUE(r.prompt_ids.empty());
  EXPECT_TRUE(r.messages.empty());

  r = accept(Endpoint::kCompletion, completion_with({{"prompt", json::array({1, 22, 333, 0})}}));
  EXPECT_TRUE(r.prompt_is_ids);
  EXPECT_EQ(r.prompt_ids, (std::vector<std::int32_t>{1, 22, 333, 0}));
  EXPECT_TRUE(r.prompt_text.empty());

  r = accept(Endpoint::kCompletion, completion_with({{"prompt", json::array({"only one"})}}));
  EXPECT_FALSE(r.prompt_is_ids);
  EXPECT_EQ(r.prompt_text, "only one");

  r = accept(Endpoint::kCompletion, completion_with({{"prompt", json::array({json::array({7, 8})})}}));
  EXPECT_TRUE(r.prompt_is_ids);
  EXPECT_EQ(r.prompt_ids, (std::vector<std::int32_t>{7, 8}));

  // A single id; an integral float id; the largest int32 id.
  r = accept(Endpoint::kCompletion, completion_with({{"prompt", json::array({5})}}));
  EXPECT_EQ(r.prompt_ids, (std::vector<std::int32_t>{5}));
  r = accept(Endpoint::kCompletion, completion_with({{"prompt", json::array({3.0, 2147483647})}}));
  EXPECT_EQ(r.prompt_ids, (std::vector<std::int32_t>{3, 2147483647}));
}

TEST(ParseRequest, NullFieldsAreAbsent) {
  const GenerateRequest chat = accept(
      Endpoint::kChat,
      chat_with({{"max_tokens", nullptr}, {"max_completion_tokens", nullptr}, {"temperature", nullptr},
                 {"top_p", nullptr}, {"top_k", nullptr}, {"min_p", nullptr}, {"presence_penalty", nullptr},
                 {"frequency_penalty", nullptr}, {"repetition_penalty", nullptr}, {"seed", nullptr},
                 {"stop", nullptr}, {"n", nullptr}, {"stream", nullptr}, {"stream_options", nullptr},
                 {"user", nullptr}, {"ignore_eos", nullptr}, {"logprobs", nullptr}, {"top_logprobs", nullptr},
                 {"logit_bias", nullptr}, {"response_format", nullptr}, {"tools", nullptr},
                 {"tool_choice", nullptr}, {"functions", nullptr}, {"function_call", nullptr},
                 {"parallel_tool_calls", nullptr}}));
  EXPECT_FALSE(chat.max_tokens.has_value());
  EXPECT_FLOAT_EQ(chat.sampling.temperature, 1.0f);
  EXPECT_FLOAT_EQ(chat.sampling.top_p, 1.0f);
  EXPECT_EQ(chat.sampling.top_k, 0);
  EXPECT_FLOAT_EQ(chat.sampling.repetition_penalty, 1.0f);
  EXPECT_FALSE(chat.sampling.seed.has_value());
  EXPECT_TRUE(chat.stop.empty());
  EXPECT_EQ(chat.n, 1);
  EXPECT_FALSE(chat.stream);
  EXPECT_FALSE(chat.include_usage);
  EXPECT_EQ(chat.user, "");
  EXPECT_FALSE(chat.ignore_eos);
  EXPECT_EQ(chat.top_logprobs, -1);

  const GenerateRequest cmpl = accept(
      Endpoint::kCompletion, completion_with({{"logprobs", nullptr}, {"echo", nullptr}, {"suffix", nullptr},
                                              {"best_of", nullptr}, {"max_tokens", nullptr}}));
  EXPECT_EQ(cmpl.top_logprobs, -1);
  EXPECT_FALSE(cmpl.echo);
  EXPECT_FALSE(cmpl.max_tokens.has_value());

  // Null message fields are absent too.
  const GenerateRequest m = accept(
      Endpoint::kChat,
      json{{"model", "qwen"},
           {"messages", json::array({json{{"role", "user"}, {"content", nullptr}, {"name", nullptr},
                                          {"tool_call_id", nullptr}, {"tool_calls", nullptr}}})}}
          .dump());
  ASSERT_EQ(m.messages.size(), 1u);
  EXPECT_EQ(m.messages[0].content, "");
}

// ------------------------------------------------------------------------------------------------
// Errors: the body as a whole

TEST(ParseRequestError, UnknownFieldsAreErrorsEvenWhenNull) {
  EXPECT_API_ERROR(reject_chat({{"bogus", nullptr}}), "bogus", "unknown field 'bogus'");
  // A field of the other endpoint is unknown here.
  EXPECT_API_ERROR(reject_chat({{"echo", nullptr}}), "echo", "unknown field 'echo'");
  EXPECT_API_ERROR(reject_completion({{"top_logprobs", nullptr}}), "top_logprobs", "unknown field 'top_logprobs'");
}

TEST(ParseRequestError, InvalidJson) {
  for (const char* body : {"", "{", "{\"model\": }", "not json", "{\"model\": \"m\",}", "\xff"}) {
    SCOPED_TRACE(body);
    EXPECT_API_ERROR(reject(Endpoint::kChat, body), "", "the request body is not valid JSON");
    EXPECT_API_ERROR(reject(Endpoint::kCompletion, body), "", "the request body is not valid JSON");
  }
}

TEST(ParseRequestError, NonObjectBody) {
  EXPECT_API_ERROR(reject(Endpoint::kChat, "[1, 2]"), "", "the request body must be a JSON object, got an array");
  EXPECT_API_ERROR(reject(Endpoint::kChat, "\"text\""), "", "the request body must be a JSON object, got a string");
  EXPECT_API_ERROR(reject(Endpoint::kCompletion, "42"), "",
                   "the request body must be a JSON object, got an integer");
  EXPECT_API_ERROR(reject(Endpoint::kCompletion, "4.5"), "", "the request body must be a JSON object, got a number");
  EXPECT_API_ERROR(reject(Endpoint::kChat, "null"), "", "the request body must be a JSON object, got null");
  EXPECT_API_ERROR(reject(Endpoint::kChat, "true"), "", "the request body must be a JSON object, got a boolean");
}

TEST(ParseRequestError, MissingModel) {
  EXPECT_API_ERROR(reject(Endpoint::kChat, R"({"messages": [{"role": "user", "content": "x"}]})"), "model",
                   "'model' is required");
  EXPECT_API_ERROR(reject(Endpoint::kCompletion, R"({"prompt": "x"})"), "model", "'model' is required");
  EXPECT_API_ERROR(reject(Endpoint::kChat, "{}"), "model", "'model' is required");
  // null is not a model.
  EXPECT_API_ERROR(reject_chat({{"model", nullptr}}), "model", "'model' must be a string, got null");
  EXPECT_API_ERROR(reject_chat({{"model", 7}}), "model", "'model' must be a string, got an integer");
  EXPECT_API_ERROR(reject_completion({{"model", json::array({"a"})}}), "model",
                   "'model' must be a string, got an array");
}

TEST(ParseRequestError, MissingMessagesOrPrompt) {
  EXPECT_API_ERROR(reject(Endpoint::kChat, R"({"model": "qwen"})"), "messages", "'messages' is required");
  EXPECT_API_ERROR(reject(Endpoint::kCompletion, R"({"model": "qwen"})"), "prompt", "'prompt' is required");
  // Each endpoint's input field is unknown to the other.
  EXPECT_API_ERROR(reject(Endpoint::kChat, R"({"model": "qwen", "prompt": "x"})"), "prompt",
                   "unknown field 'prompt'");
  EXPECT_API_ERROR(reject(Endpoint::kCompletion, R"({"model": "qwen", "messages": []})"), "messages",
                   "unknown field 'messages'");
  EXPECT_API_ERROR(reject_chat({{"messages", nullptr}}), "messages", "'messages' must be an array, got null");
  EXPECT_API_ERROR(reject_completion({{"prompt", nullptr}}), "prompt",
                   "'prompt' must be a string or a non-empty array of token ids, got null");
}

// ------------------------------------------------------------------------------------------------
// Errors: messages

TEST(ParseRequestError, Messages) {
  EXPECT_API_ERROR(reject_chat({{"messages", "hi"}}), "messages", "'messages' must be an array, got a string");
  EXPECT_API_ERROR(reject_chat({{"messages", json::object()}}), "messages",
                   "'messages' must be an array, got an object");
  EXPECT_API_ERROR(reject_chat({{"messages", json::array()}}), "messages",
                   "'messages' must contain at least one message");
  EXPECT_API_ERROR(reject_chat({{"messages", json::array({"hi"})}}), "messages[0]",
                   "'messages[0]' must be an object, got a string");
  const json user{{"role", "user"}, {"content", "x"}};
  EXPECT_API_ERROR(reject_chat({{"messages", json::array({user, json{{"content", "x"}}})}}), "messages[1].role",
                   "'messages[1].role' is required");
  EXPECT_API_ERROR(reject_chat({{"messages", json::array({json{{"role", 3}, {"content", "x"}}})}}),
                   "messages[0].role", "'messages[0].role' must be a string, got an integer");
  EXPECT_API_ERROR(reject_chat({{"messages", json::array({json{{"role", "bot"}, {"content", "x"}}})}}),
                   "messages[0].role",
                   "'messages[0].role' must be one of system, developer, user, assistant, tool; got 'bot'");
  EXPECT_API_ERROR(reject_chat({{"messages", json::array({user, json{{"role", "user"}, {"content", "x"}, {"foo", 1}}})}}),
                   "messages[1].foo", "unknown field 'messages[1].foo'");
  EXPECT_API_ERROR(reject_chat({{"messages", json::array({json{{"role", "user"}, {"content", "x"}, {"name", 5}}})}}),
                   "messages[0].name", "'messages[0].name' must be a string, got an integer");
  EXPECT_API_ERROR(
      reject_chat({{"messages", json::array({user, json{{"role", "assistant"},
                                                        {"tool_calls", json::array({json{{"id", "c"}}})}}})}}),
      "messages[1].tool_calls[0].function", "'messages[1].tool_calls[0].function' is required");
  EXPECT_API_ERROR(
      reject_chat({{"messages", json::array({json{{"role", "assistant"}, {"function_call", {{"name", "f"}}}}})}}),
      "messages[0].function_call", "'messages[0].function_call' is not supported: send 'tool_calls'");
  auto call = [](json arguments) {
    return json{{"id", "c1"}, {"type", "function"}, {"function", {{"name", "f"}, {"arguments", std::move(arguments)}}}};
  };
  auto with_call = [&](json c, const char* role = "assistant") {
    return json{{"messages", json::array({user, json{{"role", role}, {"tool_calls", json::array({std::move(c)})}}})}};
  };
  EXPECT_API_ERROR(reject_chat(with_call(call("[1]"))), "messages[1].tool_calls[0].function.arguments",
                   "'messages[1].tool_calls[0].function.arguments' must hold a JSON object; got '[1]'");
  EXPECT_API_ERROR(reject_chat(with_call(call(5))), "messages[1].tool_calls[0].function.arguments",
                   "'messages[1].tool_calls[0].function.arguments' must be a string holding a JSON object, got an "
                   "integer");
  EXPECT_API_ERROR(reject_chat(with_call(call("{}"), "user")), "messages[1].tool_calls",
                   "'messages[1].tool_calls' belongs to an assistant message, not a user message");
  json typed = call("{}");
  typed["type"] = "code";
  EXPECT_API_ERROR(reject_chat(with_call(typed)), "messages[1].tool_calls[0].type",
                   "'messages[1].tool_calls[0].type' must be \"function\"");
}

// Tool calls in the conversation: arguments as a string or an object, kept in the client's key
// order (the template writes them out); a tool message's id.
TEST(ParseRequest, ToolCallsAndToolMessages) {
  const std::string body = R"({"model": "qwen", "messages": [
      {"role": "user", "content": "weather?"},
      {"role": "assistant", "content": null, "tool_calls": [
        {"id": "call_1", "type": "function", "function": {"name": "get", "arguments": "{\"z\": 1, \"a\": 2}"}},
        {"id": "call_2", "type": "function", "function": {"name": "get", "arguments": {"z": [1], "a": {"y": 0, "b": 1}}}}]},
      {"role": "tool", "tool_call_id": "call_1", "name": "get", "content": "sunny"}]})";
  openai::ApiError err;
  const auto r = openai::parse_request(Endpoint::kChat, body, {}, &err);
  ASSERT_TRUE(r.has_value()) << err.message;
  ASSERT_EQ(r->messages.size(), 3u);
  ASSERT_EQ(r->messages[1].tool_calls.size(), 2u);
  EXPECT_EQ(r->messages[1].tool_calls[0].id, "call_1");
  EXPECT_EQ(r->messages[1].tool_calls[0].name, "get");
  EXPECT_EQ(r->messages[1].tool_calls[0].arguments, R"({"z": 1, "a": 2})");
  EXPECT_EQ(r->messages[1].tool_calls[1].arguments, R"({"z":[1],"a":{"y":0,"b":1}})");
  EXPECT_EQ(r->messages[2].tool_call_id, "call_1");
  EXPECT_EQ(r->messages[2].name, "get");
  EXPECT_EQ(r->tool_choice, openai::ToolChoice::kNone);  // no tools: none
}

TEST(ParseRequest, ToolsAndToolChoice) {
  const std::string body = R"({"model": "qwen", "messages": [{"role": "user", "content": "x"}],
      "tools": [{"type": "function", "function": {"name": "b", "parameters": {"type": "object",
                 "properties": {"z": {"type": "string"}, "a": {"type": "integer"}}}}},
                {"type": "function", "function": {"name": "a", "description": "d", "strict": true}}],
      "parallel_tool_calls": false})";
  openai::ApiError err;
  auto r = openai::parse_request(Endpoint::kChat, body, {}, &err);
  ASSERT_TRUE(r.has_value()) << err.message;
  EXPECT_EQ(r->tool_choice, openai::ToolChoice::kAuto);  // tools given: auto
  EXPECT_FALSE(r->parallel_tool_calls);
  ASSERT_EQ(r->tools.size(), 2u);
  // The schema's keys in the client's order, not sorted.
  EXPECT_EQ(r->tools[0]["function"]["parameters"]["properties"].dump(), R"({"z":{"type":"string"},"a":{"type":"integer"}})");
  const json named = json::parse(body.substr(0, body.size() - 1) +
                                 R"(, "tool_choice": {"type": "function", "function": {"name": "a"}}})");
  r = openai::parse_request(Endpoint::kChat, named.dump(), {}, &err);
  ASSERT_TRUE(r.has_value()) << err.message;
  EXPECT_EQ(r->tool_choice, openai::ToolChoice::kNamed);
  EXPECT_EQ(r->tool_choice_name, "a");
}

TEST(ParseRequestError, Tools) {
  const json tool{{"type", "function"}, {"function", {{"name", "f"}}}};
  EXPECT_API_ERROR(reject_chat({{"tools", tool}}), "tools", "'tools' must be an array, got an object");
  EXPECT_API_ERROR(reject_chat({{"tools", json::array({json{{"type", "function"}}})}}), "tools[0].function",
                   "'tools[0].function' must be an object");
  EXPECT_API_ERROR(reject_chat({{"tools", json::array({json{{"type", "retrieval"}, {"function", {{"name", "f"}}}}})}}),
                   "tools[0].type", "'tools[0].type' must be \"function\"");
  EXPECT_API_ERROR(reject_chat({{"tools", json::array({tool, tool})}}), "tools[1].function.name",
                   "'tools[1].function.name' 'f' is also tools[0]'s");
  EXPECT_API_ERROR(reject_chat({{"tools", json::array({json{{"type", "function"}, {"function", {{"name", "a<b"}}}}})}}),
                   "tools[0].function.name",
                   "'tools[0].function.name' must be a name without <, >, \" or line breaks; got 'a<b'");
  EXPECT_API_ERROR(
      reject_chat({{"tools", json::array({json{{"type", "function"}, {"function", {{"name", "f"}, {"parameters", 1}}}}})}}),
      "tools[0].function.parameters", "'tools[0].function.parameters' must be a JSON schema object, got an integer");
  EXPECT_API_ERROR(reject_chat({{"tool_choice", "required"}}), "tool_choice",
                   "'tool_choice' asks for a tool call but 'tools' lists none");
  EXPECT_API_ERROR(reject_chat({{"tools", json::array({tool})}, {"tool_choice", "sometimes"}}), "tool_choice",
                   "'tool_choice' must be \"none\", \"auto\", \"required\" or {\"type\": \"function\", \"function\": "
                   "{\"name\": ...}}; got 'sometimes'");
  EXPECT_API_ERROR(reject_chat({{"tools", json::array({tool})},
                                {"tool_choice", {{"type", "function"}, {"function", {{"name", "g"}}}}}}),
                   "tool_choice", "'tool_choice' names the function 'g', which 'tools' does not list");
  EXPECT_API_ERROR(reject_chat({{"parallel_tool_calls", 1}}), "parallel_tool_calls",
                   "'parallel_tool_calls' must be a boolean, got an integer");
  // A test hook is an unknown field unless the server turned test hooks on.
  EXPECT_API_ERROR(reject_chat({{"sextant_test_script", "x"}}), "sextant_test_script",
                   "unknown field 'sextant_test_script'");
}

TEST(ParseRequestError, MessageContent) {
  auto with_content = [](const json& content) {
    return json{{"messages", json::array({json{{"role", "user"}, {"content", content}}})}};
  };
  EXPECT_API_ERROR(reject_chat(with_content(12)), "messages[0].content",
                   "'messages[0].content' must be a string or an array of parts, got an integer");
  EXPECT_API_ERROR(reject_chat(with_content(json::object())), "messages[0].content",
                   "'messages[0].content' must be a string or an array of parts, got an object");
  EXPECT_API_ERROR(reject_chat(with_content(json::array({"plain"}))), "messages[0].content[0]",
                   "'messages[0].content[0]' must be an object, got a string");
  EXPECT_API_ERROR(reject_chat(with_content(json::array({json{{"text", "x"}}}))), "messages[0].content[0].type",
                   "'messages[0].content[0].type' must be a string");
  EXPECT_API_ERROR(
      reject_chat(with_content(json::array({json{{"type", "text"}, {"text", "a"}},
                                            json{{"type", "image_url"}, {"image_url", {{"url", "http://x"}}}}}))),
      "messages[0].content[1].type", "'messages[0].content[1].type' is 'image_url': only text parts are supported");
  EXPECT_API_ERROR(reject_chat(with_content(json::array({json{{"type", "text"}}}))), "messages[0].content[0].text",
                   "'messages[0].content[0].text' is required");
  EXPECT_API_ERROR(reject_chat(with_content(json::array({json{{"type", "text"}, {"text", 3}}}))),
                   "messages[0].content[0].text", "'messages[0].content[0].text' must be a string, got an integer");
  EXPECT_API_ERROR(reject_chat(with_content(json::array({json{{"type", "text"}, {"text", "a"}, {"extra", 1}}}))),
                   "messages[0].content[0].extra", "unknown field 'messages[0].content[0].extra'");
}

// ------------------------------------------------------------------------------------------------
// Errors: wrong types and values

TEST(ParseRequestError, WrongTypes) {
  EXPECT_API_ERROR(reject_chat({{"temperature", "0.5"}}), "temperature",
                   "'temperature' must be a number, got a string");
  EXPECT_API_ERROR(reject_chat({{"top_p", true}}), "top_p", "'top_p' must be a number, got a boolean");
  EXPECT_API_ERROR(reject_chat({{"min_p", json::array()}}), "min_p", "'min_p' must be a number, got an array");
  EXPECT_API_ERROR(reject_chat({{"presence_penalty", json::object()}}), "presence_penalty",
                   "'presence_penalty' must be a number, got an object");
  EXPECT_API_ERROR(reject_chat({{"frequency_penalty", "1"}}), "frequency_penalty",
                   "'frequency_penalty' must be a number, got a string");
  EXPECT_API_ERROR(reject_chat({{"repetition_penalty", false}}), "repetition_penalty",
                   "'repetition_penalty' must be a number, got a boolean");
  EXPECT_API_ERROR(reject_chat({{"max_tokens", "5"}}), "max_tokens", "'max_tokens' must be an integer, got a string");
  EXPECT_API_ERROR(reject_chat({{"max_tokens", 1.5}}), "max_tokens", "'max_tokens' must be an integer, got a number");
  EXPECT_API_ERROR(reject_chat({{"max_completion_tokens", true}}), "max_completion_tokens",
                   "'max_completion_tokens' must be an integer, got a boolean");
  EXPECT_API_ERROR(reject_chat({{"top_k", 2.5}}), "top_k", "'top_k' must be an integer, got a number");
  EXPECT_API_ERROR(reject_chat({{"n", "2"}}), "n", "'n' must be an integer, got a string");
  EXPECT_API_ERROR(reject_chat({{"stream", "true"}}), "stream", "'stream' must be a boolean, got a string");
  EXPECT_API_ERROR(reject_chat({{"stream", 1}}), "stream", "'stream' must be a boolean, got an integer");
  EXPECT_API_ERROR(reject_chat({{"user", 5}}), "user", "'user' must be a string, got an integer");
  EXPECT_API_ERROR(reject_chat({{"ignore_eos", 1}}), "ignore_eos", "'ignore_eos' must be a boolean, got an integer");
  EXPECT_API_ERROR(reject_chat({{"stop", 5}}), "stop",
                   "'stop' must be a string or an array of strings, got an integer");
  EXPECT_API_ERROR(reject_chat({{"stop", json::object()}}), "stop",
                   "'stop' must be a string or an array of strings, got an object");
  EXPECT_API_ERROR(reject_chat({{"stop", json::array({"a", 5})}}), "stop[1]",
                   "'stop[1]' must be a string, got an integer");
  EXPECT_API_ERROR(reject_chat({{"top_logprobs", "3"}, {"logprobs", true}}), "top_logprobs",
                   "'top_logprobs' must be an integer, got a string");
  EXPECT_API_ERROR(reject_chat({{"stream", true}, {"stream_options", {{"include_usage", "yes"}}}}),
                   "stream_options.include_usage", "'stream_options.include_usage' must be a boolean, got a string");
  EXPECT_API_ERROR(reject_chat({{"stream", true}, {"stream_options", true}}), "stream_options",
                   "'stream_options' must be an object");
  EXPECT_API_ERROR(reject_completion({{"prompt", 5}}), "prompt",
                   "'prompt' must be a string or a non-empty array of token ids, got an integer");
  EXPECT_API_ERROR(reject_completion({{"prompt", json::object()}}), "prompt",
                   "'prompt' must be a string or a non-empty array of token ids, got an object");
  EXPECT_API_ERROR(reject_completion({{"prompt", json::array({1, "x"})}}), "prompt[1]",
                   "'prompt[1]' must be an integer, got a string");
  EXPECT_API_ERROR(reject_completion({{"prompt", json::array({1, 2.5})}}), "prompt[1]",
                   "'prompt[1]' must be an integer, got a number");
}

TEST(ParseRequestError, OutOfRange) {
  EXPECT_API_ERROR(reject_chat({{"temperature", 2.5}}), "temperature",
                   "'temperature' must be at least 0 and at most 2, got 2.5");
  EXPECT_API_ERROR(reject_chat({{"temperature", -0.5}}), "temperature",
                   "'temperature' must be at least 0 and at most 2, got -0.5");
  EXPECT_API_ERROR(reject_chat({{"top_p", 0}}), "top_p", "'top_p' must be above 0 and at most 1, got 0");
  EXPECT_API_ERROR(reject_chat({{"top_p", 1.5}}), "top_p", "'top_p' must be above 0 and at most 1, got 1.5");
  // Above 0 as a double, 0 as the float the sampler gets (found by fuzz_openai_request).
  EXPECT_API_ERROR(reject_chat({{"top_p", 1e-50}}), "top_p", "'top_p' must be above 0 and at most 1, got 1e-50");
  EXPECT_API_ERROR(reject_chat({{"min_p", 1.25}}), "min_p", "'min_p' must be at least 0 and at most 1, got 1.25");
  EXPECT_API_ERROR(reject_chat({{"presence_penalty", 2.5}}), "presence_penalty",
                   "'presence_penalty' must be at least -2 and at most 2, got 2.5");
  EXPECT_API_ERROR(reject_chat({{"frequency_penalty", -3}}), "frequency_penalty",
                   "'frequency_penalty' must be at least -2 and at most 2, got -3");
  EXPECT_API_ERROR(reject_chat({{"repetition_penalty", 0}}), "repetition_penalty",
                   "'repetition_penalty' must be above 0 and at most 10, got 0");
  EXPECT_API_ERROR(reject_chat({{"repetition_penalty", 10.5}}), "repetition_penalty",
                   "'repetition_penalty' must be above 0 and at most 10, got 10.5");
  EXPECT_API_ERROR(reject_chat({{"top_k", -2}}), "top_k", "'top_k' must be between -1 and 2147483647, got -2");
  EXPECT_API_ERROR(reject_chat({{"max_tokens", 0}}), "max_tokens",
                   "'max_tokens' must be between 1 and 2147483647, got 0");
  EXPECT_API_ERROR(reject_chat({{"max_tokens", 2147483648LL}}), "max_tokens",
                   "'max_tokens' must be between 1 and 2147483647, got 2147483648");
  EXPECT_API_ERROR(reject_chat({{"max_completion_tokens", -1}}), "max_completion_tokens",
                   "'max_completion_tokens' must be between 1 and 2147483647, got -1");
  EXPECT_API_ERROR(reject_chat({{"n", 0}}), "n", "'n' must be between 1 and 8, got 0");
  EXPECT_API_ERROR(reject_chat({{"n", 9}}), "n", "'n' must be between 1 and 8, got 9");
  EXPECT_API_ERROR(reject_completion({{"prompt", json::array({1, -2})}}), "prompt[1]",
                   "'prompt[1]' must be between 0 and 2147483647, got -2");
  EXPECT_API_ERROR(reject_completion({{"prompt", json::array({json::array({-1})})}}), "prompt[0]",
                   "'prompt[0]' must be between 0 and 2147483647, got -1");
  EXPECT_API_ERROR(reject_completion({{"prompt", json::array({2147483648LL})}}), "prompt[0]",
                   "'prompt[0]' must be between 0 and 2147483647, got 2147483648");
}

TEST(ParseRequestError, IntegersAtOrAbove2To63AreShownAsSent) {
  // The client's number, never a wrapped one (2^64-1 used to read "got -1": is_number_integer() is
  // true for unsigned numbers too, so they went through get<int64_t>).
  EXPECT_API_ERROR(reject_chat({{"max_tokens", 18446744073709551615ULL}}), "max_tokens",
                   "'max_tokens' must be between 1 and 2147483647, got 18446744073709551615");
  EXPECT_API_ERROR(reject_chat({{"n", 9223372036854775808ULL}}), "n",
                   "'n' must be between 1 and 8, got 9223372036854775808");
  EXPECT_API_ERROR(reject_completion({{"prompt", json::array({1, 18446744073709551614ULL})}}), "prompt[1]",
                   "'prompt[1]' must be between 0 and 2147483647, got 18446744073709551614");
  EXPECT_API_ERROR(reject_chat({{"top_k", 9223372036854775807LL}}), "top_k",
                   "'top_k' must be between -1 and 2147483647, got 9223372036854775807");
  // A seed takes any 64-bit integer by its bits, so these are accepted as they are.
  EXPECT_EQ(accept(Endpoint::kChat, chat_with({{"seed", 18446744073709551615ULL}})).sampling.seed,
            std::optional<std::uint64_t>(18446744073709551615ULL));
  EXPECT_EQ(accept(Endpoint::kChat, chat_with({{"seed", 9223372036854775808ULL}})).sampling.seed,
            std::optional<std::uint64_t>(9223372036854775808ULL));
}

TEST(ParseRequestError, StopStrings) {
  json seventeen = json::array();
  for (int i = 0; i < 17; ++i) seventeen.push_back(std::string(1, static_cast<char>('a' + i)));
  EXPECT_API_ERROR(reject_chat({{"stop", seventeen}}), "stop", "'stop' has 17 strings; at most 16 are allowed");
  json sixteen = seventeen;
  sixteen.erase(sixteen.size() - 1);
  EXPECT_EQ(accept(Endpoint::kChat, chat_with({{"stop", sixteen}})).stop.size(), 16u);
  ParseLimits limits;
  limits.max_stop_strings = 2;
  EXPECT_API_ERROR(reject_completion({{"stop", json::array({"a", "b", "c"})}}, limits), "stop",
                   "'stop' has 3 strings; at most 2 are allowed");
  limits.max_stop_strings = 0;
  EXPECT_API_ERROR(reject_completion({{"stop", "a"}}, limits), "stop", "'stop' has 1 strings; at most 0 are allowed");
  EXPECT_API_ERROR(reject_chat({{"stop", ""}}), "stop[0]", "stop strings must not be empty");
  EXPECT_API_ERROR(reject_chat({{"stop", json::array({"a", ""})}}), "stop[1]", "stop strings must not be empty");
}

TEST(ParseRequestError, SeveralPrompts) {
  const std::string msg = "'prompt' holds several prompts: send one prompt per request (use n for several completions)";
  EXPECT_API_ERROR(reject_completion({{"prompt", json::array({"a", "b"})}}), "prompt", msg);
  EXPECT_API_ERROR(reject_completion({{"prompt", json::array({json::array({1, 2}), json::array({3})})}}), "prompt",
                   msg);
  EXPECT_API_ERROR(reject_completion({{"prompt", json::array({json::array({"a", "b"})})}}), "prompt", msg);
  // One prompt nested too deep is not several prompts.
  EXPECT_API_ERROR(reject_completion({{"prompt", json::array({json::array({json::array({1})})})}}), "prompt[0]",
                   "'prompt[0]' must be an integer, got an array");
  EXPECT_API_ERROR(reject_completion({{"prompt", json::array()}}), "prompt",
                   "'prompt' must be a string or a non-empty array of token ids, got an empty array");
  EXPECT_API_ERROR(reject_completion({{"prompt", json::array({json::array()})}}), "prompt",
                   "'prompt' must be a string or a non-empty array of token ids, got an empty array");
}

// ------------------------------------------------------------------------------------------------
// Errors: unknown and unsupported fields, inconsistent combinations

TEST(ParseRequestError, UnknownFields) {
  EXPECT_API_ERROR(reject_chat({{"foo", 1}}), "foo", "unknown field 'foo'");
  EXPECT_API_ERROR(reject_completion({{"temprature", 0.5}}), "temprature", "unknown field 'temprature'");
  EXPECT_API_ERROR(reject_chat({{"stream", true}, {"stream_options", {{"include_usage", true}, {"bar", 1}}}}),
                   "stream_options.bar", "unknown field 'stream_options.bar'");
  EXPECT_API_ERROR(reject_chat({{"stream", true}, {"stream_options", {{"continuous_usage_stats", true}}}}),
                   "stream_options.continuous_usage_stats",
                   "'stream_options.continuous_usage_stats' is not supported");
}

TEST(ParseRequestError, UnsupportedFeatures) {
  const json tool{{"type", "function"}, {"function", {{"name", "f"}}}};
  EXPECT_API_ERROR(reject_chat({{"functions", json::array()}}), "functions", "'functions' is not supported");
  EXPECT_API_ERROR(reject_chat({{"function_call", "none"}}), "function_call", "'function_call' is not supported");
  EXPECT_API_ERROR(reject_completion({{"tools", json::array({tool})}}), "tools", "'tools' is not supported");
  EXPECT_API_ERROR(reject_chat({{"logit_bias", {{"50256", -100}}}}), "logit_bias", "'logit_bias' is not supported");
  EXPECT_API_ERROR(reject_completion({{"logit_bias", json::array()}}), "logit_bias", "'logit_bias' is not supported");
  EXPECT_API_ERROR(reject_completion({{"suffix", "end"}}), "suffix", "'suffix' is not supported");
  EXPECT_API_ERROR(reject_chat({{"suffix", "end"}}), "suffix", "unknown field 'suffix'");
}

// Structured output: OpenAI's response_format and vLLM's structured_outputs become one OutputFormat
// naming the field it came from (the compile's errors name it).
TEST(ParseRequest, ResponseFormatAndStructuredOutputs) {
  using Kind = chat::OutputFormat::Kind;
  auto parse = [](const json& extra) {
    json b{{"model", "qwen"}, {"messages", json::array({json{{"role", "user"}, {"content", "x"}}})}};
    for (const auto& [k, v] : extra.items()) b[k] = v;
    openai::ApiError err;
    auto r = openai::parse_request(Endpoint::kChat, b.dump(), {}, &err);
    EXPECT_TRUE(r.has_value()) << err.message;
    return r ? r->output_format : chat::OutputFormat{};
  };
  EXPECT_EQ(parse({{"response_format", {{"type", "text"}}}}).kind, Kind::kText);
  auto f = parse({{"response_format", {{"type", "json_object"}}}});
  EXPECT_EQ(f.kind, Kind::kJsonObject);
  // The schema's text keeps the client's key order (a schema's property order is the output's).
  f = parse(json::parse(R"({"response_format": {"type": "json_schema", "json_schema": {"name": "n", "strict": true,
                           "schema": {"type": "object", "properties": {"z": {"type": "integer"}, "a": {"type": "string"}}}}}})"));
  EXPECT_EQ(f.kind, Kind::kJsonSchema);
  EXPECT_EQ(f.param, "response_format.json_schema.schema");
  f = parse({{"structured_outputs", {{"regex", "[a-z]+"}}}});
  EXPECT_EQ(f.kind, Kind::kRegex);
  EXPECT_EQ(f.source, "[a-z]+");
  EXPECT_EQ(f.param, "structured_outputs.regex");
  f = parse({{"structured_outputs", {{"choice", {"yes", "no"}}}}});
  EXPECT_EQ(f.kind, Kind::kChoice);
  EXPECT_EQ(f.choices, (std::vector<std::string>{"yes", "no"}));
  f = parse({{"structured_outputs", {{"grammar", "root ::= \"a\""}}}});
  EXPECT_EQ(f.kind, Kind::kGrammar);
  f = parse({{"structured_outputs", {{"json", "{\"type\": \"integer\"}"}}}});
  EXPECT_EQ(f.kind, Kind::kJsonSchema);
  EXPECT_EQ(f.source, R"({"type":"integer"})");
  EXPECT_EQ(parse({{"structured_outputs", {{"json_object", true}}}}).kind, Kind::kJsonObject);
}

TEST(ParseRequest, ResponseFormatSchemaKeepsKeyOrder) {
  const std::string body = R"({"model": "qwen", "messages": [{"role": "user", "content": "x"}],
      "response_format": {"type": "json_schema", "json_schema": {"name": "n",
        "schema": {"type": "object", "properties": {"z": {"type": "integer"}, "a": {"type": "string"}}}}}})";
  openai::ApiError err;
  auto r = openai::parse_request(Endpoint::kChat, body, {}, &err);
  ASSERT_TRUE(r.has_value()) << err.message;
  EXPECT_EQ(r->output_format.source, R"({"type":"object","properties":{"z":{"type":"integer"},"a":{"type":"string"}}})");
}

TEST(ParseRequestError, StructuredOutput) {
  EXPECT_API_ERROR(reject_chat({{"response_format", "json"}}), "response_format",
                   "'response_format' must be an object, got a string");
  EXPECT_API_ERROR(reject_chat({{"response_format", {{"type", 5}}}}), "response_format.type",
                   "'response_format.type' must be a string");
  EXPECT_API_ERROR(reject_chat({{"response_format", {{"type", "xml"}}}}), "response_format.type",
                   "'response_format.type' must be \"text\", \"json_object\" or \"json_schema\"; got 'xml'");
  EXPECT_API_ERROR(reject_chat({{"response_format", {{"type", "text"}, {"extra", 1}}}}), "response_format.extra",
                   "unknown field 'response_format.extra'");
  EXPECT_API_ERROR(reject_chat({{"response_format", {{"type", "json_schema"}}}}), "response_format.json_schema",
                   "'response_format.json_schema' must be an object with a 'schema'");
  EXPECT_API_ERROR(reject_chat({{"response_format", {{"type", "json_schema"}, {"json_schema", {{"name", "n"}}}}}}),
                   "response_format.json_schema.schema",
                   "'response_format.json_schema.schema' must be a JSON schema (an object)");
  EXPECT_API_ERROR(reject_chat({{"response_format", {{"type", "json_schema"},
                                                     {"json_schema", {{"schema", json::object()}, {"x", 1}}}}}}),
                   "response_format.json_schema.x", "unknown field 'response_format.json_schema.x'");
  EXPECT_API_ERROR(reject_chat({{"structured_outputs", {{"regex", "a"}, {"choice", {"b"}}}}}), "structured_outputs",
                   "'structured_outputs' must give exactly one of json, regex, choice, grammar, json_object; it gives 2");
  EXPECT_API_ERROR(reject_chat({{"structured_outputs", json::object()}}), "structured_outputs",
                   "'structured_outputs' must give exactly one of json, regex, choice, grammar, json_object; it gives 0");
  EXPECT_API_ERROR(reject_chat({{"structured_outputs", {{"choice", json::array()}}}}), "structured_outputs.choice",
                   "'structured_outputs.choice' must be a non-empty array of strings");
  EXPECT_API_ERROR(reject_chat({{"structured_outputs", {{"json", "[1]"}}}}), "structured_outputs.json",
                   "'structured_outputs.json' must be a JSON schema (an object or its text)");
  EXPECT_API_ERROR(reject_chat({{"structured_outputs", {{"structural_tag", "x"}}}}), "structured_outputs.structural_tag",
                   "'structured_outputs.structural_tag' is not supported");
  EXPECT_API_ERROR(reject_chat({{"structured_outputs", {{"regex", "a"}}}, {"response_format", {{"type", "json_object"}}}}),
                   "structured_outputs", "give either 'response_format' or 'structured_outputs', not both");
  const json tool{{"type", "function"}, {"function", {{"name", "f"}}}};
  EXPECT_API_ERROR(reject_chat({{"tools", json::array({tool})}, {"tool_choice", "required"},
                                {"response_format", {{"type", "json_object"}}}}),
                   "tool_choice",
                   "'tool_choice' required or named holds the answer to a tool call: it cannot be combined with "
                   "'response_format' or 'structured_outputs'");
}

TEST(ParseRequestError, StreamOptionsWithoutStream) {
  const std::string msg = "'stream_options' is only allowed with \"stream\": true";
  EXPECT_API_ERROR(reject_chat({{"stream_options", {{"include_usage", true}}}}), "stream_options", msg);
  EXPECT_API_ERROR(reject_chat({{"stream", false}, {"stream_options", {{"include_usage", true}}}}), "stream_options",
                   msg);
  EXPECT_API_ERROR(reject_completion({{"stream_options", json::object()}}), "stream_options", msg);
}

TEST(ParseRequestError, NothingThrowsOnOddInput) {
  // Deeply nested and unusual values end as errors or results, never exceptions.
  for (const std::string& body :
       {std::string(R"({"model": "m", "messages": [{"role": "user", "content": [[[]]]}]})"),
        std::string(R"({"model": "m", "messages": [{"role": "user", "content": [{"type": null}]}]})"),
        std::string(R"({"model": "m", "prompt": [[1, [2]]]})"), std::string(R"({"model": "m", "prompt": [null]})"),
        std::string(R"({"model": "m", "prompt": "x", "max_tokens": 1e300})"),
        std::string(R"({"model": "m", "prompt": "x", "seed": 18446744073709551615})"),
        std::string(R"({"model": "m", "prompt": "x", "response_format": {"type": [1]}})"),
        std::string(R"({"model": "m", "prompt": "x", "stream": true, "stream_options": []})")}) {
    SCOPED_TRACE(body);
    ApiError err;
    EXPECT_NO_THROW((void)parse_request(Endpoint::kChat, body, {}, &err));
    EXPECT_NO_THROW((void)parse_request(Endpoint::kCompletion, body, {}, &err));
  }
}

TEST(ParseRequestError, FirstErrorIsReported) {
  // Two bad fields: one error, for the field met first, not a mix of both.
  ApiError err = reject_chat({{"temperature", 5}, {"top_p", 5}});
  EXPECT_TRUE(err.param == "temperature" || err.param == "top_p") << err.param;
  EXPECT_NE(err.message.find(err.param), std::string::npos) << err.message;
}

TEST(ParseRequestError, JsonDepthAndSizeAreBoundedBeforeTheParse) {
  ParseLimits limits;
  limits.max_json_depth = 5;
  limits.max_json_values = 64;
  // Within the bounds: a chat body with a content part (depth 5).
  accept(Endpoint::kChat,
         R"({"model": "qwen", "messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}]}]})", limits);
  ApiError err;
  EXPECT_FALSE(parse_request(Endpoint::kChat, std::string(100000, '['), limits, &err));
  EXPECT_EQ(err.message, "the request body nests JSON 100000 levels deep; at most 5 are accepted");
  std::string wide = R"({"model": "qwen", "prompt": [1)";
  for (int i = 0; i < 100; ++i) wide += ",1";
  wide += "]}";
  EXPECT_FALSE(parse_request(Endpoint::kCompletion, wide, limits, &err));
  EXPECT_EQ(err.message, "the request body holds 104 JSON values; at most 64 are accepted");
  // The defaults accept every request shape OpenAI has and a prompt of 100000 token ids.
  std::string ids = R"({"model": "qwen", "prompt": [1)";
  for (int i = 0; i < 99999; ++i) ids += ",1";
  ids += "]}";
  EXPECT_EQ(accept(Endpoint::kCompletion, ids).prompt_ids.size(), 100000u);
}

}  // namespace
}  // namespace sx::daemon::openai
