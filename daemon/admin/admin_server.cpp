// AdminServer: the Unix-socket admin API of `sextant serve`.
#include "daemon/admin/admin_server.h"

#include <fcntl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <unordered_map>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "daemon/admin/admin_connection.h"
#include "daemon/loop/uv_status.h"
#include "runtime/base/log.h"

namespace sx::daemon::admin {

namespace {

constexpr int kBacklog = 64;
// Refused connections (bad peer, over capacity) closing at once beyond which new ones are closed
// without an answer: a flood must not cost buffers.
constexpr size_t kMaxRefusing = 16;
// sizeof(sockaddr_un::sun_path) - 1.
constexpr size_t kMaxSocketPathBytes = sizeof(sockaddr_un{}.sun_path) - 1;

Status errno_status(int err, std::string_view what) {
  StatusCode code = StatusCode::kInternal;
  switch (err) {
    case EACCES:
    case EPERM: code = StatusCode::kPermissionDenied; break;
    case ENOENT: code = StatusCode::kNotFound; break;
    case ENOTDIR:
    case EROFS:
    case ELOOP:
    case ENAMETOOLONG: code = StatusCode::kFailedPrecondition; break;
    case ENOSPC:
    case EMFILE:
    case ENFILE:
    case ENOMEM: code = StatusCode::kResourceExhausted; break;
    default: break;
  }
  return Status(code, fmt::format("{}: {}", what, std::strerror(err)));
}

Status another_daemon_error(const std::string& path) {
  return failed_precondition_error(
      "another sextant daemon is listening on {} (stop it first, or set admin.socket to another path)", path);
}

// The directory part of a socket path: "." for a bare name, "/" for a name right under the root.
std::string socket_directory(const std::string& path) {
  const size_t slash = path.rfind('/');
  if (slash == std::string::npos) return ".";
  if (slash == 0) return "/";
  return path.substr(0, slash);
}

Status directory_refused(const std::string& dir, std::string_view why, uint32_t euid) {
  return failed_precondition_error(
      "refusing the admin socket directory {}: {}; another user could put their own socket there and answer "
      "`sextant ctl`; remove it, or set admin.socket (or XDG_RUNTIME_DIR) to a path in a directory that only "
      "uid {}{} can write",
      dir, why, euid, euid == 0 ? "" : " (or root)");
}

// Creates the missing directories above `path` with mode 0700 (umask notwithstanding).
Status create_missing_directories(const std::string& dir) {
  struct stat st {};
  if (::lstat(dir.c_str(), &st) == 0 || errno != ENOENT) return ok_status();  // verified below
  for (size_t pos = 1;; ++pos) {
    pos = dir.find('/', pos);
    const std::string prefix = dir.substr(0, pos);
    if (::mkdir(prefix.c_str(), 0700) == 0) {
      if (::chmod(prefix.c_str(), 0700) != 0) {
        return errno_status(errno, fmt::format("chmod 0700 the admin socket directory {}", prefix));
      }
      log_info("admin: created the socket directory {} (mode 0700)", prefix);
    } else if (errno != EEXIST) {
      return errno_status(errno, fmt::format("create the admin socket directory {}", prefix));
    }
    if (pos == std::string::npos) break;
  }
  return ok_status();
}

// The directory that holds the socket must be a directory (the last component not a symlink),
// owned by the daemon's euid or root, and not writable by group or others: otherwise someone else
// could have made it, or could add or rename entries in it, and put their own socket where
// `sextant ctl` looks. Checked on the opened directory (O_NOFOLLOW, fstat), not on the name.
Status verify_socket_directory(const std::string& dir, const std::string& path, uint32_t euid) {
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
  if (fd < 0) {
    const int err = errno;
    struct stat lst {};
    if ((err == ELOOP || err == ENOTDIR) && ::lstat(dir.c_str(), &lst) == 0 && S_ISLNK(lst.st_mode)) {
      char target[4096];
      const ssize_t n = ::readlink(dir.c_str(), target, sizeof(target) - 1);
      const std::string to = n > 0 ? std::string(target, static_cast<size_t>(n)) : std::string("?");
      return directory_refused(dir, fmt::format("it is a symlink (to {})", to), euid);
    }
    if (err == ENOTDIR) {
      return failed_precondition_error("{} (the directory of the admin socket {}) is not a directory", dir, path);
    }
    return errno_status(err, fmt::format("admin socket directory {}", dir));
  }
  struct stat st {};
  const int rc = ::fstat(fd, &st);
  const int err = errno;
  ::close(fd);
  if (rc != 0) return errno_status(err, fmt::format("admin socket directory {}", dir));
  if (st.st_uid != euid && st.st_uid != 0) {
    const std::string why = fmt::format("it is owned by uid {}, not by the daemon's uid {}{}", st.st_uid, euid,
                                        euid == 0 ? "" : " or root");
    return directory_refused(dir, why, euid);
  }
  if ((st.st_mode & (S_IWGRP | S_IWOTH)) != 0) {
    return directory_refused(dir,
                             fmt::format("it has mode {:04o} (writable by {})", st.st_mode & 07777,
                                         (st.st_mode & S_IWOTH) != 0 ? "others" : "its group"),
                             euid);
  }
  return ok_status();
}

// Refuses a path another process listens on; removes a socket file nobody listens on.
Status clear_stale_socket(const std::string& path) {
  struct stat st {};
  if (::lstat(path.c_str(), &st) != 0) {
    if (errno == ENOENT) return ok_status();
    return errno_status(errno, fmt::format("admin socket {}", path));
  }
  if (!S_ISSOCK(st.st_mode)) {
    return failed_precondition_error(
        "{} exists and is not a socket; remove it or set admin.socket to another path", path);
  }
  int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (fd < 0) return errno_status(errno, "socket(AF_UNIX)");
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::memcpy(addr.sun_path, path.c_str(), path.size() + 1);
  int rc = ::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr));
  int err = errno;
  ::close(fd);
  // EAGAIN: the listener's backlog is full, so someone is listening.
  if (rc == 0 || err == EAGAIN || err == EINPROGRESS) return another_daemon_error(path);
  if (err != ECONNREFUSED && err != ENOENT) {
    return errno_status(err, fmt::format("probe the existing admin socket {}", path));
  }
  if (::unlink(path.c_str()) != 0 && errno != ENOENT) {
    return errno_status(errno, fmt::format("remove the stale admin socket {}", path));
  }
  log_info("admin: removed the stale socket {} (no process was listening on it)", path);
  return ok_status();
}

