// daemon/chat/tool_calls.h: calls out of answers in both syntaxes, whole and streamed in pieces cut
// at every place (a tag, a name or a value straddling two pieces): the streamed events, put
// together, give what the whole parse gives; no text ever holds a part of <tool_call>; malformed
// calls come back as text, counted.
#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "daemon/chat/tool_calls.h"

namespace sx::chat {
namespace {

using nlohmann::ordered_json;

const ordered_json kTools = ordered_json::parse(R"([
  {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object",
    "properties": {"city": {"type": "string"}, "days": {"type": "integer"}, "metric": {"type": "boolean"},
                   "where": {"type": "object"}, "note": {"type": ["null", "string"]}}}}},
  {"type": "function", "function": {"name": "search", "parameters": {"type": "object",
    "properties": {"q": {"type": "string"}}}}}
])");

struct Joined {
  std::string text;
  std::vector<ToolCallParser::Call> calls;
  std::vector<bool> ok;
  std::size_t malformed = 0;
};

// The answer fed in pieces of `cut` bytes; the events put together as a streaming client would.
Joined stream(const std::string& answer, ToolSyntax syntax, std::size_t cut) {
  std::size_t counter = 0;
  ToolCallParser p(syntax, kTools, &counter);
  Joined j;
  auto take = [&](const ToolCallParser::Output& out) {
    for (const ToolCallEvent& e : out) {
      switch (e.kind) {
        case ToolCallEvent::Kind::kText:
          // A tag's bytes held back, never sent as text: a call found later could not take them
          // back, so the text equals the answer less its calls only if none leaked.
          j.text += e.text;
          break;
        case ToolCallEvent::Kind::kBegin:
          ASSERT_EQ(e.index, j.calls.size());
          j.calls.push_back({e.name, ""});
          j.ok.push_back(false);
          break;
        case ToolCallEvent::Kind::kArguments:
          ASSERT_EQ(e.index + 1, j.calls.size());
          j.calls.back().arguments += e.text;
          break;
        case ToolCallEvent::Kind::kEnd:
          ASSERT_EQ(e.index + 1, j.calls.size());
          j.ok.back() = e.ok;
          break;
      }
    }
  };
  for (std::size_t i = 0; i < answer.size(); i += cut) take(p.feed(answer.substr(i, cut)));
  take(p.finish());
  j.malformed = p.malformed();
  return j;
}

struct Case {
  ToolSyntax syntax;
  std::string answer;
  std::string text;                   // what stays text
  std::vector<std::string> names;     // the calls'
  std::vector<std::string> arguments;  // as JSON objects (compared parsed)
  std::size_t malformed = 0;
};

