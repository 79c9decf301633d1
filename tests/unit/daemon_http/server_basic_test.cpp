// daemon/http Server: requests and responses on loopback — GET/POST, keep-alive, pipelining,
// chunked bodies, Connection: close and HTTP/1.0, routing fallbacks, HEAD, 100-continue and the
// 400 / 413 / 431 rejections.
#include <sys/socket.h>

#include <stdexcept>
#include <string>

#include <gtest/gtest.h>

#include "loop_harness.h"
#include "test_client.h"

namespace sx::daemon::http::testing {
namespace {

Router make_router() {
  Router r;
  EXPECT_TRUE(r.get("/hello", [](Request, ResponderPtr res) {
                 res->respond(200, {{"Content-Type", "text/plain"}}, "hello");
               }).ok());
  EXPECT_TRUE(r.post("/echo", [](Request req, ResponderPtr res) {
                 Headers h{{"X-Method", req.method}, {"X-Query", req.query}, {"X-Path", req.path},
                           {"X-Peer", req.peer}, {"X-Version", std::to_string(req.http_minor)}};
                 res->respond(200, std::move(h), std::move(req.body));
               }).ok());
  EXPECT_TRUE(r.get("/header", [](Request req, ResponderPtr res) {
                 res->respond(200, {}, std::string(req.headers.get("x-test").value_or("<none>")));
               }).ok());
  EXPECT_TRUE(r.get("/close", [](Request, ResponderPtr res) {
                 res->respond(200, {{"Connection", "close"}}, "bye");
               }).ok());
  EXPECT_TRUE(r.get("/throw", [](Request, ResponderPtr) { throw std::runtime_error("boom"); }).ok());
  EXPECT_TRUE(r.get("/large", [](Request, ResponderPtr res) {
                 res->respond(200, {}, std::string(4u << 20, 'L'));
               }).ok());
  EXPECT_TRUE(r.get("/empty", [](Request, ResponderPtr res) { res->respond(204, {}, "ignored"); }).ok());
  return r;
}

class ServerBasicTest : public ::testing::Test {
 protected:
  void start(ServerOptions options = {}, Router router = make_router()) {
    ASSERT_TRUE(h_.start_server(std::move(options), std::move(router)));
    ASSERT_NE(h_.port(), 0);
    h_.run();
  }
  void TearDown() override { h_.shutdown(); }
  LoopHarness h_;
};

TEST_F(ServerBasicTest, SimpleGetAndPost) {
  start();
  TestClient c(h_.port());
  ASSERT_TRUE(c.connected());
  ASSERT_TRUE(c.send(make_request("GET", "/hello")));
  auto r = c.read_response();
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 200);
  EXPECT_EQ(r->reason, "OK");
  EXPECT_EQ(r->body, "hello");
  EXPECT_EQ(r->header("Content-Length"), "5");
  EXPECT_EQ(r->header("Content-Type"), "text/plain");
  EXPECT_TRUE(r->has_header("Date"));
  EXPECT_FALSE(r->has_header("Connection"));  // HTTP/1.1 keep-alive is implicit

  ASSERT_TRUE(c.send(make_request("POST", "/echo?a=1&b=2", "{\"x\": 1}")));
  r = c.read_response();
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 200);
  EXPECT_EQ(r->body, "{\"x\": 1}");
  EXPECT_EQ(r->header("X-Method"), "POST");
  EXPECT_EQ(r->header("X-Path"), "/echo");
  EXPECT_EQ(r->header("X-Query"), "a=1&b=2");
  EXPECT_EQ(r->header("X-Peer").rfind("127.0.0.1:", 0), 0u);

  ASSERT_TRUE(c.send(make_request("GET", "/header", "", "X-TEST: Mixed Case\r\n")));
  r = c.read_response();
  ASSERT_TRUE(r);
  EXPECT_EQ(r->body, "Mixed Case");
  ServerStats s = h_.stats();
  EXPECT_EQ(s.requests, 3u);
  EXPECT_EQ(s.responses, 3u);
  EXPECT_EQ(s.accepted_connections, 1u);
}