std::string allowed_uids_text(uint32_t euid, const std::vector<uint32_t>& allowed) {
  std::string out = fmt::format("the daemon's uid {}", euid);
  if (!allowed.empty()) out += fmt::format(" and admin.allowed_uids [{}]", fmt::join(allowed, ", "));
  return out;
}

}  // namespace

Status AdminOptions::validate() const {
  if (socket_path.empty()) return invalid_argument_error("admin.socket: empty");
  if (socket_path.size() > kMaxSocketPathBytes) {
    return invalid_argument_error("admin.socket: '{}' is {} bytes; a Unix socket path may have at most {}",
                                  socket_path, socket_path.size(), kMaxSocketPathBytes);
  }
  if (socket_path.find('\0') != std::string::npos) return invalid_argument_error("admin.socket: contains a NUL byte");
  if (mode > 0777) return invalid_argument_error("admin.mode: {:o} is not a permission mode (0 to 0777)", mode);
  if (max_line_bytes < 64) return invalid_argument_error("admin.max_line_bytes: must be >= 64 (got {})", max_line_bytes);
  if (max_connections <= 0) return invalid_argument_error("admin.max_connections: must be > 0 (got {})", max_connections);
  if (idle_timeout_ms == 0) return invalid_argument_error("admin.idle_timeout_ms: must be > 0");
  return ok_status();
}

