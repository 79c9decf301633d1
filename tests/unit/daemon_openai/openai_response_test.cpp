// daemon/openai response shapes: error bodies, whole chat and text completions (choices, usage,
// logprobs, echo), stream chunks (role on the first chat chunk, finish chunks, usage null only with
// include_usage), the usage chunk, SSE framing and dump_json's replacement of invalid UTF-8.
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "daemon/openai/response.h"
#include "tests/unit/tokenizer/tiny_vocab.h"

namespace sx::daemon::openai {
namespace {

using nlohmann::json;

// ids 0..255: single bytes; 256 "hi", 257 "lo"; 258 "<|end|>" (control).
constexpr std::int32_t kHi = 256, kLo = 257, kEnd = 258;

class ResponseTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto tok = tokenizer::Tokenizer::from_data(
        tokenizer::testing::tiny_data({{"h", "i"}, {"l", "o"}}, {{"<|end|>", tokenizer::kTokenControl}}));
    ASSERT_TRUE(tok.ok()) << tok.status().to_string();
    tok_ = std::move(*tok);
    ASSERT_EQ(tok_->token_bytes(kHi), "hi");
    ASSERT_EQ(tok_->token_bytes(kLo), "lo");
    ASSERT_EQ(tok_->token_bytes(kEnd), "<|end|>");
    ASSERT_EQ(tok_->token_bytes('h'), "h");
  }

  static GenerateRequest chat() {
    GenerateRequest r;
    r.endpoint = Endpoint::kChat;
    r.model = "qwen";
    return r;
  }
  static GenerateRequest completion() {
    GenerateRequest r;
    r.endpoint = Endpoint::kCompletion;
    r.model = "qwen";
    r.prompt_text = "Say: ";
    return r;
  }
  static json parse(const std::string& s) {
    json j = json::parse(s, nullptr, /*allow_exceptions=*/false);
    EXPECT_FALSE(j.is_discarded()) << s;
    return j;
  }

  // Two generated tokens ("hi", "lo") with their alternatives.
  static std::vector<engine::TokenLogprob> two_logprobs() {
    return {engine::TokenLogprob{kHi, -0.5f, {{kHi, -0.5f}, {'h', -1.25f}}},
            engine::TokenLogprob{kLo, -0.25f, {{kLo, -0.25f}, {'l', -2.0f}}}};
  }

  const ResponseId chat_id_{"chatcmpl-abc123", 1700000000, "qwen-served"};
  const ResponseId cmpl_id_{"cmpl-xyz", 1700000001, "qwen-served"};
  std::unique_ptr<tokenizer::Tokenizer> tok_;
};

// ------------------------------------------------------------------------------------------------
// error_body, sse, dump_json

TEST(ErrorBody, AllFields) {
  ApiError e;
  e.status = 404;
  e.type = "invalid_request_error";
  e.code = "model_not_found";
  e.param = "model";
  e.message = "The model 'x' does not exist";
  const json j = json::parse(error_body(e));
  ASSERT_TRUE(j.is_object());
  ASSERT_EQ(j.size(), 1u);
  const json& err = j.at("error");
  ASSERT_EQ(err.size(), 4u);
  EXPECT_EQ(err.at("message"), "The model 'x' does not exist");
  EXPECT_EQ(err.at("type"), "invalid_request_error");
  EXPECT_EQ(err.at("param"), "model");
  EXPECT_EQ(err.at("code"), "model_not_found");
}

TEST(ErrorBody, EmptyParamAndCodeAreNull) {
  ApiError e;
  e.message = "the request body is not valid JSON";
  EXPECT_EQ(error_body(e),
            R"({"error":{"code":null,"message":"the request body is not valid JSON","param":null,)"
            R"("type":"invalid_request_error"}})");
  e.type = "service_unavailable";
  e.message = "quote \" and newline \n";
  const json j = json::parse(error_body(e));
  EXPECT_TRUE(j["error"]["param"].is_null());
  EXPECT_TRUE(j["error"]["code"].is_null());
  EXPECT_EQ(j["error"]["type"], "service_unavailable");
  EXPECT_EQ(j["error"]["message"], "quote \" and newline \n");
}