const std::vector<Case> kCases = {
    {ToolSyntax::kHermes, "No call here, just <b>text</b> and a <tool lookalike.", "No call here, just <b>text</b> and a <tool lookalike.", {}, {}},
    {ToolSyntax::kHermes,
     "Let me check.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris \\\"Ville\\\" {}\", \"days\": 3}}\n</tool_call>",
     "Let me check.\n", {"get_weather"}, {R"({"city": "Paris \"Ville\" {}", "days": 3})"}},
    {ToolSyntax::kHermes,
     "<tool_call>\n{\"name\": \"search\", \"arguments\": {\"q\": \"a\"}}\n</tool_call>\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"where\": {\"lat\": [1, 2]}}}\n</tool_call>",
     "\n", {"search", "get_weather"}, {R"({"q": "a"})", R"({"where": {"lat": [1, 2]}})"}},
    // Another key order, and arguments as a string: read once the call is whole.
    {ToolSyntax::kHermes,
     "<tool_call>{\"arguments\": \"{\\\"q\\\": \\\"x\\\"}\", \"name\": \"search\"}</tool_call>", "", {"search"},
     {R"({"q": "x"})"}},
    // Malformed: not JSON, a function no tool has, unclosed arguments at the end.
    {ToolSyntax::kHermes, "a<tool_call>\nnot json\n</tool_call>b", "a<tool_call>\nnot json\n</tool_call>b", {}, {}, 1},
    {ToolSyntax::kHermes, "<tool_call>\n{\"name\": \"rm_rf\", \"arguments\": {}}\n</tool_call>",
     "<tool_call>\n{\"name\": \"rm_rf\", \"arguments\": {}}\n</tool_call>", {}, {}, 1},
    // A call whose JSON closed stands without </tool_call> (the answer ended on a stop token).
    {ToolSyntax::kHermes, "<tool_call>\n{\"name\": \"search\", \"arguments\": {\"q\": \"y\"}}\n", "", {"search"},
     {R"({"q": "y"})"}},
    {ToolSyntax::kXml,
     "Checking.\n\n<tool_call>\n<function=get_weather>\n<parameter=city>\nNew\nYork\n</parameter>\n<parameter=days>\n5\n</parameter>\n<parameter=metric>\nTrue\n</parameter>\n<parameter=where>\n{\"lat\": 1.5}\n</parameter>\n<parameter=note>\nNone\n</parameter>\n</function>\n</tool_call>",
     "Checking.\n\n", {"get_weather"},
     {R"({"city": "New\nYork", "days": 5, "metric": true, "where": {"lat": 1.5}, "note": null})"}},
    {ToolSyntax::kXml,
     "<tool_call>\n<function=search>\n</function>\n</tool_call><tool_call>\n<function=search>\n<parameter=q>\n42\n</parameter>\n</function>\n</tool_call>",
     "", {"search", "search"}, {"{}", R"({"q": "42"})"}},
    {ToolSyntax::kXml, "<tool_call>\n<function=nope>\n</function>\n</tool_call>",
     "<tool_call>\n<function=nope>\n</function>\n</tool_call>", {}, {}, 1},
    // A dropped </parameter>: the value ends where the next parameter (or the function's end) begins.
    {ToolSyntax::kXml,
     "<tool_call>\n<function=get_weather>\n<parameter=city>\nOslo\n<parameter=days>\n2\n</function>\n</tool_call>",
     "", {"get_weather"}, {R"({"city": "Oslo", "days": 2})"}},
    // A parameter whose schema is not a plain string, written as JSON (an anyOf's string in quotes).
    {ToolSyntax::kXml,
     "<tool_call>\n<function=get_weather>\n<parameter=note>\n\"late\"\n</parameter>\n</function>\n</tool_call>",
     "", {"get_weather"}, {R"({"note": "late"})"}},
    // The answer ended inside </tool_call> (a stop string, max_tokens): the call whose JSON closed stands.
    {ToolSyntax::kHermes, "<tool_call>\n{\"name\": \"search\", \"arguments\": {}}\n</tool_", "", {"search"}, {"{}"}},
    // The tag in prose: text at once, counted as one malformed call.
    {ToolSyntax::kHermes, "Use a <tool_call> block to call.", "Use a <tool_call> block to call.", {}, {}, 1},
    {ToolSyntax::kXml, "Use a <tool_call> block to call.", "Use a <tool_call> block to call.", {}, {}, 1},
    // The syntax the template did not teach is text.
    {ToolSyntax::kNone, "<tool_call>\n{\"name\": \"search\", \"arguments\": {}}\n</tool_call>",
     "<tool_call>\n{\"name\": \"search\", \"arguments\": {}}\n</tool_call>", {}, {}},
};

TEST(ToolCallParser, WholeAndStreamedAtEveryCutAgree) {
  for (const Case& c : kCases) {
    SCOPED_TRACE(c.answer);
    const ToolCallParser::Whole w = ToolCallParser::parse(c.answer, c.syntax, kTools);
    EXPECT_EQ(w.text, c.text);
    EXPECT_EQ(w.malformed, c.malformed);
    ASSERT_EQ(w.calls.size(), c.names.size());
    for (std::size_t i = 0; i < w.calls.size(); ++i) {
      EXPECT_EQ(w.calls[i].name, c.names[i]);
      EXPECT_EQ(ordered_json::parse(w.calls[i].arguments), ordered_json::parse(c.arguments[i])) << w.calls[i].arguments;
    }
    for (std::size_t cut = 1; cut <= c.answer.size(); ++cut) {
      SCOPED_TRACE(cut);
      const Joined j = stream(c.answer, c.syntax, cut);
      EXPECT_EQ(j.text, c.text);
      EXPECT_EQ(j.malformed, c.malformed);
      ASSERT_EQ(j.calls.size(), c.names.size());
      for (std::size_t i = 0; i < j.calls.size(); ++i) {
        EXPECT_TRUE(j.ok[i]);
        EXPECT_EQ(j.calls[i].name, c.names[i]);
        EXPECT_EQ(j.calls[i].arguments, w.calls[i].arguments);
      }
    }
  }
}

TEST(ToolCallParser, HermesArgumentsStreamAsTheyArrive) {
  std::size_t counter = 0;
  ToolCallParser p(ToolSyntax::kHermes, kTools, &counter);
  auto out = p.feed("<tool_call>\n{\"name\": \"search\", \"arguments\": {\"q\": \"hel");
  ASSERT_EQ(out.size(), 2u);
  EXPECT_EQ(out[0].kind, ToolCallEvent::Kind::kBegin);
  EXPECT_EQ(out[0].name, "search");
  EXPECT_EQ(out[1].kind, ToolCallEvent::Kind::kArguments);
  EXPECT_EQ(out[1].text, "{\"q\": \"hel");
  out = p.feed("lo\"}");
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(out[0].text, "lo\"}");
  out = p.feed("}\n</tool_call>");
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(out[0].kind, ToolCallEvent::Kind::kEnd);
  EXPECT_TRUE(out[0].ok);
  EXPECT_EQ(counter, 1u);
}

