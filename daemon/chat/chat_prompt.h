// The prompt of a conversation: the model's chat template (chat_template.h) over the messages with
// what transformers passes (add_generation_prompt, the tokenizer's bos / eos tokens,
// chat_template_kwargs, which cannot replace those), or the built-in ChatML where the model has no
// template. Shared by /v1/chat/completions, /tokenize and /apply-template.
#pragma once

#include <span>
#include <string>

#include <nlohmann/json.hpp>

#include "daemon/chat/chat_template.h"
#include "daemon/chat/chatml.h"
#include "runtime/base/status.h"
#include "runtime/tokenizer/tokenizer.h"

namespace sx::chat {

// `tools`: the request's (an array; null or empty: none), passed as transformers passes them (the
// template lists them in the system turn). Messages' tool calls go in as OpenAI's shape with their
// arguments as objects (parse_tool_call_arguments), tool messages with their tool_call_id.
// `tmpl` null: ChatML (FAILED_PRECONDITION when the tokenizer has no ChatML tokens, and for tools or
// tool calls, which it has no way to show). The template's failures are INVALID_ARGUMENT with its
// message.
Result<std::string> render_chat_prompt(const ChatTemplate* tmpl, std::span<const ChatMessage> messages,
                                       const nlohmann::ordered_json& tools,
                                       const nlohmann::ordered_json& chat_template_kwargs, bool add_generation_prompt,
                                       const tokenizer::Tokenizer& tok);

}  // namespace sx::chat
