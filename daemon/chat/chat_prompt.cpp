// render_chat_prompt (chat_prompt.h).
#include "daemon/chat/chat_prompt.h"

#include <optional>

namespace sx::chat {

Result<std::string> render_chat_prompt(const ChatTemplate* tmpl, std::span<const ChatMessage> messages,
                                       const nlohmann::ordered_json& tools,
                                       const nlohmann::ordered_json& chat_template_kwargs, bool add_generation_prompt,
                                       const tokenizer::Tokenizer& tok) {
  using nlohmann::ordered_json;
  const bool has_tools = tools.is_array() && !tools.empty();
  if (tmpl == nullptr) {
    SX_RETURN_IF_ERROR(check_chat_tokens(tok));
    bool calls = false;
    for (const ChatMessage& m : messages) calls = calls || !m.tool_calls.empty();
    if (has_tools || calls) {
      return failed_precondition_error(
          "the model has no chat template, and the built-in ChatML has no way to show tools or tool calls: serve it "
          "with its template (--chat-template FILE)");
    }
    return render_chatml_checked(messages, add_generation_prompt);
  }
  ordered_json context = ordered_json::object();
  auto& list = context["messages"] = ordered_json::array();
  for (const ChatMessage& m : messages) {
    ordered_json msg = {{"role", m.role}, {"content", m.content}};
    if (m.reasoning_content) msg["reasoning_content"] = *m.reasoning_content;
    if (m.name) msg["name"] = *m.name;
    if (m.tool_call_id) msg["tool_call_id"] = *m.tool_call_id;
    if (!m.tool_calls.empty()) {
      auto& calls = msg["tool_calls"] = ordered_json::array();
      for (const ToolCall& c : m.tool_calls) {
        calls.push_back({{"id", c.id}, {"type", "function"}, {"function", {{"name", c.name}, {"arguments", c.arguments}}}});
      }
    }
    list.push_back(std::move(msg));
  }
  SX_RETURN_IF_ERROR(parse_tool_call_arguments(list));
  if (has_tools) context["tools"] = tools;
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
      if (key == "messages" || key == "tools" || key == "add_generation_prompt" || key == "bos_token" ||
          key == "eos_token") {
        continue;
      }
      context[key] = value;
    }
  }
  return tmpl->render(context);
}

}  // namespace sx::chat
