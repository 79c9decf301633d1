// runtime/base/json_parse.h: the same documents as nlohmann::json::parse, and for malformed text
// the message its exception would have carried, without one being thrown.
#include "runtime/base/json_parse.h"

#include <string>

#include <gtest/gtest.h>

namespace sx {
namespace {

std::string thrown_message(const std::string& text) {
  try {
    (void)nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    return e.what();
  }
  return "";
}

TEST(ParseJson, GivesTheDocumentNlohmannGives) {
  for (const std::string text : {"{\"a\": [1, 2.5, \"x\", null, true, {\"b\": {}}]}", "[]", "  7 ", "\"\\u00e9\""}) {
    const JsonParse p = parse_json(text);
    ASSERT_TRUE(p.ok()) << text << ": " << p.error;
    EXPECT_EQ(p.value, nlohmann::json::parse(text)) << text;
  }
}

TEST(ParseJson, GivesNlohmannsMessageForMalformedText) {
  for (const std::string text : {"", "[", "{\"a\" 1}", "[1,]", "{} {}", "[1] x", "\"\\ud800\"", "tru", "\xff",
                                 "{\"a\": [1, 2}", "01"}) {
    const std::string expected = thrown_message(text);
    ASSERT_FALSE(expected.empty()) << "nlohmann accepts " << text;
    const JsonParse p = parse_json(text);
    EXPECT_FALSE(p.ok()) << text;
    EXPECT_EQ(p.error, expected) << text;
    EXPECT_TRUE(p.value.is_null()) << text;
  }
}

TEST(ParseJson, RefusesADuplicateKeyWhenAsked) {
  EXPECT_TRUE(parse_json(R"({"cmd": "status", "cmd": "shutdown"})").ok());  // nlohmann's way: the last wins
  const JsonParse dup = parse_json(R"({"a": {"cmd": "status", "x": [{"k": 1}, {"k": 2}], "cmd": 1}})", true);
  ASSERT_FALSE(dup.ok());
  EXPECT_EQ(dup.error, "duplicate key \"cmd\" in an object");
  // The same key in sibling objects, or at other depths, is not a duplicate.
  const JsonParse fine = parse_json(R"({"k": {"k": 1}, "x": [{"k": 1}, {"k": 2}], "y": {}})", true);
  ASSERT_TRUE(fine.ok()) << fine.error;
  EXPECT_EQ(fine.value["x"][1]["k"], 2);
}

TEST(ParseJsonWithin, RefusesATreeOverItsLimitsBeforeParsingAndKeepsKeyOrderWhenAsked) {
  const JsonLimits limits{4, 10};
  const std::string deep = std::string(100000, '[') + std::string(100000, ']');
  const JsonParse d = parse_json_within(deep, limits);
  EXPECT_TRUE(d.over_limits);
  EXPECT_EQ(d.error, "nests JSON 100000 levels deep; at most 4 are accepted");
  const JsonParse w = parse_json_within("[1,2,3,4,5,6,7,8,9,10,11]", limits);
  EXPECT_TRUE(w.over_limits);
  EXPECT_EQ(w.error, "holds 12 JSON values; at most 10 are accepted");
  // Brackets and commas inside strings are text, not tree.
  const JsonParse s = parse_json_within(R"({"a": "[[[[[[,,,,,,,,,,,,"})", limits);
  ASSERT_TRUE(s.ok()) << s.error;
  const JsonParse bad = parse_json_within("[[1]", limits);
  EXPECT_FALSE(bad.ok());
  EXPECT_FALSE(bad.over_limits);
  const OrderedJsonParse o = parse_json_within<nlohmann::ordered_json>(R"({"z": 1, "a": {"y": 2}})", limits);
  ASSERT_TRUE(o.ok()) << o.error;
  EXPECT_EQ(o.value.dump(), R"({"z":1,"a":{"y":2}})");
  EXPECT_TRUE(parse_json_within(std::string(4, '[') + std::string(4, ']'), limits).ok());
}

}  // namespace
}  // namespace sx
