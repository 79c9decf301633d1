// Unit tests of Tokenizer::from_hf_json: errors that name the file and the field, and a few
// known encodings of the real Qwen2.5 tokenizer (ids from Hugging Face `tokenizers` 0.20.3).
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <thread>

#include <unistd.h>

#include "runtime/tokenizer/tokenizer.h"
#include "runtime/tokenizer/utf8.h"

#ifndef SX_QWEN_TOKENIZER_DIR
#error "SX_QWEN_TOKENIZER_DIR must point at tests/data/qwen2.5-tokenizer"
#endif

namespace sx::tokenizer {
namespace {

namespace fs = std::filesystem;
using Ids = std::vector<std::int32_t>;

const std::string kQwenJson = std::string(SX_QWEN_TOKENIZER_DIR) + "/tokenizer.json";

class TempDir {
 public:
  TempDir() {
    path_ = fs::temp_directory_path() / fmt::format("sx_tok_test_{}_{}", ::getpid(), counter_++);
    fs::create_directories(path_);
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path_, ec);
  }
  std::string write(const std::string& name, const std::string& text) const {
    const fs::path p = path_ / name;
    std::ofstream(p) << text;
    return p.string();
  }

 private:
  static inline int counter_ = 0;
  fs::path path_;
};

const char* kMinimal = R"({
  "added_tokens": [{"id": 4, "content": "<|end|>", "single_word": false, "lstrip": false,
                    "rstrip": false, "normalized": false, "special": true}],
  "normalizer": {"type": "NFC"},
  "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
     {"type": "Split", "pattern": {"Regex": "\\p{L}+|\\s+|."}, "behavior": "Isolated", "invert": false},
     {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": false, "use_regex": false}]},
  "decoder": {"type": "ByteLevel"},
  "model": {"type": "BPE", "dropout": null, "unk_token": null, "vocab": {"a": 0, "b": 1, "ab": 2, "Ġ": 3},
            "merges": ["a b"]}
})";

TEST(HfJson, MinimalFileLoads) {
  TempDir dir;
  auto t = Tokenizer::from_hf_json(dir.write("tokenizer.json", kMinimal));
  ASSERT_TRUE(t.ok()) << t.status().to_string();
  EXPECT_EQ((*t)->vocab_size(), 5);
  EXPECT_EQ((*t)->encode("ab ab<|end|>"), (Ids{2, 3, 2, 4}));
  EXPECT_TRUE((*t)->is_special(4));
  EXPECT_FALSE((*t)->eos_id().has_value());
}

TEST(HfJson, MissingFile) {
  auto t = Tokenizer::from_hf_json("/nonexistent/dir/tokenizer.json");
  ASSERT_FALSE(t.ok());
  EXPECT_EQ(t.status().code(), StatusCode::kNotFound);
  EXPECT_NE(t.status().message().find("/nonexistent/dir/tokenizer.json"), std::string::npos);
}

TEST(HfJson, InvalidJson) {
  TempDir dir;
  const std::string path = dir.write("tokenizer.json", "{ \"model\": [1, 2,, }");
  auto t = Tokenizer::from_hf_json(path);
  ASSERT_FALSE(t.ok());
  EXPECT_EQ(t.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(t.status().message().find(path), std::string::npos);
  EXPECT_NE(t.status().message().find("invalid JSON"), std::string::npos);
}

TEST(HfJson, MissingFieldsAreNamed) {
  TempDir dir;
  struct Case {
    std::string json;
    std::string field;
  };
  const std::vector<Case> cases = {
      {R"({"normalizer": null})", "'model'"},
      {R"({"model": {"type": "BPE", "merges": []}})", "'model.vocab'"},
      {R"({"model": {"type": "BPE", "vocab": {"a": 0}}})", "'model.merges'"},
      {R"({"model": {"type": "BPE", "vocab": {"a": -3}, "merges": []}})", "'model.vocab'"},
      {R"({"model": {"type": "BPE", "vocab": {"a": 0}, "merges": [7]}})", "'model.merges[0]'"},
      {R"({"model": {"type": "BPE", "vocab": {"a": 0}, "merges": []}, "added_tokens": [{"id": 1}]})",
       "'added_tokens[0].content'"},
  };
  for (const Case& c : cases) {
    const std::string path = dir.write("tokenizer.json", c.json);
    auto t = Tokenizer::from_hf_json(path);
    ASSERT_FALSE(t.ok()) << c.json;
    EXPECT_NE(t.status().message().find(path), std::string::npos) << t.status().message();
    EXPECT_NE(t.status().message().find(c.field), std::string::npos) << t.status().message();
  }
}

TEST(HfJson, UnsupportedKindsAreUnimplemented) {
  TempDir dir;
  auto t = Tokenizer::from_hf_json(dir.write("tokenizer.json", R"({"model": {"type": "WordPiece", "vocab": {}}})"));
  ASSERT_FALSE(t.ok());
  EXPECT_EQ(t.status().code(), StatusCode::kUnimplemented);
  EXPECT_NE(t.status().message().find("WordPiece"), std::string::npos);
  std::string lower = kMinimal;
  lower.replace(lower.find("\"NFC\""), 5, "\"Lowercase\"");
  t = Tokenizer::from_hf_json(dir.write("tokenizer.json", lower));
  ASSERT_FALSE(t.ok());
  EXPECT_NE(t.status().message().find("Lowercase"), std::string::npos);
}

TEST(HfJson, ConfigTokensAndErrors) {
  TempDir dir;
  const std::string path = dir.write("tokenizer.json", kMinimal);
  dir.write("tokenizer_config.json", R"({"eos_token": "<|end|>", "pad_token": {"content": "a"},
                                        "add_bos_token": false, "chat_template": "{{ x }}"})");
  auto t = Tokenizer::from_hf_json(path);
  ASSERT_TRUE(t.ok()) << t.status().to_string();
  EXPECT_EQ((*t)->eos_id(), 4);
  EXPECT_EQ((*t)->pad_id(), 0);
  EXPECT_EQ((*t)->data().chat_template, "{{ x }}");
  dir.write("tokenizer_config.json", R"({"eos_token": "<|nope|>"})");
  t = Tokenizer::from_hf_json(path);
  ASSERT_FALSE(t.ok());
  EXPECT_NE(t.status().message().find("tokenizer_config.json"), std::string::npos);
  EXPECT_NE(t.status().message().find("'eos_token'"), std::string::npos);
  dir.write("tokenizer_config.json", "not json");
  t = Tokenizer::from_hf_json(path);
  ASSERT_FALSE(t.ok());
  EXPECT_NE(t.status().message().find("tokenizer_config.json: invalid JSON"), std::string::npos);
}

