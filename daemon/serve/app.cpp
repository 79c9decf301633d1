// The `sextant serve` daemon's lifecycle (daemon.h): start-up phases, the listening sockets, signals,
// drain, upgrade and shutdown, and run_daemon.
#include "daemon/serve/app.h"

#include <arpa/inet.h>
#include <unistd.h>
#include <netinet/in.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <uv.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <csignal>
#include <cstdlib>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "daemon/admin/admin_server.h"
#include "daemon/admin/protocol.h"
#include "daemon/commands/model_session.h"
#include "daemon/config/yaml_io.h"
#include "daemon/diagnose/known_failures.h"
#include "daemon/serve/start_log.h"
#include "daemon/http/router.h"
#include "daemon/http/server.h"
#include "daemon/loop/async_queue.h"
#include "daemon/loop/timer.h"
#include "daemon/loop/uv_status.h"
#include "daemon/openai/response.h"
#include "daemon/config/serve_flags.h"
#include "daemon/replicas/replica.h"
#include "daemon/serve/handover.h"
#include "daemon/serve/metrics.h"
#include "runtime/base/log.h"
#include "runtime/engine/engine.h"
#include "daemon/serve/daemon.h"

namespace sx::daemon::serve {
namespace detail {

StartLog* g_start_log = nullptr;

namespace {


// An IPv6 literal in a URL goes in brackets (RFC 3986 §3.2.2).
std::string url_host(const std::string& host) {
  return host.find(':') != std::string::npos ? "[" + host + "]" : host;
}

// Only this machine can connect: 127.0.0.0/8, ::1, or 127.0.0.0/8 mapped into IPv6.
bool is_loopback_address(const std::string& host) {
  in_addr a4{};
  if (inet_pton(AF_INET, host.c_str(), &a4) == 1) return (ntohl(a4.s_addr) >> 24) == 127;
  in6_addr a6{};
  if (inet_pton(AF_INET6, host.c_str(), &a6) != 1) return false;
  if (IN6_IS_ADDR_LOOPBACK(&a6)) return true;
  return IN6_IS_ADDR_V4MAPPED(&a6) && a6.s6_addr[12] == 127;
}

// Descriptors kept out of the HTTP server's reach: the admin server's connections (64 served,
// 16 being refused), model and config files, the loop's own, libuv's thread pool.
constexpr std::size_t kReservedDescriptors = 128;

struct DescriptorBudget {
  std::uint64_t soft_limit = 0, hard_limit = 0;
  std::size_t http_sockets = 0;  // sockets the HTTP server may hold
};

// Raises RLIMIT_NOFILE's soft limit towards the hard one as far as `max_connections` needs, and
// says how many sockets the HTTP server may then hold.
DescriptorBudget descriptor_budget(std::size_t max_connections) {
  DescriptorBudget b;
  rlimit lim{};
  if (getrlimit(RLIMIT_NOFILE, &lim) != 0) {
    b.http_sockets = max_connections;
    return b;
  }
  // Served connections, plus as many again being refused with a 503, plus the reserve.
  const rlim_t want = static_cast<rlim_t>(2 * max_connections + kReservedDescriptors);
  if (lim.rlim_cur != RLIM_INFINITY && lim.rlim_cur < want) {
    rlimit raised = lim;
    raised.rlim_cur = lim.rlim_max == RLIM_INFINITY ? want : std::min(want, lim.rlim_max);
    if (setrlimit(RLIMIT_NOFILE, &raised) == 0) {
      if (raised.rlim_cur > lim.rlim_cur) {
        log_info("serve: raised the descriptor limit (RLIMIT_NOFILE) from {} to {} for http.max_connections",
                 lim.rlim_cur, raised.rlim_cur);
      }
      lim = raised;
    }
  }
  b.soft_limit = lim.rlim_cur;
  b.hard_limit = lim.rlim_max;
  if (lim.rlim_cur == RLIM_INFINITY) {
    b.http_sockets = 2 * max_connections;
  } else {
    b.http_sockets = lim.rlim_cur > kReservedDescriptors ? static_cast<std::size_t>(lim.rlim_cur) - kReservedDescriptors : 0;
  }
  return b;
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// Start-up

int Daemon::run() {
  std::signal(SIGPIPE, SIG_IGN);
  // Before the loop opens descriptors of its own: inherited sockets start at 3.
  auto inherited = take_inherited_listeners();
  if (!inherited.ok()) {
    log_error("serve: failed in phase http: {}", inherited.status().to_string());
    return 1;
  }
  inherited_ = std::move(inherited).value();
  if (Status s = loop::uv_status(uv_loop_init(&loop_), "uv_loop_init"); !s.ok()) {
    log_error("serve: failed in phase loop: {}", s.to_string());
    return 1;
  }
  log_info("serve: phase config: ok (model {}, backend {}, tp {} x pp {}, max_num_seqs {})", config_.model.path,
           config_.model.backend, config_.model.tp, config_.model.pp, config_.engine.max_num_seqs);
  if (const char* hooks = std::getenv("SEXTANT_TEST_HOOKS"); hooks != nullptr && std::string_view(hooks) == "1") {
    test_hooks_ = true;
    log_warn("serve: SEXTANT_TEST_HOOKS=1: requests may script the model's answer (sextant_test_script); for "
             "tests only");
  }
  auto loaded = loop::AsyncQueue<Loaded>::create(&loop_, [this](Loaded l) { on_loaded(std::move(l)); });
  auto events = loop::AsyncQueue<EngineEvent>::create(&loop_, [this](EngineEvent e) { on_event(std::move(e)); });
  auto compiled = loop::AsyncQueue<std::unique_ptr<TokenizeWork>>::create(
      &loop_, [this](std::unique_ptr<TokenizeWork> w) {
        if (w == nullptr) return compiled_->close();  // stop_compiles: the last of them came back
        start_generate(std::move(*w), 0);
      });
  if (!loaded.ok() || !events.ok() || !compiled.ok()) {
    log_error("serve: failed in phase loop: {}",
              (!loaded.ok() ? loaded.status() : !events.ok() ? events.status() : compiled.status()).to_string());
    return 1;
  }
  loaded_queue_ = std::move(loaded).value();
  events_ = std::move(events).value();
  compiled_ = std::move(compiled).value();
  compiles_ = std::make_unique<CompilePool>(static_cast<int>(config_.limits.grammar_compile_threads));
  start_signals();
  {
    char path[4096];
    const ssize_t n = ::readlink("/proc/self/exe", path, sizeof(path) - 1);
    if (n > 0) self_binary_.assign(path, static_cast<std::size_t>(n));
  }
  if (Status s = start_http(); !s.ok()) {
    fail_startup("http", s);
  } else if (Status a = start_admin(); !a.ok()) {
    fail_startup("admin", a);
  } else {
    load_in_background(config_, model_name_, next_generation_++);
  }
  uv_run(&loop_, UV_RUN_DEFAULT);
  if (loader_.joinable()) loader_.join();
  for (const auto& r : all_replicas()) r->stop();
  // Handles closed by close_everything(); a last run frees what their close callbacks own.
  uv_run(&loop_, UV_RUN_DEFAULT);
  const int rc = uv_loop_close(&loop_);
  if (rc != 0) log_warn("serve: the event loop still had open handles at exit ({})", uv_strerror(rc));
  log_info("serve: stopped (exit status {})", exit_code_);
  return exit_code_;
}

void Daemon::fail_startup(const std::string& phase, const Status& s) {
  log_error("serve: failed in phase {}: {}", phase, s.to_string());
  // A known failure (daemon/diagnose): its root cause and fix on one line.
  if (const std::string why = diagnose::cause_and_fix(s); !why.empty()) log_error("serve: {}", why);
  exit_code_ = 1;
  if (inherited_.from_daemon()) {
    // The daemon that started this one goes on serving on the same sockets: leave its file, and
    // tell it why.
    if (admin_) admin_->keep_socket_file();
    report_to_parent(inherited_.ready, fmt::format("error serve: failed in phase {}: {}", phase, s.to_string()));
  }
  close_everything();
}

Status Daemon::start_http() {
  http::ServerOptions o;
  o.host = config_.http.host;
  o.port = static_cast<std::uint16_t>(config_.http.port);
  o.max_connections = static_cast<std::size_t>(config_.http.max_connections);
  o.max_header_bytes = static_cast<std::size_t>(config_.http.max_header_bytes);
  o.max_body_bytes = static_cast<std::size_t>(config_.http.max_body_bytes);
  o.header_timeout_ms = static_cast<std::uint64_t>(config_.http.header_timeout_ms);
  o.body_timeout_ms = static_cast<std::uint64_t>(config_.http.body_timeout_ms);
  o.keepalive_timeout_ms = static_cast<std::uint64_t>(config_.http.keepalive_timeout_ms);
  o.write_timeout_ms = static_cast<std::uint64_t>(config_.http.write_timeout_ms);
  // Every route that takes a body takes OpenAI JSON: nesting and size are bounded as it arrives
  // (the parse on the thread pool checks the same bounds again).
  const openai::ParseLimits json_limits;
  o.max_json_depth = json_limits.max_json_depth;
  o.max_json_values = json_limits.max_json_values;
  o.listen_fd = inherited_.http;
  o.accept_now = !inherited_.from_daemon();  // a replaced daemon accepts until this one is ready
  if (inherited_.from_daemon()) SX_RETURN_IF_ERROR(check_inherited_sockets_match_config());
  const DescriptorBudget fds = descriptor_budget(o.max_connections);
  if (fds.http_sockets < o.max_connections) {
    log_warn("serve: http.max_connections is {} but the descriptor limit (RLIMIT_NOFILE: {} of hard {}) leaves room for "
             "{} connections beside the {} kept for the admin socket and files: at most {} are served; raise the limit "
             "(ulimit -n, or LimitNOFILE= in a systemd unit) or lower http.max_connections",
             o.max_connections, fds.soft_limit, fds.hard_limit, fds.http_sockets, kReservedDescriptors,
             fds.http_sockets);
    o.max_connections = std::max<std::size_t>(1, fds.http_sockets);
  }
  o.max_sockets = std::max<std::size_t>(1, fds.http_sockets);
  SX_ASSIGN_OR_RETURN(http_, http::Server::start(&loop_, o, make_router()));
  if (inherited_.http >= 0) {
    log_info("serve: phase http: listening on {} (socket from {}{})", base_url(), inherited_.source,
             inherited_.from_daemon() ? "; accepting once ready" : "");
  } else {
    log_info("serve: phase http: listening on {}", base_url());
  }
  if (config_.http.api_keys.empty() && !is_loopback_address(config_.http.host)) {
    log_warn("serve: http.host {} is reachable from other machines and no API key is set: anyone who can connect may "
             "generate; set http.api_keys (or --api-key), or listen on 127.0.0.1",
             config_.http.host);
  }
  return ok_status();
}

Status Daemon::check_inherited_sockets_match_config() const {
  // An upgrade keeps the sockets it was handed: a config that names others cannot be honoured
  // (the old daemon keeps serving on them), so it is refused by name, as a reload refuses it.
  auto refuse = [](std::string_view key, const std::string& was, const std::string& now) {
    return invalid_argument_error("ctl upgrade cannot change {} ({} -> {}): the new process takes over the listening "
                                  "sockets of the old one; restart the daemon to change it", key, was, now);
  };
  sockaddr_storage a{};
  socklen_t len = sizeof(a);
  if (inherited_.http >= 0 && ::getsockname(inherited_.http, reinterpret_cast<sockaddr*>(&a), &len) == 0) {
    char host[INET6_ADDRSTRLEN] = {};
    int port = 0;
    if (a.ss_family == AF_INET) {
      const auto* in4 = reinterpret_cast<const sockaddr_in*>(&a);
      port = ntohs(in4->sin_port);
      inet_ntop(AF_INET, &in4->sin_addr, host, sizeof host);
    } else if (a.ss_family == AF_INET6) {
      const auto* in6 = reinterpret_cast<const sockaddr_in6*>(&a);
      port = ntohs(in6->sin6_port);
      inet_ntop(AF_INET6, &in6->sin6_addr, host, sizeof host);
    }
    if (config_.http.port != 0 && config_.http.port != port) {
      return refuse("http.port", std::to_string(port), std::to_string(config_.http.port));
    }
    // A literal address must be the socket's (a host name is not resolved here).
    in6_addr want6{}, got6{};
    in_addr want4{}, got4{};
    if (inet_pton(AF_INET, config_.http.host.c_str(), &want4) == 1 && inet_pton(AF_INET, host, &got4) == 1 &&
        want4.s_addr != got4.s_addr) {
      return refuse("http.host", host, config_.http.host);
    }
    if (inet_pton(AF_INET6, config_.http.host.c_str(), &want6) == 1 && inet_pton(AF_INET6, host, &got6) == 1 &&
        std::memcmp(&want6, &got6, sizeof want6) != 0) {
      return refuse("http.host", host, config_.http.host);
    }
  }
  sockaddr_un u{};
  len = sizeof(u);
  if (inherited_.admin >= 0 && ::getsockname(inherited_.admin, reinterpret_cast<sockaddr*>(&u), &len) == 0 &&
      u.sun_family == AF_UNIX) {
    const std::string bound(u.sun_path, strnlen(u.sun_path, sizeof u.sun_path));
    struct stat x {}, y {};
    const bool same_file = ::stat(bound.c_str(), &x) == 0 && ::stat(config_.admin.socket.c_str(), &y) == 0 &&
                           x.st_dev == y.st_dev && x.st_ino == y.st_ino;
    if (!bound.empty() && bound != config_.admin.socket && !same_file) {
      return refuse("admin.socket", bound, config_.admin.socket);
    }
  }
  return ok_status();
}

std::string Daemon::base_url() const {
  return fmt::format("http://{}:{}", url_host(config_.http.host), http_ ? http_->bound_port() : 0);
}

Status Daemon::start_admin() {
  admin::AdminOptions o;
  o.socket_path = config_.admin.socket;
  o.mode = config_.admin.mode;
  for (std::int64_t uid : config_.admin.allowed_uids) o.allowed_uids.push_back(static_cast<std::uint32_t>(uid));
  o.listen_fd = inherited_.admin;
  o.accept_now = !inherited_.from_daemon();
  SX_ASSIGN_OR_RETURN(admin_, admin::AdminServer::start(&loop_, o, [this](const json& request, admin::Reply reply) {
                        handle_admin(request, std::move(reply));
                      }));
  log_info("serve: phase admin: socket {}", config_.admin.socket);
  return ok_status();
}

void Daemon::start_signals() {
  for (int signum : {SIGTERM, SIGINT}) {
    auto sig = loop::Signal::create(&loop_);
    if (!sig.ok()) {
      log_warn("serve: cannot watch signal {}: {}", signum, sig.status().to_string());
      continue;
    }
    Status s = sig->start(signum, [this](int got) {
      if (got == SIGINT && ++sigint_count_ >= 2) {
        log_warn("serve: second SIGINT: exiting now");
        std::_Exit(130);
      }
      log_info("serve: {}: draining, then exiting", got == SIGTERM ? "SIGTERM" : "SIGINT (again to exit at once)");
      begin_drain(/*then_shutdown=*/true);
    });
    if (!s.ok()) log_warn("serve: cannot watch signal {}: {}", signum, s.to_string());
    signals_.push_back(std::move(sig).value());
  }
  // No other signal a daemon is sent by its tools is fatal: SIGHUP reloads (the config file and
  // flags the daemon was started with, as `ctl reload`), SIGUSR1/SIGUSR2 are logged and ignored;
  // SIGPIPE is ignored (run()).
  for (int signum : {SIGHUP, SIGUSR1, SIGUSR2}) {
    auto sig = loop::Signal::create(&loop_);
    Status s = sig.ok() ? sig->start(signum, [this](int got) {
      if (got == SIGHUP) {
        if (reloading_) {
          // One more reload once this one ends (it may predate the change being signalled);
          // any number of SIGHUPs meanwhile make one.
          if (!sighup_pending_) log_info("serve: SIGHUP during a reload: another reload follows it");
          sighup_pending_ = true;
          return;
        }
        log_info("serve: SIGHUP: reloading");
        start_reload(json::object(), admin::Reply{}, "SIGHUP");
      } else {
        log_info("serve: {}: no use is assigned to it; ignored", got == SIGUSR1 ? "SIGUSR1" : "SIGUSR2");
      }
    })
                        : sig.status();
    if (!s.ok()) {
      log_warn("serve: cannot watch signal {}: {}; ignoring it instead", signum, s.to_string());
      std::signal(signum, SIG_IGN);
      continue;
    }
    signals_.push_back(std::move(sig).value());
  }
}

// ---------------------------------------------------------------------------------------------
// Drain and shutdown

void Daemon::begin_drain(bool then_shutdown) {
  if (then_shutdown) shutdown_requested_ = true;
  if (then_shutdown && upgrading_) {
    // The new process must not outlive this one with the sockets: it is ended (and reaped before
    // this process exits: its handles keep the loop running until then).
    log_warn("serve: shutdown during a pending upgrade: ending the new process (pid {})", successor_->pid());
    upgrading_ = false;
    admin::Reply reply = std::move(upgrade_reply_);
    upgrade_reply_ = admin::Reply{};
    successor_.reset();
    reply(unavailable_error("upgrade to {} abandoned: the daemon is shutting down; the new process was ended",
                            upgrade_binary_));
  }
  if (state_ == State::kReady) state_ = State::kDraining;
  if (then_shutdown && reloading_) {
    load_cancel_.store(true, std::memory_order_relaxed);  // the reload stops; the old set drains
  }
  if (state_ == State::kLoading) {
    drain_requested_ = true;
    if (then_shutdown) {
      load_cancel_.store(true, std::memory_order_relaxed);
      log_info("serve: shutdown requested while loading: the load stops at its next step, then the daemon exits");
    } else {
      log_info("serve: drain requested while loading: it applies once the load ends");
    }
    return;
  }
  log_info("serve: draining ({} request(s) in flight){}", active_.size(), then_shutdown ? ", then stopping" : "");
  if (then_shutdown && config_.http.drain_timeout_ms > 0 && !drain_timer_.valid() && !active_.empty()) {
    auto timer = loop::Timer::create(&loop_);
    if (timer.ok()) {
      drain_timer_ = std::move(timer).value();
      (void)drain_timer_.start(static_cast<std::uint64_t>(config_.http.drain_timeout_ms), 0, [this] { end_in_flight(); });
    }
  }
  maybe_finish_shutdown();
}

void Daemon::start_upgrade(const json& request, admin::Reply reply) {
  auto refuse = [&](Status s) {
    log_warn("serve: ctl upgrade: {}", s.message());
    reply(std::move(s));
  };
  if (state_ != State::kReady || !current_) {
    return refuse(failed_precondition_error("the daemon is {}; upgrade a ready one", state_name(state_)));
  }
  if (reloading_ || upgrading_ || shutdown_requested_) {
    return refuse(failed_precondition_error("a {} is in progress; retry when it has finished",
                                            reloading_ ? "reload" : upgrading_ ? "upgrade" : "shutdown"));
  }
  std::string binary = self_binary_;
  if (request.contains("binary")) {
    if (!request["binary"].is_string() || request["binary"].get<std::string>().empty()) {
      return refuse(invalid_argument_error("upgrade: binary must be a file path"));
    }
    binary = request["binary"].get<std::string>();
  }
  if (binary.empty() || ::access(binary.c_str(), X_OK) != 0) {
    return refuse(invalid_argument_error("upgrade: {} is not an executable file{}", binary.empty() ? "(none)" : binary,
                                         binary.empty() ? "" : fmt::format(" ({})", std::strerror(errno))));
  }
  auto s = Successor::start(&loop_, binary, serve_args_, http_->listen_fd(), admin_->listen_fd(),
                            static_cast<std::uint64_t>(config_.admin.upgrade_timeout_ms),
                            [this](Status st) { on_successor(std::move(st)); });
  if (!s.ok()) return refuse(s.status());
  successor_ = std::move(s).value();
  upgrading_ = true;
  upgrade_reply_ = std::move(reply);
  upgrade_binary_ = binary;
  upgrade_started_ = Clock::now();
  log_info("serve: ctl upgrade: started {} (pid {}) with the listening sockets; serving on until it is ready", binary,
           successor_->pid());
}

void Daemon::on_successor(Status status) {
  upgrading_ = false;
  admin::Reply reply = std::move(upgrade_reply_);
  upgrade_reply_ = admin::Reply{};
  if (!status.ok()) {
    const Status failed(status.code(), fmt::format("upgrade to {} failed: {}; this daemon keeps serving", upgrade_binary_,
                                                   status.message()));
    log_error("serve: ctl upgrade: {}", failed.message());
    reply(failed);
    successor_.reset();
    return;
  }
  const int pid = successor_->pid();
  log_info("serve: ctl upgrade: pid {} is ready and accepting; this daemon stops accepting, finishes its {} "
           "request(s) and exits", pid, active_.size());
  reply(json{{"pid", pid}, {"binary", upgrade_binary_}, {"in_flight", active_.size()}});
  handed_over_ = true;
  shutdown_requested_ = true;
  // The successor has the same sockets: the file stays, the listeners close here only.
  admin_->keep_socket_file();
  admin_->stop([] {});
  const auto grace = config_.http.drain_timeout_ms > 0 ? static_cast<std::uint64_t>(config_.http.drain_timeout_ms)
                                                       : http::Server::kNoGraceLimit;
  http_->stop(
      [this] {
        http_stopped_ = true;
        maybe_finish_shutdown();
      },
      grace, http::Server::StopMode::kFinishArriving);
  maybe_finish_shutdown();
}

void Daemon::maybe_finish_shutdown() {
  if (!shutdown_requested_ || !active_.empty() || state_ == State::kLoading || reloading_ || closing_) return;
  // After a hand-over the connections this daemon accepted are served to their end first.
  if (handed_over_ && !http_stopped_) return;
  state_ = State::kStopping;
  close_everything();
}

void Daemon::close_everything() {
  if (closing_) return;
  closing_ = true;
  if (http_) http_->stop([] {});
  if (admin_) admin_->stop([] {});
  for (loop::Signal& s : signals_) s.close();
  drain_timer_.close();
  stop_compiles(/*close_queue=*/false);  // what they held comes back through compiled_ (closed below)
  if (loader_.joinable()) {
    // The loader still runs (a failure elsewhere): let its result arrive, then close the queue.
    return;
  }
  if (loaded_queue_) loaded_queue_->close();
  for (const auto& r : all_replicas()) r->stop();
  successor_.reset();  // its handles close; the process (if it is the daemon now) runs on
  if (events_) events_->close();
  stop_compiles(/*close_queue=*/true);
}

}  // namespace detail

int run_daemon(const config::ServeConfig& config, std::vector<std::string> serve_args) {
  // This start's log and summary (start_log.h); a directory that cannot be used is only a warning.
  std::unique_ptr<StartLog> start_log;
  if (config.log.dir != "none") {
    const std::string dir = config.log.dir.empty() ? default_log_dir() : config.log.dir;
    std::vector<std::string> argv = {"sextant", "serve"};
    argv.insert(argv.end(), serve_args.begin(), serve_args.end());
    auto opened = StartLog::open(dir, static_cast<int>(config.log.keep), config::to_yaml(config), argv);
    if (opened.ok()) {
      start_log = std::move(opened).value();
      detail::g_start_log = start_log.get();
    } else {
      log_warn("serve: no start log: {}", opened.status().message());
    }
  }
  int rc = 0;
  {
    detail::Daemon d(config, std::move(serve_args));
    rc = d.run();
  }
  if (start_log) start_log->finish(rc);
  detail::g_start_log = nullptr;
  return rc;
}

}  // namespace sx::daemon::serve
