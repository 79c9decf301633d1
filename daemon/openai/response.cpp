// OpenAI response bodies.
#include "daemon/openai/response.h"

#include <nlohmann/json.hpp>

namespace sx::daemon::openai {

namespace {

using nlohmann::json;

json null_or(const std::string& s) { return s.empty() ? json(nullptr) : json(s); }

json token_entry(const tokenizer::Tokenizer& tok, std::int32_t id, float logprob) {
  const std::string bytes = tok.token_bytes(id);
  json b = json::array();
  for (unsigned char c : bytes) b.push_back(static_cast<int>(c));
  return json{{"token", bytes}, {"logprob", logprob}, {"bytes", std::move(b)}};
}

// Chat: {"content": [{token, logprob, bytes, top_logprobs: [...]}], "refusal": null}.
json chat_logprobs(const tokenizer::Tokenizer& tok, const std::vector<engine::TokenLogprob>& lps) {
  json content = json::array();
  for (const engine::TokenLogprob& lp : lps) {
    json e = token_entry(tok, lp.token, lp.logprob);
    json top = json::array();
    for (const auto& [id, p] : lp.top) top.push_back(token_entry(tok, id, p));
    e["top_logprobs"] = std::move(top);
    content.push_back(std::move(e));
  }
  return json{{"content", std::move(content)}, {"refusal", nullptr}};
}

// Completions (legacy): parallel arrays of tokens, their logprobs, the top alternatives as
// {token: logprob} and each token's byte offset in the text.
json completion_logprobs(const tokenizer::Tokenizer& tok, const std::vector<engine::TokenLogprob>& lps,
                         std::int64_t offset0) {
  json tokens = json::array(), token_lps = json::array(), tops = json::array(), offsets = json::array();
  std::int64_t offset = offset0;
  for (const engine::TokenLogprob& lp : lps) {
    const std::string t = tok.token_bytes(lp.token);
    tokens.push_back(t);
    token_lps.push_back(lp.logprob);
    json top = json::object();
    for (const auto& [id, p] : lp.top) top[tok.token_bytes(id)] = p;
    tops.push_back(std::move(top));
    offsets.push_back(offset);
    offset += static_cast<std::int64_t>(t.size());
  }
  return json{{"tokens", std::move(tokens)}, {"token_logprobs", std::move(token_lps)},
              {"top_logprobs", std::move(tops)}, {"text_offset", std::move(offsets)}};
}

json usage_json(const Usage& u) {
  return json{{"prompt_tokens", u.prompt_tokens},
              {"completion_tokens", u.completion_tokens},
              {"total_tokens", u.prompt_tokens + u.completion_tokens},
              {"prompt_tokens_details", {{"cached_tokens", u.cached_tokens}}}};
}

json envelope(const GenerateRequest& r, const ResponseId& id, bool chunk) {
  const bool chat = r.endpoint == Endpoint::kChat;
  return json{{"id", id.id},
              {"object", chat ? (chunk ? "chat.completion.chunk" : "chat.completion") : "text_completion"},
              {"created", id.created},
              {"model", id.model},
              {"system_fingerprint", nullptr}};
}

std::string echo_prefix(const GenerateRequest& r, const tokenizer::Tokenizer& tok) {
  if (!r.echo) return {};
  return r.prompt_is_ids ? tok.decode(r.prompt_ids) : r.prompt_text;
}

}  // namespace

std::string dump_json(const json& j) { return j.dump(-1, ' ', false, json::error_handler_t::replace); }

std::string error_body(const ApiError& e) {
  return dump_json(json{{"error", {{"message", e.message}, {"type", e.type}, {"param", null_or(e.param)},
                                   {"code", null_or(e.code)}}}});
}

std::string completion_body(const GenerateRequest& r, const ResponseId& id, const std::vector<Choice>& choices,
                            const Usage& usage, const tokenizer::Tokenizer& tok) {
  json body = envelope(r, id, false);
  json cs = json::array();
  const std::string prefix = echo_prefix(r, tok);
  for (std::size_t i = 0; i < choices.size(); ++i) {
    const Choice& c = choices[i];
    json choice{{"index", i}, {"finish_reason", null_or(c.finish_reason)}};
    const bool want_logprobs = r.top_logprobs >= 0;
    if (r.endpoint == Endpoint::kChat) {
      json calls = json::array();
      for (const ToolCallOut& t : c.tool_calls) {
        calls.push_back({{"id", t.id}, {"type", "function"}, {"function", {{"name", t.name}, {"arguments", t.arguments}}}});
      }
      const bool blank = c.text.find_first_not_of(" \t\r\n") == std::string::npos;
      choice["message"] = json{{"role", "assistant"},
                               {"content", !c.tool_calls.empty() && blank ? json(nullptr) : json(c.text)},
                               {"refusal", nullptr},
                               {"tool_calls", std::move(calls)}};
      if (r.split_reasoning) choice["message"]["reasoning_content"] = c.reasoning ? json(*c.reasoning) : json(nullptr);
      choice["logprobs"] = want_logprobs ? chat_logprobs(tok, c.logprobs) : json(nullptr);
    } else {
      choice["text"] = prefix + c.text;
      choice["logprobs"] = want_logprobs ? completion_logprobs(tok, c.logprobs, static_cast<std::int64_t>(prefix.size()))
                                         : json(nullptr);
    }
    cs.push_back(std::move(choice));
  }
  body["choices"] = std::move(cs);
  body["usage"] = usage_json(usage);
  return dump_json(body);
}

std::string chunk_json(const GenerateRequest& r, const ResponseId& id, std::int64_t index, bool first,
                       const std::string& text, const std::vector<engine::TokenLogprob>& logprobs,
                       const std::string& finish_reason, const tokenizer::Tokenizer& tok,
                       std::int64_t token_bytes_before, const std::string& reasoning) {
  json body = envelope(r, id, true);
  json choice{{"index", index}, {"finish_reason", null_or(finish_reason)}};
  const bool want_logprobs = r.top_logprobs >= 0 && !logprobs.empty();
  if (r.endpoint == Endpoint::kChat) {
    json delta = json::object();
    if (first) delta["role"] = "assistant";
    if (!reasoning.empty()) delta["reasoning_content"] = reasoning;
    if (!text.empty() || (first && finish_reason.empty() && reasoning.empty())) delta["content"] = text;
    choice["delta"] = std::move(delta);
    choice["logprobs"] = want_logprobs ? chat_logprobs(tok, logprobs) : json(nullptr);
  } else {
    const std::string prefix = echo_prefix(r, tok);
    choice["text"] = first ? prefix + text : text;
    choice["logprobs"] = want_logprobs ? completion_logprobs(tok, logprobs, static_cast<std::int64_t>(prefix.size()) +
                                                                               token_bytes_before)
                                       : json(nullptr);
  }
  body["choices"] = json::array({std::move(choice)});
  if (r.include_usage) body["usage"] = nullptr;
  return dump_json(body);
}

std::string delta_chunk_json(const GenerateRequest& r, const ResponseId& id, std::int64_t index, bool first,
                             json delta, const std::vector<engine::TokenLogprob>& logprobs,
                             const std::string& finish_reason, const tokenizer::Tokenizer& tok) {
  json body = envelope(r, id, true);
  if (first) delta["role"] = "assistant";
  json choice{{"index", index}, {"delta", std::move(delta)}, {"finish_reason", null_or(finish_reason)}};
  choice["logprobs"] = r.top_logprobs >= 0 && !logprobs.empty() ? chat_logprobs(tok, logprobs) : json(nullptr);
  body["choices"] = json::array({std::move(choice)});
  if (r.include_usage) body["usage"] = nullptr;
  return dump_json(body);
}

json tool_call_begin_delta(std::size_t index, const std::string& id, const std::string& name) {
  return {{"index", index}, {"id", id}, {"type", "function"}, {"function", {{"name", name}, {"arguments", ""}}}};
}

json tool_call_arguments_delta(std::size_t index, const std::string& fragment) {
  return {{"index", index}, {"function", {{"arguments", fragment}}}};
}

std::string usage_chunk_json(const GenerateRequest& r, const ResponseId& id, const Usage& usage) {
  json body = envelope(r, id, true);
  body["choices"] = json::array();
  body["usage"] = usage_json(usage);
  return dump_json(body);
}

std::string sse(const std::string& payload) { return "data: " + payload + "\n\n"; }

}  // namespace sx::daemon::openai