TEST(ErrorBody, InvalidUtf8InMessageDoesNotThrow) {
  ApiError e;
  e.param = "messages[0].content";
  e.message = std::string("bad byte \xff here");
  std::string body;
  ASSERT_NO_THROW(body = error_body(e));
  const json j = json::parse(body);
  EXPECT_EQ(j["error"]["message"], "bad byte \xEF\xBF\xBD here");
}

TEST(Sse, Framing) {
  EXPECT_EQ(sse("{\"a\":1}"), "data: {\"a\":1}\n\n");
  EXPECT_EQ(sse(""), "data: \n\n");
  EXPECT_EQ(sse("[DONE]"), "data: [DONE]\n\n");
}

TEST(DumpJson, ReplacesInvalidUtf8) {
  const json j{{"text", std::string("a\xff" "b\xc3")}, {"ok", "caf\xc3\xa9"}};
  EXPECT_THROW((void)j.dump(), json::type_error);  // what dump_json guards against
  std::string out;
  ASSERT_NO_THROW(out = dump_json(j));
  EXPECT_EQ(out, "{\"ok\":\"caf\xc3\xa9\",\"text\":\"a\xEF\xBF\xBD" "b\xEF\xBF\xBD\"}");
  // Compact, no ASCII escaping of valid UTF-8.
  EXPECT_EQ(dump_json(json{{"k", json::array({1, 2})}}), R"({"k":[1,2]})");
  EXPECT_EQ(dump_json(json("\xe2\x82\xac")), "\"\xe2\x82\xac\"");
}

// ------------------------------------------------------------------------------------------------
// completion_body

TEST_F(ResponseTest, ChatCompletionBody) {
  GenerateRequest r = chat();
  r.n = 2;
  const std::vector<Choice> choices{{"Hello!", {}, "stop"}, {"Hel", {}, "length"}};
  const json j = parse(completion_body(r, chat_id_, choices, Usage{10, 7, 4}, *tok_));
  EXPECT_EQ(j.at("id"), "chatcmpl-abc123");
  EXPECT_EQ(j.at("object"), "chat.completion");
  EXPECT_EQ(j.at("created"), 1700000000);
  EXPECT_EQ(j.at("model"), "qwen-served");
  ASSERT_TRUE(j.contains("system_fingerprint"));
  EXPECT_TRUE(j.at("system_fingerprint").is_null());
  const json& cs = j.at("choices");
  ASSERT_EQ(cs.size(), 2u);
  for (std::size_t i = 0; i < 2; ++i) {
    SCOPED_TRACE(i);
    EXPECT_EQ(cs[i].at("index"), i);
    const json& m = cs[i].at("message");
    EXPECT_EQ(m.at("role"), "assistant");
    EXPECT_TRUE(m.at("refusal").is_null());
    EXPECT_EQ(m.at("tool_calls"), json::array());
    ASSERT_TRUE(cs[i].contains("logprobs"));
    EXPECT_TRUE(cs[i].at("logprobs").is_null());
    EXPECT_FALSE(cs[i].contains("text"));
  }
  EXPECT_EQ(cs[0]["message"]["content"], "Hello!");
  EXPECT_EQ(cs[0]["finish_reason"], "stop");
  EXPECT_EQ(cs[1]["message"]["content"], "Hel");
  EXPECT_EQ(cs[1]["finish_reason"], "length");
  const json& u = j.at("usage");
  EXPECT_EQ(u.at("prompt_tokens"), 10);
  EXPECT_EQ(u.at("completion_tokens"), 7);
  EXPECT_EQ(u.at("total_tokens"), 17);
  EXPECT_EQ(u.at("prompt_tokens_details").at("cached_tokens"), 4);
}

