// A model's own Jinja chat template (GGUF tokenizer.chat_template, a safetensors directory's
// chat_template.jinja / tokenizer_config.json, or --chat-template FILE), rendered the way Hugging
// Face transformers' apply_chat_template renders it: Python jinja2's sandbox with trim_blocks,
// lstrip_blocks and loop controls, `tojson` as json.dumps(ensure_ascii=False) (no HTML escaping,
// ", " and ": " separators, keys in their order), raise_exception(message) failing the render with
// that message, strftime_now(format), and `| string` as Python's str() (True, None, 0.5). Line ends
// CRLF or CR read as LF, as jinja2 normalises them. The engine is google's minja (the minja wrap);
// tests/chat/golden_test.py holds it to Python jinja2 byte for byte on every Qwen template.
//
// The context is what transformers passes: messages, tools, add_generation_prompt, the special
// tokens (bos_token, eos_token, ...) and any chat_template_kwargs (enable_thinking, ...), as an
// ordered JSON object (key order is output order for tojson). Tool-call arguments given as a JSON
// string (OpenAI's wire format) must be parsed into an object first: the XML-tool templates iterate
// them (parse_tool_call_arguments).
//
// Thread-safety: a ChatTemplate is immutable after parse; render may run on several threads.
#pragma once

#include <memory>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "runtime/base/status.h"

namespace sx::chat {

class ChatTemplate {
 public:
  // INVALID_ARGUMENT naming `origin` (e.g. "tokenizer.chat_template of model.gguf") when the
  // template does not parse.
  static Result<std::shared_ptr<const ChatTemplate>> parse(std::string_view source, std::string origin);
  ~ChatTemplate();

  // The rendered prompt; INVALID_ARGUMENT "<origin>: <message>" where the template raises (its
  // raise_exception message) or fails (an undefined operation on the given values).
  Result<std::string> render(const nlohmann::ordered_json& context) const;

  const std::string& origin() const { return origin_; }
  const std::string& source() const { return source_; }  // line ends normalised

 private:
  struct Program;
  ChatTemplate(std::string source, std::string origin, std::shared_ptr<Program> program);
  std::string source_, origin_;
  std::shared_ptr<Program> program_;
};

// The template `sextant serve` renders chat requests with: the file `override_path` names
// (--chat-template / model.chat_template), else the model's own text (`model_template`, read from
// `model_origin`), else none (null: the built-in ChatML). An override that cannot be read or parsed
// is an error naming the file; the model's own template that does not parse is a warning in
// `said` and ChatML. `said` also gets the line for the log: which template, from where.
Result<std::shared_ptr<const ChatTemplate>> choose_chat_template(const std::string& override_path,
                                                                 const std::string& model_template,
                                                                 const std::string& model_origin, std::string* said);

// Every messages[i].tool_calls[j].function.arguments that is a string holding a JSON object,
// replaced by that object (in place). INVALID_ARGUMENT naming the call ("messages[2].tool_calls[0]
// .function.arguments") when such a string is not a JSON object.
Status parse_tool_call_arguments(nlohmann::ordered_json& messages);

// Python's str() of a JSON value: strings as they are, True / False / None, integers in decimal,
// floats as repr (the shortest round-trip digits: 0.5, 3.0, 1e-05, 1e+16), lists and dicts as
// Python writes them ([1, 'a'], {'k': None}).
std::string python_str(const nlohmann::ordered_json& v);

}  // namespace sx::chat
