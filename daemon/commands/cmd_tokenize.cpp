// `sextant tokenize`: token ids (or pieces) of a text, with the model's tokenizer or a
// Hugging Face tokenizer.json.
#include <cstdio>
#include <string>

#include "daemon/commands/commands.h"
#include "daemon/commands/model_session.h"
#include "runtime/tokenizer/chat_template.h"

namespace sx::daemon {

int cmd_tokenize(int argc, char** argv) {
  Args args("tokenize", "Print the token ids of TEXT on one line, space-separated.",
            {
                {{"-m", "--model"}, true, false, "model (GGUF file or safetensors directory) whose tokenizer to use", "PATH"},
                {{"--tokenizer"}, true, false, "a Hugging Face tokenizer.json instead of a model", "FILE"},
                {{"--pieces"}, false, false, "print each token's text instead of ids", ""},
                {{"--chat"}, false, false, "render TEXT as one user turn of the chat template first", ""},
                {{"--no-special"}, false, false, "treat special-token text as plain text", ""},
            },
            "TEXT");
  if (Status s = args.parse(argc, argv); !s.ok()) return report_error("tokenize", s);
  if (args.has("--help")) {
    std::fputs(args.usage().c_str(), stdout);
    return 0;
  }
  if (args.positional().size() != 1) {
    return report_error("tokenize", invalid_argument_error("give exactly one TEXT argument"));
  }
  std::unique_ptr<tokenizer::Tokenizer> owned;
  engine::OpenedModel opened;
  const tokenizer::Tokenizer* tok = nullptr;
  if (auto path = args.get("--tokenizer")) {
    auto t = tokenizer::Tokenizer::from_hf_json(*path);
    if (!t.ok()) return report_error("tokenize", t.status());
    owned = std::move(t).value();
    tok = owned.get();
  } else {
    auto m = open_model_arg(args);
    if (!m.ok()) return report_error("tokenize", m.status());
    opened = std::move(m).value();
    tok = opened.tokenizer.get();
  }
  std::string text = args.positional()[0];
  if (args.has("--chat")) {
    const tokenizer::ChatMessage user{"user", text};
    text = tokenizer::render_chatml(std::span<const tokenizer::ChatMessage>(&user, 1), true);
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