TEST_F(ResponseTest, EmptyFinishReasonIsNull) {
  const json j = parse(completion_body(chat(), chat_id_, {{"x", {}, ""}}, Usage{}, *tok_));
  ASSERT_TRUE(j["choices"][0].contains("finish_reason"));
  EXPECT_TRUE(j["choices"][0]["finish_reason"].is_null());
  EXPECT_EQ(j["usage"]["total_tokens"], 0);
  EXPECT_EQ(j["usage"]["prompt_tokens_details"]["cached_tokens"], 0);
}

TEST_F(ResponseTest, ChatLogprobs) {
  GenerateRequest r = chat();
  r.top_logprobs = 2;
  const json j = parse(completion_body(r, chat_id_, {{"hilo", two_logprobs(), "stop"}}, Usage{3, 2, 0}, *tok_));
  const json& lp = j["choices"][0].at("logprobs");
  ASSERT_TRUE(lp.is_object());
  ASSERT_TRUE(lp.contains("refusal"));
  EXPECT_TRUE(lp.at("refusal").is_null());
  const json& content = lp.at("content");
  ASSERT_EQ(content.size(), 2u);
  EXPECT_EQ(content[0].at("token"), "hi");
  EXPECT_EQ(content[0].at("logprob"), -0.5);
  EXPECT_EQ(content[0].at("bytes"), json::array({104, 105}));
  ASSERT_EQ(content[0].at("top_logprobs").size(), 2u);
  EXPECT_EQ(content[0]["top_logprobs"][0], (json{{"token", "hi"}, {"logprob", -0.5}, {"bytes", {104, 105}}}));
  EXPECT_EQ(content[0]["top_logprobs"][1], (json{{"token", "h"}, {"logprob", -1.25}, {"bytes", {104}}}));
  EXPECT_EQ(content[1].at("token"), "lo");
  EXPECT_EQ(content[1].at("logprob"), -0.25);
  EXPECT_EQ(content[1].at("bytes"), json::array({108, 111}));
  EXPECT_EQ(content[1]["top_logprobs"][1], (json{{"token", "l"}, {"logprob", -2.0}, {"bytes", {108}}}));
  // An entry has exactly these four fields.
  EXPECT_EQ(content[0].size(), 4u);
}

TEST_F(ResponseTest, ChatLogprobsWithoutAlternatives) {
  GenerateRequest r = chat();
  r.top_logprobs = 0;
  const json j = parse(completion_body(r, chat_id_, {{"hi", {engine::TokenLogprob{kHi, -0.75f, {}}}, "stop"}},
                                       Usage{}, *tok_));
  const json& content = j["choices"][0]["logprobs"]["content"];
  ASSERT_EQ(content.size(), 1u);
  EXPECT_EQ(content[0]["top_logprobs"], json::array());
  EXPECT_EQ(content[0]["logprob"], -0.75);
}

TEST_F(ResponseTest, LogprobsOfPartialUtf8Token) {
  // A token that is half a character: the token string is replaced, the bytes are exact.
  GenerateRequest r = chat();
  r.top_logprobs = 1;
  std::string body;
  ASSERT_NO_THROW(body = completion_body(r, chat_id_, {{"?", {engine::TokenLogprob{0xC3, -1.0f, {{0xC3, -1.0f}}}}, "stop"}},
                                         Usage{}, *tok_));
  const json j = parse(body);
  const json& e = j["choices"][0]["logprobs"]["content"][0];
  EXPECT_EQ(e["token"], "\xEF\xBF\xBD");
  EXPECT_EQ(e["bytes"], json::array({0xC3}));
  EXPECT_EQ(e["top_logprobs"][0]["bytes"], json::array({0xC3}));

  GenerateRequest c = completion();
  c.top_logprobs = 1;
  ASSERT_NO_THROW(body = completion_body(c, cmpl_id_, {{"?", {engine::TokenLogprob{0xC3, -1.0f, {{0xC3, -1.0f}}}}, "stop"}},
                                         Usage{}, *tok_));
  EXPECT_EQ(parse(body)["choices"][0]["logprobs"]["tokens"][0], "\xEF\xBF\xBD");
}

