// render_template TEMPLATE [--openai] < CONTEXT.json: the template (daemon/chat/chat_template.h)
// rendered with the JSON object on stdin, written to stdout as is. --openai first parses tool-call
// arguments given as JSON strings (parse_tool_call_arguments), as the server does. Exit 0; 2 when
// the template does not parse or the input is not JSON; 3 when the render fails (the message on
// stderr). For tests/chat/golden_test.py.
#include <cstdio>
#include <fstream>
#include <iostream>
#include <iterator>
#include <sstream>
#include <string>

#include "daemon/chat/chat_template.h"

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: render_template TEMPLATE [--openai] < CONTEXT.json\n");
    return 2;
  }
  std::ifstream in(argv[1], std::ios::binary);
  if (!in) {
    std::fprintf(stderr, "cannot read %s\n", argv[1]);
    return 2;
  }
  const std::string source((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const std::string input((std::istreambuf_iterator<char>(std::cin)), std::istreambuf_iterator<char>());
  auto context = nlohmann::ordered_json::parse(input, nullptr, /*allow_exceptions=*/false);
  if (context.is_discarded()) {
    std::fprintf(stderr, "stdin is not JSON\n");
    return 2;
  }
  if (argc > 2 && std::string(argv[2]) == "--openai" && context.contains("messages")) {
    if (auto s = sx::chat::parse_tool_call_arguments(context["messages"]); !s.ok()) {
      std::fprintf(stderr, "%s\n", s.to_string().c_str());
      return 3;
    }
  }
  auto tmpl = sx::chat::ChatTemplate::parse(source, argv[1]);
  if (!tmpl.ok()) {
    std::fprintf(stderr, "%s\n", tmpl.status().to_string().c_str());
    return 2;
  }
  auto out = (*tmpl)->render(context);
  if (!out.ok()) {
    std::fprintf(stderr, "%s\n", out.status().to_string().c_str());
    return 3;
  }
  std::fwrite(out->data(), 1, out->size(), stdout);
  return 0;
}
