// Unit tests of the text layers under the tokenizer: Python-compatible invalid UTF-8 replacement,
// NFC, the byte-level alphabet, the Oniguruma -> PCRE2 translation and the Qwen2 regex split.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "runtime/tokenizer/byte_level.h"
#include "runtime/tokenizer/pretokenizer.h"
#include "runtime/tokenizer/utf8.h"

namespace sx::tokenizer {
namespace {

const std::string R = "\xEF\xBF\xBD";  // U+FFFD

TEST(Utf8, ReplacementMatchesPython) {
  // Expected values are Python's bytes.decode('utf-8', errors='replace').
  EXPECT_EQ(utf8::replace_invalid("\xFF"), R);
  EXPECT_EQ(utf8::replace_invalid("\xE2\x82"), R);
  EXPECT_EQ(utf8::replace_invalid("\xF0\x80\x80"), R + R + R);
  EXPECT_EQ(utf8::replace_invalid("\xED\xA0\x80"), R + R + R);  // UTF-16 surrogate
  EXPECT_EQ(utf8::replace_invalid("\xC0\xAF"), R + R);            // overlong
  EXPECT_EQ(utf8::replace_invalid("\xE0\x80\xAF"), R + R + R);
  EXPECT_EQ(utf8::replace_invalid("a\xE2\x82\xAC" "b\xE2\x82" "c"), "a\xE2\x82\xAC" "b" + R + "c");
  EXPECT_EQ(utf8::replace_invalid("\xF4\x90\x80\x80"), R + R + R + R);  // above U+10FFFF
  EXPECT_EQ(utf8::replace_invalid("\xF1\x80\x80"), R);
  EXPECT_EQ(utf8::replace_invalid("\x80\x80"), R + R);
  EXPECT_EQ(utf8::replace_invalid("\xF0\x9F\x98"), R);
  EXPECT_EQ(utf8::replace_invalid(""), "");
  EXPECT_EQ(utf8::replace_invalid("plain \xE4\xBD\xA0"), "plain \xE4\xBD\xA0");
  EXPECT_TRUE(utf8::is_valid("\xF0\x9F\x91\x8D\xF0\x9F\x8F\xBD"));
  EXPECT_FALSE(utf8::is_valid("abcdefgh\xC3"));
}

TEST(Utf8, StreamingKeepsIncompleteTail) {
  std::string out;
  EXPECT_EQ(utf8::append_replacing_invalid(out, "ab\xF0\x9F", /*final=*/false), 2u);
  EXPECT_EQ(out, "ab");
  out.clear();
  EXPECT_EQ(utf8::append_replacing_invalid(out, "ab\xF0\x9F", /*final=*/true), 4u);
  EXPECT_EQ(out, "ab" + R);
}

TEST(Utf8, Nfc) {
  EXPECT_EQ(utf8::nfc("e\xCC\x81"), "\xC3\xA9");              // e + U+0301 -> é
  EXPECT_EQ(utf8::nfc("\xE1\x84\x80\xE1\x85\xA1"), "\xEA\xB0\x80");  // Hangul jamo -> 가
  EXPECT_EQ(utf8::nfc("\xE2\x84\xAB"), "\xC3\x85");           // Angstrom sign -> Å
  // Marks assigned after Unicode 9.0 are inert, as in the reference's Unicode 9.0 tables: U+07FD
  // (NKo Dantayalan, Unicode 11) blocks e + U+0301 from composing; U+0323 (old) does not: e + U+0323 -> U+1EB9.
  EXPECT_EQ(utf8::nfc("e\xDF\xBD\xCC\x81"), "e\xDF\xBD\xCC\x81");
  EXPECT_EQ(utf8::nfc("e\xCC\xA3\xCC\x81"), "\xE1\xBA\xB9\xCC\x81");  // U+1EB9 U+0301
  // Dives Akuru E + AU length mark (Unicode 13) stay uncomposed.
  EXPECT_EQ(utf8::nfc("\xF0\x91\xA4\xB5\xF0\x91\xA4\xB0"), "\xF0\x91\xA4\xB5\xF0\x91\xA4\xB0");
  // The fast path (no code point at or above U+0300) must really be NFC already.
  for (char32_t cp = 1; cp < 0x300; ++cp) {
    std::string s;
    utf8::append_code_point(s, cp);
    ASSERT_FALSE(utf8::may_need_nfc(s));
    // Also with a following combining mark, which would compose if a rule existed.
    std::string with_mark = s + "\xCC\x81";
    std::string composed = utf8::nfc(with_mark);
    ASSERT_TRUE(utf8::is_valid(composed));
  }
}

TEST(ByteLevel, Alphabet) {
  EXPECT_EQ(byte_level::encode(" the"), "\xC4\xA0the");  // "Ġthe"
  EXPECT_EQ(byte_level::encode("\n"), "\xC4\x8A");       // "Ċ"
  for (int b = 0; b < 256; ++b) {
    const std::string one(1, static_cast<char>(b));
    auto back = byte_level::decode(byte_level::encode(one));
    ASSERT_TRUE(back.has_value());
    EXPECT_EQ(*back, one);
  }
  EXPECT_FALSE(byte_level::decode("\xE4\xBD\xA0").has_value());  // 你 is not in the alphabet
}

std::vector<std::string> split(const RegexSplitter& s, std::string_view text) {
  std::vector<std::string_view> pieces;
  s.split(text, pieces);
  return {pieces.begin(), pieces.end()};
}

TEST(Pretokenizer, Qwen2Pattern) {
  auto s = RegexSplitter::create(kQwen2Pattern);
  ASSERT_TRUE(s.ok()) << s.status().to_string();
  const RegexSplitter& r = **s;
  using V = std::vector<std::string>;
  EXPECT_EQ(split(r, "Hello world!"), (V{"Hello", " world", "!"}));
  EXPECT_EQ(split(r, "DON'T we'LL"), (V{"DON", "'T", " we", "'LL"}));
  EXPECT_EQ(split(r, "x 12345"), (V{"x", " ", "1", "2", "3", "4", "5"}));
  EXPECT_EQ(split(r, "a  \n\n\tb"), (V{"a", "  \n\n", "\tb"}));
  EXPECT_EQ(split(r, "end   "), (V{"end", "   "}));
  EXPECT_EQ(split(r, "a   b"), (V{"a", "  ", " b"}));
  EXPECT_EQ(split(r, "x = {\"k\": 1};\r\n"), (V{"x", " =", " {\"", "k", "\":", " ", "1", "};\r\n"}));
  EXPECT_EQ(split(r, "你好，世界"), (V{"你好", "，世界"}));
  // U+0085 (NEL) is white space for Oniguruma; PCRE2's own \s would miss it.
  EXPECT_EQ(split(r, "a\xC2\x85" "b"), (V{"a", "\xC2\x85" "b"}));
  EXPECT_TRUE(split(r, "").empty());
}

// Qwen3.5's pattern keeps combining marks with their letters: a Devanagari word (its vowel signs and
// virama are marks) and a decomposed accent stay one word, where Qwen2's cuts them off as
// punctuation. Both are known by their GGUF names.
TEST(Pretokenizer, Qwen35PatternJoinsMarksToLetters) {
  auto q35 = RegexSplitter::create(kQwen35Pattern);
  auto q2 = RegexSplitter::create(kQwen2Pattern);
  ASSERT_TRUE(q35.ok() && q2.ok());
  using V = std::vector<std::string>;
  const std::string hindi = "\xE0\xA4\xB9\xE0\xA4\xBF\xE0\xA4\xA8\xE0\xA5\x8D\xE0\xA4\xA6\xE0\xA5\x80";  // हिन्दी
  EXPECT_EQ(split(**q35, " " + hindi), (V{" " + hindi}));
  EXPECT_GT(split(**q2, " " + hindi).size(), 1u);
  EXPECT_EQ(split(**q35, "cafe\xCC\x81 ok"), (V{"cafe\xCC\x81", " ok"}));  // e + COMBINING ACUTE
  EXPECT_EQ(split(**q35, "Hello world!"), (V{"Hello", " world", "!"}));
  EXPECT_EQ(pre_tokenizer_pattern("qwen35"), kQwen35Pattern);
  EXPECT_EQ(pre_tokenizer_pattern("qwen2"), kQwen2Pattern);
  EXPECT_TRUE(pre_tokenizer_pattern("llama3").empty());
  EXPECT_EQ(pre_tokenizer_name(kQwen35Pattern), "qwen35");
  EXPECT_TRUE(pre_tokenizer_name("\\s+").empty());
}

TEST(Pretokenizer, OnigurumaTranslation) {
  auto t = oniguruma_to_pcre2(R"(\s+(?!\S)|[^\s\p{L}]|\w)");
  ASSERT_TRUE(t.ok());
  EXPECT_EQ(t.value().find("\\s"), std::string::npos);
  EXPECT_NE(t.value().find("\\x{85}"), std::string::npos);
  EXPECT_FALSE(oniguruma_to_pcre2(R"([^\S])").ok());
  EXPECT_FALSE(oniguruma_to_pcre2(R"([a-z&&[^c]])").ok());
  EXPECT_FALSE(RegexSplitter::create("(unclosed").ok());
}

}  // namespace
}  // namespace sx::tokenizer