TEST_F(ResponseTest, TextCompletionBody) {
  GenerateRequest r = completion();
  r.n = 3;
  const std::vector<Choice> choices{{"a", {}, "stop"}, {"b", {}, "length"}, {"c", {}, "stop"}};
  const json j = parse(completion_body(r, cmpl_id_, choices, Usage{5, 3, 2}, *tok_));
  EXPECT_EQ(j.at("id"), "cmpl-xyz");
  EXPECT_EQ(j.at("object"), "text_completion");
  EXPECT_EQ(j.at("created"), 1700000001);
  EXPECT_EQ(j.at("model"), "qwen-served");
  EXPECT_TRUE(j.at("system_fingerprint").is_null());
  const json& cs = j.at("choices");
  ASSERT_EQ(cs.size(), 3u);
  const char* texts[] = {"a", "b", "c"};
  const char* finishes[] = {"stop", "length", "stop"};
  for (std::size_t i = 0; i < 3; ++i) {
    SCOPED_TRACE(i);
    EXPECT_EQ(cs[i].at("index"), i);
    EXPECT_EQ(cs[i].at("text"), texts[i]);  // no echo: the prompt is not repeated
    EXPECT_EQ(cs[i].at("finish_reason"), finishes[i]);
    EXPECT_TRUE(cs[i].at("logprobs").is_null());
    EXPECT_FALSE(cs[i].contains("message"));
  }
  EXPECT_EQ(j["usage"]["prompt_tokens"], 5);
  EXPECT_EQ(j["usage"]["completion_tokens"], 3);
  EXPECT_EQ(j["usage"]["total_tokens"], 8);
  EXPECT_EQ(j["usage"]["prompt_tokens_details"]["cached_tokens"], 2);
}

TEST_F(ResponseTest, TextCompletionLogprobs) {
  GenerateRequest r = completion();
  r.top_logprobs = 2;
  const json j = parse(completion_body(r, cmpl_id_, {{"hilo", two_logprobs(), "length"}}, Usage{}, *tok_));
  const json& lp = j["choices"][0].at("logprobs");
  ASSERT_EQ(lp.size(), 4u);
  EXPECT_EQ(lp.at("tokens"), json::array({"hi", "lo"}));
  EXPECT_EQ(lp.at("token_logprobs"), json::array({-0.5, -0.25}));
  EXPECT_EQ(lp.at("top_logprobs"), json::array({json{{"hi", -0.5}, {"h", -1.25}}, json{{"lo", -0.25}, {"l", -2.0}}}));
  EXPECT_EQ(lp.at("text_offset"), json::array({0, 2}));
}

TEST_F(ResponseTest, TextCompletionEchoPrefix) {
  GenerateRequest r = completion();
  r.echo = true;
  r.top_logprobs = 0;
  std::vector<engine::TokenLogprob> lps{{kHi, -0.5f, {}}, {kLo, -0.25f, {}}};
  json j = parse(completion_body(r, cmpl_id_, {{"hilo", lps, "stop"}}, Usage{}, *tok_));
  EXPECT_EQ(j["choices"][0]["text"], "Say: hilo");
  // Offsets count from the start of the returned text, the echoed prompt included.
  EXPECT_EQ(j["choices"][0]["logprobs"]["text_offset"], json::array({5, 7}));
  EXPECT_EQ(j["choices"][0]["logprobs"]["top_logprobs"], json::array({json::object(), json::object()}));

  // A prompt of token ids is echoed as its decoded text; every choice gets the prefix.
  r.prompt_text.clear();
  r.prompt_is_ids = true;
  r.prompt_ids = {kHi, ' ', kLo};
  r.top_logprobs = -1;
  j = parse(completion_body(r, cmpl_id_, {{"X", {}, "stop"}, {"Y", {}, "stop"}}, Usage{}, *tok_));
  EXPECT_EQ(j["choices"][0]["text"], "hi loX");
  EXPECT_EQ(j["choices"][1]["text"], "hi loY");

  // Echo is a completions feature: a chat message never carries a prefix.
  GenerateRequest c = chat();
  c.echo = true;
  c.prompt_text = "ignored";
  j = parse(completion_body(c, chat_id_, {{"Z", {}, "stop"}}, Usage{}, *tok_));
  EXPECT_EQ(j["choices"][0]["message"]["content"], "Z");
}

