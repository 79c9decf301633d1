// Fuzz target: the tool-call parser (daemon/chat/tool_calls.h) on answers a model may write. Input:
// one mode byte (bit 0: XML, else hermes; the rest + 1: the size of the pieces the answer streams
// in), then the answer. Invariants: the answer streamed in pieces and the answer whole give the same
// text and the same calls (names, arguments); every call's arguments are a JSON object within the
// server's JSON limits (runtime/base/json_parse.h); a call that failed after its name went out is
// followed by its text, so the text is the same either way.
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "daemon/chat/tool_calls.h"
#include "runtime/base/json_parse.h"
#include "tests/fuzz/fuzz_check.h"

namespace {

const nlohmann::ordered_json& tools() {
  static const nlohmann::ordered_json t = nlohmann::ordered_json::parse(R"([
    {"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": {
      "s": {"type": "string"}, "i": {"type": "integer"}, "b": {"type": "boolean"}, "o": {"type": "object"},
      "n": {"type": ["null", "number"]}}}}},
    {"type": "function", "function": {"name": "get_weather"}}])");
  return t;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size < 1) return 0;
  const sx::chat::ToolSyntax syntax = (data[0] & 1) ? sx::chat::ToolSyntax::kXml : sx::chat::ToolSyntax::kHermes;
  const std::size_t cut = static_cast<std::size_t>(data[0] >> 1) + 1;
  const std::string_view answer(reinterpret_cast<const char*>(data + 1), size - 1);

  const sx::chat::ToolCallParser::Whole whole = sx::chat::ToolCallParser::parse(answer, syntax, tools());
  for (const auto& c : whole.calls) {
    const auto args = nlohmann::ordered_json::parse(c.arguments, nullptr, /*allow_exceptions=*/false);
    FUZZ_CHECK(args.is_object());
    FUZZ_CHECK(sx::json_shape(c.arguments).depth <= sx::JsonLimits{}.max_depth);  // a deeper call is text
  }
  FUZZ_CHECK(whole.text.size() <= answer.size());

  std::size_t counter = 0;
  sx::chat::ToolCallParser p(syntax, tools(), &counter);
  std::string text;
  std::vector<sx::chat::ToolCallParser::Call> calls, open;
  std::size_t begun = 0;
  auto take = [&](const sx::chat::ToolCallParser::Output& out) {
    for (const auto& e : out) {
      switch (e.kind) {
        case sx::chat::ToolCallEvent::Kind::kText: text += e.text; break;
        case sx::chat::ToolCallEvent::Kind::kBegin:
          FUZZ_CHECK(open.empty());
          FUZZ_CHECK(e.index == begun++);  // numbered in order
          open.push_back({e.name, {}});
          break;
        case sx::chat::ToolCallEvent::Kind::kArguments:
          FUZZ_CHECK(open.size() == 1);
          open.back().arguments += e.text;
          break;
        case sx::chat::ToolCallEvent::Kind::kEnd:
          FUZZ_CHECK(open.size() == 1);
          if (e.ok) calls.push_back(std::move(open.back()));
          open.clear();
          break;
      }
    }
  };
  for (std::size_t i = 0; i < answer.size(); i += cut) take(p.feed(answer.substr(i, cut)));
  take(p.finish());
  FUZZ_CHECK(open.empty());
  FUZZ_CHECK(text == whole.text);
  FUZZ_CHECK(calls.size() == whole.calls.size());
  for (std::size_t i = 0; i < calls.size(); ++i) {
    FUZZ_CHECK(calls[i].name == whole.calls[i].name);
    FUZZ_CHECK(calls[i].arguments == whole.calls[i].arguments);
  }
  FUZZ_CHECK(p.malformed() == whole.malformed);
  return 0;
}
