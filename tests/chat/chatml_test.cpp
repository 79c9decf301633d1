// Unit tests of the built-in ChatML renderer (daemon/chat/chatml.h). Expected strings were produced
// by rendering the chat_template of tests/data/qwen2.5-tokenizer/tokenizer_config.json with Jinja2
// (as transformers does).
#include <gtest/gtest.h>

#include <vector>

#include "daemon/chat/chatml.h"
#include "tests/unit/tokenizer/tiny_vocab.h"

namespace sx::chat {
namespace {

using tokenizer::kTokenControl;
using tokenizer::Tokenizer;

const std::string kSys = "<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\n";

TEST(ChatMl, DefaultSystemPrompt) {
  std::vector<ChatMessage> m = {{"user", "Hello!"}};
  EXPECT_EQ(render_chatml(m), kSys + "<|im_start|>user\nHello!<|im_end|>\n<|im_start|>assistant\n");
  EXPECT_EQ(render_chatml(m, false), kSys + "<|im_start|>user\nHello!<|im_end|>\n");
}

TEST(ChatMl, OwnSystemAndTurns) {
  std::vector<ChatMessage> m = {{"system", "Be brief."}, {"user", "Hi"}, {"assistant", "Hello."}, {"user", "Bye"}};
  EXPECT_EQ(render_chatml(m),
            "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"
            "<|im_start|>assistant\nHello.<|im_end|>\n<|im_start|>user\nBye<|im_end|>\n<|im_start|>assistant\n");
}

TEST(ChatMl, ToolResponsesAreGrouped) {
  std::vector<ChatMessage> m = {{"user", "q"}, {"assistant", "calling"}, {"tool", "r1"}, {"tool", "r2"}, {"user", "thanks"}};
  EXPECT_EQ(render_chatml(m),
            kSys + "<|im_start|>user\nq<|im_end|>\n<|im_start|>assistant\ncalling<|im_end|>\n"
                   "<|im_start|>user\n<tool_response>\nr1\n</tool_response>\n<tool_response>\nr2\n</tool_response>"
                   "<|im_end|>\n<|im_start|>user\nthanks<|im_end|>\n<|im_start|>assistant\n");
  std::vector<ChatMessage> first = {{"tool", "x"}};
  EXPECT_EQ(render_chatml(first, false),
            kSys + "<|im_start|>user\n<tool_response>\nx\n</tool_response><|im_end|>\n");
}

TEST(ChatMl, LateSystemAndUnknownRoles) {
  std::vector<ChatMessage> late = {{"user", "a"}, {"system", "s2"}};
  EXPECT_EQ(render_chatml(late),
            kSys + "<|im_start|>user\na<|im_end|>\n<|im_start|>system\ns2<|im_end|>\n<|im_start|>assistant\n");
  std::vector<ChatMessage> unknown = {{"user", "a"}, {"narrator", "zzz"}};
  EXPECT_EQ(render_chatml(unknown), kSys + "<|im_start|>user\na<|im_end|>\n<|im_start|>assistant\n");
  auto checked = render_chatml_checked(unknown);
  ASSERT_FALSE(checked.ok());
  EXPECT_NE(checked.status().message().find("messages[1].role 'narrator'"), std::string::npos);
  EXPECT_FALSE(render_chatml_checked({}).ok());
  std::vector<ChatMessage> ok = {{"user", "a"}};
  ASSERT_TRUE(render_chatml_checked(ok).ok());
  EXPECT_EQ(render_chatml_checked(ok).value(), render_chatml(ok));
}

TEST(ChatMl, CustomOrNoDefaultSystem) {
  std::vector<ChatMessage> m = {{"user", "hi"}};
  EXPECT_EQ(render_chatml(m, true, "You are a helpful assistant."),
            "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n"
            "<|im_start|>assistant\n");
  EXPECT_EQ(render_chatml(m, true, ""), "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n");
}

// A tokenizer without ChatML's markers cannot carry a conversation: refused naming the token
// (the serve route answers 400 no_chat_template with this message).
TEST(ChatMl, ChatNeedsTheChatMlTokens) {
  auto with = Tokenizer::from_data(tokenizer::testing::tiny_data({}, {{"<|im_start|>", kTokenControl}, {"<|im_end|>", kTokenControl}}));
  ASSERT_TRUE(with.ok()) << with.status().to_string();
  EXPECT_TRUE(check_chat_tokens(**with).ok());
  auto half = Tokenizer::from_data(tokenizer::testing::tiny_data({}, {{"<|im_start|>", kTokenControl}}));
  ASSERT_TRUE(half.ok()) << half.status().to_string();
  const Status st = check_chat_tokens(**half);
  EXPECT_EQ(st.code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(st.message().find("the model has no chat template: its tokenizer has no <|im_end|> token"),
            std::string::npos)
      << st.to_string();
  auto none = Tokenizer::from_data(tokenizer::testing::tiny_data({}));
  ASSERT_TRUE(none.ok());
  EXPECT_NE(check_chat_tokens(**none).message().find("no <|im_start|> token"), std::string::npos);
}

}  // namespace
}  // namespace sx::chat