class Qwen : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    const auto t0 = std::chrono::steady_clock::now();
    auto t = Tokenizer::from_hf_json(kQwenJson);
    const auto t1 = std::chrono::steady_clock::now();
    ASSERT_TRUE(t.ok()) << t.status().to_string();
    tok_ = std::move(t).value().release();
    std::printf("qwen2.5 tokenizer.json load: %.0f ms\n", std::chrono::duration<double, std::milli>(t1 - t0).count());
  }
  static void TearDownTestSuite() {
    delete tok_;
    tok_ = nullptr;
  }
  static inline Tokenizer* tok_ = nullptr;
};

TEST_F(Qwen, KnownEncodings) {
  const Tokenizer& t = *tok_;
  EXPECT_EQ(t.vocab_size(), 151665);
  EXPECT_EQ(t.encode("Hello world"), (Ids{9707, 1879}));
  EXPECT_EQ(t.encode("<|im_start|>user\nhi<|im_end|>\n"), (Ids{151644, 872, 198, 6023, 151645, 198}));
  EXPECT_EQ(t.encode("e\xCC\x81t\xC3\xA9"), (Ids{38783}));  // NFC: "été"
  EXPECT_EQ(t.encode("DON'T we'LL"), (Ids{84641, 17323, 582, 6, 4086}));
  EXPECT_EQ(t.encode("  \n\n\t x 12345"), (Ids{18611, 197, 856, 220, 16, 17, 18, 19, 20}));
  EXPECT_EQ(t.encode("你好，世界"), (Ids{108386, 3837, 99489}));
  EXPECT_EQ(t.encode("\xF0\x9F\x91\x8D\xF0\x9F\x8F\xBD"), (Ids{144349, 145375}));
  EXPECT_EQ(t.encode("<|im_start|>user", /*parse_special=*/false), (Ids{27, 91, 318, 4906, 91, 29, 872}));
}

TEST_F(Qwen, ConfigAndSpecials) {
  const Tokenizer& t = *tok_;
  EXPECT_EQ(t.eos_id(), 151645);  // <|im_end|>
  EXPECT_EQ(t.pad_id(), 151643);  // <|endoftext|>
  EXPECT_FALSE(t.bos_id().has_value());
  EXPECT_FALSE(t.add_bos());
  EXPECT_EQ(t.token_id("<|im_end|>"), 151645);
  EXPECT_TRUE(t.is_special(151645));
  EXPECT_EQ(t.token_string(9707), "Hello");
  EXPECT_EQ(t.token_bytes(220), " ");
  EXPECT_NE(t.data().chat_template.find("im_start"), std::string::npos);
  EXPECT_EQ(t.data().pre, "qwen2");
}

TEST_F(Qwen, ConcurrentEncodeMatchesSerial) {
  const Tokenizer& t = *tok_;
  std::vector<std::string> texts;
  for (int i = 0; i < 64; ++i) {
    texts.push_back(fmt::format("Sample {} of the quick brown fox, 数字 {} and émoji 🦊 #{}", i, i * 7919, i % 5));
  }
  std::vector<Ids> expect;
  for (const auto& s : texts) expect.push_back(t.encode(s));
  std::atomic<int> bad{0};
  std::vector<std::thread> threads;
  for (int k = 0; k < 4; ++k) {
    threads.emplace_back([&, k] {
      for (int rep = 0; rep < 50; ++rep) {
        for (std::size_t i = 0; i < texts.size(); ++i) {
          const std::size_t j = (i + static_cast<std::size_t>(k) * 13) % texts.size();
          if (t.encode(texts[j]) != expect[j]) ++bad;
        }
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(bad.load(), 0);
}

TEST_F(Qwen, StreamDecoderOnRealTokens) {
  const Tokenizer& t = *tok_;
  const std::string text = "Grüße 👩‍👩‍👧 我们 ñ";
  const Ids ids = t.encode(text);
  StreamDecoder s(t);
  std::string streamed;
  for (std::int32_t id : ids) {
    const std::string piece = s.push(id);
    EXPECT_TRUE(utf8::is_valid(piece));  // every piece is complete UTF-8 on its own
    streamed += piece;
  }
  streamed += s.flush();
  EXPECT_EQ(streamed, text);
  EXPECT_EQ(t.decode(ids), text);
}

}  // namespace
}  // namespace sx::tokenizer
