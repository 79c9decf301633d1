// ChatML rendering (chatml.h): Qwen2.5's template without tools.
#include "daemon/chat/chatml.h"

namespace sx::chat {

std::string render_chatml(std::span<const ChatMessage> messages, bool add_generation_prompt,
                          std::string_view default_system) {
  std::string out;
  std::size_t bytes = 128 + default_system.size();
  for (const ChatMessage& m : messages) bytes += m.role.size() + m.content.size() + 40;
  out.reserve(bytes);

  auto turn = [&](std::string_view role, std::string_view content) {
    out += "<|im_start|>";
    out += role;
    out += '\n';
    out += content;
    out += "<|im_end|>\n";
  };
  const bool first_is_system = !messages.empty() && messages[0].role == "system";
  if (first_is_system) {
    turn("system", messages[0].content);
  } else if (!default_system.empty()) {
    turn("system", default_system);
  }
  for (std::size_t i = 0; i < messages.size(); ++i) {
    const ChatMessage& m = messages[i];
    if (m.role == "user" || m.role == "assistant" || (m.role == "system" && i != 0)) {
      turn(m.role, m.content);
    } else if (m.role == "tool") {
      if (i == 0 || messages[i - 1].role != "tool") out += "<|im_start|>user";
      out += "\n<tool_response>\n";
      out += m.content;
      out += "\n</tool_response>";
      if (i + 1 == messages.size() || messages[i + 1].role != "tool") out += "<|im_end|>\n";
    }
    // The first system message was rendered above; unknown roles render nothing.
  }
  if (add_generation_prompt) out += "<|im_start|>assistant\n";
  return out;
}

Result<std::string> render_chatml_checked(std::span<const ChatMessage> messages, bool add_generation_prompt,
                                          std::string_view default_system) {
  if (messages.empty()) return invalid_argument_error("chat template: the conversation has no messages");
  for (std::size_t i = 0; i < messages.size(); ++i) {
    const std::string& r = messages[i].role;
    if (r != "system" && r != "user" && r != "assistant" && r != "tool") {
      return invalid_argument_error("chat template: messages[{}].role '{}' is not one of system, user, assistant, tool",
                                    i, r);
    }
  }
  return render_chatml(messages, add_generation_prompt, default_system);
}

Status check_chat_tokens(const tokenizer::Tokenizer& tok) {
  for (const std::string_view marker : {std::string_view("<|im_start|>"), std::string_view("<|im_end|>")}) {
    if (!tok.token_id(marker)) {
      return failed_precondition_error(
          "the model has no chat template: its tokenizer has no {} token (ChatML, the conversation format Sextant "
          "renders); send prompts in the model's own format to /v1/completions",
          marker);
    }
  }
  return ok_status();
}

std::vector<std::int64_t> message_starts(std::span<const std::int32_t> prompt, const tokenizer::Tokenizer& tok) {
  std::vector<std::int64_t> at;
  const std::optional<std::int32_t> start = tok.token_id("<|im_start|>");
  if (!start) return at;
  for (std::size_t i = 0; i < prompt.size(); ++i) {
    if (prompt[i] == *start) at.push_back(static_cast<std::int64_t>(i));
  }
  if (at.size() > 8) at.erase(at.begin() + 2, at.end() - 6);
  return at;
}

}  // namespace sx::chat
