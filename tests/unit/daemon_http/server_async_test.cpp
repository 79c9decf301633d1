// daemon/http Server with handlers that answer later: results from another thread through
// loop::AsyncQueue, streamed (chunked / SSE) responses, client disconnects mid-stream, and 200
// concurrent keep-alive connections.
#include <sys/socket.h>

#include <condition_variable>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <gtest/gtest.h>

#include "daemon/loop/async_queue.h"
#include "loop_harness.h"
#include "test_client.h"

namespace sx::daemon::http::testing {
namespace {

// A stand-in for an engine thread: takes jobs, works off the loop, replies via an AsyncQueue.
struct Reply {
  ResponderPtr responder;
  std::string body;
};

class Worker {
 public:
  explicit Worker(loop::AsyncQueue<Reply>::Sender replies) : replies_(std::move(replies)) {
    thread_ = std::thread([this] { run(); });
  }
  ~Worker() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      done_ = true;
    }
    cv_.notify_all();
    thread_.join();
  }
  void submit(ResponderPtr r, std::string body) {  // loop thread
    {
      std::lock_guard<std::mutex> lock(mu_);
      jobs_.push_back({std::move(r), std::move(body)});
    }
    cv_.notify_one();
  }

 private:
  void run() {
    std::unique_lock<std::mutex> lock(mu_);
    for (;;) {
      cv_.wait(lock, [&] { return done_ || !jobs_.empty(); });
      if (jobs_.empty()) return;
      Reply job = std::move(jobs_.front());
      jobs_.pop_front();
      lock.unlock();
      std::this_thread::sleep_for(std::chrono::milliseconds(20));  // "compute"
      replies_.push({std::move(job.responder), "processed:" + job.body});
      lock.lock();
    }
  }

  loop::AsyncQueue<Reply>::Sender replies_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Reply> jobs_;
  bool done_ = false;
  std::thread thread_;
};

class ServerAsyncTest : public ::testing::Test {
 protected:
  void TearDown() override { h_.shutdown(); }
  LoopHarness h_;
};

TEST_F(ServerAsyncTest, ResponsesComputedOnAnotherThreadArriveThroughAnAsyncQueue) {
  auto replies = loop::AsyncQueue<Reply>::create(h_.loop(), [](Reply r) {
    EXPECT_TRUE(r.responder->respond(200, {{"Content-Type", "text/plain"}}, std::move(r.body)));
  });
  ASSERT_TRUE(replies.ok());
  std::shared_ptr<loop::AsyncQueue<Reply>> queue = std::move(replies).value();
  auto worker = std::make_shared<Worker>(queue->sender());
  Router router;
  ASSERT_TRUE(router.post("/work", [worker](Request req, ResponderPtr res) {
                      worker->submit(std::move(res), std::move(req.body));
                    }).ok());
  ASSERT_TRUE(router.get("/now", [](Request, ResponderPtr res) { res->respond(200, {}, "now"); }).ok());
  ASSERT_TRUE(h_.start_server(ServerOptions{}, std::move(router)));
  h_.at_shutdown([queue] { queue->close(); });
  h_.run();

  // Many connections at once: replies coalesce in the queue and are all delivered.
  std::vector<std::unique_ptr<TestClient>> clients;
  for (int i = 0; i < 20; ++i) {
    clients.push_back(std::make_unique<TestClient>(h_.port()));
    ASSERT_TRUE(clients.back()->send(make_request("POST", "/work", "job" + std::to_string(i))));
  }
  for (int i = 0; i < 20; ++i) {
    auto r = clients[i]->read_response();
    ASSERT_TRUE(r) << i;
    EXPECT_EQ(r->body, "processed:job" + std::to_string(i));
  }
  // Pipelined behind a late answer: the quick request's response still comes second.
  TestClient c(h_.port());
  ASSERT_TRUE(c.send(make_request("POST", "/work", "slow") + make_request("GET", "/now")));
  auto first = c.read_response();
  auto second = c.read_response();
  ASSERT_TRUE(first && second);
  EXPECT_EQ(first->body, "processed:slow");
  EXPECT_EQ(second->body, "now");
  h_.shutdown();
  worker.reset();  // joins the worker thread
}

