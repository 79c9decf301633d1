// daemon/admin admin_call and `sextant ctl` against a server on a loop thread: results, daemon
// errors mapped back to StatusCodes, a missing or stale socket, a timeout, cmd_ctl's exit codes,
// request fields and output, and (root only) a listener of another uid that is not trusted.
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <poll.h>
#include <unistd.h>

#include <cstring>
#include <string>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "admin_harness.h"
#include "daemon/admin/admin_client.h"
#include "daemon/admin/protocol.h"
#include "daemon/commands/commands.h"

namespace sx::daemon::admin::testing {
namespace {

using nlohmann::json;

class AdminClientTest : public ::testing::Test {
 protected:
  void start() {
    AdminOptions o;
    o.socket_path = path_;
    ASSERT_TRUE(h_.start(o, [this](const json& request, Reply reply) {
      last_request_ = request;
      const std::string cmd = request["cmd"];
      if (cmd == "status") {
        reply(json{{"state", "serving"}, {"replicas", json::array({json{{"id", 0}, {"tp", 2}}})}});
      } else if (cmd == "drain") {
        reply(Status(StatusCode::kFailedPrecondition, "already draining"));
      } else if (cmd == "hold") {
        held_.push_back(reply);
      } else if (cmd == "echo") {
        reply(request);
      } else {
        reply(Status(StatusCode::kNotFound, "unknown command '" + cmd + "'"));
      }
    }));
    h_.at_shutdown([this] { held_.clear(); });
    h_.run();
  }
  void TearDown() override { h_.shutdown(); }

  int ctl(std::vector<std::string> words) {
    std::vector<char*> argv;
    for (std::string& w : words) argv.push_back(w.data());
    return cmd_ctl(static_cast<int>(argv.size()), argv.data());
  }

  AdminHarness h_;
  TempDir dir_;
  std::string path_ = dir_.file("admin.sock");
  json last_request_;        // loop thread
  std::vector<Reply> held_;  // loop thread
};

TEST_F(AdminClientTest, ReturnsTheResult) {
  start();
  auto r = admin_call(path_, json{{"cmd", "status"}}, 5000);
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_EQ((*r)["state"], "serving");
  EXPECT_EQ((*r)["replicas"][0]["tp"], 2);
  auto e = admin_call(path_, json{{"cmd", "echo"}, {"x", 1.5}}, 5000);
  ASSERT_TRUE(e.ok());
  EXPECT_EQ(*e, (json{{"cmd", "echo"}, {"x", 1.5}}));
}

TEST_F(AdminClientTest, MapsDaemonErrorsBackToStatusCodes) {
  start();
  auto r = admin_call(path_, json{{"cmd", "drain"}}, 5000);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(r.status().message(), "already draining");
  r = admin_call(path_, json{{"cmd", "bogus"}}, 5000);
  EXPECT_EQ(r.status().code(), StatusCode::kNotFound);
  r = admin_call(path_, json{{"no_cmd", 1}}, 5000);
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
}

TEST_F(AdminClientTest, MissingSocketSaysNoDaemonIsListening) {
  start();
  std::string missing = dir_.file("nobody-here.sock");
  auto r = admin_call(missing, json{{"cmd", "status"}}, 1000);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kUnavailable);
  EXPECT_EQ(r.status().message(),
            "no sextant daemon is listening on " + missing +
                " (is `sextant serve` running? its admin socket is set by admin.socket)");
}

TEST_F(AdminClientTest, StaleSocketIsConnectionRefused) {
  start();
  std::string stale = dir_.file("stale.sock");
  ASSERT_TRUE(make_stale_socket(stale));
  auto r = admin_call(stale, json{{"cmd", "status"}}, 1000);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kUnavailable);
  EXPECT_NE(r.status().message().find("nothing is listening on " + stale), std::string::npos)
      << r.status().message();
}

TEST_F(AdminClientTest, TimesOutWhenNoAnswerComes) {
  start();
  auto t0 = std::chrono::steady_clock::now();
  auto r = admin_call(path_, json{{"cmd", "hold"}}, 200);
  auto took = std::chrono::steady_clock::now() - t0;
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kDeadlineExceeded);
  EXPECT_NE(r.status().message().find("within 200 ms"), std::string::npos) << r.status().message();
  EXPECT_GE(took, std::chrono::milliseconds(190));
  EXPECT_LT(took, std::chrono::seconds(3));
}

