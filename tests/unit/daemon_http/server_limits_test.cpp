// daemon/http Server: timeouts (slow-loris headers, slow body, silent and idle keep-alive
// connections, a client that stops reading), max_connections, start failures and stop().
#include <sys/socket.h>

#include <chrono>
#include <memory>
#include <string>

#include <gtest/gtest.h>

#include "loop_harness.h"
#include "test_client.h"

namespace sx::daemon::http::testing {
namespace {

using Clock = std::chrono::steady_clock;

long ms_since(Clock::time_point t) {
  return static_cast<long>(std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - t).count());
}

Router hello_router() {
  Router r;
  EXPECT_TRUE(r.get("/hello", [](Request, ResponderPtr res) { res->respond(200, {}, "hello"); }).ok());
  EXPECT_TRUE(r.get("/big", [](Request, ResponderPtr res) {
                 res->respond(200, {}, std::string(64u << 20, 'z'));
               }).ok());
  return r;
}

class ServerLimitsTest : public ::testing::Test {
 protected:
  void start(ServerOptions options, Router router = hello_router()) {
    ASSERT_TRUE(h_.start_server(std::move(options), std::move(router)));
    h_.run();
  }
  void TearDown() override { h_.shutdown(); }
  LoopHarness h_;
};

TEST_F(ServerLimitsTest, SlowLorisHeadersGet408) {
  ServerOptions o;
  o.header_timeout_ms = 200;
  start(o);
  TestClient c(h_.port());
  auto t0 = Clock::now();
  ASSERT_TRUE(c.send("GET /hello HTTP/1.1\r\nHost: t\r\n"));
  bool closed = false;
  // One header byte every 30 ms: each read is "progress", but the deadline covers the whole head.
  for (int i = 0; i < 100 && !closed; ++i) {
    c.send("X");
    closed = c.wait_closed(30);
  }
  ASSERT_TRUE(closed) << "the server never closed a slow-loris connection";
  long elapsed = ms_since(t0);
  EXPECT_GE(elapsed, 150);
  EXPECT_LT(elapsed, 2000);
  auto r = c.read_response();
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 408);
  EXPECT_EQ(h_.stats().header_timeouts, 1u);
  EXPECT_EQ(h_.stats().requests, 0u);
}

TEST_F(ServerLimitsTest, SlowBodyGets408) {
  ServerOptions o;
  o.body_timeout_ms = 200;
  start(o);
  TestClient c(h_.port());
  auto t0 = Clock::now();
  ASSERT_TRUE(c.send("POST /hello HTTP/1.1\r\nHost: t\r\nContent-Length: 100\r\n\r\n0123456789"));
  ASSERT_TRUE(c.wait_closed(3000));
  EXPECT_GE(ms_since(t0), 150);
  auto r = c.read_response();
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 408);
  EXPECT_EQ(h_.stats().body_timeouts, 1u);
}

TEST_F(ServerLimitsTest, SilentConnectionIsClosedWithoutAResponse) {
  ServerOptions o;
  o.header_timeout_ms = 200;
  start(o);
  TestClient c(h_.port());
  auto t0 = Clock::now();
  ASSERT_TRUE(c.wait_closed(3000));
  EXPECT_GE(ms_since(t0), 150);
  EXPECT_TRUE(c.buffered().empty());
  EXPECT_EQ(h_.stats().idle_timeouts, 1u);
}

TEST_F(ServerLimitsTest, IdleKeepAliveConnectionIsClosed) {
  ServerOptions o;
  o.keepalive_timeout_ms = 200;
  start(o);
  TestClient c(h_.port());
  ASSERT_TRUE(c.send(make_request("GET", "/hello")));
  ASSERT_TRUE(c.read_response());
  auto t0 = Clock::now();
  ASSERT_TRUE(c.wait_closed(3000));
  EXPECT_GE(ms_since(t0), 150);
  EXPECT_TRUE(c.buffered().empty());
  EXPECT_EQ(h_.stats().idle_timeouts, 1u);
  EXPECT_TRUE(wait_until([&] { return h_.stats().open_connections == 0; }));
}

