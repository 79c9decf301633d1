// Handing the listening sockets to a new daemon, and taking them over.
#include "daemon/serve/handover.h"

#include <fcntl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <csignal>
#include <optional>

#include <fmt/format.h>

#include "daemon/loop/uv_status.h"

extern char** environ;

namespace sx::daemon::serve {

namespace {

constexpr const char* kListenVar = "SEXTANT_LISTEN_FDS";
constexpr const char* kReadyVar = "SEXTANT_READY_FD";
constexpr int kHttpFd = 3, kAdminFd = 4, kReadyFd = 5;
// A ready line is "ready" or "error <the first error>": far below this.
constexpr std::size_t kMaxReadyLine = 4096;

// A descriptor number of at least 3, or -1.
int parse_fd(std::string_view s) {
  if (s.empty() || s.size() > 6) return -1;
  int v = 0;
  for (char c : s) {
    if (c < '0' || c > '9') return -1;
    v = v * 10 + (c - '0');
  }
  return v >= 3 ? v : -1;
}

void set_cloexec(int fd) {
  const int flags = ::fcntl(fd, F_GETFD);
  if (flags >= 0) (void)::fcntl(fd, F_SETFD, flags | FD_CLOEXEC);
}

bool is_open(int fd) { return ::fcntl(fd, F_GETFD) >= 0; }

// A socket in the listening state (what systemd and a replaced daemon hand over).
bool is_listening_socket(int fd) {
  int listening = 0;
  socklen_t len = sizeof(listening);
  return ::getsockopt(fd, SOL_SOCKET, SO_ACCEPTCONN, &listening, &len) == 0 && listening != 0;
}

// The address family of a socket (AF_INET, AF_INET6, AF_UNIX), or -1.
int socket_family(int fd) {
  sockaddr_storage a{};
  socklen_t len = sizeof(a);
  if (::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) != 0) return -1;
  return a.ss_family;
}

// The listener for `name` ("http": TCP; "admin": a Unix socket) is what it must be: else why not.
std::string listener_problem(std::string_view name, int fd) {
  if (!is_listening_socket(fd)) return fmt::format("descriptor {} is not a listening socket", fd);
  const int family = socket_family(fd);
  if (name == "http" && family != AF_INET && family != AF_INET6) {
    return fmt::format("descriptor {} for http is not a TCP socket", fd);
  }
  if (name == "admin" && family != AF_UNIX) return fmt::format("descriptor {} for admin is not a Unix socket", fd);
  return {};
}

// What the environment said, fit for a message: at most 200 bytes (the log escapes the rest).
std::string quoted(std::string_view value) {
  return value.size() > 200 ? std::string(value.substr(0, 200)) + "..." : std::string(value);
}

}  // namespace