class AdminServer::Impl final : public ConnectionOwner {
 public:
  Impl(uv_loop_t* loop, AdminOptions options, CommandHandler handler) : euid_(::geteuid()) {
    ctx_.loop = loop;
    ctx_.owner = this;
    ctx_.options = std::move(options);
    ctx_.handler = std::move(handler);
  }

  Status listen() {
    const std::string& path = ctx_.options.socket_path;
    if (ctx_.options.listen_fd >= 0) {  // handed over: the directory and the file were checked by its maker
      SX_RETURN_IF_ERROR(loop::uv_status(uv_pipe_init(ctx_.loop, &listener_, 0), "uv_pipe_init"));
      listener_.data = this;
      listener_open_ = true;
      SX_RETURN_IF_ERROR(loop::uv_status(uv_pipe_open(&listener_, ctx_.options.listen_fd),
                                         fmt::format("take over the admin socket {}", path)));
      struct stat st {};
      if (::lstat(path.c_str(), &st) == 0 && S_ISSOCK(st.st_mode)) {
        bound_ = true;
        dev_ = st.st_dev;
        ino_ = st.st_ino;
      }
      if (ctx_.options.accept_now) SX_RETURN_IF_ERROR(start_accepting());
      return ok_status();
    }
    const std::string dir = socket_directory(path);
    SX_RETURN_IF_ERROR(create_missing_directories(dir));
    SX_RETURN_IF_ERROR(verify_socket_directory(dir, path, euid_));
    SX_RETURN_IF_ERROR(clear_stale_socket(path));
    SX_RETURN_IF_ERROR(loop::uv_status(uv_pipe_init(ctx_.loop, &listener_, 0), "uv_pipe_init"));
    listener_.data = this;
    listener_open_ = true;
    int rc = uv_pipe_bind(&listener_, path.c_str());
    if (rc == UV_EADDRINUSE) return another_daemon_error(path);  // lost a race with another start
    SX_RETURN_IF_ERROR(loop::uv_status(rc, fmt::format("bind the admin socket {}", path)));
    struct stat st {};
    if (::lstat(path.c_str(), &st) == 0) {
      bound_ = true;
      dev_ = st.st_dev;
      ino_ = st.st_ino;
    }
    if (::chmod(path.c_str(), static_cast<mode_t>(ctx_.options.mode)) != 0) {
      return errno_status(errno, fmt::format("chmod {:o} the admin socket {}", ctx_.options.mode, path));
    }
    if (ctx_.options.accept_now) SX_RETURN_IF_ERROR(start_accepting());
    return ok_status();
  }

  Status start_accepting() {
    if (accepting_ || !listener_open_ || stop_requested_) return ok_status();
    SX_RETURN_IF_ERROR(loop::uv_status(
        uv_listen(reinterpret_cast<uv_stream_t*>(&listener_), kBacklog, &Impl::on_connection),
        fmt::format("listen on the admin socket {}", ctx_.options.socket_path)));
    accepting_ = true;
    return ok_status();
  }

  int listen_fd() const {
    return listener_open_ ? loop::handle_fd(reinterpret_cast<const uv_handle_t*>(&listener_)) : -1;
  }

  void keep_socket_file() {
    bound_ = false;
    // libuv removes the path a pipe was bound to when it closes the pipe (uv__pipe_close); the
    // path now serves the process the socket went to, so this pipe forgets it (the name is libuv's
    // own allocation, freed here as libuv would).
    if (listener_open_ && listener_.pipe_fname != nullptr) {
      std::free(const_cast<char*>(listener_.pipe_fname));
      listener_.pipe_fname = nullptr;
    }
  }

  const AdminCounters& stats() const { return ctx_.stats; }
  const std::string& path() const { return ctx_.options.socket_path; }
  bool finished() const { return finished_; }

