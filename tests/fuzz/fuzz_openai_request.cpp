// Fuzz target: the OpenAI request-body parser (daemon/openai/request.h, parse_request) on arbitrary
// bytes as the body, for both endpoints. Invariants (request.h, sampler.h):
// * success: the endpoint is the one asked for; JSON held in strings (tool-call arguments, a schema's
//   text) within the body's depth limit; 1 <= n <= limits.max_n; at most
//   limits.max_stop_strings stop strings, none empty; every sampling value finite and in the
//   range the API allows (SamplingParams::validate() agrees); max_tokens in 1..2^31-1;
//   chat: at least one message, every role one of system/user/assistant/tool (so the chat
//   template renders it without an error), no prompt; completion: no messages, a text prompt or
//   a non-empty list of non-negative ids; include_usage only with stream;
// * failure: a 400 invalid_request_error with a non-empty message; an error about one field names
//   it in `param` and the message mentions that field; an error without a param is about the
//   body as a whole ("the request body ...").
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <limits>
#include <optional>
#include <string>
#include <string_view>

#include "daemon/chat/chatml.h"
#include "daemon/openai/request.h"
#include "runtime/base/json_depth.h"
#include "tests/fuzz/fuzz_check.h"

namespace {

namespace openai = sx::daemon::openai;

// Small limits, so that inputs at and past them are within the fuzzer's reach.
constexpr openai::ParseLimits kLimits{.max_stop_strings = 3, .max_n = 4};

// The one call of the parser (its signature is about to gain bounds: adapt here).
std::optional<openai::GenerateRequest> parse(openai::Endpoint endpoint, std::string_view body,
                                             openai::ApiError* error) {
  return openai::parse_request(endpoint, body, kLimits, error);
}

bool in(double v, double lo, double hi) { return std::isfinite(v) && v >= lo && v <= hi; }

// "messages[2].content[0].text" -> "messages"; "stream_options.include_usage" -> "stream_options".
std::string_view top_level(std::string_view param) { return param.substr(0, param.find_first_of("[.")); }

void check_success(openai::Endpoint endpoint, const openai::GenerateRequest& r) {
  const bool chat = endpoint == openai::Endpoint::kChat;
  FUZZ_CHECK(r.endpoint == endpoint);
  FUZZ_CHECK(r.n >= 1 && r.n <= kLimits.max_n);
  FUZZ_CHECK(static_cast<std::int64_t>(r.stop.size()) <= kLimits.max_stop_strings);
  for (const std::string& s : r.stop) FUZZ_CHECK(!s.empty());
  const sx::engine::SamplingParams& p = r.sampling;
  FUZZ_CHECK(in(p.temperature, 0.0, 2.0));
  FUZZ_CHECK(in(p.top_p, 0.0, 1.0) && p.top_p > 0.0f);
  FUZZ_CHECK(in(p.min_p, 0.0, 1.0));
  FUZZ_CHECK(in(p.presence_penalty, -2.0, 2.0));
  FUZZ_CHECK(in(p.frequency_penalty, -2.0, 2.0));
  FUZZ_CHECK(in(p.repetition_penalty, 0.0, 10.0) && p.repetition_penalty > 0.0f);
  FUZZ_CHECK(p.top_k >= -1);
  FUZZ_CHECK(p.validate().ok());
  if (r.max_tokens) FUZZ_CHECK(*r.max_tokens >= 1 && *r.max_tokens <= std::numeric_limits<std::int32_t>::max());
  if (r.include_usage) FUZZ_CHECK(r.stream);
  if (r.output_format.kind == sx::chat::OutputFormat::Kind::kJsonSchema) {
    FUZZ_CHECK(sx::json_shape(r.output_format.source).depth <= kLimits.max_json_depth);
  }
  if (chat) {
    FUZZ_CHECK(!r.messages.empty());
    for (const auto& m : r.messages) {
      FUZZ_CHECK(m.role == "system" || m.role == "user" || m.role == "assistant" || m.role == "tool");
    }
    FUZZ_CHECK(sx::chat::render_chatml_checked(r.messages).ok());
    // JSON held in a string field is within the body's tree limits (issue 53: 100,000 levels in
    // arguments killed the daemon).
    for (const auto& m : r.messages) {
      for (const auto& c : m.tool_calls) FUZZ_CHECK(sx::json_shape(c.arguments).depth <= kLimits.max_json_depth);
    }
    FUZZ_CHECK(r.prompt_text.empty() && r.prompt_ids.empty() && !r.prompt_is_ids);
    FUZZ_CHECK(!r.echo);
    FUZZ_CHECK(r.top_logprobs >= -1 && r.top_logprobs <= 20);
  } else {
    FUZZ_CHECK(r.messages.empty());
    if (r.prompt_is_ids) {
      FUZZ_CHECK(!r.prompt_ids.empty() && r.prompt_text.empty());
      for (std::int32_t id : r.prompt_ids) FUZZ_CHECK(id >= 0);
    } else {
      FUZZ_CHECK(r.prompt_ids.empty());
    }
    FUZZ_CHECK(r.top_logprobs >= -1 && r.top_logprobs <= 5);
  }
}

void check_failure(const openai::ApiError& e) {
  // (A member named "" is a field whose name is empty: "unknown field ''" with an empty param.)
  const bool about_body = e.message.starts_with("the request body ") || e.message.starts_with("unknown field ''");
  if (e.param.empty() != about_body || e.message.find(top_level(e.param)) == std::string::npos) {
    std::fprintf(stderr, "fuzz_openai_request: error param '%s', message '%s'\n", e.param.c_str(), e.message.c_str());
  }
  FUZZ_CHECK(e.status == 400);
  FUZZ_CHECK(e.type == "invalid_request_error");
  FUZZ_CHECK(!e.message.empty());
  if (e.param.empty()) {
    FUZZ_CHECK(about_body);
  } else {
    FUZZ_CHECK(e.message.find(top_level(e.param)) != std::string::npos);
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string_view body(reinterpret_cast<const char*>(data), size);
  for (openai::Endpoint endpoint : {openai::Endpoint::kChat, openai::Endpoint::kCompletion}) {
    openai::ApiError error;
    if (auto r = parse(endpoint, body, &error)) {
      check_success(endpoint, *r);
    } else {
      check_failure(error);
    }
  }
  return 0;
}