TEST_F(ResponseTest, NoChoices) {
  const json j = parse(completion_body(chat(), chat_id_, {}, Usage{1, 0, 0}, *tok_));
  EXPECT_EQ(j["choices"], json::array());
  EXPECT_EQ(j["usage"]["total_tokens"], 1);
}

// ------------------------------------------------------------------------------------------------
// chunk_json, usage_chunk_json

TEST_F(ResponseTest, ChatFirstChunkCarriesRole) {
  const json j = parse(chunk_json(chat(), chat_id_, 0, /*first=*/true, "Hel", {}, "", *tok_));
  EXPECT_EQ(j.at("id"), "chatcmpl-abc123");
  EXPECT_EQ(j.at("object"), "chat.completion.chunk");
  EXPECT_EQ(j.at("created"), 1700000000);
  EXPECT_EQ(j.at("model"), "qwen-served");
  EXPECT_TRUE(j.at("system_fingerprint").is_null());
  EXPECT_FALSE(j.contains("usage"));  // only with include_usage
  ASSERT_EQ(j.at("choices").size(), 1u);
  const json& c = j["choices"][0];
  EXPECT_EQ(c.at("index"), 0);
  EXPECT_EQ(c.at("delta"), (json{{"role", "assistant"}, {"content", "Hel"}}));
  EXPECT_TRUE(c.at("finish_reason").is_null());
  EXPECT_TRUE(c.at("logprobs").is_null());
  EXPECT_FALSE(c.contains("text"));
}

TEST_F(ResponseTest, ChatFirstChunkWithoutTextHasEmptyContent) {
  const json j = parse(chunk_json(chat(), chat_id_, 0, true, "", {}, "", *tok_));
  EXPECT_EQ(j["choices"][0]["delta"], (json{{"role", "assistant"}, {"content", ""}}));
}

TEST_F(ResponseTest, ChatLaterChunks) {
  json j = parse(chunk_json(chat(), chat_id_, 2, /*first=*/false, "lo", {}, "", *tok_));
  EXPECT_EQ(j["choices"][0]["index"], 2);
  EXPECT_EQ(j["choices"][0]["delta"], (json{{"content", "lo"}}));
  EXPECT_TRUE(j["choices"][0]["finish_reason"].is_null());
  // The finish chunk: an empty delta and the reason.
  j = parse(chunk_json(chat(), chat_id_, 1, false, "", {}, "stop", *tok_));
  EXPECT_EQ(j["choices"][0]["index"], 1);
  EXPECT_EQ(j["choices"][0]["delta"], json::object());
  EXPECT_EQ(j["choices"][0]["finish_reason"], "stop");
  j = parse(chunk_json(chat(), chat_id_, 0, false, "", {}, "length", *tok_));
  EXPECT_EQ(j["choices"][0]["finish_reason"], "length");
  // A choice that finishes before any text: the role, no content.
  j = parse(chunk_json(chat(), chat_id_, 0, true, "", {}, "stop", *tok_));
  EXPECT_EQ(j["choices"][0]["delta"], (json{{"role", "assistant"}}));
  EXPECT_EQ(j["choices"][0]["finish_reason"], "stop");
}

TEST_F(ResponseTest, UsageNullInEveryChunkOnlyWithIncludeUsage) {
  GenerateRequest r = chat();
  r.stream = true;
  r.include_usage = true;
  for (const bool first : {true, false}) {
    for (const std::string finish : {"", "stop"}) {
      const json j = parse(chunk_json(r, chat_id_, 0, first, "x", {}, finish, *tok_));
      ASSERT_TRUE(j.contains("usage"));
      EXPECT_TRUE(j["usage"].is_null());
    }
  }
  GenerateRequest c = completion();
  c.stream = true;
  c.include_usage = true;
  json j = parse(chunk_json(c, cmpl_id_, 0, true, "x", {}, "", *tok_));
  ASSERT_TRUE(j.contains("usage"));
  EXPECT_TRUE(j["usage"].is_null());
  c.include_usage = false;
  j = parse(chunk_json(c, cmpl_id_, 0, true, "x", {}, "", *tok_));
  EXPECT_FALSE(j.contains("usage"));
}

