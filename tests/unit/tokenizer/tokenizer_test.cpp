// Unit tests of the BPE tokenizer on hand-made vocabularies: merge order, added/special tokens,
// parse_special, HF added-token flags, invalid UTF-8, decode, the stream decoder and from_data
// validation.
#include <gtest/gtest.h>

#include <atomic>
#include <string>
#include <thread>
#include <vector>

#include "runtime/tokenizer/tokenizer.h"
#include "tests/unit/tokenizer/tiny_vocab.h"

namespace sx::tokenizer {
namespace {

using testing::tiny_data;
using Ids = std::vector<std::int32_t>;

std::unique_ptr<Tokenizer> make(TokenizerData d) {
  auto t = Tokenizer::from_data(std::move(d));
  EXPECT_TRUE(t.ok()) << t.status().to_string();
  return std::move(t).value();
}

std::int32_t id_of(const Tokenizer& t, std::string_view raw) {
  auto id = t.token_id(byte_level::encode(raw));
  EXPECT_TRUE(id.has_value()) << raw;
  return id.value_or(-1);
}

TEST(Bpe, MergesApplyLowestRankFirst) {
  auto t = make(tiny_data({{"a", "b"}, {"ab", "c"}, {"b", "c"}}));
  EXPECT_EQ(t->encode("abc"), Ids{id_of(*t, "abc")});
  EXPECT_EQ(t->encode("bc"), Ids{id_of(*t, "bc")});
  // a-b (rank 0) first, then ab-c (1), then the remaining b-c (2).
  EXPECT_EQ(t->encode("abcbc"), (Ids{id_of(*t, "abc"), id_of(*t, "bc")}));
}

TEST(Bpe, RankDecidesOverPosition) {
  auto t = make(tiny_data({{"b", "c"}, {"a", "b"}}));
  // b-c has the lower rank, so "abc" becomes a + bc even though a-b comes first in the text.
  EXPECT_EQ(t->encode("abc"), (Ids{'a', id_of(*t, "bc")}));
}

TEST(Bpe, TiesGoLeftmost) {
  auto t = make(tiny_data({{"a", "a"}}));
  EXPECT_EQ(t->encode("aaa"), (Ids{id_of(*t, "aa"), 'a'}));
  EXPECT_EQ(t->encode("aaaa"), (Ids{id_of(*t, "aa"), id_of(*t, "aa")}));
}

TEST(Bpe, PreTokenizerBoundsMerges) {
  // " b" is its own word (" ?\p{L}+"), so no merge crosses from "a" into it.
  auto t = make(tiny_data({{"a", " "}, {" ", "b"}}));
  EXPECT_EQ(t->encode("a b"), (Ids{'a', id_of(*t, " b")}));
}

TEST(Bpe, EmptyAndLongInput) {
  auto t = make(tiny_data({{"a", "a"}, {"aa", "aa"}}));
  EXPECT_TRUE(t->encode("").empty());
  const std::string long_word(100000, 'a');
  const Ids ids = t->encode(long_word);
  ASSERT_EQ(ids.size(), 25000u);
  EXPECT_EQ(ids.front(), id_of(*t, "aaaa"));
  EXPECT_EQ(t->decode(ids), long_word);
}

TEST(Bpe, ThreadSafeEncode) {
  auto t = make(tiny_data({{"a", "b"}, {"ab", "c"}}));
  const Ids expect = t->encode("abc abcab cab");
  std::vector<std::thread> threads;
  std::atomic<int> bad{0};
  for (int k = 0; k < 4; ++k) {
    threads.emplace_back([&] {
      for (int i = 0; i < 2000; ++i) {
        if (t->encode("abc abcab cab") != expect) ++bad;
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(bad.load(), 0);
}

TEST(SpecialTokens, SplitBeforeBpe) {
  auto t = make(tiny_data({{"h", "i"}}, {{"<|im_start|>", kTokenControl}, {"<|im_end|>", kTokenControl}}));
  const auto start = *t->token_id("<|im_start|>");
  const auto end = *t->token_id("<|im_end|>");
  EXPECT_EQ(t->encode("<|im_start|>hi<|im_end|>"), (Ids{start, id_of(*t, "hi"), end}));
  EXPECT_EQ(t->encode("<|im_start|><|im_end|>"), (Ids{start, end}));
  // Partial special tokens are plain text.
  EXPECT_EQ(t->encode("<|im_sta"), (Ids{'<', '|', 'i', 'm', '_', 's', 't', 'a'}));
  EXPECT_TRUE(t->is_special(start));
  EXPECT_TRUE(t->is_added(start));
  EXPECT_FALSE(t->is_special('a'));
}

TEST(SpecialTokens, ParseSpecialFalseTreatsThemAsText) {
  auto t = make(tiny_data({}, {{"<s>", kTokenControl}, {"<tool>", kTokenUserDefined}}));
  EXPECT_EQ(t->encode("<s>", /*parse_special=*/false), (Ids{'<', 's', '>'}));
  EXPECT_EQ(t->encode("<s>", /*parse_special=*/true), (Ids{*t->token_id("<s>")}));
  // User-defined added tokens are matched either way (as in HF).
  EXPECT_EQ(t->encode("<tool>", /*parse_special=*/false), (Ids{*t->token_id("<tool>")}));
}

TEST(SpecialTokens, LongestMatchWins) {
  auto t = make(tiny_data({}, {{"<x>", kTokenControl}, {"<x>y", kTokenControl}}));
  EXPECT_EQ(t->encode("a<x>yz"), (Ids{'a', *t->token_id("<x>y"), 'z'}));
  EXPECT_EQ(t->encode("<x>z"), (Ids{*t->token_id("<x>"), 'z'}));
}

TEST(SpecialTokens, HfFlags) {
  TokenizerData d = tiny_data({}, {{"<m>", kTokenUserDefined}, {"<w>", kTokenUserDefined}});
  const auto m = static_cast<std::int32_t>(d.tokens.size() - 2);
  const auto w = static_cast<std::int32_t>(d.tokens.size() - 1);
  AddedTokenOptions strip;
  strip.id = m;
  strip.lstrip = true;
  strip.rstrip = true;
  AddedTokenOptions single;
  single.id = w;
  single.single_word = true;
  d.added_token_options = {strip, single};
  auto t = make(std::move(d));
  // lstrip/rstrip swallow the white space around the token.
  EXPECT_EQ(t->encode("a \t<m>  b"), (Ids{'a', m, 'b'}));
  // single_word: only matched when not glued to word characters.
  EXPECT_EQ(t->encode("<w> x"), (Ids{w, ' ', 'x'}));
  EXPECT_EQ(t->encode("a<w>"), (Ids{'a', '<', 'w', '>'}));
}

TEST(InvalidUtf8, ReplacedLikePython) {
  TokenizerData d = tiny_data({{"\xEF", "\xBF"}, {"\xEF\xBF", "\xBD"}});
  auto t = make(std::move(d));
  const Ids fffd = t->encode("\xEF\xBF\xBD");
  ASSERT_EQ(fffd.size(), 1u);
  const auto r = fffd[0];
  EXPECT_EQ(t->encode("\xFF"), (Ids{r}));
  EXPECT_EQ(t->encode("\xE2\x82"), (Ids{r}));             // truncated sequence: one U+FFFD
  EXPECT_EQ(t->encode("\xF0\x80\x80"), (Ids{r, r, r}));   // bad second byte: three
  EXPECT_EQ(t->encode("x\xC3"), (Ids{'x', r}));
}

TEST(Decode, BytesAndSpecials) {
  auto t = make(tiny_data({{"a", "b"}}, {{"<|end|>", kTokenControl}}));
  const auto end = *t->token_id("<|end|>");
  const Ids ids = {id_of(*t, "ab"), ' ', end};
  EXPECT_EQ(t->decode(ids), "ab <|end|>");
  EXPECT_EQ(t->decode(ids, /*skip_special=*/true), "ab ");
  EXPECT_EQ(t->token_bytes(' '), " ");
  EXPECT_EQ(t->token_string(' '), "\xC4\xA0");  // "Ġ"
  // Partial UTF-8 is kept as bytes; unknown ids are skipped.
  const Ids partial = {0xE2, 0x82, -5, 1 << 30};
  EXPECT_EQ(t->decode(partial), "\xE2\x82");
}

TEST(StreamDecoder, NeverEmitsHalfACharacter) {
  auto t = make(tiny_data({}));
  StreamDecoder s(*t);
  // "é" = C3 A9 split across two byte tokens.
  EXPECT_EQ(s.push(0xC3), "");
  EXPECT_EQ(s.pending_bytes(), 1u);
  EXPECT_EQ(s.push(0xA9), "\xC3\xA9");
  // An emoji as four byte tokens.
  EXPECT_EQ(s.push(0xF0), "");
  EXPECT_EQ(s.push(0x9F), "");
  EXPECT_EQ(s.push(0x98), "");
  EXPECT_EQ(s.push(0x80), "\xF0\x9F\x98\x80");
  EXPECT_EQ(s.push('a'), "a");
  EXPECT_EQ(s.flush(), "");
}

TEST(StreamDecoder, InvalidBytesBecomeReplacement) {
  auto t = make(tiny_data({}, {{"<|e|>", kTokenControl}}));
  StreamDecoder s(*t);
  EXPECT_EQ(s.push(0xFF), "\xEF\xBF\xBD");
  EXPECT_EQ(s.push(0xE2), "");
  EXPECT_EQ(s.push(0x82), "");
  EXPECT_EQ(s.push('x'), "\xEF\xBF\xBDx");  // truncated sequence, then 'x'
  EXPECT_EQ(s.push(0xE2), "");
  EXPECT_EQ(s.flush(), "\xEF\xBF\xBD");
  StreamDecoder skip(*t, /*skip_special=*/true);
  EXPECT_EQ(skip.push(*t->token_id("<|e|>")), "");
  StreamDecoder keep(*t);
  EXPECT_EQ(keep.push(*t->token_id("<|e|>")), "<|e|>");
}

TEST(FromData, Errors) {
  {
    TokenizerData d = tiny_data({});
    d.merges.push_back("q zz");
    auto t = Tokenizer::from_data(std::move(d));
    ASSERT_FALSE(t.ok());
    EXPECT_NE(t.status().message().find("'zz'"), std::string::npos) << t.status().message();
  }
  {
    TokenizerData d = tiny_data({});
    d.merges.push_back("nospace");
    auto t = Tokenizer::from_data(std::move(d));
    ASSERT_FALSE(t.ok());
    EXPECT_NE(t.status().message().find("nospace"), std::string::npos);
  }
  {
    TokenizerData d = tiny_data({});
    d.pre = "llama3";
    auto t = Tokenizer::from_data(std::move(d));
    ASSERT_FALSE(t.ok());
    EXPECT_EQ(t.status().code(), StatusCode::kUnimplemented);
    EXPECT_NE(t.status().message().find("llama3"), std::string::npos);
  }
  {
    TokenizerData d = tiny_data({});
    d.tokens.push_back(d.tokens[5]);
    d.token_types.push_back(kTokenNormal);
    auto t = Tokenizer::from_data(std::move(d));
    ASSERT_FALSE(t.ok());
    EXPECT_NE(t.status().message().find("are both"), std::string::npos);
  }
  {
    TokenizerData d = tiny_data({});
    d.token_types.pop_back();
    EXPECT_FALSE(Tokenizer::from_data(std::move(d)).ok());
  }
  {
    TokenizerData d = tiny_data({});
    d.eos_id = 1000;
    auto t = Tokenizer::from_data(std::move(d));
    ASSERT_FALSE(t.ok());
    EXPECT_NE(t.status().message().find("eos"), std::string::npos);
  }
  {
    TokenizerData d = tiny_data({});
    d.token_types[3] = 9;
    EXPECT_FALSE(Tokenizer::from_data(std::move(d)).ok());
  }
  EXPECT_FALSE(Tokenizer::from_data(TokenizerData{}).ok());
}

TEST(FromData, UnusedTokensMayRepeatAndDecodeToNothing) {
  TokenizerData d = tiny_data({});
  d.tokens.push_back("[PAD]");
  d.tokens.push_back("[PAD]");
  d.token_types.push_back(kTokenUnused);
  d.token_types.push_back(kTokenUnused);
  auto t = make(std::move(d));
  EXPECT_EQ(t->vocab_size(), 258);
  EXPECT_EQ(t->decode(Ids{256, 'a', 257}), "a");
}

}  // namespace
}  // namespace sx::tokenizer
