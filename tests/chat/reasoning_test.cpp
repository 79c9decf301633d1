// daemon/chat/reasoning.h: thinking split out of answers, whole and in pieces cut at every place
// (tags straddling two pieces), against the rule written out here: reasoning from the start (prompt
// in thinking) or from an opening <think>, to the first </think>; content after it without its
// leading newlines; an unclosed thinking all reasoning; no <think> all content.
#include <gtest/gtest.h>

#include <optional>
#include <string>
#include <vector>

#include "daemon/chat/reasoning.h"

namespace sx::chat {
namespace {

struct Want {
  std::optional<std::string> reasoning;  // null: no reasoning
  std::string content;
};

// The rule, restated plainly.
Want rule(const std::string& answer, bool opened) {
  std::string rest = answer;
  if (!opened) {
    const std::size_t first = answer.find_first_not_of(" \t\r\n");
    if (first == std::string::npos || answer.compare(first, 7, "<think>") != 0) return {std::nullopt, answer};
    rest = answer.substr(first + 7);
  }
  auto trim = [](std::string s, bool back) {
    while (!s.empty() && s.front() == '\n') s.erase(0, 1);
    while (back && !s.empty() && s.back() == '\n') s.pop_back();
    return s;
  };
  const std::size_t close = rest.find("</think>");
  if (close == std::string::npos) return {trim(rest, true), ""};
  return {trim(rest.substr(0, close), true), trim(rest.substr(close + 8), false)};
}

const std::vector<std::pair<std::string, bool>> kCases = {
    {"<think>\nLet me see.\n</think>\n\nThe answer is 4.", false},
    {"Let me see.\n</think>\n\nThe answer is 4.", true},
    {"The answer is 4.", false},
    {"The answer is 4. <think>not at the start</think>", false},
    {"  \n<think>\nleading space\n</think>\ncontent", false},
    {"<think>\nnever closed", false},
    {"never closed, prompt opened", true},
    {"<think></think>", false},
    {"<think>\n\n</think>\n\nempty thinking", false},
    {"a </thin k> b </think>c</think>d", true},
    {"<thi", false},
    {"", true},
    {"ü€😀 <think>", false},
    {"<think>x</think>\n\n\n", false},
};

TEST(ReasoningSplitter, WholeAnswersFollowTheRule) {
  for (const auto& [answer, opened] : kCases) {
    const Want want = rule(answer, opened);
    const ReasoningSplitter::Whole got = ReasoningSplitter::split(answer, opened);
    EXPECT_EQ(got.content, want.content) << answer;
    EXPECT_EQ(got.reasoning, want.reasoning) << answer;
  }
}

// Streamed in two and in three pieces cut everywhere: the pieces add up to the whole answer's
// split (reasoning up to the newlines the whole split trims), and no tag text leaks.
TEST(ReasoningSplitter, PiecesCutAnywhereAddUpToTheWhole) {
  for (const auto& [answer, opened] : kCases) {
    const Want want = rule(answer, opened);
    for (std::size_t i = 0; i <= answer.size(); ++i) {
      for (std::size_t j = i; j <= answer.size(); ++j) {
        ReasoningSplitter s(opened);
        std::string reasoning, content;
        for (const std::string_view piece : {std::string_view(answer).substr(0, i),
                                             std::string_view(answer).substr(i, j - i),
                                             std::string_view(answer).substr(j)}) {
          const auto p = s.feed(piece);
          reasoning += p.reasoning;
          content += p.content;
        }
        const auto p = s.finish();
        reasoning += p.reasoning;
        content += p.content;
        while (!reasoning.empty() && reasoning.back() == '\n') reasoning.pop_back();
        while (!reasoning.empty() && reasoning.front() == '\n') reasoning.erase(0, 1);
        ASSERT_EQ(content, want.content) << answer << " cut at " << i << ", " << j;
        ASSERT_EQ(reasoning, want.reasoning.value_or("")) << answer << " cut at " << i << ", " << j;
        ASSERT_EQ(s.reasoned(), want.reasoning.has_value()) << answer;
      }
    }
  }
}

TEST(ReasoningSplitter, PromptsAndTemplates) {
  EXPECT_TRUE(prompt_opens_thinking("<|im_start|>assistant\n<think>\n"));
  EXPECT_FALSE(prompt_opens_thinking("<|im_start|>assistant\n<think>\n\n</think>\n\n"));
  EXPECT_TRUE(prompt_opens_thinking("<think>a</think> b <think>"));
  EXPECT_FALSE(prompt_opens_thinking("<|im_start|>assistant\n"));
  EXPECT_TRUE(template_thinks("{{ '<think>\\n\\n</think>\\n\\n' }}"));
  EXPECT_FALSE(template_thinks("{{ messages }}"));
}

}  // namespace
}  // namespace sx::chat