TEST_F(ServerLimitsTest, KeepAliveDeadlineRestartsAfterEachResponse) {
  ServerOptions o;
  o.keepalive_timeout_ms = 300;
  start(o);
  TestClient c(h_.port());
  for (int i = 0; i < 6; ++i) {  // 6 x 100 ms > 300 ms in total
    ASSERT_TRUE(c.send(make_request("GET", "/hello")));
    ASSERT_TRUE(c.read_response()) << i;
    EXPECT_FALSE(c.wait_closed(100)) << i;
  }
  EXPECT_EQ(h_.stats().idle_timeouts, 0u);
}

TEST_F(ServerLimitsTest, ClientThatStopsReadingIsDisconnected) {
  ServerOptions o;
  o.write_timeout_ms = 300;
  start(o);
  TestClient c(h_.port());
  int small = 4096;
  ::setsockopt(c.fd(), SOL_SOCKET, SO_RCVBUF, &small, sizeof(small));
  ASSERT_TRUE(c.send(make_request("GET", "/big")));  // 64 MiB that nobody reads
  EXPECT_TRUE(wait_until([&] { return h_.stats().write_timeouts == 1; }, 5000));
  EXPECT_TRUE(wait_until([&] { return h_.stats().open_connections == 0; }));
}

TEST_F(ServerLimitsTest, MaxConnectionsRejectsTheExcessWith503) {
  ServerOptions o;
  o.max_connections = 2;
  start(o);
  TestClient a(h_.port());
  TestClient b(h_.port());
  for (TestClient* c : {&a, &b}) {
    ASSERT_TRUE(c->send(make_request("GET", "/hello")));
    ASSERT_TRUE(c->read_response());
  }
  TestClient over(h_.port());
  ASSERT_TRUE(over.connected());
  auto r = over.read_response();
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 503);
  EXPECT_EQ(r->header("Connection"), "close");
  EXPECT_TRUE(over.wait_closed(3000));
  EXPECT_EQ(h_.stats().rejected_over_capacity, 1u);
  EXPECT_EQ(h_.stats().open_connections, 2u);

  a.close();  // a slot frees up
  ASSERT_TRUE(wait_until([&] { return h_.stats().open_connections == 1; }));
  TestClient next(h_.port());
  ASSERT_TRUE(next.send(make_request("GET", "/hello")));
  r = next.read_response();
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 200);
}

