// daemon/http pure pieces: Headers, response heads, Router matching, ServerOptions validation.
#include <gtest/gtest.h>

#include "daemon/http/headers.h"
#include "daemon/http/response_head.h"
#include "daemon/http/router.h"
#include "daemon/http/server_options.h"

namespace sx::daemon::http {
namespace {

TEST(Headers, CaseInsensitiveLookupKeepsOrderAndSpelling) {
  Headers h;
  h.add("Content-Type", "application/json");
  h.add("X-Multi", "a");
  h.add("x-multi", "b");
  EXPECT_EQ(h.get("content-type").value_or(""), "application/json");
  EXPECT_EQ(h.get("CONTENT-TYPE").value_or(""), "application/json");
  EXPECT_FALSE(h.get("Content-Length").has_value());
  ASSERT_EQ(h.get_all("X-MULTI").size(), 2u);
  EXPECT_EQ(h.get_all("X-MULTI")[1], "b");
  EXPECT_EQ(h.begin()->first, "Content-Type");
  h.set("X-Multi", "c");
  EXPECT_EQ(h.get_all("x-multi").size(), 1u);
  EXPECT_EQ(h.remove("X-MULTI"), 1u);
  EXPECT_EQ(h.size(), 1u);
}

TEST(Headers, TokenListsAcrossFields) {
  Headers h{{"Connection", "keep-alive, Upgrade"}, {"connection", " Close "}};
  EXPECT_TRUE(h.has_token("Connection", "close"));
  EXPECT_TRUE(h.has_token("connection", "upgrade"));
  EXPECT_FALSE(h.has_token("Connection", "keep"));
  EXPECT_TRUE(iequals("Keep-Alive", "keep-alive"));
  EXPECT_FALSE(iequals("Keep-Alive", "keep-alive2"));
}

TEST(ResponseHead, ServerOwnsFramingAndDropsUnsafeFields) {
  Headers h{{"Content-Type", "text/plain"},
            {"Content-Length", "999"},
            {"Transfer-Encoding", "gzip"},
            {"Connection", "keep-alive"},
            {"X-Evil", "a\r\nSet-Cookie: x=1"},
            {"X-Ok", "fine"}};
  HeadFraming f;
  f.content_length = 5;
  f.keep_alive = false;
  f.date = "Sun, 06 Nov 1994 08:49:37 GMT";
  std::string head = build_response_head(404, h, f);
  EXPECT_EQ(head.rfind("HTTP/1.1 404 Not Found\r\n", 0), 0u);
  EXPECT_NE(head.find("Content-Type: text/plain\r\n"), std::string::npos);
  EXPECT_NE(head.find("Content-Length: 5\r\n"), std::string::npos);
  EXPECT_EQ(head.find("999"), std::string::npos);
  EXPECT_EQ(head.find("gzip"), std::string::npos);
  EXPECT_EQ(head.find("Set-Cookie"), std::string::npos);
  EXPECT_NE(head.find("X-Ok: fine\r\n"), std::string::npos);
  EXPECT_NE(head.find("Connection: close\r\n"), std::string::npos);
  EXPECT_NE(head.find("Date: Sun, 06 Nov 1994 08:49:37 GMT\r\n"), std::string::npos);
  EXPECT_EQ(head.substr(head.size() - 4), "\r\n\r\n");

  HeadFraming chunked;
  chunked.chunked = true;
  chunked.http10_client = true;
  std::string s = build_response_head(200, {}, chunked);
  EXPECT_NE(s.find("Transfer-Encoding: chunked\r\n"), std::string::npos);
  EXPECT_NE(s.find("Connection: keep-alive\r\n"), std::string::npos);
  EXPECT_EQ(s.find("Content-Length"), std::string::npos);
}

TEST(ResponseHead, ReasonsAndDate) {
  EXPECT_EQ(status_reason(200), "OK");
  EXPECT_EQ(status_reason(431), "Request Header Fields Too Large");
  EXPECT_EQ(status_reason(799), "Unknown");
  EXPECT_TRUE(status_has_no_body(204));
  EXPECT_TRUE(status_has_no_body(101));
  EXPECT_FALSE(status_has_no_body(200));
  std::string d = http_date();
  EXPECT_EQ(d.size(), 29u) << d;
  EXPECT_EQ(d.substr(d.size() - 4), " GMT");
}

TEST(Router, MatchesExactPathsAndMethods) {
  Router r;
  Handler h = [](Request, ResponderPtr) {};
  ASSERT_TRUE(r.get("/v1/models", h).ok());
  ASSERT_TRUE(r.post("/v1/models", h).ok());
  ASSERT_TRUE(r.post("/v1/chat/completions", h).ok());
  EXPECT_EQ(r.add("POST", "/v1/chat/completions", h).code(), StatusCode::kAlreadyExists);
  EXPECT_EQ(r.add("GET", "nope", h).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(r.add("", "/x", h).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(r.add("GET", "/x", nullptr).code(), StatusCode::kInvalidArgument);

  const Handler* found = nullptr;
  std::string allow;
  EXPECT_EQ(r.match("GET", "/v1/models", &found, &allow), Router::Match::kFound);
  EXPECT_NE(found, nullptr);
  EXPECT_EQ(r.match("HEAD", "/v1/models", &found, &allow), Router::Match::kFound);  // GET route
  EXPECT_EQ(r.match("DELETE", "/v1/models", &found, &allow), Router::Match::kMethodNotAllowed);
  EXPECT_EQ(allow, "GET, POST");
  EXPECT_EQ(r.match("GET", "/v1/models/", &found, &allow), Router::Match::kNotFound);
  EXPECT_EQ(r.match("get", "/v1/models", &found, &allow), Router::Match::kMethodNotAllowed);
  EXPECT_EQ(r.match("HEAD", "/v1/chat/completions", &found, &allow), Router::Match::kMethodNotAllowed);
}

TEST(ServerOptions, ValidateNamesTheField) {
  ServerOptions o;
  EXPECT_TRUE(o.validate().ok());
  o.max_connections = 0;
  EXPECT_NE(o.validate().message().find("max_connections"), std::string::npos);
  o = ServerOptions{};
  o.header_timeout_ms = 0;
  EXPECT_NE(o.validate().message().find("header_timeout_ms"), std::string::npos);
  o = ServerOptions{};
  o.host = "";
  EXPECT_EQ(o.validate().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(o.validate().message(), "http.host: empty");  // the config key, not "server.host"
}

}  // namespace
}  // namespace sx::daemon::http