TEST_F(ServerAsyncTest, StreamedChunkedResponseArrivesPieceByPiece) {
  auto held = std::make_shared<ResponderPtr>();
  auto closes = std::make_shared<int>(0);
  Router router;
  ASSERT_TRUE(router.get("/v1/stream", [held, closes](Request, ResponderPtr res) {
                      EXPECT_TRUE(res->start_stream(200, {{"Content-Type", "text/event-stream"},
                                                          {"Cache-Control", "no-cache"}}));
                      EXPECT_TRUE(res->write_chunk("data: 0\n\n"));
                      res->on_close([closes] { ++*closes; });
                      *held = std::move(res);
                    }).ok());
  ASSERT_TRUE(h_.start_server(ServerOptions{}, std::move(router)));
  h_.run();
  TestClient c(h_.port());
  ASSERT_TRUE(c.send(make_request("GET", "/v1/stream")));
  auto head = c.read_head();
  ASSERT_TRUE(head);
  EXPECT_EQ(head->status, 200);
  EXPECT_TRUE(head->chunked);
  EXPECT_EQ(head->header("Content-Type"), "text/event-stream");
  EXPECT_FALSE(head->has_header("Content-Length"));
  // The first event arrives while the handler still holds the stream open.
  auto first = c.read_chunk();
  ASSERT_TRUE(first);
  EXPECT_EQ(*first, "data: 0\n\n");
  h_.call([held] {
    for (int i = 1; i <= 3; ++i) EXPECT_TRUE((*held)->write_chunk("data: " + std::to_string(i) + "\n\n"));
    EXPECT_TRUE((*held)->write_chunk(""));  // empty chunks are skipped, not a terminator
    EXPECT_GT((*held)->queued_bytes() + 1, 0u);
    EXPECT_TRUE((*held)->end_stream());
    EXPECT_TRUE((*held)->finished());
    EXPECT_FALSE((*held)->write_chunk("late"));
  });
  for (int i = 1; i <= 3; ++i) {
    auto chunk = c.read_chunk();
    ASSERT_TRUE(chunk);
    EXPECT_EQ(*chunk, "data: " + std::to_string(i) + "\n\n");
  }
  auto terminator = c.read_chunk();
  ASSERT_TRUE(terminator);
  EXPECT_TRUE(terminator->empty());
  // Keep-alive after a stream: the connection serves the next request.
  ASSERT_TRUE(c.send(make_request("GET", "/nope")));
  auto r = c.read_response();
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 404);
  c.close();
  h_.call([held] { held->reset(); });
  h_.shutdown();
  EXPECT_EQ(*closes, 0) << "on_close must not fire after a normal finish";
}

TEST_F(ServerAsyncTest, StreamToAnHttp10ClientIsRawBytesThenClose) {
  Router router;
  ASSERT_TRUE(router.get("/s", [](Request, ResponderPtr res) {
                      res->start_stream(200, {});
                      res->write_chunk("abc");
                      res->write_chunk("def");
                      res->end_stream();
                    }).ok());
  ASSERT_TRUE(h_.start_server(ServerOptions{}, std::move(router)));
  h_.run();
  TestClient c(h_.port());
  ASSERT_TRUE(c.send("GET /s HTTP/1.0\r\nConnection: keep-alive\r\n\r\n"));
  auto r = c.read_response();  // no length, not chunked: body until EOF
  ASSERT_TRUE(r);
  EXPECT_FALSE(r->chunked);
  EXPECT_EQ(r->header("Connection"), "close");
  EXPECT_EQ(r->body, "abcdef");
}