TEST_F(ServerLimitsTest, StartFailsCleanlyOnABusyPortAndABadHost) {
  start(ServerOptions{});
  ServerOptions same;
  same.port = h_.port();
  auto busy = h_.call([&] { return Server::start(h_.loop(), same, hello_router()).status(); });
  EXPECT_EQ(busy.code(), StatusCode::kUnavailable) << busy.to_string();
  EXPECT_NE(busy.message().find("EADDRINUSE"), std::string::npos) << busy.to_string();
  ServerOptions bad;
  bad.host = "not-an-ip";
  auto host = h_.call([&] { return Server::start(h_.loop(), bad, hello_router()).status(); });
  EXPECT_EQ(host.code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(host.message(), "http.host: 'not-an-ip' is not an IPv4 or IPv6 address");  // the config key
  // TearDown's uv_loop_close() == 0 proves the failed servers' handles were freed.
}

TEST_F(ServerLimitsTest, StopClosesIdleAndHalfSentConnections) {
  start(ServerOptions{});
  TestClient served(h_.port());
  ASSERT_TRUE(served.send(make_request("GET", "/hello")));
  ASSERT_TRUE(served.read_response());
  TestClient silent(h_.port());
  TestClient partial(h_.port());
  ASSERT_TRUE(partial.send("GET /hello HTTP/1.1\r\nHost"));
  ASSERT_TRUE(wait_until([&] { return h_.stats().open_connections == 3; }));
  auto t0 = Clock::now();
  h_.shutdown();  // checks on_stopped ran and uv_loop_close() == 0
  EXPECT_LT(ms_since(t0), 2000);
  EXPECT_TRUE(served.wait_closed(1000));
  EXPECT_TRUE(silent.wait_closed(1000));
  EXPECT_TRUE(partial.wait_closed(1000));
  TestClient late(h_.port());
  EXPECT_FALSE(late.connected() && late.send(make_request("GET", "/hello")) && late.read_response());
}

// A hand-over (another process now accepts on the same socket): an idle keep-alive connection
// closes at once, but a connection just accepted and one with half a request are answered, then
// closed, instead of being reset with their bytes unread.
TEST_F(ServerLimitsTest, StopForAHandOverAnswersTheRequestsOnTheirWay) {
  start(ServerOptions{});
  TestClient served(h_.port());
  ASSERT_TRUE(served.send(make_request("GET", "/hello")));
  ASSERT_TRUE(served.read_response());
  TestClient fresh(h_.port());
  TestClient partial(h_.port());
  ASSERT_TRUE(partial.send("GET /hello HTTP/1.1\r\nHost"));
  ASSERT_TRUE(wait_until([&] { return h_.stats().open_connections == 3; }));
  h_.begin_stop(Server::kNoGraceLimit, Server::StopMode::kFinishArriving);
  EXPECT_TRUE(served.wait_closed(1000));
  EXPECT_FALSE(fresh.wait_closed(200));
  ASSERT_TRUE(fresh.send(make_request("GET", "/hello")));
  auto a = fresh.read_response();
  ASSERT_TRUE(a);
  EXPECT_EQ(a->status, 200);
  EXPECT_EQ(a->header("Connection"), "close");
  ASSERT_TRUE(partial.send(": x\r\n\r\n"));
  auto b = partial.read_response();
  ASSERT_TRUE(b);
  EXPECT_EQ(b->status, 200);
  EXPECT_TRUE(fresh.wait_closed(1000));
  EXPECT_TRUE(partial.wait_closed(1000));
  h_.shutdown();
}

TEST_F(ServerLimitsTest, StopLetsAResponseInProgressFinish) {
  auto held = std::make_shared<ResponderPtr>();  // loop thread only
  Router r;
  ASSERT_TRUE(r.get("/wait", [held](Request, ResponderPtr res) { *held = std::move(res); }).ok());
  start(ServerOptions{}, std::move(r));
  TestClient c(h_.port());
  ASSERT_TRUE(c.send(make_request("GET", "/wait")));
  ASSERT_TRUE(wait_until([&] { return h_.stats().requests == 1; }));
  h_.begin_stop();
  // Stopping: no new connections are accepted.
  ASSERT_TRUE(wait_until([&] {
    TestClient probe(h_.port(), 200);
    return !probe.connected() || probe.wait_closed(200);
  }));
  EXPECT_FALSE(c.wait_closed(100));  // the busy connection stays
  h_.post([held] {
    EXPECT_TRUE((*held)->respond(200, {}, "late"));
    held->reset();
  });
  auto resp = c.read_response();
  ASSERT_TRUE(resp);
  EXPECT_EQ(resp->body, "late");
  EXPECT_EQ(resp->header("Connection"), "close");
  EXPECT_TRUE(c.wait_closed(2000));
}

TEST_F(ServerLimitsTest, StopGracePeriodForceClosesUnansweredRequests) {
  auto held = std::make_shared<ResponderPtr>();
  auto closes = std::make_shared<int>(0);
  Router r;
  ASSERT_TRUE(r.get("/never", [held, closes](Request, ResponderPtr res) {
                 res->on_close([closes] { ++*closes; });
                 *held = std::move(res);
               }).ok());
  start(ServerOptions{}, std::move(r));
  TestClient c(h_.port());
  ASSERT_TRUE(c.send(make_request("GET", "/never")));
  ASSERT_TRUE(wait_until([&] { return h_.stats().requests == 1; }));
  h_.at_shutdown([held] { held->reset(); });
  auto t0 = Clock::now();
  h_.begin_stop(/*grace_ms=*/100);
  EXPECT_TRUE(c.wait_closed(3000));
  EXPECT_GE(ms_since(t0), 50);
  EXPECT_EQ(h_.stats().client_disconnects, 1u);
  h_.shutdown();
  EXPECT_EQ(*closes, 1);
}

}  // namespace
}  // namespace sx::daemon::http::testing