TEST_F(AdminClientTest, CtlForwardsTheCommandAndFields) {
  start();
  ::testing::internal::CaptureStdout();
  int rc = ctl({"--socket", path_, "echo", "n=3", "flag=true", "name=draft", "ratio=0.5", "ids=[1,2]",
                "quoted=\"7\"", "mode=0600"});
  std::string out = ::testing::internal::GetCapturedStdout();
  EXPECT_EQ(rc, 0);
  json expected = {{"cmd", "echo"},  {"n", 3},        {"flag", true},      {"name", "draft"},
                   {"ratio", 0.5},   {"ids", {1, 2}}, {"quoted", "7"},     {"mode", "0600"}};
  EXPECT_EQ(h_.call([this] { return last_request_; }), expected);
  EXPECT_NE(out.find("n: 3\n"), std::string::npos) << out;
  EXPECT_NE(out.find("ids: 1, 2\n"), std::string::npos) << out;

  ::testing::internal::CaptureStdout();
  rc = ctl({"--json", "--socket=" + path_, "status"});
  out = ::testing::internal::GetCapturedStdout();
  EXPECT_EQ(rc, 0);
  EXPECT_EQ(json::parse(out), (json{{"state", "serving"}, {"replicas", json::array({json{{"id", 0}, {"tp", 2}}})}}));
  EXPECT_NE(out.find("\n  \"replicas\": [\n"), std::string::npos) << out;  // pretty, 2 spaces

  ::testing::internal::CaptureStdout();
  rc = ctl({"--socket", path_, "status"});
  out = ::testing::internal::GetCapturedStdout();
  EXPECT_EQ(rc, 0);
  EXPECT_EQ(out, "replicas:\n  - id: 0\n    tp: 2\nstate: serving\n");
}

TEST_F(AdminClientTest, CtlExitCodes) {
  start();
  ::testing::internal::CaptureStderr();
  EXPECT_EQ(ctl({"--socket", path_, "drain"}), 1);
  std::string err = ::testing::internal::GetCapturedStderr();
  EXPECT_EQ(err, "sextant ctl: already draining\n");

  ::testing::internal::CaptureStderr();
  EXPECT_EQ(ctl({"--socket", dir_.file("missing.sock"), "status"}), 1);
  err = ::testing::internal::GetCapturedStderr();
  EXPECT_NE(err.find("sextant ctl: no sextant daemon is listening on "), std::string::npos) << err;

  ::testing::internal::CaptureStderr();
  EXPECT_EQ(ctl({"--socket", path_}), 2);                        // no command
  EXPECT_EQ(ctl({"--socket", path_, "status", "verbose"}), 2);   // not key=value
  EXPECT_EQ(ctl({"--socket", path_, "status", "a=1", "a=2"}), 2);  // twice
  EXPECT_EQ(ctl({"--socket", path_, "status", "cmd=x"}), 2);
  EXPECT_EQ(ctl({"--socket", path_, "--timeout-ms", "soon", "status"}), 2);
  EXPECT_EQ(ctl({"--bogus", "status"}), 2);
  err = ::testing::internal::GetCapturedStderr();
  EXPECT_NE(err.find("missing <command>"), std::string::npos) << err;
  ::testing::internal::CaptureStdout();
  EXPECT_EQ(ctl({"--help"}), 0);
  std::string out = ::testing::internal::GetCapturedStdout();
  EXPECT_NE(out.find("usage: sextant ctl"), std::string::npos) << out;
}

// ---- who answers ----

TEST(AdminClientTrustTest, OwnUidRootAndTheGivenDaemonUidAreTrusted) {
  const std::string path = "/tmp/sextant-1000/admin.sock";
  EXPECT_TRUE(check_daemon_uid(path, 1000, 1000, std::nullopt).ok());
  EXPECT_TRUE(check_daemon_uid(path, 0, 1000, std::nullopt).ok());
  EXPECT_TRUE(check_daemon_uid(path, 0, 0, std::nullopt).ok());
  EXPECT_TRUE(check_daemon_uid(path, 999, 1000, 999u).ok());

  Status other = check_daemon_uid(path, 1001, 1000, std::nullopt);
  EXPECT_EQ(other.code(), StatusCode::kPermissionDenied);
  EXPECT_EQ(other.message(),
            "refusing the admin socket /tmp/sextant-1000/admin.sock: the process listening on it runs as uid 1001, "
            "not as your uid 1000 or root, so it is not your sextant daemon and its answers are not trusted (if it "
            "is a daemon run by that user, pass --daemon-uid 1001)");
  Status not_the_given = check_daemon_uid(path, 1001, 1000, 999u);
  EXPECT_EQ(not_the_given.code(), StatusCode::kPermissionDenied);
  EXPECT_NE(not_the_given.message().find("runs as uid 1001, not as uid 999 (--daemon-uid), your uid 1000 or root"),
            std::string::npos)
      << not_the_given.message();
  EXPECT_NE(check_daemon_uid(path, 65534, 0, std::nullopt).message().find("not as root (your uid)"),
            std::string::npos);
}

// ---- who answers (root only: a forked child of uid 65534 listens) ----

