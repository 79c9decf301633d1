// ChatTemplate::parse refuses templates that nest deeper than minja's recursive parser can take
// (brackets, block statements, prefix operators in a row), naming the limit, instead of
// overflowing the stack (a libFuzzer finding: tests/fuzz/corpus/jinja_template/
// deep-brackets-stack-overflow); what is outside tags and inside string literals does not count.
#include <gtest/gtest.h>

#include <string>

#include "daemon/chat/chat_template.h"

namespace sx::chat {
namespace {

std::string repeat(std::string_view s, int n) {
  std::string out;
  for (int i = 0; i < n; ++i) out += s;
  return out;
}

void expect_refused(const std::string& source, std::string_view why) {
  auto t = ChatTemplate::parse(source, "t.jinja");
  ASSERT_FALSE(t.ok());
  EXPECT_EQ(t.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(t.status().message().find(why), std::string::npos) << t.status().message();
  EXPECT_NE(t.status().message().find("t.jinja"), std::string::npos) << t.status().message();
}

TEST(ChatTemplateParse, NestingBeyondTheParsersDepthIsRefusedByName) {
  expect_refused("{{ f(a," + repeat("{", 2000) + " }}", "brackets nest deeper than 128");
  expect_refused("{{ " + repeat("(", 129) + "1" + repeat(")", 129) + " }}", "brackets nest deeper than 128");
  expect_refused(repeat("{% if x %}", 65) + repeat("{% endif %}", 65), "block statements nest deeper than 64");
  expect_refused("{{ " + repeat("not ", 65) + "x }}", "more than 64 prefix operators");
  expect_refused("{{ " + repeat("- ", 65) + "1 }}", "more than 64 prefix operators");
}

TEST(ChatTemplateParse, DeepButReasonableTemplatesParse) {
  // 128 brackets, 64 blocks, 64 operators: at the limits; text and string literals do not count.
  EXPECT_TRUE(ChatTemplate::parse("{{ " + repeat("(", 127) + "1" + repeat(")", 127) + " }}", "t").ok());
  EXPECT_TRUE(ChatTemplate::parse(repeat("{% if x %}", 64) + repeat("{% endif %}", 64), "t").ok());
  EXPECT_TRUE(ChatTemplate::parse("{{ " + repeat("not ", 64) + "x }}", "t").ok());
  EXPECT_TRUE(ChatTemplate::parse(repeat("-", 500) + repeat("[(", 300) + "{{ '" + repeat("(", 300) + "' }}", "t").ok());
  // Many blocks one after another are not nested.
  EXPECT_TRUE(ChatTemplate::parse(repeat("{%- if x %}a{% endif -%}", 500), "t").ok());
}

}  // namespace
}  // namespace sx::chat
