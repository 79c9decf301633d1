// admin_call: one request and its response over the admin socket, blocking, with a deadline.
#include "daemon/admin/admin_client.h"

#include <poll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <thread>

#include <fmt/format.h>

#include "daemon/admin/protocol.h"
#include "runtime/base/regular_file.h"

namespace sx::daemon::admin {

namespace {

using Clock = std::chrono::steady_clock;

// The most bytes a response line may have (a large plan or config is far below this).
constexpr size_t kMaxResponseBytes = 64u << 20;

class Fd {
 public:
  explicit Fd(int fd) : fd_(fd) {}
  ~Fd() {
    if (fd_ >= 0) ::close(fd_);
  }
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  int get() const { return fd_; }

 private:
  int fd_;
};

class Deadline {
 public:
  explicit Deadline(int timeout_ms)
      : unlimited_(timeout_ms <= 0), end_(Clock::now() + std::chrono::milliseconds(timeout_ms)) {}
  // Milliseconds left for poll(): -1 without a limit, 0 once passed.
  int poll_ms() const {
    if (unlimited_) return -1;
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(end_ - Clock::now()).count();
    // Round up so that a sub-millisecond remainder still polls instead of spinning.
    return left <= 0 ? 0 : static_cast<int>(left) + 1;
  }
  bool passed() const { return !unlimited_ && Clock::now() >= end_; }

 private:
  bool unlimited_;
  Clock::time_point end_;
};

Status timeout_error(const std::string& path, int timeout_ms, std::string_view stage) {
  return deadline_exceeded_error("no answer from the sextant daemon on {} within {} ms ({}); a long command "
                                 "such as drain may need a larger --timeout-ms",
                                 path, timeout_ms, stage);
}

Status connect_error(int err, const std::string& path) {
  // A path that is there but is no socket: say what it is (not "the daemon has exited").
  struct stat st {};
  if (err != EACCES && err != EPERM && ::stat(path.c_str(), &st) == 0 && !S_ISSOCK(st.st_mode)) {
    return unavailable_error("{} is {}, not a socket: admin.socket (or ctl --socket) must name the daemon's admin "
                             "socket", path, file_kind_name(st.st_mode));
  }
  switch (err) {
    case ENOENT:
      return unavailable_error(
          "no sextant daemon is listening on {} (is `sextant serve` running? its admin socket is set by "
          "admin.socket)",
          path);
    case ECONNREFUSED:
      return unavailable_error(
          "nothing is listening on {}: the socket file is stale (the daemon that created it has exited; is "
          "`sextant serve` running?)",
          path);
    case EACCES:
    case EPERM:
      return Status(StatusCode::kPermissionDenied,
                    fmt::format("cannot connect to the admin socket {}: {} (run as the daemon's user, or have "
                                "the daemon list your uid in admin.allowed_uids and widen admin.mode)",
                                path, std::strerror(err)));
    case ENOTDIR:
      return unavailable_error("no sextant daemon is listening on {} ({})", path, std::strerror(err));
    case ENOTSOCK:
      return unavailable_error("{} is not a socket (admin.socket names the daemon's admin socket)", path);
    default:
      return unavailable_error("cannot connect to the admin socket {}: {}", path, std::strerror(err));
  }
}

// Waits until `fd` is ready for `events`: OK, or DEADLINE_EXCEEDED / UNAVAILABLE.
Status wait_for(int fd, short events, const Deadline& deadline, const std::string& path, int timeout_ms,
                std::string_view stage) {
  for (;;) {
    pollfd p{fd, events, 0};
    int rc = ::poll(&p, 1, deadline.poll_ms());
    if (rc > 0) return ok_status();
    if (rc == 0) return timeout_error(path, timeout_ms, stage);
    if (errno != EINTR) return unavailable_error("poll on the admin socket {}: {}", path, std::strerror(errno));
  }
}

// The uid of the process listening on the connected socket `fd`.
Result<uint32_t> peer_uid(int fd, const std::string& path) {
  ucred cred{};
  socklen_t len = sizeof(cred);
  if (::getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) != 0 || len != sizeof(cred)) {
    return unavailable_error("cannot tell who listens on the admin socket {} (SO_PEERCRED: {})", path,
                             std::strerror(errno));
  }
  return static_cast<uint32_t>(cred.uid);
}

}  // namespace

