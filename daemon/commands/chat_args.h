// `--chat` for `sextant generate` and `sextant tokenize`: the prompt rendered as a conversation
// through the same chat layer as `sextant serve` (daemon/chat/chat_prompt.h, the function behind
// /v1/chat/completions, /tokenize and /apply-template), so the command line shows the model the
// text a chat request would: the model's own template (GGUF tokenizer.chat_template, a safetensors
// directory's chat_template.jinja / tokenizer_config.json), or `--chat-template FILE` instead (as
// serve's flag), or the built-in ChatML for a model with none. `--chat-template-kwargs JSON` is a
// request's `chat_template_kwargs` (e.g. '{"enable_thinking": false}'); `--system TEXT` a system
// message before the user's.
//
// Errors: INVALID_ARGUMENT naming the option (and the file) for a template file that cannot be read
// or does not parse, kwargs that are not a JSON object (or nest deeper than a request may), and for
// --system / --chat-template / --chat-template-kwargs without --chat; the template's own failures
// (raise_exception) and a model without ChatML tokens as render_chat_prompt reports them, after
// "--chat: ". Threading: call from one thread.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "daemon/chat/chat_template.h"
#include "daemon/commands/args.h"
#include "runtime/base/status.h"
#include "runtime/tokenizer/tokenizer.h"

namespace sx::daemon {

// --chat, --system, --chat-template, --chat-template-kwargs (`what`: "the prompt" / "TEXT").
std::vector<Args::Spec> chat_specs(std::string_view what);

struct ChatArgs {
  bool chat = false;  // --chat given: the rest applies
  std::optional<std::string> system;
  std::shared_ptr<const chat::ChatTemplate> override_template;  // --chat-template's, parsed; null: the model's
  std::string override_said;                                     // which file (for the log line)
  nlohmann::ordered_json kwargs = nlohmann::ordered_json::object();
};

// Reads the chat flags, the --chat-template file and the kwargs: call before opening the model, so
// that a bad flag costs nothing.
Result<ChatArgs> chat_args(const Args& args);

// The conversation [system?, user: `text`] rendered as serve's /apply-template renders it (with the
// generation prompt), with --chat-template's template, else the model's own (`tok`'s, read from
// `model_origin`), else ChatML. `said`, when not null, gets which template, from where (as serve
// logs it, with a warning where the model's own does not parse).
Result<std::string> render_chat_args(const ChatArgs& chat, const tokenizer::Tokenizer& tok,
                                     const std::string& model_origin, std::string_view text, std::string* said);

}  // namespace sx::daemon
