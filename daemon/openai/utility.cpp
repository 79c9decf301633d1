// /tokenize, /detokenize and /apply-template (utility.h).
#include "daemon/openai/utility.h"

#include <fmt/format.h>

#include "daemon/chat/chat_prompt.h"
#include "daemon/openai/response.h"

namespace sx::daemon::openai {

namespace {

using json = nlohmann::ordered_json;

std::optional<std::string> fail(ApiError* error, std::string param, std::string message) {
  *error = ApiError{};
  error->param = std::move(param);
  error->message = std::move(message);
  return std::nullopt;
}

// The optional boolean `key` of `doc` (its default when absent or null).
bool flag(const json& doc, const char* key, bool fallback, bool* ok, ApiError* error) {
  const auto it = doc.find(key);
  if (it == doc.end() || it->is_null()) return fallback;
  if (!it->is_boolean()) {
    fail(error, key, fmt::format("'{}' must be a boolean", key));
    *ok = false;
    return fallback;
  }
  return it->get<bool>();
}

// The rendered conversation of a body with "messages"; nullopt with the error set.
std::optional<std::string> chat_prompt(const json& doc, const UtilityContext& ctx, bool add_generation_prompt,
                                       ApiError* error) {
  std::vector<chat::ChatMessage> messages;
  if (!parse_chat_messages(doc["messages"], messages, error)) return std::nullopt;
  json kwargs = json::object();
  if (const auto it = doc.find("chat_template_kwargs"); it != doc.end() && !it->is_null()) {
    if (!it->is_object()) return fail(error, "chat_template_kwargs", "'chat_template_kwargs' must be an object");
    kwargs = *it;
  }
  json tools;
  if (const auto it = doc.find("tools"); it != doc.end() && !it->is_null()) {
    if (!parse_chat_tools(*it, tools, error)) return std::nullopt;
  }
  auto text = chat::render_chat_prompt(ctx.chat_template, messages, tools, kwargs, add_generation_prompt,
                                       *ctx.tokenizer);
  if (!text.ok()) {
    *error = chat_prompt_error(text.status());
    return std::nullopt;
  }
  return std::move(text).value();
}

}  // namespace

std::optional<std::string> run_utility(UtilityEndpoint endpoint, std::string_view body, const UtilityContext& ctx,
                                       ApiError* error) {
  std::optional<json> parsed = parse_body_object(body, ctx.limits, error);
  if (!parsed) return std::nullopt;
  const json& doc = *parsed;
  if (const auto it = doc.find("model"); it != doc.end() && !it->is_null()) {
    if (!it->is_string()) return fail(error, "model", "'model' must be a string");
    if (it->get<std::string>() != ctx.model_name) {
      *error = model_not_found(it->get<std::string>(), ctx.model_name);
      return std::nullopt;
    }
  }
  const tokenizer::Tokenizer& tok = *ctx.tokenizer;
  bool ok = true;
  if (endpoint == UtilityEndpoint::kApplyTemplate) {
    if (!doc.contains("messages")) return fail(error, "messages", "'messages' is required");
    const bool gen = flag(doc, "add_generation_prompt", true, &ok, error);
    if (!ok) return std::nullopt;
    auto text = chat_prompt(doc, ctx, gen, error);
    if (!text) return std::nullopt;
    return dump_json(json{{"prompt", *text}});
  }
  if (endpoint == UtilityEndpoint::kDetokenize) {
    const auto it = doc.find("tokens");
    if (it == doc.end() || !it->is_array()) return fail(error, "tokens", "'tokens' must be an array of token ids");
    std::vector<std::int32_t> ids;
    for (std::size_t i = 0; i < it->size(); ++i) {
      const json& v = (*it)[i];
      if (!v.is_number_integer() || v.get<std::int64_t>() < 0 || v.get<std::int64_t>() >= tok.vocab_size()) {
        return fail(error, fmt::format("tokens[{}]", i),
                    fmt::format("'tokens[{}]' must be a token id from 0 to {}", i, tok.vocab_size() - 1));
      }
      ids.push_back(static_cast<std::int32_t>(v.get<std::int64_t>()));
    }
    return dump_json(json{{"prompt", tok.decode(ids)}});
  }
  // /tokenize
  const bool chat = doc.contains("messages");
  if (chat == doc.contains("prompt")) {
    return fail(error, "prompt", "give either 'prompt' (text) or 'messages' (a conversation), not both");
  }
  const bool add_special = flag(doc, "add_special_tokens", !chat, &ok, error);
  const bool gen = flag(doc, "add_generation_prompt", true, &ok, error);
  const bool strs = flag(doc, "return_token_strs", false, &ok, error);
  if (!ok) return std::nullopt;
  std::string text;
  if (chat) {
    auto rendered = chat_prompt(doc, ctx, gen, error);
    if (!rendered) return std::nullopt;
    text = std::move(*rendered);
  } else {
    if (!doc["prompt"].is_string()) return fail(error, "prompt", "'prompt' must be a string");
    text = doc["prompt"].get<std::string>();
  }
  std::vector<std::int32_t> ids;
  const tokenizer::TokenizerData& data = tok.data();
  if (add_special && data.add_bos && data.bos_id) ids.push_back(*data.bos_id);
  const std::vector<std::int32_t> body_ids = tok.encode(text);
  ids.insert(ids.end(), body_ids.begin(), body_ids.end());
  json out{{"count", ids.size()}, {"max_model_len", ctx.max_model_len}, {"tokens", ids}, {"token_strs", nullptr}};
  if (strs) {
    json list = json::array();
    for (std::int32_t id : ids) list.push_back(data.tokens[static_cast<std::size_t>(id)]);
    out["token_strs"] = std::move(list);
  }
  return dump_json(out);
}

}  // namespace sx::daemon::openai
