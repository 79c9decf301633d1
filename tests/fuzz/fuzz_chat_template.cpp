// Fuzz target: the ChatML chat template (daemon/chat/chatml.h) on conversations
// built from the input. Input: one flag byte (bit 0: add_generation_prompt; bits 1-2: the default
// system prompt: 0 Qwen's, 1 none, 2 the first piece's text), then pieces separated by NUL bytes,
// each "role:content" (the role is everything before the first ':'; a piece without one is a role
// with empty content). Invariants (chat_template.h):
// * render_chatml equals the Qwen2.5 Jinja template (no tools), restated below statement by
//   statement: a system turn first (the first message's or the default), user/assistant/later
//   system turns as "<|im_start|>{role}\n{content}<|im_end|>\n", consecutive tool messages in one
//   user turn of <tool_response> blocks, unknown roles nothing, the generation prompt last;
// * with the generation prompt the output is the one without it plus "<|im_start|>assistant\n";
// * rendering a prefix of the conversation gives a prefix of the output (except where it cuts a
//   group of tool messages, whose closing <|im_end|> waits for the last one);
// * render_chatml_checked fails exactly for an empty conversation or a role outside
//   system/user/assistant/tool, as INVALID_ARGUMENT naming the first such message
//   ("messages[3]"), and otherwise returns what render_chatml does.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include <fmt/format.h>

#include "daemon/chat/chatml.h"
#include "tests/fuzz/fuzz_check.h"

namespace {

using sx::chat::ChatMessage;

bool known_role(std::string_view r) { return r == "system" || r == "user" || r == "assistant" || r == "tool"; }

// tokenizer_config.json's chat_template for Qwen2.5 without tools, one line per Jinja statement.
std::string jinja_reference(std::span<const ChatMessage> messages, bool add_generation_prompt,
                            std::string_view default_system) {
  std::string out;
  if (!messages.empty() && messages[0].role == "system") {  // {%- if messages[0]['role'] == 'system' %}
    out += "<|im_start|>system\n" + messages[0].content + "<|im_end|>\n";
  } else if (!default_system.empty()) {  // {%- else %} (Sextant: no default when it is empty)
    out += "<|im_start|>system\n" + std::string(default_system) + "<|im_end|>\n";
  }
  for (std::size_t i = 0; i < messages.size(); ++i) {  // {%- for message in messages %}
    const ChatMessage& m = messages[i];
    const bool first = i == 0, last = i + 1 == messages.size();
    if (m.role == "user" || (m.role == "system" && !first) || m.role == "assistant") {
      out += "<|im_start|>" + m.role + "\n" + m.content + "<|im_end|>" + "\n";
    } else if (m.role == "tool") {
      if (first || messages[i - 1].role != "tool") out += "<|im_start|>user";
      out += "\n<tool_response>\n";
      out += m.content;
      out += "\n</tool_response>";
      if (last || messages[i + 1].role != "tool") out += "<|im_end|>\n";
    }
  }
  if (add_generation_prompt) out += "<|im_start|>assistant\n";
  return out;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size == 0) return 0;
  const std::uint8_t flags = data[0];
  const bool add_generation_prompt = (flags & 1) != 0;
  std::string_view rest(reinterpret_cast<const char*>(data) + 1, size - 1);
  std::vector<std::string_view> pieces;
  while (!rest.empty()) {
    const std::size_t nul = rest.find('\0');
    pieces.push_back(rest.substr(0, nul));
    if (nul == std::string_view::npos) break;
    rest.remove_prefix(nul + 1);
  }
  std::string default_system(sx::chat::kQwenDefaultSystem);
  if (((flags >> 1) & 3) == 1) default_system.clear();
  if (((flags >> 1) & 3) == 2 && !pieces.empty()) {
    default_system = std::string(pieces.front());
    pieces.erase(pieces.begin());
  }
  std::vector<ChatMessage> messages;
  for (std::string_view p : pieces) {
    const std::size_t colon = p.find(':');
    messages.push_back({std::string(p.substr(0, colon)),
                        colon == std::string_view::npos ? std::string() : std::string(p.substr(colon + 1))});
  }

  const std::string with_prompt = sx::chat::render_chatml(messages, true, default_system);
  const std::string without = sx::chat::render_chatml(messages, false, default_system);
  FUZZ_CHECK(with_prompt == without + "<|im_start|>assistant\n");
  const std::string& out = add_generation_prompt ? with_prompt : without;
  FUZZ_CHECK(out == jinja_reference(messages, add_generation_prompt, default_system));

  // Prefixes: at most 16 cut points, so long conversations stay linear.
  const std::size_t n = messages.size();
  const std::size_t step = std::max<std::size_t>(1, n / 16);
  for (std::size_t k = 1; k < n; k += step) {
    if (messages[k - 1].role == "tool" && messages[k].role == "tool") continue;
    const std::string part = sx::chat::render_chatml(std::span(messages).first(k), false, default_system);
    FUZZ_CHECK(without.starts_with(part));
  }

  const sx::Result<std::string> checked =
      sx::chat::render_chatml_checked(messages, add_generation_prompt, default_system);
  const auto bad = std::find_if(messages.begin(), messages.end(), [](const ChatMessage& m) { return !known_role(m.role); });
  if (messages.empty() || bad != messages.end()) {
    FUZZ_CHECK(!checked.ok());
    FUZZ_CHECK(checked.status().code() == sx::StatusCode::kInvalidArgument);
    if (!messages.empty()) {
      const std::string name = fmt::format("messages[{}]", bad - messages.begin());
      FUZZ_CHECK(checked.status().message().find(name) != std::string::npos);
    }
  } else {
    FUZZ_CHECK(checked.ok());
    FUZZ_CHECK(*checked == out);
  }
  return 0;
}