  void stop(std::function<void()> on_stopped) {
    if (finished_) {
      if (on_stopped) on_stopped();  // already stopped: at once
      return;
    }
    if (on_stopped) {
      if (on_stopped_) {
        on_stopped_ = [a = std::move(on_stopped_), b = std::move(on_stopped)] { a(); b(); };
      } else {
        on_stopped_ = std::move(on_stopped);
      }
    }
    if (stop_requested_) return;
    stop_requested_ = true;
    if (listener_open_) {
      uv_close(reinterpret_cast<uv_handle_t*>(&listener_), &Impl::on_listener_closed);
    }
    unlink_socket();
    // begin_stop() and close_now() only schedule closes: the map changes in close callbacks.
    for (auto& entry : connections_) {
      if (abandoned_) {
        entry.first->close_now();  // nobody waits for answers still flushing
      } else {
        entry.first->begin_stop();
      }
    }
    maybe_finish();  // may free this object: nothing after
  }

  // The owner is gone: close everything; this object frees itself when the last handle closed.
  static void abandon(std::unique_ptr<Impl> impl) {
    Impl* raw = impl.get();
    raw->on_stopped_ = nullptr;
    raw->self_ = std::move(impl);
    if (raw->stop_requested_) {
      // A stop is under way: cut the connections still flushing.
      for (auto& entry : raw->connections_) entry.first->close_now();
      return;
    }
    raw->abandoned_ = true;
    raw->stop(nullptr);  // may free raw: nothing after
  }

  void connection_closed(AdminConnection* c) override {
    auto it = connections_.find(c);
    if (it != connections_.end()) {
      if (it->second.active) {
        --active_;
        ctx_.stats.open_connections.store(static_cast<uint64_t>(active_), std::memory_order_relaxed);
      } else {
        --refusing_;
      }
      connections_.erase(it);
    }
    maybe_finish();  // may free this object: nothing after
  }

 private:
  struct Entry {
    std::unique_ptr<AdminConnection> connection;
    bool active = false;  // serving requests (not refused)
  };

  static void on_connection(uv_stream_t* listener, int status) {
    auto* self = static_cast<Impl*>(listener->data);
    if (status < 0) {
      log_warn("admin: accept: {}", uv_strerror(status));
      return;
    }
    self->accept_one(listener);
  }

  void accept_one(uv_stream_t* listener) {
    auto owned = std::make_unique<AdminConnection>(ctx_);
    AdminConnection* c = owned.get();
    Entry& entry = connections_[c];
    entry.connection = std::move(owned);
    ctx_.stats.accepted_connections.fetch_add(1, std::memory_order_relaxed);
    ++refusing_;  // until it is known to be served
    // From here on `c` ends through connection_closed(), whatever happens.
    if (!c->open(listener)) return;
    Status refusal = admission(*c);
    if (refusal.ok()) {
      --refusing_;
      entry.active = true;
      ++active_;
      ctx_.stats.open_connections.store(static_cast<uint64_t>(active_), std::memory_order_relaxed);
      c->start();
      return;
    }
    if (refusing_ > kMaxRefusing) {
      c->close_now();  // a flood: no answer
    } else {
      c->refuse(refusal);
    }
  }

