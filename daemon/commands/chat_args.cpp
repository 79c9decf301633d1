// The chat flags of `generate` and `tokenize` (chat_args.h).
#include "daemon/commands/chat_args.h"

#include <fmt/format.h>

#include "daemon/chat/chat_prompt.h"
#include "daemon/chat/chatml.h"
#include "runtime/base/json_parse.h"

namespace sx::daemon {

std::vector<Args::Spec> chat_specs(std::string_view what) {
  return {
      {{"--chat"}, false, false,
       fmt::format("render {} as one user turn of the model's chat template (as serve's /apply-template)", what), ""},
      {{"--system"}, true, false, "with --chat: a system message before it (default: none; the template may add its own)",
       "TEXT"},
      {{"--chat-template"}, true, false, "with --chat: a Jinja chat template instead of the model's own (as serve's)",
       "FILE"},
      {{"--chat-template-kwargs"}, true, false,
       "with --chat: a JSON object passed to the template, as a request's chat_template_kwargs "
       "(e.g. '{\"enable_thinking\": false}')",
       "JSON"},
  };
}

Result<ChatArgs> chat_args(const Args& args) {
  ChatArgs c;
  c.chat = args.has("--chat");
  if (!c.chat) {
    for (const char* name : {"--system", "--chat-template", "--chat-template-kwargs"}) {
      if (args.has(name)) return invalid_argument_error("{} applies to the chat prompt: add --chat", name);
    }
    return c;
  }
  c.system = args.get("--system");
  if (auto path = args.get("--chat-template")) {
    if (path->empty()) return invalid_argument_error("--chat-template expects a file, got ''");
    auto t = chat::choose_chat_template(*path, "", "", &c.override_said);
    if (!t.ok()) return t.status().with_context("--chat-template");
    c.override_template = *t;
  }
  if (auto text = args.get("--chat-template-kwargs")) {
    // The limits of a request body's JSON (a chat request's chat_template_kwargs arrives in one).
    auto parsed = parse_json_within<nlohmann::ordered_json>(*text, JsonLimits{});
    if (!parsed.ok()) return invalid_argument_error("--chat-template-kwargs is not valid JSON: {}", parsed.error);
    if (!parsed.value.is_object()) {
      return invalid_argument_error("--chat-template-kwargs must be a JSON object (e.g. '{{\"enable_thinking\": false}}'), "
                                    "got {}",
                                    parsed.value.type_name());
    }
    c.kwargs = std::move(parsed.value);
  }
  return c;
}

Result<std::string> render_chat_args(const ChatArgs& chat, const tokenizer::Tokenizer& tok,
                                     const std::string& model_origin, std::string_view text, std::string* said) {
  std::shared_ptr<const chat::ChatTemplate> tmpl = chat.override_template;
  std::string line = chat.override_said;
  if (tmpl == nullptr) {
    auto own = chat::choose_chat_template("", tok.data().chat_template, model_origin, &line);
    if (!own.ok()) return own.status();
    tmpl = *own;
  }
  if (said != nullptr) *said = line;
  std::vector<chat::ChatMessage> messages;
  if (chat.system) messages.push_back({"system", *chat.system});
  messages.push_back({"user", std::string(text)});
  auto prompt = chat::render_chat_prompt(tmpl.get(), messages, nlohmann::ordered_json(), chat.kwargs,
                                         /*add_generation_prompt=*/true, tok);
  if (!prompt.ok()) return prompt.status().with_context("--chat");
  return prompt;
}

}  // namespace sx::daemon
