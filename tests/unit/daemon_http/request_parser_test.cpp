// daemon/http RequestParser: the RFC 9112 message rules llhttp leaves to its user (Host, obs-fold,
// Transfer-Encoding), the limits, and that where a read splits the bytes changes nothing.
#include "daemon/http/request_parser.h"

#include <string>
#include <vector>

#include <gtest/gtest.h>

namespace sx::daemon::http::testing {
namespace {

struct Outcome {
  RequestParser::Result result = RequestParser::Result::kNeedMore;
  int status = 0;
  std::vector<Request> requests;
  int begins = 0, heads = 0;
};

class Recorder final : public RequestParser::Listener {
 public:
  void on_request_begin() override { ++begins; }
  void on_request_head(const Request&, bool) override { ++heads; }
  int begins = 0, heads = 0;
};

// Feeds `wire` in pieces of `step` bytes (0: all at once), like reads of a connection.
Outcome parse(const std::string& wire, size_t step = 0, RequestParser::Limits limits = {}) {
  Recorder rec;
  RequestParser p(limits, &rec);
  Outcome out;
  std::string pending;
  size_t fed = 0;
  while (fed < wire.size() || !pending.empty()) {
    if (fed < wire.size()) {
      const size_t n = step == 0 ? wire.size() - fed : std::min(step, wire.size() - fed);
      pending.append(wire, fed, n);
      fed += n;
    }
    size_t used = 0;
    out.result = p.feed(pending.data(), pending.size(), &used);
    pending.erase(0, used);
    if (out.result == RequestParser::Result::kComplete) {
      out.requests.push_back(p.take());
      continue;
    }
    if (out.result == RequestParser::Result::kError) {
      out.status = p.error_status();
      EXPECT_FALSE(p.error_reason().empty());
      break;
    }
    if (fed == wire.size()) break;  // kNeedMore and nothing left to feed
  }
  out.begins = rec.begins;
  out.heads = rec.heads;
  return out;
}

TEST(RequestParser, ParsesPipelinedRequestsTheSameWhateverTheReadSizes) {
  const std::string wire =
      "POST /v1/completions?x=1 HTTP/1.1\r\nHost: a\r\nContent-Length: 5\r\n\r\nhello"
      "POST /c HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n2\r\nde\r\n0\r\n\r\n"
      "GET /h HTTP/1.0\r\n\r\n";
  for (size_t step : {0, 1, 2, 3, 7, 64}) {
    Outcome o = parse(wire, step);
    ASSERT_EQ(o.requests.size(), 3u) << "step " << step;
    EXPECT_EQ(o.status, 0);
    EXPECT_EQ(o.requests[0].method, "POST");
    EXPECT_EQ(o.requests[0].path, "/v1/completions");
    EXPECT_EQ(o.requests[0].query, "x=1");
    EXPECT_EQ(o.requests[0].body, "hello");
    EXPECT_EQ(o.requests[1].body, "abcde");
    EXPECT_EQ(o.requests[2].http_minor, 0);  // HTTP/1.0 needs no Host
    EXPECT_FALSE(o.requests[2].keep_alive);
    EXPECT_EQ(o.begins, 3);
    EXPECT_EQ(o.heads, 3);
  }
}

TEST(RequestParser, Http11WithoutExactlyOneHostIs400) {
  EXPECT_EQ(parse("GET / HTTP/1.1\r\n\r\n").status, 400);
  EXPECT_EQ(parse("GET / HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n").status, 400);
  EXPECT_EQ(parse("GET / HTTP/1.0\r\nHost: a\r\nHost: b\r\n\r\n").status, 400);
  EXPECT_EQ(parse("GET / HTTP/1.1\r\nhOST: a\r\n\r\n").requests.size(), 1u);
}

TEST(RequestParser, ObsFoldIs400InEveryReadSplitButASplitValueIsFine) {
  const std::string folded = "GET / HTTP/1.1\r\nHost: a\r\nX-Long: first\r\n  second\r\n\r\n";
  const std::string tabbed = "GET / HTTP/1.1\r\nHost: a\r\nX-Long: first\r\n\tsecond\r\n\r\n";
  for (size_t step : {0, 1, 2, 3, 5, 31, 32, 33, 34}) {
    EXPECT_EQ(parse(folded, step).status, 400) << "step " << step;
    EXPECT_EQ(parse(tabbed, step).status, 400) << "step " << step;
    Outcome plain = parse("GET / HTTP/1.1\r\nHost: a\r\nX-Long: first  second\r\n\r\n", step);
    ASSERT_EQ(plain.requests.size(), 1u) << "step " << step;
    EXPECT_EQ(plain.requests[0].headers.get("X-Long"), "first  second");
  }
}

TEST(RequestParser, TransferEncodingMustBeChunkedAlone) {
  const std::string body = "\r\n\r\n0\r\n\r\n";
  EXPECT_EQ(parse("POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: gzip, chunked" + body).status, 501);
  EXPECT_EQ(parse("POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: gzip\r\nTransfer-Encoding: chunked" + body).status,
            501);
  EXPECT_EQ(parse("POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked, gzip" + body).status, 400);
  EXPECT_EQ(parse("POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: gzip" + body).status, 400);
  EXPECT_EQ(parse("POST / HTTP/1.0\r\nTransfer-Encoding: chunked" + body).status, 400);
  EXPECT_EQ(parse("POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\nContent-Length: 1" + body).status, 400);
  Outcome ok = parse("POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: Chunked" + body);
  ASSERT_EQ(ok.requests.size(), 1u);
  EXPECT_EQ(ok.requests[0].body, "");
}

TEST(RequestParser, LimitsGive431And413) {
  RequestParser::Limits small{256, 8};
  EXPECT_EQ(parse("GET / HTTP/1.1\r\nHost: a\r\nX: " + std::string(300, 'v') + "\r\n\r\n", 0, small).status, 431);
  Outcome announced = parse("POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 9\r\n\r\n", 0, small);
  EXPECT_EQ(announced.status, 413);
  EXPECT_EQ(announced.heads, 0) << "refused before the head is handed on";
  EXPECT_EQ(parse("POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nabcde\r\n5\r\nfghij\r\n0\r\n\r\n",
                  0, small)
                .status,
            413);
  EXPECT_EQ(parse("POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 8\r\n\r\n12345678", 0, small).requests.size(), 1u);
}

TEST(RequestParser, JsonBodiesBeyondTheBoundsAre400BeforeTheRestArrives) {
  RequestParser::Limits limits;
  limits.max_json_depth = 4;
  limits.max_json_values = 10;
  auto post = [](std::string_view type, const std::string& body, bool announce = true) {
    std::string head = "POST / HTTP/1.1\r\nHost: a\r\n";
    if (!type.empty()) head += "Content-Type: " + std::string(type) + "\r\n";
    return head + "Content-Length: " + std::to_string(announce ? body.size() : body.size() + 1000) + "\r\n\r\n" + body;
  };
  for (size_t step : {0, 1, 7}) {
    EXPECT_EQ(parse(post("", "[[[[1]]]]"), step, limits).requests.size(), 1u);
    EXPECT_EQ(parse(post("application/json", "[[[[[1]]]]]"), step, limits).status, 400);
    EXPECT_EQ(parse(post("application/json; charset=utf-8", "[1,2,3,4,5,6,7,8,9]"), step, limits).requests.size(), 1u);
    EXPECT_EQ(parse(post("application/vnd.x+json", "[1,2,3,4,5,6,7,8,9,10]"), step, limits).status, 400);
    EXPECT_EQ(parse(post("", "{\"a\": \"[[[[[[,,,,,,,,,,,]\"}"), step, limits).requests.size(), 1u) << "inside a string";
    EXPECT_EQ(parse(post("text/plain", "[[[[[[[[[[,,,,,,,,,,,,]"), step, limits).requests.size(), 1u);
    // Refused while the body is still arriving: 995 bytes of the announced length never come.
    EXPECT_EQ(parse(post("", std::string(5, '['), /*announce=*/false), step, limits).status, 400);
  }
}

TEST(RequestParser, FieldValuesLoseTheirTrailingWhitespace) {
  for (size_t step : {0, 1, 4}) {
    Outcome o = parse("POST / HTTP/1.1\r\nHost: a \t\r\nTransfer-Encoding: chunked \r\nX-Y:  v w\t \r\n\r\n"
                      "2\r\nab\r\n0\r\n\r\n", step);
    ASSERT_EQ(o.requests.size(), 1u) << "step " << step;
    EXPECT_EQ(o.requests[0].headers.get("Host"), "a");
    EXPECT_EQ(o.requests[0].headers.get("Transfer-Encoding"), "chunked");
    EXPECT_EQ(o.requests[0].headers.get("X-Y"), "v w");
    EXPECT_EQ(o.requests[0].body, "ab");
  }
}

TEST(RequestParser, TrailerFieldsAreCountedButNotMergedIntoTheHeaders) {
  const std::string head = "POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\n";
  for (size_t step : {0, 1, 5}) {
    Outcome o = parse(head + "Host: b\r\nX-Trailer: t\r\n\r\n", step);
    ASSERT_EQ(o.requests.size(), 1u) << "step " << step;
    EXPECT_EQ(o.requests[0].body, "abc");
    EXPECT_EQ(o.requests[0].headers.get_all("Host").size(), 1u) << "a trailer Host would be a second one";
    EXPECT_FALSE(o.requests[0].headers.get("X-Trailer").has_value());
    // Trailer bytes count against the header limit as header bytes do.
    EXPECT_EQ(parse(head + "X: " + std::string(300, 'v') + "\r\n\r\n", step, {256, 64}).status, 431) << "step " << step;
  }
}

TEST(RequestParser, TheFirstLimitReachedInTheBytesDecidesWhateverTheReadSizes) {
  // More than 3 values within the first 8 bytes (the body limit): the JSON bound is met first
  // (400), also when one read carries the body past the size limit; values past byte 8: 413.
  RequestParser::Limits limits{1024, 8, 0, 3};
  const std::string chunked = "POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n";
  for (size_t step : {0, 1, 3, 60, 70}) {
    EXPECT_EQ(parse(chunked + "c\r\n[1,2,3,4,5,6\r\n0\r\n\r\n", step, limits).status, 400) << "step " << step;
    EXPECT_EQ(parse(chunked + "c\r\n[1,      2,3\r\n0\r\n\r\n", step, limits).status, 413) << "step " << step;
  }
}

TEST(RequestParser, AfterAnErrorNothingMoreIsParsed) {
  Recorder rec;
  RequestParser p({}, &rec);
  const std::string bad = "GET / HTTP/1.1\r\n\r\n";
  size_t used = 0;
  EXPECT_EQ(p.feed(bad.data(), bad.size(), &used), RequestParser::Result::kError);
  const std::string good = "GET / HTTP/1.1\r\nHost: a\r\n\r\n";
  EXPECT_EQ(p.feed(good.data(), good.size(), &used), RequestParser::Result::kError);
  EXPECT_EQ(used, 0u);
}

}  // namespace
}  // namespace sx::daemon::http::testing
