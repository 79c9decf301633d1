// ChatML, the built-in chat format for a model with no chat template of its own (chat_prompt.h
// falls back to it), as Qwen2.5's tokenizer_config.json "chat_template" renders it without tools,
// and the messages every chat path shares (the OpenAI routes, `sextant generate / tokenize --chat`):
// a system turn first (the caller's, or the default system prompt), then
// "<|im_start|>{role}\n{content}<|im_end|>\n" per turn, consecutive tool messages grouped into one
// user turn of <tool_response> blocks, and "<|im_start|>assistant\n" as the generation prompt.
//
// Threading: pure functions. Errors: render_chatml never fails (messages with roles the template
// does not know render nothing, as in Jinja); render_chatml_checked returns INVALID_ARGUMENT for
// an empty conversation or an unknown role, naming the message index.
#pragma once

#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "runtime/base/status.h"
#include "runtime/tokenizer/tokenizer.h"

namespace sx::chat {

inline constexpr std::string_view kQwenDefaultSystem =
    "You are Qwen, created by Alibaba Cloud. You are a helpful assistant.";

// A call an assistant turn made (OpenAI's message.tool_calls[i]): its arguments as JSON text, as
// the client sent them (a string, or an object written out in its key order).
struct ToolCall {
  std::string id;
  std::string name;
  std::string arguments;
};

struct ChatMessage {
  std::string role;     // "system", "user", "assistant" or "tool"
  std::string content;
  std::optional<std::string> reasoning_content;  // an assistant turn's thinking, for templates that show it
  std::vector<ToolCall> tool_calls;              // assistant
  std::optional<std::string> tool_call_id;       // tool: the call it answers
  std::optional<std::string> name;               // the participant's or the tool's name
};

// Renders `messages` exactly as Qwen2.5's Jinja template does without tools. When the first
// message is not a system message, a system turn with `default_system` is inserted (none if
// `default_system` is empty).
std::string render_chatml(std::span<const ChatMessage> messages, bool add_generation_prompt = true,
                          std::string_view default_system = kQwenDefaultSystem);

// As render_chatml, after checking that there is at least one message and that every role is one
// of system/user/assistant/tool.
Result<std::string> render_chatml_checked(std::span<const ChatMessage> messages, bool add_generation_prompt = true,
                                          std::string_view default_system = kQwenDefaultSystem);

// Whether `tok` can carry a ChatML conversation: FAILED_PRECONDITION, naming the missing token,
// when it has no <|im_start|> or <|im_end|> token (a base model's or a foreign tokenizer: the
// rendered markers would be split into ordinary text and the model would not see turns).
Status check_chat_tokens(const tokenizer::Tokenizer& tok);

// Where a later request is likely to part from this prompt (engine::RequestOptions::
// snapshot_hints): the positions of its <|im_start|> tokens, where its messages start (the first
// two, where branches of one system prompt part, and the last six, where the next turn of this
// conversation does). Empty when the tokenizer has no <|im_start|>.
std::vector<std::int64_t> message_starts(std::span<const std::int32_t> prompt, const tokenizer::Tokenizer& tok);

}  // namespace sx::chat