TEST_F(ServerBasicTest, KeepAliveServesManyRequestsOnOneConnection) {
  start();
  TestClient c(h_.port());
  for (int i = 0; i < 20; ++i) {
    std::string body = "request-" + std::to_string(i);
    ASSERT_TRUE(c.send(make_request("POST", "/echo", body)));
    auto r = c.read_response();
    ASSERT_TRUE(r) << i;
    EXPECT_EQ(r->body, body);
  }
  ServerStats s = h_.stats();
  EXPECT_EQ(s.accepted_connections, 1u);
  EXPECT_EQ(s.requests, 20u);
  EXPECT_EQ(s.open_connections, 1u);
}

TEST_F(ServerBasicTest, PipelinedRequestsAreAnsweredInOrder) {
  start();
  TestClient c(h_.port());
  std::string batch;
  for (int i = 0; i < 10; ++i) batch += make_request("POST", "/echo?i=" + std::to_string(i), "body" + std::to_string(i));
  batch += make_request("GET", "/hello");
  ASSERT_TRUE(c.send(batch));  // one write: the server sees all requests at once
  for (int i = 0; i < 10; ++i) {
    auto r = c.read_response();
    ASSERT_TRUE(r) << i;
    EXPECT_EQ(r->body, "body" + std::to_string(i));
    EXPECT_EQ(r->header("X-Query"), "i=" + std::to_string(i));
  }
  auto last = c.read_response();
  ASSERT_TRUE(last);
  EXPECT_EQ(last->body, "hello");
  EXPECT_EQ(h_.stats().requests, 11u);
}

TEST_F(ServerBasicTest, ChunkedRequestBody) {
  start();
  TestClient c(h_.port());
  ASSERT_TRUE(c.send("POST /echo HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\n"
                     "5\r\nhello\r\n"));
  ASSERT_TRUE(c.send("6\r\n world\r\n"));
  ASSERT_TRUE(c.send("0\r\n\r\n"));
  auto r = c.read_response();
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 200);
  EXPECT_EQ(r->body, "hello world");
  // The connection is still usable.
  ASSERT_TRUE(c.send(make_request("GET", "/hello")));
  r = c.read_response();
  ASSERT_TRUE(r);
  EXPECT_EQ(r->body, "hello");
}

TEST_F(ServerBasicTest, ConnectionCloseFromClientAndFromHandler) {
  start();
  {
    TestClient c(h_.port());
    ASSERT_TRUE(c.send(make_request("GET", "/hello", "", "Connection: close\r\n")));
    auto r = c.read_response();
    ASSERT_TRUE(r);
    EXPECT_EQ(r->body, "hello");
    EXPECT_EQ(r->header("Connection"), "close");
    EXPECT_TRUE(c.wait_closed(2000));
  }
  {
    TestClient c(h_.port());
    ASSERT_TRUE(c.send(make_request("GET", "/close")));
    auto r = c.read_response();
    ASSERT_TRUE(r);
    EXPECT_EQ(r->body, "bye");
    EXPECT_EQ(r->header("Connection"), "close");
    EXPECT_TRUE(c.wait_closed(2000));
  }
  EXPECT_TRUE(wait_until([&] { return h_.stats().open_connections == 0; }));
}

TEST_F(ServerBasicTest, Http10ClosesUnlessKeepAliveIsAsked) {
  start();
  {
    TestClient c(h_.port());
    ASSERT_TRUE(c.send("POST /echo HTTP/1.0\r\nContent-Length: 3\r\n\r\nabc"));
    auto r = c.read_response();
    ASSERT_TRUE(r);
    EXPECT_EQ(r->body, "abc");
    EXPECT_EQ(r->header("X-Version"), "0");
    EXPECT_EQ(r->header("Connection"), "close");
    EXPECT_TRUE(c.wait_closed(2000));
  }
  {
    TestClient c(h_.port());
    ASSERT_TRUE(c.send("GET /hello HTTP/1.0\r\nConnection: keep-alive\r\n\r\n"));
    auto r = c.read_response();
    ASSERT_TRUE(r);
    EXPECT_EQ(r->header("Connection"), "keep-alive");
    ASSERT_TRUE(c.send("GET /hello HTTP/1.0\r\nConnection: keep-alive\r\n\r\n"));
    r = c.read_response();
    ASSERT_TRUE(r);
    EXPECT_EQ(r->body, "hello");
  }
}