Result<InheritedListeners> take_inherited_listeners() {
  InheritedListeners in;
  if (const char* listen = std::getenv(kListenVar)) {
    const std::string text = listen;
    const char* ready = std::getenv(kReadyVar);
    const std::string ready_text = ready != nullptr ? ready : "";
    ::unsetenv(kListenVar);
    ::unsetenv(kReadyVar);
    // "http:3,admin:4"
    std::string_view rest = text;
    while (!rest.empty()) {
      const std::size_t comma = rest.find(',');
      const std::string_view item = rest.substr(0, comma);
      rest = comma == std::string_view::npos ? std::string_view{} : rest.substr(comma + 1);
      const std::size_t colon = item.find(':');
      const int fd = colon == std::string_view::npos ? -1 : parse_fd(item.substr(colon + 1));
      const std::string_view name = item.substr(0, colon);
      if (fd < 0 || (name != "http" && name != "admin")) {
        return invalid_argument_error("{}: expected http:FD,admin:FD naming listening sockets, got \"{}\"",
                                      kListenVar, quoted(text));
      }
      int& slot = name == "http" ? in.http : in.admin;
      if (slot >= 0) return invalid_argument_error("{}: {} is named twice in \"{}\"", kListenVar, name, quoted(text));
      if (const std::string why = listener_problem(name, fd); !why.empty()) {
        return invalid_argument_error("{}: {} (\"{}\")", kListenVar, why, quoted(text));
      }
      slot = fd;
    }
    if (in.http >= 0 && in.http == in.admin) {
      return invalid_argument_error("{}: one descriptor ({}) for both http and admin", kListenVar, in.http);
    }
    in.ready = parse_fd(ready_text);
    struct stat st {};
    if (in.ready < 0 || !is_open(in.ready)) {
      return invalid_argument_error("{}: expected an open descriptor, got \"{}\"", kReadyVar, quoted(ready_text));
    }
    if (in.ready == in.http || in.ready == in.admin || ::fstat(in.ready, &st) != 0 || !S_ISFIFO(st.st_mode)) {
      const int named = in.ready;
      in.ready = -1;  // never written to, never closed: it is not the pipe of a replaced daemon
      return invalid_argument_error("{}: descriptor {} is not the write end of a pipe (a replaced daemon's ready "
                                    "pipe){}", kReadyVar, named,
                                    named == in.http || named == in.admin ? ": it is one of the listening sockets" : "");
    }
    in.source = "ctl upgrade";
  } else if (const char* pid = std::getenv("LISTEN_PID"); pid != nullptr && std::atol(pid) == ::getpid()) {
    const char* count = std::getenv("LISTEN_FDS");
    const char* names = std::getenv("LISTEN_FDNAMES");
    const int n = count != nullptr ? std::atoi(count) : 0;
    std::vector<std::string> name_list;
    if (names != nullptr) {
      std::string_view rest = names;
      while (true) {
        const std::size_t colon = rest.find(':');
        name_list.emplace_back(rest.substr(0, colon));
        if (colon == std::string_view::npos) break;
        rest = rest.substr(colon + 1);
      }
    }
    for (int i = 0; i < n; ++i) {
      const int fd = 3 + i;  // SD_LISTEN_FDS_START
      const std::string name = i < static_cast<int>(name_list.size()) ? name_list[static_cast<std::size_t>(i)] : "";
      const bool unnamed = name.empty() || name == "unknown";
      if (name == "http" || (unnamed && i == 0)) {
        in.http = fd;
      } else if (name == "admin" || (unnamed && i == 1)) {
        in.admin = fd;
      }
    }
    ::unsetenv("LISTEN_PID");
    ::unsetenv("LISTEN_FDS");
    ::unsetenv("LISTEN_FDNAMES");
    for (const auto& [name, fd] : {std::pair<std::string_view, int>{"http", in.http}, {"admin", in.admin}}) {
      if (fd < 0) continue;
      if (const std::string why = listener_problem(name, fd); !why.empty()) {
        return invalid_argument_error("LISTEN_FDS: {} (check the .socket unit's FileDescriptorName= values: http, "
                                      "admin)", why);
      }
    }
    if (in.http >= 0 || in.admin >= 0) in.source = "systemd";
  }
  for (int fd : {in.http, in.admin, in.ready}) {
    if (fd >= 0) set_cloexec(fd);
  }
  return in;
}

void report_to_parent(int& fd, std::string_view line) {
  if (fd < 0) return;
  std::string text(line);
  text += '\n';
  const char* p = text.data();
  std::size_t left = text.size();
  while (left > 0) {
    const ssize_t n = ::write(fd, p, left);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    p += n;
    left -= static_cast<std::size_t>(n);
  }
  ::close(fd);
  fd = -1;
}

// ---------------------------------------------------------------------------------------------

struct Successor::Impl {
  uv_process_t process{};
  uv_pipe_t pipe{};
  uv_timer_t timer{};  // the ready deadline, then the grace between SIGTERM and SIGKILL
  bool process_open = false, pipe_open = false, timer_open = false;
  bool owner_gone = false, reported = false, ready = false, running = false, terminating = false;
  std::string received;
  std::optional<Status> exited;  // how the process ended, when it did before it was ready
  Successor::Done done;
  std::uint64_t ready_timeout_ms = 0;
  std::uint64_t kill_grace_ms = Successor::kKillGraceMs;

