// Structured output's compiles (daemon/chat/structured.h, issue 53 items 5, 7 and 9) on a tiny
// byte-level vocabulary: a grammar that matches no text is refused naming the field (one that
// matches only the empty text is not); strict mode's reading of {"type": "array", "minItems": 1}
// gives way to JSON Schema's; a compile stops at its deadline or when cancelled, and what it left
// in xgrammar's cache does not answer the next compile of the same format; a schema nested
// kMaxFormatDepth deep compiles in well under a second (its cache key was cubic), a deeper one is
// refused before xgrammar's recursive walks see it.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "daemon/chat/structured.h"
#include "runtime/base/json_depth.h"
#include "tests/unit/tokenizer/tiny_vocab.h"

namespace sx::chat {
namespace {

using namespace std::chrono_literals;

// ids 0..255: single bytes; 256 "<|end|>" (control, the stop token).
constexpr std::int32_t kEnd = 256;

class StructuredTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto tok = tokenizer::Tokenizer::from_data(tokenizer::testing::tiny_data({}, {{"<|end|>", tokenizer::kTokenControl}}));
    ASSERT_TRUE(tok.ok()) << tok.status().to_string();
    tok_ = std::move(*tok);
    grammars_ = std::make_unique<Grammars>(*tok_, std::vector<std::int32_t>{kEnd});
  }

  // A schema of `levels` arrays, each the items of the one around it, around an integer: JSON
  // nested levels + 1 deep.
  static std::string nested_arrays(std::size_t levels) {
    std::string s;
    for (std::size_t i = 0; i < levels; ++i) s += R"({"type":"array","items":)";
    s += R"({"type":"integer"})";
    s.append(levels, '}');
    return s;
  }

  static OutputFormat schema(const std::string& text) {
    return {OutputFormat::Kind::kJsonSchema, text, {}, "response_format.json_schema.schema"};
  }

  // The tokens a fresh constraint of `f` allows after `text` (one byte token each).
  std::vector<std::int32_t> allowed_after(const CompiledFormat& f, const std::string& text) {
    auto c = grammars_->constraint(f);
    EXPECT_TRUE(c.ok()) << c.status().to_string();
    for (const char ch : text) (*c)->accept(static_cast<std::uint8_t>(ch));
    std::vector<std::uint32_t> words((tok_->vocab_size() + 31) / 32, 0);
    (*c)->fill_mask(words);
    std::vector<std::int32_t> out;
    for (std::int32_t t = 0; t < tok_->vocab_size(); ++t) {
      if (words[t / 32] & (1u << (t % 32))) out.push_back(t);
    }
    return out;
  }

  std::unique_ptr<tokenizer::Tokenizer> tok_;
  std::unique_ptr<Grammars> grammars_;
};