TEST_F(ServerBasicTest, ClientHalfCloseStillReceivesTheWholeResponse) {
  start();
  for (const char* extra : {"", "Connection: close\r\n"}) {
    TestClient c(h_.port());
    ASSERT_TRUE(c.send(make_request("GET", "/large", "", extra)));
    ASSERT_EQ(::shutdown(c.fd(), SHUT_WR), 0);  // EOF right after the request
    auto r = c.read_response();
    ASSERT_TRUE(r) << extra;
    EXPECT_EQ(r->status, 200);
    EXPECT_EQ(r->body.size(), 4u << 20);
    EXPECT_TRUE(c.wait_closed(3000));
  }
}

TEST_F(ServerBasicTest, UnknownRouteWrongMethodHeadAndNoContent) {
  start();
  TestClient c(h_.port());
  ASSERT_TRUE(c.send(make_request("GET", "/nope")));
  auto r = c.read_response();
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 404);
  ASSERT_TRUE(c.send(make_request("DELETE", "/echo")));
  r = c.read_response();
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 405);
  EXPECT_EQ(r->header("Allow"), "POST");
  ASSERT_TRUE(c.send(make_request("HEAD", "/hello")));
  r = c.read_response(/*head_request=*/true);
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 200);
  EXPECT_EQ(r->header("Content-Length"), "5");
  ASSERT_TRUE(c.send(make_request("GET", "/empty")));
  r = c.read_response();
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 204);
  EXPECT_FALSE(r->has_header("Content-Length"));
  // Nothing stray was sent after the HEAD or 204 responses: the next response parses.
  ASSERT_TRUE(c.send(make_request("GET", "/hello")));
  r = c.read_response();
  ASSERT_TRUE(r);
  EXPECT_EQ(r->body, "hello");
}

TEST_F(ServerBasicTest, CustomNotFoundHandler) {
  Router router = make_router();
  router.set_not_found([](Request req, ResponderPtr res) {
    res->respond(404, {{"Content-Type", "application/json"}}, "{\"missing\":\"" + req.path + "\"}");
  });
  start({}, std::move(router));
  TestClient c(h_.port());
  ASSERT_TRUE(c.send(make_request("GET", "/v1/nothing")));
  auto r = c.read_response();
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 404);
  EXPECT_EQ(r->body, "{\"missing\":\"/v1/nothing\"}");
}

TEST_F(ServerBasicTest, HandlerExceptionBecomes500) {
  start();
  TestClient c(h_.port());
  ASSERT_TRUE(c.send(make_request("GET", "/throw")));
  auto r = c.read_response();
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 500);
  ASSERT_TRUE(c.send(make_request("GET", "/hello")));  // the connection survives
  r = c.read_response();
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 200);
}

TEST_F(ServerBasicTest, ExpectContinueGetsAnInterimResponse) {
  start();
  TestClient c(h_.port());
  ASSERT_TRUE(c.send("POST /echo HTTP/1.1\r\nHost: t\r\nContent-Length: 4\r\nExpect: 100-continue\r\n\r\n"));
  ASSERT_TRUE(wait_until([&] {
    return c.wait_closed(50) || c.buffered().find("\r\n\r\n") != std::string::npos;
  }));
  EXPECT_EQ(c.buffered(), "HTTP/1.1 100 Continue\r\n\r\n");
  ASSERT_TRUE(c.send("data"));
  auto r = c.read_response();
  ASSERT_TRUE(r);
  EXPECT_EQ(r->body, "data");
}

