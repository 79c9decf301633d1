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

}  // namespace
}  // namespace sx