TEST_F(ResponseTest, ChatChunkLogprobs) {
  GenerateRequest r = chat();
  r.top_logprobs = 1;
  json j = parse(chunk_json(r, chat_id_, 0, false, "hi", {engine::TokenLogprob{kHi, -0.5f, {{kHi, -0.5f}}}}, "",
                            *tok_));
  const json& lp = j["choices"][0]["logprobs"];
  ASSERT_TRUE(lp.is_object());
  EXPECT_TRUE(lp["refusal"].is_null());
  ASSERT_EQ(lp["content"].size(), 1u);
  EXPECT_EQ(lp["content"][0]["token"], "hi");
  EXPECT_EQ(lp["content"][0]["logprob"], -0.5);
  EXPECT_EQ(lp["content"][0]["bytes"], json::array({104, 105}));
  EXPECT_EQ(lp["content"][0]["top_logprobs"],
            json::array({json{{"token", "hi"}, {"logprob", -0.5}, {"bytes", {104, 105}}}}));
  // No logprobs in this chunk (a finish chunk): null even though they were asked for.
  j = parse(chunk_json(r, chat_id_, 0, false, "", {}, "stop", *tok_));
  EXPECT_TRUE(j["choices"][0]["logprobs"].is_null());
  // Not asked for: null even when the engine sent some.
  j = parse(chunk_json(chat(), chat_id_, 0, false, "hi", {engine::TokenLogprob{kHi, -0.5f, {}}}, "", *tok_));
  EXPECT_TRUE(j["choices"][0]["logprobs"].is_null());
}

TEST_F(ResponseTest, CompletionChunks) {
  GenerateRequest r = completion();
  json j = parse(chunk_json(r, cmpl_id_, 1, true, "hi", {}, "", *tok_));
  EXPECT_EQ(j.at("id"), "cmpl-xyz");
  EXPECT_EQ(j.at("object"), "text_completion");
  EXPECT_EQ(j.at("created"), 1700000001);
  const json& c = j["choices"][0];
  EXPECT_EQ(c.at("index"), 1);
  EXPECT_EQ(c.at("text"), "hi");
  EXPECT_TRUE(c.at("finish_reason").is_null());
  EXPECT_TRUE(c.at("logprobs").is_null());
  EXPECT_FALSE(c.contains("delta"));
  EXPECT_FALSE(j.contains("usage"));
  j = parse(chunk_json(r, cmpl_id_, 0, false, "", {}, "length", *tok_));
  EXPECT_EQ(j["choices"][0]["text"], "");
  EXPECT_EQ(j["choices"][0]["finish_reason"], "length");
}

TEST_F(ResponseTest, CompletionChunkEchoOnlyInFirstChunk) {
  GenerateRequest r = completion();
  r.echo = true;
  EXPECT_EQ(parse(chunk_json(r, cmpl_id_, 0, true, "hi", {}, "", *tok_))["choices"][0]["text"], "Say: hi");
  EXPECT_EQ(parse(chunk_json(r, cmpl_id_, 0, false, "lo", {}, "", *tok_))["choices"][0]["text"], "lo");
  r.prompt_text.clear();
  r.prompt_is_ids = true;
  r.prompt_ids = {'h', 'i'};
  EXPECT_EQ(parse(chunk_json(r, cmpl_id_, 0, true, "!", {}, "", *tok_))["choices"][0]["text"], "hi!");
}

