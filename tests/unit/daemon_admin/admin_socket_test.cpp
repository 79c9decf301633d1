// daemon/admin AdminServer: the socket file — mode, parent directory creation, stale sockets, a
// second daemon on the same path, unlink on stop and on destruction, invalid options, and the
// SO_PEERCRED check against a peer of another uid (root only: a forked child drops to 65534).
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <fcntl.h>
#include <poll.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <string>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "admin_harness.h"

namespace sx::daemon::admin::testing {
namespace {

using nlohmann::json;

constexpr uint32_t kNobody = 65534;

CommandHandler echo_handler() {
  return [](const json& request, Reply reply) { reply(json{{"echo", request}}); };
}

bool answers_echo(const std::string& path) {
  LineClient c(path);
  if (!c.connected() || !c.send("{\"cmd\": \"ping\"}\n")) return false;
  auto line = c.read_line();
  if (!line) return false;
  json r = json::parse(*line, nullptr, false);
  return !r.is_discarded() && r.value("ok", false) && r["result"]["echo"]["cmd"] == "ping";
}

TEST(AdminSocketTest, SocketIsCreatedWithMode0600AndUnlinkedOnStop) {
  TempDir dir;
  std::string path = dir.file("admin.sock");
  AdminHarness h;
  AdminOptions o;
  o.socket_path = path;
  ASSERT_TRUE(h.start(o, echo_handler()));
  EXPECT_EQ(h.server()->socket_path(), path);
  h.run();
  EXPECT_TRUE(is_socket(path));
  EXPECT_EQ(mode_of(path), 0600);
  EXPECT_TRUE(answers_echo(path));
  h.shutdown();
  EXPECT_FALSE(exists(path));
}

TEST(AdminSocketTest, ModeOptionIsApplied) {
  TempDir dir;
  std::string path = dir.file("admin.sock");
  AdminHarness h;
  AdminOptions o;
  o.socket_path = path;
  o.mode = 0660;
  ASSERT_TRUE(h.start(o, echo_handler()));
  h.run();
  EXPECT_EQ(mode_of(path), 0660);
  h.shutdown();
}

TEST(AdminSocketTest, MissingParentDirectoriesAreCreatedWith0700) {
  TempDir dir;
  std::string path = dir.file("run/sextant/admin.sock");
  mode_t old_umask = ::umask(022);
  AdminHarness h;
  AdminOptions o;
  o.socket_path = path;
  ASSERT_TRUE(h.start(o, echo_handler()));
  ::umask(old_umask);
  h.run();
  EXPECT_EQ(mode_of(dir.file("run")), 0700);
  EXPECT_EQ(mode_of(dir.file("run/sextant")), 0700);
  EXPECT_TRUE(answers_echo(path));
  h.shutdown();
  EXPECT_TRUE(exists(dir.file("run/sextant")));  // the directory stays
  EXPECT_FALSE(exists(path));
}

TEST(AdminSocketTest, StaleSocketFileIsReplaced) {
  TempDir dir;
  std::string path = dir.file("admin.sock");
  ASSERT_TRUE(make_stale_socket(path));
  AdminHarness h;
  AdminOptions o;
  o.socket_path = path;
  ASSERT_TRUE(h.start(o, echo_handler()));
  h.run();
  EXPECT_TRUE(answers_echo(path));
  EXPECT_EQ(mode_of(path), 0600);
  h.shutdown();
}

TEST(AdminSocketTest, PathThatIsNotASocketIsRefused) {
  TempDir dir;
  std::string path = dir.file("admin.sock");
  std::ofstream(path) << "not a socket";
  AdminHarness h;
  AdminOptions o;
  o.socket_path = path;
  auto started = h.try_start(o, echo_handler());
  ASSERT_FALSE(started.ok());
  EXPECT_EQ(started.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(started.status().message().find(path + " exists and is not a socket"), std::string::npos)
      << started.status().message();
  EXPECT_TRUE(exists(path));  // never removed
  h.shutdown();               // runs the loop on this thread; uv_loop_close() == 0
}

TEST(AdminSocketTest, SecondServerOnTheSamePathIsRefused) {
  TempDir dir;
  std::string path = dir.file("admin.sock");
  AdminHarness first;
  AdminOptions o;
  o.socket_path = path;
  ASSERT_TRUE(first.start(o, echo_handler()));
  first.run();

  AdminHarness second;
  auto started = second.try_start(o, echo_handler());
  ASSERT_FALSE(started.ok());
  EXPECT_EQ(started.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(started.status().message().find("another sextant daemon is listening on " + path), std::string::npos)
      << started.status().message();
  second.shutdown();

  // The first one still owns the file and answers.
  EXPECT_TRUE(is_socket(path));
  EXPECT_TRUE(answers_echo(path));
  first.shutdown();
  EXPECT_FALSE(exists(path));
}

TEST(AdminSocketTest, InvalidOptionsAreRefused) {
  AdminHarness h;
  AdminOptions o;
  auto started = h.try_start(o, echo_handler());
  ASSERT_FALSE(started.ok());
  EXPECT_EQ(started.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(started.status().message().find("admin.socket"), std::string::npos);

  o.socket_path = "/tmp/" + std::string(120, 'a');
  started = h.try_start(o, echo_handler());
  ASSERT_FALSE(started.ok());
  EXPECT_NE(started.status().message().find("at most 107"), std::string::npos) << started.status().message();

  o.socket_path = "/tmp/x.sock";
  o.mode = 01777;
  EXPECT_FALSE(h.try_start(o, echo_handler()).ok());
  o.mode = 0600;
  o.max_connections = 0;
  EXPECT_FALSE(h.try_start(o, echo_handler()).ok());
  h.shutdown();
}

TEST(AdminSocketTest, DestroyingWithoutStopClosesAndUnlinks) {
  TempDir dir;
  std::string path = dir.file("admin.sock");
  AdminHarness h;
  AdminOptions o;
  o.socket_path = path;
  ASSERT_TRUE(h.start(o, echo_handler()));
  h.run();
  LineClient c(path);
  ASSERT_TRUE(c.connected());
  ASSERT_TRUE(c.send("{\"cmd\": \"ping\"}\n"));
  ASSERT_TRUE(c.read_line());
  // Destroy the server on the loop thread while a connection is open: everything closes.
  h.destroy_server();
  EXPECT_TRUE(c.wait_closed());
  EXPECT_FALSE(exists(path));
  h.shutdown();
}

// ---- the socket's directory: created private, or verified ----

// start() on `path` must fail with FAILED_PRECONDITION naming `dir` and saying `why` and what to do.
void expect_directory_refused(const std::string& path, const std::string& dir, const std::string& why) {
  AdminHarness h;
  AdminOptions o;
  o.socket_path = path;
  auto started = h.try_start(o, echo_handler());
  ASSERT_FALSE(started.ok()) << "started on " << path << " in " << dir;
  EXPECT_EQ(started.status().code(), StatusCode::kFailedPrecondition);
  const std::string& m = started.status().message();
  EXPECT_EQ(m.rfind("refusing the admin socket directory " + dir + ": " + why, 0), 0u) << m;
  EXPECT_NE(m.find("remove it, or set admin.socket (or XDG_RUNTIME_DIR)"), std::string::npos) << m;
  EXPECT_FALSE(exists(path));  // nothing was bound there
  h.shutdown();
}

TEST(AdminSocketDirectoryTest, DirectoryWritableByOthersIsRefused) {
  TempDir dir;
  const std::string sub = dir.file("sextant-0");
  ASSERT_EQ(::mkdir(sub.c_str(), 0700), 0);
  ASSERT_EQ(::chmod(sub.c_str(), 0777), 0);
  expect_directory_refused(sub + "/admin.sock", sub, "it has mode 0777 (writable by others)");
  ASSERT_EQ(::chmod(sub.c_str(), 0770), 0);
  expect_directory_refused(sub + "/admin.sock", sub, "it has mode 0770 (writable by its group)");
  ASSERT_EQ(::chmod(sub.c_str(), 01777), 0);  // sticky like /tmp: still others can add names
  expect_directory_refused(sub + "/admin.sock", sub, "it has mode 1777 (writable by others)");
}

TEST(AdminSocketDirectoryTest, SymlinkAsTheDirectoryIsRefused) {
  TempDir dir;
  const std::string real = dir.file("real");
  ASSERT_EQ(::mkdir(real.c_str(), 0700), 0);
  const std::string link = dir.file("sextant-0");
  ASSERT_EQ(::symlink(real.c_str(), link.c_str()), 0);
  expect_directory_refused(link + "/admin.sock", link, "it is a symlink (to " + real + ")");
  EXPECT_FALSE(exists(real + "/admin.sock"));
}

TEST(AdminSocketDirectoryTest, DirectoryOwnedByAnotherUidIsRefused) {
  if (::geteuid() != 0) GTEST_SKIP() << "needs root to chown a directory to another uid";
  // What another local user can do first: mkdir /tmp/sextant-<uid> with mode 0777.
  TempDir dir;
  const std::string sub = dir.file("sextant-0");
  ASSERT_EQ(::mkdir(sub.c_str(), 0700), 0);
  ASSERT_EQ(::chown(sub.c_str(), 12345, 12345), 0);
  expect_directory_refused(sub + "/admin.sock", sub, "it is owned by uid 12345, not by the daemon's uid 0");
  ASSERT_EQ(::chmod(sub.c_str(), 0777), 0);
  expect_directory_refused(sub + "/admin.sock", sub, "it is owned by uid 12345, not by the daemon's uid 0");
}

TEST(AdminSocketDirectoryTest, OwnPrivateAndRootReadableDirectoriesAreAccepted) {
  TempDir dir;
  for (mode_t mode : {0700, 0750, 0755, 0711}) {
    SCOPED_TRACE(mode);
    const std::string sub = dir.file("d" + std::to_string(mode));
    ASSERT_EQ(::mkdir(sub.c_str(), 0700), 0);
    ASSERT_EQ(::chmod(sub.c_str(), mode), 0);
    AdminHarness h;
    AdminOptions o;
    o.socket_path = sub + "/admin.sock";
    ASSERT_TRUE(h.start(o, echo_handler()));
    h.run();
    EXPECT_TRUE(answers_echo(o.socket_path));
    h.shutdown();
  }
}

// ---- peer credentials (root only) ----

struct ChildResult {
  int exit_code = -1;
  std::string output;  // what the child read from the socket
};

// Forks a child that drops to uid/gid 65534, connects to `path`, sends `request` (if any) and
// reads one line; the line comes back through a pipe. Only async-signal-safe calls in the child.
ChildResult run_as_nobody(const std::string& path, const std::string& request) {
  ChildResult result;
  int pipefd[2];
  if (::pipe(pipefd) != 0) return result;
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::snprintf(addr.sun_path, sizeof(addr.sun_path), "%s", path.c_str());
  pid_t pid = ::fork();
  if (pid == 0) {
    ::close(pipefd[0]);
    if (::setgid(kNobody) != 0 || ::setuid(kNobody) != 0) ::_exit(10);
    int fd = ::socket(AF_UNIX, SOCK_STREAM, 0);
    if (fd < 0) ::_exit(11);
    if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) ::_exit(12);
    if (!request.empty()) {
      (void)::send(fd, request.data(), request.size(), MSG_NOSIGNAL);
    }
    char buf[4096];
    size_t got = 0;
    while (got < sizeof(buf)) {
      ssize_t n = ::read(fd, buf + got, sizeof(buf) - got);
      if (n <= 0) break;
      got += static_cast<size_t>(n);
      if (std::memchr(buf, '\n', got) != nullptr) break;
    }
    (void)::write(pipefd[1], buf, got);
    ::_exit(0);
  }
  ::close(pipefd[1]);
  if (pid < 0) {
    ::close(pipefd[0]);
    return result;
  }
  char buf[4096];
  for (;;) {
    pollfd p{pipefd[0], POLLIN, 0};
    if (::poll(&p, 1, 10000) <= 0) break;
    ssize_t n = ::read(pipefd[0], buf, sizeof(buf));
    if (n <= 0) break;
    result.output.append(buf, static_cast<size_t>(n));
  }
  ::close(pipefd[0]);
  int status = 0;
  if (::waitpid(pid, &status, 0) == pid && WIFEXITED(status)) result.exit_code = WEXITSTATUS(status);
  return result;
}

class AdminPeerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (::geteuid() != 0) GTEST_SKIP() << "needs root to fork a peer with another uid (setuid 65534)";
    // The child (uid 65534) must reach the socket: a 0755 directory and a 0666 socket.
    ASSERT_EQ(::chmod(dir_.path().c_str(), 0755), 0);
  }
  AdminOptions options() {
    AdminOptions o;
    o.socket_path = path_;
    o.mode = 0666;
    return o;
  }
  TempDir dir_;
  std::string path_ = dir_.file("admin.sock");
};

TEST_F(AdminPeerTest, PeerWithAnotherUidIsRefused) {
  AdminHarness h;
  ASSERT_TRUE(h.start(options(), echo_handler()));
  h.run();
  ChildResult child = run_as_nobody(path_, "{\"cmd\": \"status\"}\n");
  EXPECT_EQ(child.exit_code, 0) << "child failed at step " << child.exit_code;
  ASSERT_FALSE(child.output.empty());
  json r = json::parse(child.output.substr(0, child.output.find('\n')), nullptr, false);
  ASSERT_FALSE(r.is_discarded()) << child.output;
  EXPECT_EQ(r["ok"], false);
  EXPECT_EQ(r["error"]["code"], "PERMISSION_DENIED");
  std::string message = r["error"]["message"];
  EXPECT_EQ(message.rfind("uid 65534 is not allowed on the admin socket " + path_, 0), 0u) << message;
  EXPECT_TRUE(wait_until([&h] { return h.stats().refused_peers == 1; }));
  EXPECT_EQ(h.stats().requests, 0u);
  EXPECT_TRUE(answers_echo(path_));  // root (the daemon's uid) still gets in
  h.shutdown();
}

TEST_F(AdminPeerTest, AllowedUidsLetThePeerIn) {
  AdminHarness h;
  AdminOptions o = options();
  o.allowed_uids = {1234, kNobody};
  ASSERT_TRUE(h.start(o, echo_handler()));
  h.run();
  ChildResult child = run_as_nobody(path_, "{\"cmd\": \"status\"}\n");
  EXPECT_EQ(child.exit_code, 0) << "child failed at step " << child.exit_code;
  json r = json::parse(child.output.substr(0, child.output.find('\n')), nullptr, false);
  ASSERT_FALSE(r.is_discarded()) << child.output;
  EXPECT_EQ(r["ok"], true) << r.dump();
  EXPECT_EQ(r["result"]["echo"]["cmd"], "status");
  EXPECT_EQ(h.stats().refused_peers, 0u);
  h.shutdown();
}

TEST_F(AdminPeerTest, Mode0600KeepsOtherUsersOutBeforeTheyConnect) {
  AdminHarness h;
  AdminOptions o = options();
  o.mode = 0600;
  ASSERT_TRUE(h.start(o, echo_handler()));
  h.run();
  ChildResult child = run_as_nobody(path_, "");
  EXPECT_EQ(child.exit_code, 12);  // connect() failed (EACCES)
  EXPECT_EQ(h.stats().accepted_connections, 0u);
  h.shutdown();
}

}  // namespace
}  // namespace sx::daemon::admin::testing