// A forked child that drops to uid/gid 65534, listens on `path`, and answers the first connection
// with a forged success line (what another local user could do on a socket path they control).
class ForgedServer {
 public:
  explicit ForgedServer(const std::string& path) {
    int ready[2];
    if (::pipe(ready) != 0) return;
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    std::snprintf(addr.sun_path, sizeof(addr.sun_path), "%s", path.c_str());
    pid_ = ::fork();
    if (pid_ == 0) {
      ::close(ready[0]);
      ::alarm(10);  // never outlives the test
      if (::setgid(65534) != 0 || ::setuid(65534) != 0) ::_exit(10);
      int fd = ::socket(AF_UNIX, SOCK_STREAM, 0);
      if (fd < 0 || ::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) ::_exit(11);
      ::chmod(addr.sun_path, 0666);
      if (::listen(fd, 4) != 0) ::_exit(12);
      (void)::write(ready[1], "r", 1);
      int c = ::accept(fd, nullptr, nullptr);
      if (c < 0) ::_exit(13);
      static const char kForged[] = "{\"ok\": true, \"result\": \"forged\"}\n";
      (void)::send(c, kForged, sizeof(kForged) - 1, MSG_NOSIGNAL);
      char buf[256];
      (void)::read(c, buf, sizeof(buf));
      ::_exit(0);
    }
    ::close(ready[1]);
    pollfd p{ready[0], POLLIN, 0};
    char byte = 0;
    ready_ = pid_ > 0 && ::poll(&p, 1, 5000) == 1 && ::read(ready[0], &byte, 1) == 1;
    ::close(ready[0]);
  }
  ~ForgedServer() {
    if (pid_ <= 0) return;
    ::kill(pid_, SIGKILL);
    int status = 0;
    ::waitpid(pid_, &status, 0);
  }
  bool ready() const { return ready_; }

 private:
  pid_t pid_ = -1;
  bool ready_ = false;
};

TEST(AdminClientPeerTest, AnswerFromAnotherUidIsNotTrusted) {
  if (::geteuid() != 0) GTEST_SKIP() << "needs root to fork a listener with another uid (setuid 65534)";
  TempDir dir;
  ASSERT_EQ(::chmod(dir.path().c_str(), 0755), 0);
  const std::string theirs = dir.file("theirs");  // a directory the other user owns
  ASSERT_EQ(::mkdir(theirs.c_str(), 0755), 0);
  ASSERT_EQ(::chown(theirs.c_str(), 65534, 65534), 0);
  const std::string path = theirs + "/admin.sock";
  ForgedServer server(path);
  ASSERT_TRUE(server.ready());
  auto r = admin_call(path, json{{"cmd", "status"}}, 5000);
  ASSERT_FALSE(r.ok()) << "trusted the answer " << r->dump() << " of a process of uid 65534";
  EXPECT_EQ(r.status().code(), StatusCode::kPermissionDenied);
  EXPECT_EQ(r.status().message().rfind("refusing the admin socket " + path +
                                           ": the process listening on it runs as uid 65534, not as",
                                       0),
            0u)
      << r.status().message();
}

TEST(AdminClientPeerTest, DaemonUidTrustsThatUser) {
  if (::geteuid() != 0) GTEST_SKIP() << "needs root to fork a listener with another uid (setuid 65534)";
  TempDir dir;
  ASSERT_EQ(::chmod(dir.path().c_str(), 0755), 0);
  const std::string theirs = dir.file("theirs");
  ASSERT_EQ(::mkdir(theirs.c_str(), 0755), 0);
  ASSERT_EQ(::chown(theirs.c_str(), 65534, 65534), 0);
  const std::string path = theirs + "/admin.sock";
  ForgedServer server(path);
  ASSERT_TRUE(server.ready());
  auto r = admin_call(path, json{{"cmd", "status"}}, 5000, 65534u);
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_EQ(*r, "forged");
}

TEST(AdminProtocolTest, CodeNamesRoundTrip) {
  for (int i = 1; i <= static_cast<int>(StatusCode::kDataLoss); ++i) {
    auto code = static_cast<StatusCode>(i);
    EXPECT_EQ(status_code_from_name(status_code_name(code)), code);
    auto decoded = decode_response(encode_error(Status(code, "m")));
    ASSERT_FALSE(decoded.ok());
    EXPECT_EQ(decoded.status().code(), code);
    EXPECT_EQ(decoded.status().message(), "m");
  }
  EXPECT_FALSE(status_code_from_name("OK").has_value());
  EXPECT_FALSE(status_code_from_name("WHATEVER").has_value());
  auto unknown = decode_response(R"({"ok": false, "error": {"code": "WHATEVER", "message": "x"}})");
  EXPECT_EQ(unknown.status().code(), StatusCode::kInternal);
  EXPECT_NE(unknown.status().message().find("WHATEVER"), std::string::npos);
  EXPECT_EQ(decode_response("garbage").status().code(), StatusCode::kDataLoss);
  auto ok = decode_response("{\"ok\": true}\n");
  ASSERT_TRUE(ok.ok());
  EXPECT_TRUE(ok->is_null());
  EXPECT_EQ(encode_response(json{{"a", 1}}), "{\"ok\":true,\"result\":{\"a\":1}}\n");
  EXPECT_EQ(encode_error(Status(StatusCode::kPermissionDenied, "no")),
            "{\"error\":{\"code\":\"PERMISSION_DENIED\",\"message\":\"no\"},\"ok\":false}\n");
}

}  // namespace
}  // namespace sx::daemon::admin::testing
