// `sextant tokenize`: token ids (or pieces) of a text, with the model's tokenizer or a
// Hugging Face tokenizer.json.
#include <cstdio>
#include <string>

#include "daemon/commands/chat_args.h"
#include "daemon/commands/commands.h"
#include "daemon/commands/model_session.h"

namespace sx::daemon {

int cmd_tokenize(int argc, char** argv) {
  std::vector<Args::Spec> specs = {
      {{"-m", "--model"}, true, false, "model (GGUF file or safetensors directory) whose tokenizer to use", "PATH"},
      {{"--tokenizer"}, true, false, "a Hugging Face tokenizer.json instead of a model", "FILE"},
      {{"--pieces"}, false, false, "print each token's text instead of ids", ""},
      {{"--no-special"}, false, false, "treat special-token text as plain text", ""},
  };
  const std::vector<Args::Spec> chat_flags = chat_specs("TEXT");
  specs.insert(specs.begin() + 3, chat_flags.begin(), chat_flags.end());
  Args args("tokenize", "Print the token ids of TEXT on one line, space-separated.", specs, "TEXT");
  if (Status s = args.parse(argc, argv); !s.ok()) return report_error("tokenize", s);
  if (args.has("--help")) {
    std::fputs(args.usage().c_str(), stdout);
    return 0;
  }
  if (args.positional().size() != 1) {
    return report_error("tokenize", invalid_argument_error("give exactly one TEXT argument"));
  }
  auto chat = chat_args(args);
  if (!chat.ok()) return report_error("tokenize", chat.status());
  std::unique_ptr<tokenizer::Tokenizer> owned;
  engine::OpenedModel opened;
  const tokenizer::Tokenizer* tok = nullptr;
  std::string origin;  // where the tokenizer (and the model's own chat template) comes from
  if (auto path = args.get("--tokenizer")) {
    origin = *path;
    auto t = tokenizer::Tokenizer::from_hf_json(*path);
    if (!t.ok()) return report_error("tokenize", t.status());
    owned = std::move(t).value();
    tok = owned.get();
  } else {
    origin = args.get("--model").value_or("");
    auto m = open_model_arg(args);
    if (!m.ok()) return report_error("tokenize", m.status());
    opened = std::move(m).value();
    tok = opened.tokenizer.get();
  }
  std::string text = args.positional()[0];
  if (chat->chat) {  // as serve's /apply-template renders [system?, user]; /tokenize's ids for them
    auto rendered = render_chat_args(*chat, *tok, origin, text, nullptr);
    if (!rendered.ok()) return report_error("tokenize", rendered.status());
    text = std::move(rendered).value();
  }
  const std::vector<std::int32_t> ids = tok->encode(text, !args.has("--no-special"));
  std::string line;
  for (std::int32_t id : ids) {
    if (!line.empty()) line += ' ';
    if (args.has("--pieces")) {
      line += fmt::format("{:?}", tok->token_bytes(id));
    } else {
      line += std::to_string(id);
    }
  }
  std::printf("%s\n", line.c_str());
  return 0;
}

}  // namespace sx::daemon