TEST_F(ResponseTest, CompletionChunkLogprobs) {
  GenerateRequest r = completion();
  r.top_logprobs = 2;
  json j = parse(chunk_json(r, cmpl_id_, 0, true, "hilo", two_logprobs(), "", *tok_));
  const json& lp = j["choices"][0]["logprobs"];
  EXPECT_EQ(lp["tokens"], json::array({"hi", "lo"}));
  EXPECT_EQ(lp["token_logprobs"], json::array({-0.5, -0.25}));
  EXPECT_EQ(lp["top_logprobs"], json::array({json{{"hi", -0.5}, {"h", -1.25}}, json{{"lo", -0.25}, {"l", -2.0}}}));
  EXPECT_EQ(lp["text_offset"], json::array({0, 2}));
  // With echo the first chunk's offsets count the prompt it carries, as in the whole response.
  r.echo = true;
  j = parse(chunk_json(r, cmpl_id_, 0, true, "hilo", two_logprobs(), "", *tok_));
  EXPECT_EQ(j["choices"][0]["text"], "Say: hilo");
  EXPECT_EQ(j["choices"][0]["logprobs"]["text_offset"], json::array({5, 7}));
  // A later chunk continues after the prompt and the 4 token bytes already sent; no echo again.
  j = parse(chunk_json(r, cmpl_id_, 0, false, "hilo", two_logprobs(), "", *tok_, 4));
  EXPECT_EQ(j["choices"][0]["text"], "hilo");
  EXPECT_EQ(j["choices"][0]["logprobs"]["text_offset"], json::array({9, 11}));
  r.echo = false;
  j = parse(chunk_json(r, cmpl_id_, 0, false, "hilo", two_logprobs(), "", *tok_, 4));
  EXPECT_EQ(j["choices"][0]["logprobs"]["text_offset"], json::array({4, 6}));
}

TEST_F(ResponseTest, UsageChunk) {
  GenerateRequest r = chat();
  r.stream = true;
  r.include_usage = true;
  json j = parse(usage_chunk_json(r, chat_id_, Usage{12, 30, 8}));
  EXPECT_EQ(j.at("id"), "chatcmpl-abc123");
  EXPECT_EQ(j.at("object"), "chat.completion.chunk");
  EXPECT_EQ(j.at("created"), 1700000000);
  EXPECT_EQ(j.at("model"), "qwen-served");
  EXPECT_EQ(j.at("choices"), json::array());
  EXPECT_EQ(j.at("usage"), (json{{"prompt_tokens", 12},
                                 {"completion_tokens", 30},
                                 {"total_tokens", 42},
                                 {"prompt_tokens_details", {{"cached_tokens", 8}}}}));
  GenerateRequest c = completion();
  c.stream = true;
  c.include_usage = true;
  j = parse(usage_chunk_json(c, cmpl_id_, Usage{1, 2, 0}));
  EXPECT_EQ(j.at("object"), "text_completion");
  EXPECT_EQ(j.at("choices"), json::array());
  EXPECT_EQ(j["usage"]["total_tokens"], 3);
}

TEST_F(ResponseTest, ChunksAreOneLine) {
  // SSE needs the payload on one line: the JSON is compact and escapes newlines in text.
  const std::string s = chunk_json(chat(), chat_id_, 0, true, "a\nb\r\n", {}, "", *tok_);
  EXPECT_EQ(s.find('\n'), std::string::npos);
  EXPECT_EQ(s.find('\r'), std::string::npos);
  EXPECT_EQ(parse(s)["choices"][0]["delta"]["content"], "a\nb\r\n");
  const std::string framed = sse(s);
  EXPECT_EQ(framed, "data: " + s + "\n\n");
}

TEST_F(ResponseTest, ChunkWithPartialUtf8TextDoesNotThrow) {
  std::string s;
  ASSERT_NO_THROW(s = chunk_json(chat(), chat_id_, 0, false, std::string("\xe2\x82"), {}, "", *tok_));
  EXPECT_EQ(parse(s)["choices"][0]["delta"]["content"], "\xEF\xBF\xBD");
}

}  // namespace
}  // namespace sx::daemon::openai