TEST_F(StructuredTest, AGrammarThatMatchesNoTextIsRefusedNamingTheField) {
  // Item 7: each $ref leads only to the other; the answer was empty, finish_reason stop.
  auto r = grammars_->compile(schema(R"({"$ref":"#/$defs/a","$defs":{"a":{"$ref":"#/$defs/b"},"b":{"$ref":"#/$defs/a"}}})"));
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(r.status().message(),
            "'response_format.json_schema.schema' cannot be used: no text matches it (its grammar allows neither a "
            "first token nor an empty answer, e.g. a $ref that leads only to itself)");
  // Likewise after the closed thinking, and for an EBNF grammar without an end.
  EXPECT_EQ(grammars_->compile(schema(R"({"$ref":"#/$defs/a","$defs":{"a":{"$ref":"#/$defs/a"}}})"), true)
                .status()
                .code(),
            StatusCode::kInvalidArgument);
  auto loop = grammars_->compile({OutputFormat::Kind::kGrammar, "root ::= a\na ::= a", {}, "structured_outputs.grammar"});
  ASSERT_FALSE(loop.ok());
  EXPECT_TRUE(loop.status().message().starts_with("'structured_outputs.grammar' cannot be used")) << loop.status().message();
}

TEST_F(StructuredTest, AGrammarThatMatchesOnlyTheEmptyTextIsAcceptedAndEndsAtOnce) {
  auto r = grammars_->compile({OutputFormat::Kind::kGrammar, "root ::= \"\"", {}, "structured_outputs.grammar"});
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_EQ(allowed_after(**r, ""), std::vector<std::int32_t>{kEnd});
}

TEST_F(StructuredTest, ATrailingDeadEndIsNotRefused) {
  // Only the first token is checked: a grammar that can start is compiled as before.
  auto r = grammars_->compile({OutputFormat::Kind::kGrammar, "root ::= \"a\" b\nb ::= b \"x\"", {}, "g"});
  EXPECT_TRUE(r.ok()) << r.status().to_string();
}

TEST_F(StructuredTest, StrictModesReadingOfAnArrayWithoutItemsGivesWayToJsonSchemas) {
  // Item 9: xgrammar's strict mode reads a missing "items" as none allowed, and refused this valid
  // schema as unsatisfiable ("minItems is greater than the number of prefixItems, but additional
  // items are not allowed: 1 > 0").
  auto r = grammars_->compile(schema(R"({"type":"array","minItems":1})"));
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  const std::vector<std::int32_t> after_open = allowed_after(**r, "[");
  EXPECT_EQ(std::count(after_open.begin(), after_open.end(), ']'), 0);  // at least one item
  EXPECT_EQ(std::count(after_open.begin(), after_open.end(), '"'), 1);  // of any type
  EXPECT_EQ(std::count(after_open.begin(), after_open.end(), '{'), 1);
  // A tool's parameters likewise.
  const nlohmann::ordered_json tools = nlohmann::ordered_json::parse(
      R"([{"type":"function","function":{"name":"f","parameters":{"type":"object","properties":{"xs":{"type":"array","minItems":1}},"required":["xs"]}}}])");
  EXPECT_TRUE(grammars_->compile_tool_call(ToolSyntax::kHermes, tools, "").ok());
  // What is unsatisfiable by JSON Schema's rules too is still refused, with xgrammar's reason.
  auto both = grammars_->compile(schema(R"({"type":"array","minItems":2,"maxItems":1})"));
  ASSERT_FALSE(both.ok());
  EXPECT_EQ(both.status().message(),
            "'response_format.json_schema.schema' cannot be used: minItems is greater than maxItems: 2 > 1");
  // Strict mode still holds an object to the properties it lists.
  auto strict = grammars_->compile(schema(R"({"type":"object","properties":{"a":{"type":"integer"}},"required":["a"]})"));
  ASSERT_TRUE(strict.ok());
  const std::vector<std::int32_t> after_a = allowed_after(**strict, R"({"a":1)");
  EXPECT_EQ(std::count(after_a.begin(), after_a.end(), ','), 0);
}

TEST_F(StructuredTest, AToolWhoseParametersMatchNothingIsRefusedNamingIt) {
  const nlohmann::ordered_json tools = nlohmann::ordered_json::parse(R"([
    {"type":"function","function":{"name":"ok","parameters":{"type":"object"}}},
    {"type":"function","function":{"name":"loop","parameters":{"$ref":"#/$defs/a","$defs":{"a":{"$ref":"#/$defs/a"}}}}}])");
  auto r = grammars_->compile_tool_call(ToolSyntax::kHermes, tools, "");
  ASSERT_FALSE(r.ok());
  EXPECT_TRUE(r.status().message().starts_with("'tools[1].function.parameters' cannot be used: no text matches it"))
      << r.status().message();
  EXPECT_TRUE(grammars_->compile_tool_call(ToolSyntax::kHermes, tools, "ok").ok());
  // XML writes the required parameters only, each value on its own (none here): the call can be made.
  EXPECT_TRUE(grammars_->compile_tool_call(ToolSyntax::kXml, tools, "").ok());
}

TEST_F(StructuredTest, ACompileStopsAtItsDeadlineNamingTheField) {
  CompileBudget budget;
  budget.timeout = 1ms;
  // The first check of the compile comes after its deadline.
  budget.cancelled = [] {
    std::this_thread::sleep_for(3ms);
    return false;
  };
  auto r = grammars_->compile(schema(R"({"type":"object","properties":{"deadline":{"type":"string"}}})"), false, budget);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kDeadlineExceeded);
  EXPECT_TRUE(r.status().message().starts_with("'response_format.json_schema.schema' did not compile within 1 ms"))
      << r.status().message();
  // The interrupted compile left nothing in xgrammar's cache: the same schema compiles now.
  EXPECT_TRUE(grammars_->compile(schema(R"({"type":"object","properties":{"deadline":{"type":"string"}}})")).ok());
  // A regex, a grammar and a tool call stop likewise.
  EXPECT_EQ(grammars_->compile({OutputFormat::Kind::kRegex, "[a-z]{1,40}x", {}, "structured_outputs.regex"}, false, budget)
                .status()
                .code(),
            StatusCode::kDeadlineExceeded);
  const nlohmann::ordered_json tools = nlohmann::ordered_json::parse(
      R"([{"type":"function","function":{"name":"f","parameters":{"type":"object","properties":{"q":{"type":"string"}}}}}])");
  EXPECT_EQ(grammars_->compile_tool_call(ToolSyntax::kHermes, tools, "", false, budget).status().code(),
            StatusCode::kDeadlineExceeded);
}

TEST_F(StructuredTest, ACancelledCompileStopsAndLeavesNothingCached) {
  CompileBudget budget;
  budget.cancelled = [] { return true; };
  const OutputFormat f{OutputFormat::Kind::kGrammar, "root ::= \"c\" [0-9]+", {}, "structured_outputs.grammar"};
  auto r = grammars_->compile(f, false, budget);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kCancelled);
  EXPECT_TRUE(grammars_->compile(f).ok());
  // A schema goes through xgrammar's cache by its text: the same.
  const OutputFormat s = schema(R"({"type":"integer","minimum":3})");
  EXPECT_EQ(grammars_->compile(s, false, budget).status().code(), StatusCode::kCancelled);
  EXPECT_TRUE(grammars_->compile(s).ok());
}

TEST_F(StructuredTest, AnotherCompilesInterruptionIsNotThisOnes) {
  // Two threads ask for one schema: the first computes it in xgrammar's cache and is cancelled
  // midway; the second, which waited for that entry, compiles it itself.
  const std::string deep = nested_arrays(kMaxFormatDepth - 1);
  std::atomic<bool> first_started{false}, release{false};
  CompileBudget first;
  first.cancelled = [&] {
    first_started = true;
    while (!release) std::this_thread::sleep_for(1ms);
    return true;
  };
  Result<std::shared_ptr<const CompiledFormat>> a = internal_error("not run"), b = internal_error("not run");
  std::thread ta([&] { a = grammars_->compile(schema(deep), false, first); });
  while (!first_started) std::this_thread::sleep_for(1ms);
  std::thread tb([&] { b = grammars_->compile(schema(deep)); });
  std::this_thread::sleep_for(50ms);  // b waits on a's entry
  release = true;
  ta.join();
  tb.join();
  EXPECT_EQ(a.status().code(), StatusCode::kCancelled);
  EXPECT_TRUE(b.ok()) << b.status().to_string();
}

TEST_F(StructuredTest, ASchemaAtTheDepthLimitCompilesQuicklyAndADeeperOneIsRefusedAtOnce) {
  // Item 5: 800 nested arrays (20 KB) took 45 s in xgrammar's schema cache key alone, on any
  // vocabulary; under AddressSanitizer its recursive walks overflowed the stack.
  const std::string at_limit = nested_arrays(kMaxFormatDepth - 1);  // the integer's object is one more
  ASSERT_EQ(json_shape(at_limit).depth, kMaxFormatDepth);
  const auto t0 = std::chrono::steady_clock::now();
  auto r = grammars_->compile(schema(at_limit));
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_LT(s, 5.0);  // well under 0.1 s here; slack for a sanitizer build and a busy machine
  for (const int levels : {static_cast<int>(kMaxFormatDepth), 800, 2000}) {
    auto deep = grammars_->compile(schema(nested_arrays(levels)));
    ASSERT_FALSE(deep.ok()) << levels;
    EXPECT_EQ(deep.status().code(), StatusCode::kInvalidArgument);
    EXPECT_EQ(deep.status().message(), fmt::format("'response_format.json_schema.schema' nests {} levels deep; at most "
                                                   "{} are accepted",
                                                   levels + 1, kMaxFormatDepth));
  }
  // A tool's parameters likewise, named by their index.
  nlohmann::ordered_json tools = nlohmann::ordered_json::array();
  tools.push_back({{"type", "function"}, {"function", {{"name", "ok"}, {"parameters", {{"type", "object"}}}}}});
  tools.push_back({{"type", "function"},
                   {"function", {{"name", "deep"}, {"parameters", nlohmann::ordered_json::parse(nested_arrays(100))}}}});
  auto call = grammars_->compile_tool_call(ToolSyntax::kHermes, tools, "");
  ASSERT_FALSE(call.ok());
  EXPECT_EQ(call.status().message(),
            fmt::format("'tools[1].function.parameters' nests 101 levels deep; at most {} are accepted", kMaxFormatDepth));
  EXPECT_TRUE(grammars_->compile_tool_call(ToolSyntax::kHermes, tools, "ok").ok());
}

}  // namespace
}  // namespace sx::chat
