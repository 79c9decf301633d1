// render_chat_prompt (chat_prompt.h).
#include "daemon/chat/chat_prompt.h"

#include <optional>

namespace sx::chat {

Result<std::string> render_chat_prompt(const ChatTemplate* tmpl, std::span<const tokenizer::ChatMessage> messages,
                                       const nlohmann::json& chat_template_kwargs, bool add_generation_prompt,
                                       const tokenizer::Tokenizer& tok) {
  if (tmpl == nullptr) {
    SX_RETURN_IF_ERROR(tokenizer::check_chat_tokens(tok));
    return tokenizer::render_chatml_checked(messages, add_generation_prompt);
  }
  nlohmann::ordered_json context = nlohmann::ordered_json::object();
  auto& list = context["messages"] = nlohmann::ordered_json::array();
  for (const tokenizer::ChatMessage& m : messages) {
    nlohmann::ordered_json msg = {{"role", m.role}, {"content", m.content}};
    if (m.reasoning_content) msg["reasoning_content"] = *m.reasoning_content;
    list.push_back(std::move(msg));
  }
  context["add_generation_prompt"] = add_generation_prompt;
  const tokenizer::TokenizerData& data = tok.data();
  auto token_text = [&](const std::optional<std::int32_t>& id) -> nlohmann::ordered_json {
    if (!id || *id < 0 || static_cast<std::size_t>(*id) >= data.tokens.size()) return nullptr;
    return data.tokens[static_cast<std::size_t>(*id)];
  };
  context["bos_token"] = token_text(data.bos_id);
  context["eos_token"] = token_text(data.eos_id);
  if (chat_template_kwargs.is_object()) {
    for (const auto& [key, value] : chat_template_kwargs.items()) {
      if (key == "messages" || key == "add_generation_prompt" || key == "bos_token" || key == "eos_token") continue;
      context[key] = nlohmann::ordered_json::parse(value.dump());
    }
  }
  return tmpl->render(context);
}

}  // namespace sx::chat