  void report(Status s) {
    if (reported) return;
    reported = true;
    ready = s.ok();
    if (!ready) terminate();  // whatever went wrong, the process must not live on
    if (done) done(std::move(s));
  }
  // SIGTERM now, SIGKILL after the grace; the exit callback reaps it and frees what is left.
  void terminate() {
    if (!running || terminating) return;
    terminating = true;
    signal_group(SIGTERM);
    if (timer_open) {
      uv_timer_stop(&timer);
      uv_timer_start(&timer, [](uv_timer_t* t) {
        auto* self = static_cast<Impl*>(t->data);
        if (self->running) self->signal_group(SIGKILL);
      }, kill_grace_ms, 0);
    }
  }
  // The process and its group (it leads one: UV_PROCESS_DETACHED).
  void signal_group(int signum) {
    if (!running) return;
    (void)::kill(-process.pid, signum);
    (void)uv_process_kill(&process, signum);
  }
  void close_handle(uv_handle_t* h, bool& open) {
    if (!open || uv_is_closing(h)) return;
    uv_close(h, [](uv_handle_t* closed) {
      auto* self = static_cast<Impl*>(closed->data);
      if (closed == reinterpret_cast<uv_handle_t*>(&self->pipe)) self->pipe_open = false;
      if (closed == reinterpret_cast<uv_handle_t*>(&self->process)) self->process_open = false;
      if (closed == reinterpret_cast<uv_handle_t*>(&self->timer)) self->timer_open = false;
      self->maybe_free();
    });
  }
  void close_pipe() { close_handle(reinterpret_cast<uv_handle_t*>(&pipe), pipe_open); }
  void close_timer() { close_handle(reinterpret_cast<uv_handle_t*>(&timer), timer_open); }
  void close_process() { close_handle(reinterpret_cast<uv_handle_t*>(&process), process_open); }
  void maybe_free() {
    if (owner_gone && !process_open && !pipe_open && !timer_open) delete this;
  }
  // A whole line from the new process: "ready" or "error <message>".
  void on_line(const std::string& line) {
    uv_read_stop(reinterpret_cast<uv_stream_t*>(&pipe));
    close_pipe();
    if (line == "ready") {
      if (timer_open) uv_timer_stop(&timer);
      report(ok_status());
    } else if (line.rfind("error ", 0) == 0) {
      report(failed_precondition_error("the new process did not start: {}", line.substr(6)));
    } else {
      report(internal_error("the new process said \"{}\" instead of ready", line.substr(0, 200)));
    }
  }
};