TEST(ToolCallParser, ACallThatBreaksAfterItsNameEndsNotOkAndItsTextFollows) {
  // Arguments cut short by the end of the answer (max_tokens): the name went out, so the call ends
  // not ok, and every byte of it comes back as text.
  const std::string answer = "<tool_call>\n{\"name\": \"search\", \"arguments\": {\"q\": \"unfini";
  const Joined j = stream(answer, ToolSyntax::kHermes, 7);
  ASSERT_EQ(j.calls.size(), 1u);
  EXPECT_FALSE(j.ok[0]);
  EXPECT_EQ(j.text, answer);
  EXPECT_EQ(j.malformed, 1u);
  const ToolCallParser::Whole w = ToolCallParser::parse(answer, ToolSyntax::kHermes, kTools);
  EXPECT_TRUE(w.calls.empty());
  EXPECT_EQ(w.text, answer);
}

// A model's call whose JSON nests deeper than the server parses anything (runtime/base/json_parse.h:
// 32 levels): text, counted as malformed, never a parse that recurses 100,000 levels (issue 53).
TEST(ToolCallParser, ACallNestedDeeperThanTheJsonLimitsIsText) {
  const std::string deep = std::string(100000, '[') + std::string(100000, ']');
  const std::string hermes = "<tool_call>\n{\"name\": \"search\", \"arguments\": {\"q\": " + deep + "}}\n</tool_call>";
  const std::string as_string = "<tool_call>{\"arguments\": \"{\\\"q\\\": " + deep + "}\", \"name\": \"search\"}</tool_call>";
  const std::string xml = "<tool_call>\n<function=get_weather>\n<parameter=where>\n{\"a\": " + deep +
                          "}\n</parameter>\n</function>\n</tool_call>";
  for (const auto& [answer, syntax] : {std::pair{hermes, ToolSyntax::kHermes}, std::pair{as_string, ToolSyntax::kHermes}}) {
    const ToolCallParser::Whole w = ToolCallParser::parse(answer, syntax, kTools);
    EXPECT_TRUE(w.calls.empty());
    EXPECT_EQ(w.text, answer);
    const Joined j = stream(answer, syntax, 4096);
    EXPECT_EQ(j.malformed, 1u);
    EXPECT_TRUE(std::none_of(j.ok.begin(), j.ok.end(), [](bool ok) { return ok; }));
  }
  // An XML parameter's value that is not JSON within the limits is kept as the text it is.
  const ToolCallParser::Whole x = ToolCallParser::parse(xml, ToolSyntax::kXml, kTools);
  ASSERT_EQ(x.calls.size(), 1u);
  EXPECT_EQ(ordered_json::parse(x.calls[0].arguments)["where"], "{\"a\": " + deep + "}");
}

TEST(ToolCallParser, AnXmlCallCutInAParameterGivesAllItsTextBack) {
  const std::string answer = "<tool_call>\n<function=search>\n<parameter=q>\nnever ends";
  for (std::size_t cut : {std::size_t{1}, std::size_t{5}, answer.size()}) {
    const Joined j = stream(answer, ToolSyntax::kXml, cut);
    ASSERT_EQ(j.calls.size(), 1u);
    EXPECT_FALSE(j.ok[0]);
    EXPECT_EQ(j.text, answer);
  }
  EXPECT_EQ(ToolCallParser::parse(answer, ToolSyntax::kXml, kTools).text, answer);
}

TEST(ToolCallParser, ATagInProseHoldsNothingBack) {
  std::size_t counter = 0;
  ToolCallParser p(ToolSyntax::kHermes, kTools, &counter);
  std::string told;
  for (const ToolCallEvent& e : p.feed("I could write <tool_call> here, and go on ")) told += e.text;
  EXPECT_EQ(told, "I could write <tool_call> here, and go on ");  // all of it, before the answer ends
}

TEST(ToolCallParser, TwoParsersShareTheCallNumbers) {
  std::size_t counter = 0;
  ToolCallParser thinking(ToolSyntax::kXml, kTools, &counter), content(ToolSyntax::kXml, kTools, &counter);
  auto a = thinking.feed("<tool_call>\n<function=search>\n</function>\n</tool_call>");
  auto b = content.feed("<tool_call>\n<function=get_weather>\n</function>\n</tool_call>");
  ASSERT_FALSE(a.empty());
  ASSERT_FALSE(b.empty());
  EXPECT_EQ(a.front().index, 0u);
  EXPECT_EQ(b.front().index, 1u);
}

TEST(ToolSyntax, FromTheTemplate) {
  EXPECT_EQ(tool_syntax_of("...<tool_call>\\n<function=' + tool_call.name"), ToolSyntax::kXml);
  EXPECT_EQ(tool_syntax_of("{{- '<tool_call>\\n{\"name\": \"' }}"), ToolSyntax::kHermes);
  EXPECT_EQ(tool_syntax_of("{{ messages }}"), ToolSyntax::kNone);
}

}  // namespace
}  // namespace sx::chat