TEST_F(ServerAsyncTest, ClientDisconnectMidStreamFiresOnCloseOnceAndLaterWritesAreNoOps) {
  auto held = std::make_shared<ResponderPtr>();
  auto closes = std::make_shared<int>(0);
  Router router;
  ASSERT_TRUE(router.get("/stream", [held, closes](Request, ResponderPtr res) {
                      res->start_stream(200, {{"Content-Type", "text/event-stream"}});
                      res->write_chunk("data: first\n\n");
                      res->on_close([closes] { ++*closes; });
                      *held = std::move(res);
                    }).ok());
  ASSERT_TRUE(h_.start_server(ServerOptions{}, std::move(router)));
  h_.run();
  {
    TestClient c(h_.port());
    ASSERT_TRUE(c.send(make_request("GET", "/stream")));
    ASSERT_TRUE(c.read_head());
    ASSERT_TRUE(c.read_chunk());
  }  // the client goes away mid-stream
  // A FIN alone could be a half-close (the client may still read): the next writes of the stream
  // meet the client's reset, and that is the disconnect.
  ASSERT_TRUE(wait_until([&] {
    return h_.call([held, closes] {
      if (*closes == 0) (*held)->write_chunk("data: more\n\n");
      return *closes;
    }) == 1;
  }));
  bool closed_seen_from_other_thread = false;
  ResponderPtr copy = h_.call([held] { return *held; });
  closed_seen_from_other_thread = copy->closed();  // closed() is atomic: any thread
  EXPECT_TRUE(closed_seen_from_other_thread);
  h_.call([held, closes] {
    ResponderPtr r = *held;
    EXPECT_TRUE(r->closed());
    EXPECT_FALSE(r->finished());
    EXPECT_FALSE(r->write_chunk("data: after\n\n"));
    EXPECT_FALSE(r->end_stream());
    EXPECT_FALSE(r->respond(200, {}, "x"));
    EXPECT_EQ(r->queued_bytes(), 0u);
    int late = 0;
    r->on_close([&late] { ++late; });  // registering after the loss runs at once
    EXPECT_EQ(late, 1);
    EXPECT_EQ(*closes, 1);
    held->reset();
  });
  copy.reset();
  EXPECT_EQ(h_.stats().client_disconnects, 1u);
  EXPECT_TRUE(wait_until([&] { return h_.stats().open_connections == 0; }));
  h_.shutdown();
  EXPECT_EQ(*closes, 1);
}

TEST_F(ServerAsyncTest, TwoHundredConcurrentKeepAliveConnections) {
  // Half the answers are immediate, half go through an AsyncQueue (answered on a later turn).
  auto later = loop::AsyncQueue<ResponderPtr>::create(h_.loop(), [](ResponderPtr r) {
    r->respond(200, {}, "later");
  });
  ASSERT_TRUE(later.ok());
  std::shared_ptr<loop::AsyncQueue<ResponderPtr>> queue = std::move(later).value();
  Router router;
  ASSERT_TRUE(router.get("/now", [](Request, ResponderPtr res) { res->respond(200, {}, "now"); }).ok());
  ASSERT_TRUE(router.get("/later", [queue](Request, ResponderPtr res) { queue->push(std::move(res)); }).ok());
  ASSERT_TRUE(h_.start_server(ServerOptions{}, std::move(router)));
  h_.at_shutdown([queue] { queue->close(); });
  h_.run();
  constexpr int kClients = 200;
  std::vector<std::unique_ptr<TestClient>> clients;
  for (int i = 0; i < kClients; ++i) {
    clients.push_back(std::make_unique<TestClient>(h_.port()));
    ASSERT_TRUE(clients.back()->connected()) << i;
  }
  for (int round = 0; round < 2; ++round) {
    for (int i = 0; i < kClients; ++i) {
      ASSERT_TRUE(clients[i]->send(make_request("GET", i % 2 ? "/later" : "/now")));
    }
    for (int i = 0; i < kClients; ++i) {
      auto r = clients[i]->read_response();
      ASSERT_TRUE(r) << "client " << i << " round " << round;
      EXPECT_EQ(r->body, i % 2 ? "later" : "now");
    }
  }
  ServerStats s = h_.stats();
  EXPECT_EQ(s.open_connections, static_cast<uint64_t>(kClients));
  EXPECT_EQ(s.accepted_connections, static_cast<uint64_t>(kClients));
  EXPECT_EQ(s.requests, 2u * kClients);
  EXPECT_EQ(s.rejected_over_capacity, 0u);
}

// A route whose handler keeps the responder: the test answers it later from the loop thread.
Router held_router(std::shared_ptr<ResponderPtr> held, std::shared_ptr<int> closes) {
  Router router;
  EXPECT_TRUE(router.post("/later", [held, closes](Request, ResponderPtr res) {
                      res->on_close([closes] { ++*closes; });
                      *held = std::move(res);
                    }).ok());
  return router;
}