Status check_daemon_uid(const std::string& socket_path, uint32_t peer, uint32_t own_uid,
                        std::optional<uint32_t> daemon_uid) {
  if (peer == own_uid || peer == 0 || (daemon_uid && peer == *daemon_uid)) return ok_status();
  std::string trusted = own_uid == 0 ? "root (your uid)" : fmt::format("your uid {} or root", own_uid);
  if (daemon_uid) trusted = fmt::format("uid {} (--daemon-uid), {}", *daemon_uid, trusted);
  return Status(StatusCode::kPermissionDenied,
                fmt::format("refusing the admin socket {}: the process listening on it runs as uid {}, not as {}, "
                            "so it is not your sextant daemon and its answers are not trusted (if it is a daemon "
                            "run by that user, pass --daemon-uid {})",
                            socket_path, peer, trusted, peer));
}

Result<nlohmann::json> admin_call(const std::string& socket_path, const nlohmann::json& request,
                                  int timeout_ms, std::optional<uint32_t> daemon_uid) {
  const std::string& path = socket_path;
  sockaddr_un addr{};
  if (path.empty()) return invalid_argument_error("the admin socket path is empty");
  if (path.size() >= sizeof(addr.sun_path)) {
    return invalid_argument_error("the admin socket path {} is {} bytes; a Unix socket path may have at most {}",
                                  path, path.size(), sizeof(addr.sun_path) - 1);
  }
  addr.sun_family = AF_UNIX;
  std::memcpy(addr.sun_path, path.c_str(), path.size() + 1);

  Deadline deadline(timeout_ms);
  Fd fd(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
  if (fd.get() < 0) return unavailable_error("socket(AF_UNIX): {}", std::strerror(errno));

  // A Unix-socket connect never blocks half-way: it succeeds, fails, or (backlog full) says EAGAIN.
  for (;;) {
    if (::connect(fd.get(), reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0) break;
    int err = errno;
    if (err == EINTR) continue;
    if (err == EINPROGRESS) {
      SX_RETURN_IF_ERROR(wait_for(fd.get(), POLLOUT, deadline, path, timeout_ms, "connecting"));
      int so_error = 0;
      socklen_t len = sizeof(so_error);
      ::getsockopt(fd.get(), SOL_SOCKET, SO_ERROR, &so_error, &len);
      if (so_error != 0) return connect_error(so_error, path);
      break;
    }
    if (err != EAGAIN) return connect_error(err, path);
    if (deadline.passed()) return timeout_error(path, timeout_ms, "the daemon's accept queue is full");
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }

  // Nothing is sent to, or read from, a listener of another user.
  SX_ASSIGN_OR_RETURN(uint32_t peer, peer_uid(fd.get(), path));
  SX_RETURN_IF_ERROR(check_daemon_uid(path, peer, static_cast<uint32_t>(::geteuid()), daemon_uid));

  // The daemon may answer at once without reading (a refused peer): a failed write is then not the
  // end; the answer is read below.
  std::string out = dump_line(request) + "\n";
  size_t sent = 0;
  bool write_failed = false;
  while (sent < out.size()) {
    ssize_t n = ::send(fd.get(), out.data() + sent, out.size() - sent, MSG_NOSIGNAL);
    if (n > 0) {
      sent += static_cast<size_t>(n);
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      SX_RETURN_IF_ERROR(wait_for(fd.get(), POLLOUT, deadline, path, timeout_ms, "sending the request"));
      continue;
    }
    write_failed = true;
    break;
  }

  std::string in;
  char buf[16 * 1024];
  for (;;) {
    size_t newline = in.find('\n');
    if (newline != std::string::npos) return decode_response(std::string_view(in).substr(0, newline));
    if (in.size() > kMaxResponseBytes) {
      return data_loss_error("the answer on the admin socket {} is longer than {} bytes", path, kMaxResponseBytes);
    }
    ssize_t n = ::recv(fd.get(), buf, sizeof(buf), 0);
    if (n > 0) {
      in.append(buf, static_cast<size_t>(n));
      continue;
    }
    if (n == 0) break;  // EOF
    if (errno == EINTR) continue;
    if (errno == EAGAIN || errno == EWOULDBLOCK) {
      SX_RETURN_IF_ERROR(wait_for(fd.get(), POLLIN, deadline, path, timeout_ms, "waiting for the answer"));
      continue;
    }
    if (errno == ECONNRESET && !in.empty()) break;
    return unavailable_error("reading from the admin socket {}: {}", path, std::strerror(errno));
  }
  if (!in.empty()) return decode_response(in);  // a last line without '\n'
  return unavailable_error("the sextant daemon on {} closed the connection without answering{}", path,
                           write_failed ? " (the request could not be sent)" : "");
}

}  // namespace sx::daemon::admin