TEST_F(ServerBasicTest, AnnouncedBodyTooLargeIs413BeforeReadingIt) {
  ServerOptions o;
  o.max_body_bytes = 1024;
  start(o);
  TestClient c(h_.port());
  // Only the head is sent: the server must answer without waiting for 10 MB.
  ASSERT_TRUE(c.send("POST /echo HTTP/1.1\r\nHost: t\r\nContent-Length: 10485760\r\n\r\n"));
  auto r = c.read_response();
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 413);
  EXPECT_EQ(r->header("Connection"), "close");
  EXPECT_TRUE(c.wait_closed(3000));
  EXPECT_EQ(h_.stats().rejected_body_too_large, 1u);
  EXPECT_EQ(h_.stats().requests, 0u);
}

TEST_F(ServerBasicTest, ChunkedBodyTooLargeIs413) {
  ServerOptions o;
  o.max_body_bytes = 1024;
  start(o);
  TestClient c(h_.port());
  ASSERT_TRUE(c.send("POST /echo HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\n"));
  std::string chunk(600, 'x');
  ASSERT_TRUE(c.send("258\r\n" + chunk + "\r\n"));  // 0x258 = 600
  c.send("258\r\n" + chunk + "\r\n");               // may fail once the server closed
  auto r = c.read_response();
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 413);
  EXPECT_TRUE(c.wait_closed(3000));
  EXPECT_EQ(h_.stats().rejected_body_too_large, 1u);
}

TEST_F(ServerBasicTest, BodyAtTheLimitIsAccepted) {
  ServerOptions o;
  o.max_body_bytes = 1024;
  start(o);
  TestClient c(h_.port());
  std::string body(1024, 'b');
  ASSERT_TRUE(c.send(make_request("POST", "/echo", body)));
  auto r = c.read_response();
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 200);
  EXPECT_EQ(r->body, body);
}

TEST_F(ServerBasicTest, HeaderTooLargeIs431) {
  ServerOptions o;
  o.max_header_bytes = 1024;
  start(o);
  TestClient c(h_.port());
  ASSERT_TRUE(c.send(make_request("GET", "/hello", "", "X-Big: " + std::string(4000, 'h') + "\r\n")));
  auto r = c.read_response();
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 431);
  EXPECT_TRUE(c.wait_closed(3000));
  EXPECT_EQ(h_.stats().rejected_header_too_large, 1u);

  TestClient many(h_.port());  // many small headers count too
  std::string extra;
  for (int i = 0; i < 200; ++i) extra += "X-H" + std::to_string(i) + ": v\r\n";
  ASSERT_TRUE(many.send(make_request("GET", "/hello", "", extra)));
  r = many.read_response();
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 431);
}

TEST_F(ServerBasicTest, MalformedRequestIs400ThenClose) {
  start();
  for (const char* bad : {"GARBAGE\r\n\r\n", "GET /hello HTTP/9.9\r\n\r\n",
                          "GET /hello HTTP/1.1\r\nBad Header Without Colon\r\n\r\n",
                          "POST /echo HTTP/1.1\r\nContent-Length: 3\r\nContent-Length: 4\r\n\r\nabcd"}) {
    TestClient c(h_.port());
    ASSERT_TRUE(c.send(bad));
    auto r = c.read_response();
    ASSERT_TRUE(r) << bad;
    EXPECT_EQ(r->status, 400) << bad;
    EXPECT_EQ(r->header("Connection"), "close");
    EXPECT_TRUE(c.wait_closed(3000)) << bad;
  }
  EXPECT_EQ(h_.stats().rejected_bad_request, 4u);
  EXPECT_EQ(h_.stats().requests, 0u);
}

TEST_F(ServerBasicTest, ValidRequestsBeforeAMalformedOneAreAnswered) {
  start();
  TestClient c(h_.port());
  ASSERT_TRUE(c.send(make_request("GET", "/hello") + "NOT HTTP AT ALL\r\n\r\n"));
  auto r = c.read_response();
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 200);
  r = c.read_response();
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 400);
  EXPECT_TRUE(c.wait_closed(3000));
}

}  // namespace
}  // namespace sx::daemon::http::testing