TEST_F(ServerAsyncTest, HalfCloseBeforeAnAnswerGivenLaterStillGetsTheAnswer) {
  auto held = std::make_shared<ResponderPtr>();
  auto closes = std::make_shared<int>(0);
  ASSERT_TRUE(h_.start_server(ServerOptions{}, held_router(held, closes)));
  h_.run();
  for (bool stream : {false, true}) {
    TestClient c(h_.port());
    ASSERT_TRUE(c.send(make_request("POST", "/later", "{}")));
    ASSERT_EQ(::shutdown(c.fd(), SHUT_WR), 0);  // the client says it sends nothing more
    ASSERT_TRUE(wait_until([&] { return h_.call([held] { return *held != nullptr; }); }));
    std::this_thread::sleep_for(std::chrono::milliseconds(400));  // the EOF has arrived; probes went out
    h_.call([held, stream] {
      ResponderPtr r = std::move(*held);
      EXPECT_FALSE(r->closed()) << "a half-close is not a disconnect";
      if (!stream) {
        EXPECT_TRUE(r->respond(200, {}, "answer"));
        return;
      }
      EXPECT_TRUE(r->start_stream(200, {}));
      for (int i = 0; i < 3; ++i) EXPECT_TRUE(r->write_chunk("part" + std::to_string(i)));
      EXPECT_TRUE(r->end_stream());
    });
    if (!stream) {
      auto resp = c.read_response();  // interim 100 Continue responses come first and are skipped
      ASSERT_TRUE(resp);
      EXPECT_EQ(resp->status, 200);
      EXPECT_EQ(resp->body, "answer");
    } else {
      auto head = c.read_head();
      ASSERT_TRUE(head);
      EXPECT_EQ(head->status, 200);
      for (int i = 0; i < 3; ++i) EXPECT_EQ(c.read_chunk(), "part" + std::to_string(i));
      EXPECT_EQ(c.read_chunk(), "");
    }
    EXPECT_TRUE(c.wait_closed(3000)) << "the server closes once the half-closed client has its answer";
  }
  EXPECT_EQ(h_.call([closes] { return *closes; }), 0);
}

TEST_F(ServerAsyncTest, HalfCloseMidStreamStillReceivesTheRest) {
  auto held = std::make_shared<ResponderPtr>();
  Router router;
  ASSERT_TRUE(router.get("/stream", [held](Request, ResponderPtr res) {
                      res->start_stream(200, {});
                      res->write_chunk("first");
                      *held = std::move(res);
                    }).ok());
  ASSERT_TRUE(h_.start_server(ServerOptions{}, std::move(router)));
  h_.run();
  TestClient c(h_.port());
  ASSERT_TRUE(c.send(make_request("GET", "/stream")));
  ASSERT_TRUE(c.read_head());
  EXPECT_EQ(c.read_chunk(), "first");
  ASSERT_EQ(::shutdown(c.fd(), SHUT_WR), 0);
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  h_.call([held] {
    ResponderPtr r = std::move(*held);
    EXPECT_FALSE(r->closed());
    EXPECT_TRUE(r->write_chunk("second"));
    EXPECT_TRUE(r->end_stream());
  });
  EXPECT_EQ(c.read_chunk(), "second");
  EXPECT_EQ(c.read_chunk(), "");
  EXPECT_TRUE(c.wait_closed(3000));
}

TEST_F(ServerAsyncTest, AClientGoneBeforeItsAnswerBeganIsNoticedByTheInterimProbes) {
  auto held = std::make_shared<ResponderPtr>();
  auto closes = std::make_shared<int>(0);
  ASSERT_TRUE(h_.start_server(ServerOptions{}, held_router(held, closes)));
  h_.run();
  {
    TestClient c(h_.port());
    ASSERT_TRUE(c.send(make_request("POST", "/later", "{}")));
    ASSERT_TRUE(wait_until([&] { return h_.call([held] { return *held != nullptr; }); }));
  }  // closed entirely, with nothing unread: a FIN, as a half-close would send
  // No write from the handler: the connection's own "100 Continue" meets the reset.
  ASSERT_TRUE(wait_until([&] { return h_.call([closes] { return *closes; }) == 1; }, 3000));
  h_.call([held] {
    EXPECT_TRUE((*held)->closed());
    held->reset();
  });
  EXPECT_EQ(h_.stats().client_disconnects, 1u);
}

}  // namespace
}  // namespace sx::daemon::http::testing
