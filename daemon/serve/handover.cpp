// Handing the listening sockets to a new daemon, and taking them over.
#include "daemon/serve/handover.h"

#include <fcntl.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <optional>

#include <fmt/format.h>

#include "daemon/loop/uv_status.h"

extern char** environ;

namespace sx::daemon::serve {

namespace {

constexpr const char* kListenVar = "SEXTANT_LISTEN_FDS";
constexpr const char* kReadyVar = "SEXTANT_READY_FD";
constexpr int kHttpFd = 3, kAdminFd = 4, kReadyFd = 5;

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
      if (fd < 0 || !is_listening_socket(fd) || (name != "http" && name != "admin")) {
        return invalid_argument_error("{}: expected http:FD,admin:FD naming listening sockets, got \"{}\"",
                                      kListenVar, text);
      }
      (name == "http" ? in.http : in.admin) = fd;
    }
    in.ready = parse_fd(ready_text);
    if (in.ready < 0 || !is_open(in.ready)) {
      return invalid_argument_error("{}: expected an open descriptor, got \"{}\"", kReadyVar, ready_text);
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
    for (int fd : {in.http, in.admin}) {
      if (fd >= 0 && !is_listening_socket(fd)) {
        return invalid_argument_error("LISTEN_FDS: descriptor {} is not a listening socket (check the .socket unit's "
                                      "FileDescriptorName= values: http, admin)", fd);
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
  bool process_open = false, pipe_open = false, owner_gone = false, reported = false;
  std::string received;
  std::optional<Status> exited;  // how the process ended, when it did before it was ready
  Successor::Done done;

  void report(Status s) {
    if (reported) return;
    reported = true;
    if (done) done(std::move(s));
  }
  void close_pipe() {
    if (!pipe_open || uv_is_closing(reinterpret_cast<uv_handle_t*>(&pipe))) return;
    uv_close(reinterpret_cast<uv_handle_t*>(&pipe), [](uv_handle_t* h) {
      auto* self = static_cast<Impl*>(h->data);
      self->pipe_open = false;
      self->maybe_free();
    });
  }
  void close_process() {
    if (!process_open || uv_is_closing(reinterpret_cast<uv_handle_t*>(&process))) return;
    uv_close(reinterpret_cast<uv_handle_t*>(&process), [](uv_handle_t* h) {
      auto* self = static_cast<Impl*>(h->data);
      self->process_open = false;
      self->maybe_free();
    });
  }
  void maybe_free() {
    if (owner_gone && !process_open && !pipe_open) delete this;
  }
  // A whole line from the new process: "ready" or "error <message>".
  void on_line(const std::string& line) {
    uv_read_stop(reinterpret_cast<uv_stream_t*>(&pipe));
    close_pipe();
    if (line == "ready") {
      report(ok_status());
    } else if (line.rfind("error ", 0) == 0) {
      report(failed_precondition_error("the new process did not start: {}", line.substr(6)));
    } else {
      report(internal_error("the new process said \"{}\" instead of ready", line));
    }
  }
};

Result<std::unique_ptr<Successor>> Successor::start(uv_loop_t* loop, const std::string& binary,
                                                    const std::vector<std::string>& serve_args, int http_fd,
                                                    int admin_fd, Done done) {
  int fds[2];
  if (::pipe2(fds, O_CLOEXEC) != 0) return internal_error("pipe2: {}", std::strerror(errno));
  auto* impl = new Impl();
  impl->done = std::move(done);
  impl->pipe.data = impl;
  impl->process.data = impl;
  std::unique_ptr<Successor> s(new Successor(impl));
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
  o.exit_cb = [](uv_process_t* p, int64_t status, int signal) {
    auto* self = static_cast<Impl*>(p->data);
    self->exited = signal != 0
                       ? internal_error("the new process was killed by signal {} before it was ready", signal)
                       : failed_precondition_error("the new process exited with status {} before it was ready", status);
    // Its error line may still wait in the pipe: the pipe's end reports, unless it is gone.
    if (!self->pipe_open) self->report(*self->exited);
    self->close_process();
  };
  const int rc = uv_spawn(loop, &impl->process, &o);
  ::close(fds[1]);  // the child has its copy; the pipe's end comes when the child closes it
  if (rc != 0) {
    uv_close(reinterpret_cast<uv_handle_t*>(&impl->process), nullptr);  // required after a failed spawn
    return loop::uv_status(rc, fmt::format("start {}", binary));
  }
  impl->process_open = true;
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
        if (const std::size_t nl = self->received.find('\n'); nl != std::string::npos) {
          self->on_line(self->received.substr(0, nl));
          return;
        }
        if (n < 0) {  // the end without a line: how the process ended says why
          uv_read_stop(stream);
          self->close_pipe();  // before report(), whose callback may destroy the owner
          self->report(self->exited ? *self->exited
                                    : failed_precondition_error("the new process (pid {}) closed its pipe before it "
                                                                "was ready, without an error line", self->process.pid));
        }
      });
  return s;
}

Successor::~Successor() {
  impl_->done = nullptr;
  impl_->owner_gone = true;
  impl_->close_pipe();
  impl_->close_process();
  impl_->maybe_free();
}

int Successor::pid() const { return impl_->process_open ? impl_->process.pid : -1; }

}  // namespace sx::daemon::serve