Result<std::unique_ptr<Successor>> Successor::start(uv_loop_t* loop, const std::string& binary,
                                                    const std::vector<std::string>& serve_args, int http_fd,
                                                    int admin_fd, std::uint64_t ready_timeout_ms, Done done) {
  int fds[2];
  if (::pipe2(fds, O_CLOEXEC) != 0) return internal_error("pipe2: {}", std::strerror(errno));
  auto* impl = new Impl();
  impl->done = std::move(done);
  impl->pipe.data = impl;
  impl->process.data = impl;
  impl->timer.data = impl;
  std::unique_ptr<Successor> s(new Successor(impl));
  if (int rc = uv_timer_init(loop, &impl->timer); rc != 0) {
    ::close(fds[0]);
    ::close(fds[1]);
    return loop::uv_status(rc, "uv_timer_init");
  }
  impl->timer_open = true;
  if (int rc = uv_pipe_init(loop, &impl->pipe, 0); rc != 0) {
    ::close(fds[0]);
    ::close(fds[1]);
    return loop::uv_status(rc, "uv_pipe_init");
  }
  impl->pipe_open = true;
  if (int rc = uv_pipe_open(&impl->pipe, fds[0]); rc != 0) {
    ::close(fds[0]);
    ::close(fds[1]);
    return loop::uv_status(rc, "uv_pipe_open");
  }
  // argv: the binary, "serve", the arguments the running daemon was started with.
  std::vector<std::string> args{binary, "serve"};
  args.insert(args.end(), serve_args.begin(), serve_args.end());
  std::vector<char*> argv;
  for (std::string& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  std::vector<std::string> env;
  for (char** e = environ; *e != nullptr; ++e) {
    const std::string_view v = *e;
    if (v.starts_with("SEXTANT_LISTEN_FDS=") || v.starts_with("SEXTANT_READY_FD=") || v.starts_with("LISTEN_")) continue;
    env.emplace_back(v);
  }
  env.push_back(fmt::format("{}=http:{},admin:{}", kListenVar, kHttpFd, kAdminFd));
  env.push_back(fmt::format("{}={}", kReadyVar, kReadyFd));
  std::vector<char*> envp;
  for (std::string& e : env) envp.push_back(e.data());
  envp.push_back(nullptr);
  uv_stdio_container_t stdio[6];
  const int parent_fds[6] = {0, 1, 2, http_fd, admin_fd, fds[1]};
  for (int i = 0; i < 6; ++i) {
    stdio[i].flags = UV_INHERIT_FD;
    stdio[i].data.fd = parent_fds[i];
  }
  uv_process_options_t o{};
  o.file = binary.c_str();
  o.args = argv.data();
  o.env = envp.data();
  o.stdio_count = 6;
  o.stdio = stdio;
  // Its own process group (and session): ending it ends whatever it started too (a wrapper
  // script's children hold the inherited sockets as well), and the terminal's Ctrl-C that stops
  // this daemon does not reach the daemon that replaces it.
  o.flags = UV_PROCESS_DETACHED;
  o.exit_cb = [](uv_process_t* p, int64_t status, int signal) {
    auto* self = static_cast<Impl*>(p->data);
    self->running = false;  // reaped by libuv
    // What it started and left behind in its group goes too (it holds the sockets as well).
    if (self->terminating) (void)::kill(-p->pid, SIGKILL);
    self->exited = signal != 0
                       ? internal_error("the new process was killed by signal {} before it was ready", signal)
                       : failed_precondition_error("the new process exited with status {} before it was ready", status);
    // Its error line may still wait in the pipe: the pipe's end reports, unless it is gone.
    if (!self->pipe_open) self->report(*self->exited);
    self->close_timer();
    self->close_process();
  };
  const int rc = uv_spawn(loop, &impl->process, &o);
  ::close(fds[1]);  // the child has its copy; the pipe's end comes when the child closes it
  if (rc != 0) {
    uv_close(reinterpret_cast<uv_handle_t*>(&impl->process), nullptr);  // required after a failed spawn
    return loop::uv_status(rc, fmt::format("start {}", binary));
  }
  impl->process_open = true;
  impl->running = true;
  // The ready deadline: a new process that neither reports nor exits is ended.
  uv_timer_start(&impl->timer, [](uv_timer_t* t) {
    auto* self = static_cast<Impl*>(t->data);
    if (self->pipe_open) {
      uv_read_stop(reinterpret_cast<uv_stream_t*>(&self->pipe));
      self->close_pipe();
    }
    self->report(deadline_exceeded_error("the new process (pid {}) did not report ready within {} ms "
                                         "(admin.upgrade_timeout_ms); it was ended", self->process.pid,
                                         self->ready_timeout_ms));
  }, ready_timeout_ms, 0);
  impl->ready_timeout_ms = ready_timeout_ms;
  uv_read_start(
      reinterpret_cast<uv_stream_t*>(&impl->pipe),
      [](uv_handle_t*, size_t suggested, uv_buf_t* buf) {
        buf->base = static_cast<char*>(std::malloc(suggested));
        buf->len = buf->base != nullptr ? suggested : 0;
      },
      [](uv_stream_t* stream, ssize_t n, const uv_buf_t* buf) {
        auto* self = static_cast<Impl*>(stream->data);
        if (n > 0) self->received.append(buf->base, static_cast<std::size_t>(n));
        std::free(buf->base);
        if (const std::size_t nl = self->received.find('\n'); nl != std::string::npos && nl <= kMaxReadyLine) {
          self->on_line(self->received.substr(0, nl));
          return;
        }
        if (self->received.size() > kMaxReadyLine) {  // a ready line is a few words; an error one line
          uv_read_stop(stream);
          self->close_pipe();
          self->report(internal_error("the new process (pid {}) wrote more than {} bytes to its ready pipe without "
                                      "ending a line; it was ended", self->process.pid, kMaxReadyLine));
          return;
        }
        if (n < 0) {  // the end without a line: how the process ended says why
          uv_read_stop(stream);
          self->close_pipe();  // before report(), whose callback may destroy the owner
          self->report(self->exited ? *self->exited
                                    : failed_precondition_error("the new process (pid {}) closed its pipe before it "
                                                                "was ready, without an error line; it was ended",
                                                                self->process.pid));
        }
      });
  return s;
}

Successor::~Successor() {
  impl_->done = nullptr;
  impl_->owner_gone = true;
  impl_->close_pipe();
  if (impl_->ready) {
    // The new daemon serves: it runs on, and outlives this process.
    impl_->close_timer();
    impl_->close_process();
  } else {
    // Not ready (or not yet): it is ended, and its handles stay open until it has exited, so that
    // it is reaped and the loop (and so this process) waits for it to let go of the sockets.
    impl_->terminate();
    if (!impl_->running) {
      impl_->close_timer();
      impl_->close_process();
    }
  }
  impl_->maybe_free();
}

int Successor::pid() const { return impl_->running || impl_->ready ? impl_->process.pid : -1; }

}  // namespace sx::daemon::serve