  // OK when the peer may use the socket now; otherwise the line it gets before the close.
  Status admission(AdminConnection& c) {
    Result<PeerCredentials> peer = c.peer_credentials();
    if (!peer.ok()) {
      ctx_.stats.refused_peers.fetch_add(1, std::memory_order_relaxed);
      log_warn("admin: refusing a connection: {}", peer.status().message());
      return Status(StatusCode::kPermissionDenied, peer.status().message());
    }
    const std::vector<uint32_t>& allowed = ctx_.options.allowed_uids;
    if (peer->uid != euid_ && std::find(allowed.begin(), allowed.end(), peer->uid) == allowed.end()) {
      ctx_.stats.refused_peers.fetch_add(1, std::memory_order_relaxed);
      log_warn("admin: refused a connection from uid {} (pid {}) on {}", peer->uid, peer->pid,
               ctx_.options.socket_path);
      return Status(StatusCode::kPermissionDenied,
                    fmt::format("uid {} is not allowed on the admin socket {} (allowed: {}; add the uid "
                                "to admin.allowed_uids to let it in)",
                                peer->uid, ctx_.options.socket_path, allowed_uids_text(euid_, allowed)));
    }
    if (active_ >= ctx_.options.max_connections) {
      ctx_.stats.rejected_over_capacity.fetch_add(1, std::memory_order_relaxed);
      return resource_exhausted_error("too many admin connections (max_connections = {}); try again later",
                                      ctx_.options.max_connections);
    }
    return ok_status();
  }

  static void on_listener_closed(uv_handle_t* handle) {
    auto* self = static_cast<Impl*>(handle->data);
    self->listener_open_ = false;
    self->maybe_finish();  // may free self
  }

  void unlink_socket() {
    if (!bound_) return;
    bound_ = false;
    const std::string& path = ctx_.options.socket_path;
    struct stat st {};
    // Only the file this server bound: a socket someone else put there since stays.
    if (::lstat(path.c_str(), &st) == 0 && st.st_dev == dev_ && st.st_ino == ino_) {
      if (::unlink(path.c_str()) != 0) log_warn("admin: cannot remove {}: {}", path, std::strerror(errno));
    }
  }

  void maybe_finish() {
    if (!stop_requested_ || finished_ || listener_open_ || !connections_.empty()) return;
    finished_ = true;
    std::function<void()> callback = std::move(on_stopped_);
    if (self_) {
      std::unique_ptr<Impl> self = std::move(self_);  // abandoned: free now, no callback
      return;
    }
    if (callback) callback();  // may destroy the AdminServer and this object
  }

  AdminContext ctx_;
  uv_pipe_t listener_{};
  bool listener_open_ = false;  // initialised and its close callback has not run
  bool accepting_ = false;
  bool bound_ = false;          // the socket file at the path is ours (dev_, ino_)
  dev_t dev_ = 0;
  ino_t ino_ = 0;
  const uint32_t euid_;
  std::unordered_map<AdminConnection*, Entry> connections_;
  int active_ = 0;        // accepted, admitted, not closed
  size_t refusing_ = 0;   // accepted, refused (or not yet admitted), not closed
  bool stop_requested_ = false;
  bool abandoned_ = false;
  bool finished_ = false;
  std::function<void()> on_stopped_;
  std::unique_ptr<Impl> self_;  // set by abandon()
};

Result<std::unique_ptr<AdminServer>> AdminServer::start(uv_loop_t* loop, AdminOptions options,
                                                        CommandHandler handler) {
  SX_RETURN_IF_ERROR(options.validate());
  auto impl = std::make_unique<Impl>(loop, std::move(options), std::move(handler));
  Status status = impl->listen();
  if (!status.ok()) {
    Impl::abandon(std::move(impl));
    return status;
  }
  return std::make_unique<AdminServer>(std::move(impl));
}

AdminServer::AdminServer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)), path_(impl_->path()) {}

AdminServer::~AdminServer() {
  if (!impl_ || impl_->finished()) return;
  Impl::abandon(std::move(impl_));
}

void AdminServer::stop(std::function<void()> on_stopped) {
  if (impl_) impl_->stop(std::move(on_stopped));
}

Status AdminServer::start_accepting() { return impl_ ? impl_->start_accepting() : ok_status(); }

int AdminServer::listen_fd() const { return impl_ ? impl_->listen_fd() : -1; }

void AdminServer::keep_socket_file() {
  if (impl_) impl_->keep_socket_file();
}

AdminStats AdminServer::stats() const { return impl_ ? impl_->stats().snapshot() : AdminStats{}; }

}  // namespace sx::daemon::admin
