// The `sextant serve` daemon: start-up phases, the OpenAI routes, engine events, drain and shutdown.
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
#include "daemon/openai/request.h"
#include "daemon/openai/response.h"
#include "daemon/config/serve_flags.h"
#include "daemon/replicas/replica.h"
#include "daemon/serve/engine_service.h"
#include "daemon/serve/handover.h"
#include "daemon/serve/metrics.h"
#include "runtime/base/log.h"
#include "runtime/engine/engine.h"
#include "runtime/tokenizer/chat_template.h"

namespace sx::daemon::serve {

namespace {

// This start's log (run_daemon), for the admin command "logs"; null when none is kept.
StartLog* g_start_log = nullptr;

using nlohmann::json;
using Clock = std::chrono::steady_clock;

enum class State { kLoading, kReady, kDraining, kStopping };

std::string_view state_name(State s) {
  switch (s) {
    case State::kLoading: return "loading";
    case State::kReady: return "ready";
    case State::kDraining: return "draining";
    case State::kStopping: return "stopping";
  }
  return "?";
}

using replicas::Replica;
using replicas::ReplicaState;

// A replica's engine figures as status and /metrics count them: a failed replica's KV blocks serve
// nobody, so they count neither as free nor in the total.
engine::EngineStats replica_stats(const Replica& r) {
  engine::EngineStats es = r.stats();
  if (r.state == ReplicaState::kFailed) {
    es.kv_free_blocks = 0;
    es.kv_total_blocks = 0;
    es.kv_usage = 0;
  }
  return es;
}

// The replicas of one configuration: the set in service, or the one a reload is building.
struct Generation {
  int number = 0;
  config::ServeConfig config;
  std::string model_name;  // what clients send; kept across reloads unless the config names another
  std::vector<std::shared_ptr<Replica>> replicas;
  std::int64_t max_model_len = 0;  // the smallest of its replicas'
  // Every replica loaded the same files: one tokenizer speaks for all.
  const tokenizer::Tokenizer& tokenizer() const { return replicas.front()->tokenizer(); }
};

// What the loader thread hands to the loop: a generation, or why it could not be built.
struct Loaded {
  int number = 0;  // the generation it was to be
  Status status;
  std::string phase;  // the phase that failed
  std::unique_ptr<Generation> generation;
};

struct EngineEvent {
  std::uint64_t key = 0;
  std::size_t choice = 0;
  int attempt = 0;  // events of an earlier attempt (before a retry on another replica) are stale
  engine::RequestEvent event;
};

// One OpenAI request in flight: its n engine requests (choices), where each runs, and what was
// sent so far. All choices start on one replica; a choice whose replica failed before any of it
// reached the client is retried on another.
struct Active {
  std::uint64_t key = 0;
  openai::GenerateRequest request;
  openai::ResponseId id;
  http::ResponderPtr responder;
  std::shared_ptr<Generation> generation;  // whose tokenizer made the prompt and decodes the output
  std::vector<std::int32_t> prompt;
  std::vector<engine::RequestOptions> options;  // per choice, for a retry
  std::vector<std::shared_ptr<Replica>> replica;  // per choice
  std::vector<std::uint64_t> engine_ids;          // per choice (valid where replica[c] is set)
  std::vector<bool> token_seen;
  std::vector<int> attempt;
  std::vector<std::int64_t> pending_tokens;  // per choice: counted in its replica's pending_prompt_tokens
  std::vector<openai::Choice> choices;
  std::vector<bool> done, started;
  std::vector<std::int64_t> token_bytes_sent;  // per choice, for streamed logprobs' text_offset
  std::vector<Clock::time_point> last_token;
  std::size_t remaining = 0;
  openai::Usage usage;
  Clock::time_point arrival;
  bool first_token_seen = false;
  bool cancelled = false;
  std::optional<Status> error;
};

std::string random_hex(std::size_t n) {
  static thread_local std::uint64_t state =
      static_cast<std::uint64_t>(Clock::now().time_since_epoch().count()) ^ 0x9E3779B97F4A7C15ull;
  std::string out;
  while (out.size() < n) {
    state ^= state << 13;
    state ^= state >> 7;
    state ^= state << 17;
    out += fmt::format("{:016x}", state);
  }
  out.resize(n);
  return out;
}

// Compares a client's key with a configured one in time that depends only on the client's key
// length. An empty configured key never matches.
bool constant_time_equal(std::string_view given, std::string_view key) {
  if (key.empty()) return false;
  unsigned diff = given.size() == key.size() ? 0u : 1u;
  for (std::size_t i = 0; i < given.size(); ++i) {
    diff |= static_cast<unsigned>(given[i] ^ key[i % key.size()]);
  }
  return diff == 0;
}

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

class Daemon;

// A request whose body is being parsed and whose prompt is rendered and tokenized on libuv's
// thread pool: a body of up to http.max_body_bytes never costs the loop thread its parse. When a
// reload put another generation in service meanwhile, the parsed request is tokenized again with
// the new generation's tokenizer (`parsed` set: run() skips the parse).
struct TokenizeWork {
  uv_work_t req;
  Daemon* self = nullptr;
  std::shared_ptr<Generation> generation;  // its tokenizer and model name
  openai::Endpoint endpoint = openai::Endpoint::kChat;
  std::string body;
  openai::ParseLimits limits;
  http::ResponderPtr responder;
  bool parsed = false;
  openai::GenerateRequest request;       // out
  std::vector<std::int32_t> prompt;      // out
  std::optional<openai::ApiError> error;  // out
  void run();  // thread pool
};

class Daemon {
 public:
  Daemon(const config::ServeConfig& config, std::vector<std::string> serve_args)
      : config_(config), serve_args_(std::move(serve_args)),
        model_name_(config::effective_served_model_name(config.model)), started_(std::time(nullptr)),
        start_clock_(Clock::now()) {}

  int run();

 private:
  Status start_http();
  // A replaced daemon's sockets are the ones this config names (http.port, http.host, admin.socket).
  Status check_inherited_sockets_match_config() const;
  // "http://HOST:PORT" of the listener, an IPv6 host in brackets.
  std::string base_url() const;
  Status start_admin();
  void start_signals();
  // Builds the replicas of `config` as generation `number` on the loader thread; the result
  // arrives in on_loaded().
  void load_in_background(config::ServeConfig config, std::string model_name, int number);
  void on_loaded(Loaded loaded);
  // A reload's load ended: in service, or refused with nothing changed; `reply` answers it.
  void finish_reload(Loaded loaded, admin::Reply reply);
  // Puts a loaded generation in service: new requests go to it, the previous one drains.
  void switch_to(std::unique_ptr<Generation> next);
  // A reload (ctl reload, SIGHUP): the new configuration, checked, built beside the old set; the
  // reply (if any) comes when it is in service or has failed, and a failure changes nothing.
  void start_reload(const json& request, admin::Reply reply, std::string_view source);
  Result<config::ServeConfig> reload_config(const json& request) const;
  // Drained replicas of older generations with nothing left in flight: stopped and freed.
  void reap_retired();
  // Every replica there is: the generation in service's, then the older ones still draining.
  std::vector<std::shared_ptr<Replica>> all_replicas() const;
  // The replica for a new request's prompt among the current generation's (nullptr: none ready),
  // `excluded` left out (a retry).
  std::shared_ptr<Replica> route(std::span<const std::int32_t> prompt, const Replica* excluded);
  // Submits choice `c` of `a` to `r`; false (with the error in `error`) when the engine refuses it.
  bool submit_choice(Active& a, std::size_t c, const std::shared_ptr<Replica>& r, Status* error);
  // The choice's share of its replica's outstanding work ends (finished, or its first token came).
  void settle_pending(Active& a, std::size_t c);
  // A replica whose step failed is taken out of rotation. An engine ends a request with an error
  // only when a step fails (bad requests are refused at submit): such an event is the sign, seen
  // as soon as it arrives (the service's failed-step counter may lag behind it).
  void mark_failed(Replica& r);
  // ctl upgrade: starts the new binary with the listening sockets; once it is ready this daemon
  // stops accepting, finishes what it has and exits 0; otherwise it keeps serving.
  void start_upgrade(const json& request, admin::Reply reply);
  void on_successor(Status status);
  void fail_startup(const std::string& phase, const Status& s);

  http::Router make_router();
  bool authorized(const http::Request& request, const http::ResponderPtr& responder);
  void send_error(const http::ResponderPtr& r, const openai::ApiError& e);
  // 503 for a generation request while loading, draining or stopping (counted in the metrics).
  void refuse_not_ready(const http::ResponderPtr& r);
  void handle_generate(openai::Endpoint endpoint, http::Request request, http::ResponderPtr responder);
  void queue_tokenize(std::unique_ptr<TokenizeWork> work);
  friend struct TokenizeWork;
  // Loop thread, after the prompt was tokenized (status: the work request's, UV_ECANCELED if cancelled).
  void start_generate(TokenizeWork work, int status);
  void on_event(EngineEvent e);
  void complete(Active& a);
  // Whether requests can be served now (/health 200), and if not, the state and why.
  struct Health {
    bool ok = false;
    std::string state;   // "ready", "loading", "draining", "stopping", or "unavailable" (no replica)
    std::string reason;  // empty when ok
  };
  Health health() const;
  json status_json();
  void handle_admin(const json& request, admin::Reply reply);

  void begin_drain(bool then_shutdown);
  void maybe_finish_shutdown();
  // Answers every request still in flight with 503 (or an error event on a stream) and cancels it.
  void end_in_flight();
  // Ends the response of `a` now with `err` (on a stream: an error event, [DONE] and the last
  // chunk; otherwise the error response) and cancels its engine requests, whose final events then
  // erase it. Every cancel that the client did not cause goes through here, so a response that
  // has begun always ends.
  void end_request(Active& a, const openai::ApiError& err);
  void close_everything();

  config::ServeConfig config_;
  std::vector<std::string> serve_args_;  // the arguments after `serve`: a reload re-reads them
  std::string model_name_;
  std::time_t started_;
  Clock::time_point start_clock_;
  uv_loop_t loop_{};
  State state_ = State::kLoading;
  bool shutdown_requested_ = false;
  bool drain_requested_ = false;  // an admin drain that arrived while loading
  // A shutdown while loading: the loader stops at its next step (read by the loader thread).
  std::atomic<bool> load_cancel_{false};
  bool closing_ = false;
  int exit_code_ = 0;
  int sigint_count_ = 0;

  std::unique_ptr<http::Server> http_;
  std::unique_ptr<admin::AdminServer> admin_;
  std::vector<loop::Signal> signals_;
  loop::Timer drain_timer_;  // shutdown: ends what is still in flight after http.drain_timeout_ms
  std::unique_ptr<loop::AsyncQueue<Loaded>> loaded_queue_;
  std::unique_ptr<loop::AsyncQueue<EngineEvent>> events_;
  std::thread loader_;

  std::shared_ptr<Generation> current_;           // in service (null while starting)
  std::vector<std::shared_ptr<Replica>> retiring_;  // older generations' replicas, draining
  int next_generation_ = 1;
  bool reloading_ = false;
  bool sighup_pending_ = false;  // a SIGHUP arrived during a reload: one more follows it
  admin::Reply reload_reply_;  // the ctl reload waiting for its result (detached for SIGHUP)
  std::string reload_source_;
  replicas::RouterOptions router_;
  std::size_t route_turn_ = 0;  // idle replicas take turns

  InheritedListeners inherited_;  // sockets taken over from a replaced daemon or systemd
  std::string self_binary_;       // /proc/self/exe at start: what ctl upgrade runs by default
  std::unique_ptr<Successor> successor_;
  admin::Reply upgrade_reply_;
  std::string upgrade_binary_;
  Clock::time_point upgrade_started_;
  bool upgrading_ = false;
  bool handed_over_ = false;   // a successor serves: finish and exit once the HTTP server stopped
  bool http_stopped_ = false;

  std::unordered_map<std::uint64_t, std::unique_ptr<Active>> active_;
  std::uint64_t next_key_ = 1;
  ServeMetrics metrics_;
};

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
  auto loaded = loop::AsyncQueue<Loaded>::create(&loop_, [this](Loaded l) { on_loaded(std::move(l)); });
  auto events = loop::AsyncQueue<EngineEvent>::create(&loop_, [this](EngineEvent e) { on_event(std::move(e)); });
  if (!loaded.ok() || !events.ok()) {
    log_error("serve: failed in phase loop: {}", (!loaded.ok() ? loaded.status() : events.status()).to_string());
    return 1;
  }
  loaded_queue_ = std::move(loaded).value();
  events_ = std::move(events).value();
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

void Daemon::load_in_background(config::ServeConfig config, std::string model_name, int number) {
  loader_ = std::thread([this, config = std::move(config), model_name = std::move(model_name), number,
                         sender = loaded_queue_->sender()]() mutable {
    // The boundary around everything a load runs (readers of files the user named, planners,
    // backends): whatever fails inside it, an exception included, arrives as a failed load and
    // changes nothing in service. Nothing escapes the thread (an escaping exception would abort
    // the daemon with every stream in flight).
    Loaded l;
    l.number = number;
    try {
      auto loaded = replicas::load_replicas(config, number, &load_cancel_, &l.phase);
      if (!loaded.ok()) {
        l.status = loaded.status();
      } else {
        auto g = std::make_unique<Generation>();
        g->number = number;
        g->config = std::move(config);
        g->model_name = std::move(model_name);
        for (auto& r : *loaded) {
          const std::int64_t len = r->max_request_tokens();
          g->max_model_len = g->replicas.empty() ? len : std::min(g->max_model_len, len);
          g->replicas.push_back(std::shared_ptr<Replica>(std::move(r)));
        }
        l.generation = std::move(g);
      }
    } catch (const std::bad_alloc&) {
      l.generation.reset();
      l.status = resource_exhausted_error("out of host memory while loading (std::bad_alloc)");
    } catch (const std::exception& e) {
      l.generation.reset();
      l.status = internal_error("unexpected exception while loading: {}", e.what());
    } catch (...) {
      l.generation.reset();
      l.status = internal_error("unexpected exception while loading");
    }
    sender.push(std::move(l));
  });
}

void Daemon::on_loaded(Loaded l) {
  if (loader_.joinable()) loader_.join();
  const bool reload = reloading_;
  reloading_ = false;
  if (closing_) {  // start-up already failed elsewhere, or a shutdown: the result is not wanted
    if (reload) reload_reply_(unavailable_error("the daemon is shutting down"));
    loaded_queue_->close();
    events_->close();
    return;
  }
  if (reload) {
    admin::Reply reply = std::move(reload_reply_);
    reload_reply_ = admin::Reply{};
    finish_reload(std::move(l), std::move(reply));
    if (sighup_pending_ && !shutdown_requested_ && !closing_) {
      sighup_pending_ = false;
      log_info("serve: SIGHUP (during the last reload): reloading");
      start_reload(json::object(), admin::Reply{}, "SIGHUP");
    }
    return;
  }
  if (l.status.code() == StatusCode::kCancelled && shutdown_requested_) {
    log_info("serve: the load stopped in phase {} for the shutdown ({})", l.phase, l.status.message());
    state_ = State::kStopping;
    close_everything();
    return;
  }
  if (!l.status.ok()) return fail_startup(l.phase, l.status);
  switch_to(std::move(l.generation));
  if (shutdown_requested_) {  // a SIGTERM arrived while loading
    state_ = State::kDraining;
    maybe_finish_shutdown();
    return;
  }
  state_ = drain_requested_ ? State::kDraining : State::kReady;
  if (inherited_.from_daemon()) {
    // The sockets were handed over: accept from now on, then let the old daemon go.
    Status a = http_->start_accepting();
    if (a.ok()) a = admin_->start_accepting();
    if (!a.ok()) return fail_startup("ready", a);
    report_to_parent(inherited_.ready, "ready");
  }
  log_info("serve: {}: model '{}' at {}/v1 ({} replica(s); admin: {})",
           drain_requested_ ? "ready but draining" : "ready", model_name_, base_url(), current_->replicas.size(),
           config_.admin.socket);
}

void Daemon::finish_reload(Loaded l, admin::Reply reply) {
  if (!l.status.ok()) {
    next_generation_ = l.number;  // a failed reload uses up no generation number
    const Status failed(l.status.code(), fmt::format("{}: reload failed in phase {}: {}; the replicas of generation {} "
                                                     "keep serving", reload_source_, l.phase, l.status.message(),
                                                     current_->number));
    log_error("serve: {}", failed.message());
    reply(failed);
    maybe_finish_shutdown();
    return;
  }
  if (shutdown_requested_) {  // a shutdown arrived while the new set loaded: it is not needed
    reply(unavailable_error("the daemon is shutting down"));
    maybe_finish_shutdown();
    return;
  }
  const int number = l.generation->number;
  switch_to(std::move(l.generation));
  json r{{"generation", number}, {"model", model_name_}, {"model_path", config_.model.path},
         {"replicas", current_->replicas.size()}, {"retiring", retiring_.size()}};
  log_info("serve: {}: generation {} in service ({} replica(s)); {} older replica(s) draining", reload_source_,
           number, current_->replicas.size(), retiring_.size());
  reply(r);
}

void Daemon::switch_to(std::unique_ptr<Generation> next) {
  std::shared_ptr<Generation> old = std::move(current_);
  current_ = std::shared_ptr<Generation>(std::move(next));
  for (const auto& r : current_->replicas) r->start();
  config_ = current_->config;
  model_name_ = current_->model_name;
  router_.prefix_affinity = config_.engine.prefix_affinity;
  set_log_level(config_.log.level);
  set_log_json(config_.log.format == config::LogFormat::kJson);
  if (old) {
    for (const auto& r : old->replicas) {
      if (r->state != ReplicaState::kFailed) r->state = ReplicaState::kDraining;
      retiring_.push_back(r);
    }
  }
  reap_retired();
}

std::vector<std::shared_ptr<Replica>> Daemon::all_replicas() const {
  std::vector<std::shared_ptr<Replica>> all;
  if (current_) all = current_->replicas;
  all.insert(all.end(), retiring_.begin(), retiring_.end());
  return all;
}

void Daemon::reap_retired() {
  for (auto it = retiring_.begin(); it != retiring_.end();) {
    Replica& r = **it;
    if (r.running > 0) {
      ++it;
      continue;
    }
    r.stop();
    if (r.state != ReplicaState::kFailed) r.state = ReplicaState::kStopped;
    metrics_.retire(r.index(), r.stats());  // its counters stay in its slot's series
    log_info("serve: {} stopped (drained after the reload)", r.name());
    it = retiring_.erase(it);  // freed when the last request that held it is gone
  }
}

Result<config::ServeConfig> Daemon::reload_config(const json& request) const {
  // The arguments the daemon was started with, the config file replaced when one is given: the
  // file is re-read and the flags still win, exactly as at start.
  std::vector<std::string> args;
  std::optional<std::string> config_file, model;
  if (request.contains("config")) {
    if (!request["config"].is_string() || request["config"].get<std::string>().empty()) {
      return invalid_argument_error("reload: config must be a file path");
    }
    config_file = request["config"].get<std::string>();
  }
  if (request.contains("model")) {
    if (!request["model"].is_string() || request["model"].get<std::string>().empty()) {
      return invalid_argument_error("reload: model must be a model path");
    }
    model = request["model"].get<std::string>();
  }
  for (std::size_t i = 0; i < serve_args_.size(); ++i) {
    const std::string& a = serve_args_[i];
    if (config_file && a == "--config") {
      ++i;
      continue;
    }
    if (config_file && a.starts_with("--config=")) continue;
    args.push_back(a);
  }
  if (config_file) {
    args.push_back("--config");
    args.push_back(*config_file);
  }
  std::vector<std::string_view> views(args.begin(), args.end());
  SX_ASSIGN_OR_RETURN(config::ServeInvocation inv, config::parse_serve_flags(views));
  config::ServeConfig next = std::move(inv.config);
  if (model) next.model.path = *model;
  SX_RETURN_IF_ERROR(config::validate(next));
  if (const std::vector<std::string> fixed = config::settings_needing_restart(config_, next); !fixed.empty()) {
    return invalid_argument_error("reload: {} cannot change without a new listener or server; restart the daemon "
                                  "to change {}", fmt::join(fixed, ", "),
                                  fixed.size() == 1 ? "it" : "them");
  }
  return next;
}

void Daemon::start_reload(const json& request, admin::Reply reply, std::string_view source) {
  auto refuse = [&](Status s) {
    log_warn("serve: {}: {}", source, s.message());
    reply(std::move(s));
  };
  if (state_ == State::kLoading || !current_) return refuse(failed_precondition_error("the daemon is still starting"));
  if (shutdown_requested_ || closing_) return refuse(failed_precondition_error("the daemon is shutting down"));
  if (upgrading_) return refuse(failed_precondition_error("an upgrade is in progress"));
  if (reloading_) {
    return refuse(failed_precondition_error("a reload ({}) is already in progress; retry when it has finished",
                                            reload_source_));
  }
  auto next = reload_config(request);
  if (!next.ok()) return refuse(next.status());
  // The served name stays unless the new configuration names one.
  std::string name = next->model.served_model_name.empty() ? model_name_ : next->model.served_model_name;
  const int number = next_generation_++;
  log_info("serve: {}: loading generation {} ({} replica(s) of {}) beside generation {}", source, number,
           next->model.replicas, next->model.path, current_->number);
  reloading_ = true;
  reload_reply_ = std::move(reply);
  reload_source_ = std::string(source);
  load_cancel_.store(false, std::memory_order_relaxed);
  load_in_background(std::move(next).value(), std::move(name), number);
}

// ---------------------------------------------------------------------------------------------
// HTTP

void Daemon::send_error(const http::ResponderPtr& r, const openai::ApiError& e) {
  r->respond(e.status, {{"Content-Type", "application/json"}}, openai::error_body(e));
}

void Daemon::refuse_not_ready(const http::ResponderPtr& r) {
  openai::ApiError err;
  err.status = 503;
  err.type = "service_unavailable";
  err.message = state_ == State::kLoading ? "the model is still loading; retry when GET /health answers 200"
                                          : "the server is draining and accepts no new requests";
  ++metrics_.http_rejected_busy;
  send_error(r, err);
}

bool Daemon::authorized(const http::Request& request, const http::ResponderPtr& responder) {
  if (config_.http.api_keys.empty()) return true;
  const auto header = request.headers.get("Authorization");
  // "Bearer" is an auth-scheme, matched without regard to case (RFC 9110 §11.1), then one or
  // more spaces, then the key.
  constexpr std::string_view kBearer = "bearer";
  if (header && header->size() > kBearer.size() && http::iequals(header->substr(0, kBearer.size()), kBearer) &&
      (*header)[kBearer.size()] == ' ') {
    std::string_view key = header->substr(kBearer.size());
    while (!key.empty() && key.front() == ' ') key.remove_prefix(1);
    for (const std::string& k : config_.http.api_keys) {
      if (constant_time_equal(key, k)) return true;
    }
  }
  openai::ApiError e;
  e.status = 401;
  e.code = "invalid_api_key";
  e.message = header ? "Incorrect API key provided." : "Missing API key: send \"Authorization: Bearer <key>\".";
  send_error(responder, e);
  return false;
}

http::Router Daemon::make_router() {
  http::Router router;
  auto generate = [this](openai::Endpoint ep) {
    return [this, ep](http::Request req, http::ResponderPtr r) { handle_generate(ep, std::move(req), std::move(r)); };
  };
  (void)router.post("/v1/chat/completions", generate(openai::Endpoint::kChat));
  (void)router.post("/v1/completions", generate(openai::Endpoint::kCompletion));
  (void)router.get("/v1/models", [this](http::Request req, http::ResponderPtr r) {
    if (!authorized(req, r)) return;
    json model{{"id", model_name_}, {"object", "model"}, {"created", started_}, {"owned_by", "sextant"}};
    if (current_) model["max_model_len"] = current_->max_model_len;
    r->respond(200, {{"Content-Type", "application/json"}},
               openai::dump_json(json{{"object", "list"}, {"data", json::array({model})}}));
  });
  (void)router.get("/health", [this](http::Request, http::ResponderPtr r) {
    const Health h = health();
    json body{{"status", h.ok ? "ok" : h.state}};
    if (!h.reason.empty()) body["reason"] = h.reason;
    r->respond(h.ok ? 200 : 503, {{"Content-Type", "application/json"}}, openai::dump_json(body));
  });
  (void)router.get("/metrics", [this](http::Request, http::ResponderPtr r) {
    ServeMetrics::Extra extra;
    if (http_) {
      const http::ServerStats hs = http_->stats();
      extra.open_connections = static_cast<std::int64_t>(hs.open_connections);
      extra.http_requests = hs.requests;
    }
    std::vector<ServeMetrics::ReplicaSample> samples;
    for (const auto& rep : all_replicas()) {
      samples.push_back({rep->index(), std::string(replicas::replica_state_name(rep->state)), replica_stats(*rep)});
    }
    extra.ready = health().ok;
    r->respond(200, {{"Content-Type", "text/plain; version=0.0.4; charset=utf-8"}},
               metrics_.render(model_name_, samples, extra));
  });
  router.set_not_found([this](http::Request req, http::ResponderPtr r) {
    openai::ApiError e;
    e.status = 404;
    e.code = "not_found";
    e.message = fmt::format("no route for {} {}", req.method, req.path);
    send_error(r, e);
  });
  return router;
}

void Daemon::handle_generate(openai::Endpoint endpoint, http::Request request, http::ResponderPtr responder) {
  if (!authorized(request, responder)) return;
  if (state_ != State::kReady) return refuse_not_ready(responder);
  // The body is parsed, the chat template rendered and the prompt tokenized on libuv's thread
  // pool (a large body or a long prompt takes a while); start_generate continues on the loop.
  auto work = std::make_unique<TokenizeWork>();
  work->self = this;
  work->generation = current_;
  work->endpoint = endpoint;
  work->body = std::move(request.body);
  work->limits = {config_.limits.max_stop_strings, config_.limits.max_n};
  work->responder = std::move(responder);
  queue_tokenize(std::move(work));
}

void Daemon::queue_tokenize(std::unique_ptr<TokenizeWork> work) {
  work->req.data = work.get();
  const int rc = uv_queue_work(
      &loop_, &work->req, [](uv_work_t* w) { static_cast<TokenizeWork*>(w->data)->run(); },
      [](uv_work_t* w, int status) {
        std::unique_ptr<TokenizeWork> owned(static_cast<TokenizeWork*>(w->data));
        owned->self->start_generate(std::move(*owned), status);
      });
  if (rc != 0) {
    openai::ApiError err;
    err.status = 500;
    err.type = "internal_error";
    err.message = fmt::format("cannot queue the request: {}", uv_strerror(rc));
    return send_error(work->responder, err);
  }
  (void)work.release();  // owned by the work request until its after-work callback
}

void TokenizeWork::run() {
  if (!parsed) {
    openai::ApiError err;
    std::optional<openai::GenerateRequest> got = openai::parse_request(endpoint, body, limits, &err);
    std::string().swap(body);  // the text is not needed any more
    if (!got) {
      error = std::move(err);
      return;
    }
    request = std::move(*got);
    parsed = true;
  }
  const openai::GenerateRequest& req = request;
  const std::string& model_name = generation->model_name;
  const tokenizer::Tokenizer* tok = &generation->tokenizer();
  if (req.model != model_name) {
    error = openai::ApiError{};
    error->status = 404;
    error->code = "model_not_found";
    error->param = "model";
    error->message = fmt::format("The model '{}' does not exist; this server serves '{}'.", req.model, model_name);
    return;
  }
  if (req.endpoint == openai::Endpoint::kChat) {
    if (Status chat = tokenizer::check_chat_tokens(*tok); !chat.ok()) {
      error = openai::ApiError{};
      error->code = "no_chat_template";
      error->message = chat.message();
      return;
    }
    auto text = tokenizer::render_chatml_checked(req.messages);
    if (!text.ok()) {
      error = openai::ApiError{};
      error->param = "messages";
      error->message = text.status().message();
      return;
    }
    prompt = tok->encode(*text);
  } else if (req.prompt_is_ids) {
    prompt = req.prompt_ids;
    for (std::size_t i = 0; i < prompt.size(); ++i) {
      if (prompt[i] >= tok->vocab_size()) {
        error = openai::ApiError{};
        error->param = fmt::format("prompt[{}]", i);
        error->message = fmt::format("token id {} is outside the vocabulary of {}", prompt[i], tok->vocab_size());
        return;
      }
    }
  } else {
    prompt = tok->encode(req.prompt_text);
  }
}

void Daemon::start_generate(TokenizeWork w, int status) {
  http::ResponderPtr responder = std::move(w.responder);
  if (responder->closed()) return;  // the client left while its prompt was tokenized
  openai::ApiError err;
  if (w.error) return send_error(responder, *w.error);
  // The state may have changed while the prompt was tokenized.
  if (status != 0 || state_ != State::kReady) return refuse_not_ready(responder);
  if (w.generation != current_) {
    // A reload put another generation in service meanwhile: its tokenizer makes the prompt.
    auto again = std::make_unique<TokenizeWork>(std::move(w));
    again->generation = current_;
    again->responder = std::move(responder);
    again->prompt.clear();
    return queue_tokenize(std::move(again));
  }
  openai::GenerateRequest& req = w.request;
  const openai::Endpoint endpoint = req.endpoint;
  std::vector<std::int32_t> prompt = std::move(w.prompt);
  const Generation& g = *current_;
  // Engine requests that cannot run yet: beyond max_num_seqs on their replica (counted here; the
  // engines' own figures lag by a step, and a burst arrives within one).
  std::int64_t waiting = 0;
  for (const auto& rep : g.replicas) waiting += std::max<std::int64_t>(0, rep->running - config_.engine.max_num_seqs);
  if (waiting + req.n > config_.http.max_queued_requests) {
    err.status = 429;
    err.type = "rate_limit_error";
    err.message = fmt::format("{} requests are already waiting (http.max_queued_requests = {}); retry later", waiting,
                              config_.http.max_queued_requests);
    ++metrics_.http_rejected_busy;
    return send_error(responder, err);
  }
  const std::int64_t max_model_len = g.max_model_len;
  const auto n_prompt = static_cast<std::int64_t>(prompt.size());
  const std::int64_t max_prompt = config_.limits.max_prompt_tokens > 0
                                      ? std::min(config_.limits.max_prompt_tokens, max_model_len - 1)
                                      : max_model_len - 1;
  if (n_prompt == 0) {
    err.param = endpoint == openai::Endpoint::kChat ? "messages" : "prompt";
    err.message = "the prompt is empty";
    return send_error(responder, err);
  }
  if (n_prompt > max_prompt || (req.max_tokens && n_prompt + *req.max_tokens > max_model_len)) {
    err.param = n_prompt > max_prompt ? (endpoint == openai::Endpoint::kChat ? "messages" : "prompt") : "max_tokens";
    err.code = "context_length_exceeded";
    if (n_prompt > max_prompt && max_prompt < max_model_len - 1) {
      err.message = fmt::format("The prompt has {} tokens; this server accepts at most {} (limits.max_prompt_tokens).",
                                n_prompt, max_prompt);
    } else {
      err.message = fmt::format(
          "This model's maximum context length is {} tokens. However, you requested {} tokens ({} in the prompt, {} "
          "for the completion). Please reduce the length of the prompt or the completion.",
          max_model_len, n_prompt + req.max_tokens.value_or(0), n_prompt, req.max_tokens.value_or(0));
    }
    return send_error(responder, err);
  }
  std::shared_ptr<Replica> target = route(prompt, nullptr);
  if (!target) {
    err.status = 503;
    err.type = "service_unavailable";
    err.message = "no replica is ready to serve (all have failed); see sextant ctl status";
    ++metrics_.http_rejected_busy;
    return send_error(responder, err);
  }

  auto a = std::make_unique<Active>();
  a->key = next_key_++;
  a->id = {fmt::format("{}-{}", endpoint == openai::Endpoint::kChat ? "chatcmpl" : "cmpl", random_hex(24)),
           static_cast<std::int64_t>(std::time(nullptr)), model_name_};
  a->responder = responder;
  a->arrival = Clock::now();
  a->generation = current_;
  const auto n = static_cast<std::size_t>(req.n);
  a->choices.resize(n);
  a->done.assign(n, false);
  a->started.assign(n, false);
  a->token_bytes_sent.assign(n, 0);
  a->last_token.assign(n, a->arrival);
  a->replica.assign(n, nullptr);
  a->engine_ids.assign(n, 0);
  a->token_seen.assign(n, false);
  a->attempt.assign(n, 0);
  a->pending_tokens.assign(n, 0);
  a->remaining = n;
  a->usage.prompt_tokens = n_prompt;

  engine::RequestOptions o;
  o.sampling = req.sampling;
  o.max_tokens = req.max_tokens.value_or(std::min(config_.limits.max_tokens_default, max_model_len - n_prompt));
  o.stop_strings = req.stop;
  o.ignore_eos = req.ignore_eos;
  o.top_logprobs = req.top_logprobs;
  for (std::size_t c = 0; c < n; ++c) {
    a->options.push_back(o);
    if (a->options.back().sampling.seed && c > 0) *a->options.back().sampling.seed += c;  // n samples, not n copies
  }
  a->request = std::move(req);
  a->prompt = std::move(prompt);
  Active& ref = *a;
  const std::uint64_t key = a->key;
  active_.emplace(key, std::move(a));
  for (std::size_t c = 0; c < n; ++c) {
    Status failed;
    if (submit_choice(ref, c, target, &failed)) continue;
    for (std::size_t s = 0; s < c; ++s) ref.replica[s]->service().cancel(ref.engine_ids[s]);
    err.message = failed.message();
    if (failed.code() == StatusCode::kUnavailable) {
      err.status = 503;
      err.type = "service_unavailable";
    }
    ref.responder.reset();
    if (c == 0) {
      active_.erase(key);
    } else {  // the final events of the choices already submitted (cancelled) erase it
      ref.cancelled = true;
      ref.remaining = c;
    }
    return send_error(responder, err);
  }
  if (ref.request.stream) {
    responder->start_stream(200, {{"Content-Type", "text/event-stream"}, {"Cache-Control", "no-cache"}});
  }
  // A client that leaves cancels its engine requests; their final events then erase the entry.
  responder->on_close([this, key] {
    auto it = active_.find(key);
    if (it == active_.end() || it->second->cancelled) return;
    it->second->cancelled = true;
    Active& act = *it->second;
    for (std::size_t c = 0; c < act.replica.size(); ++c) {
      if (act.replica[c] && !act.done[c]) act.replica[c]->service().cancel(act.engine_ids[c]);
    }
  });
}

std::shared_ptr<Replica> Daemon::route(std::span<const std::int32_t> prompt, const Replica* excluded) {
  if (!current_) return nullptr;
  std::vector<replicas::ReplicaLoad> loads;
  for (const auto& rep : current_->replicas) {
    replicas::ReplicaLoad l;
    l.ready = rep->state == ReplicaState::kReady && rep.get() != excluded;
    l.pending_prompt_tokens = rep->pending_prompt_tokens;
    l.running = rep->running;
    l.free_kv_blocks = rep->stats().kv_free_blocks;
    l.prefix_match_tokens = rep->prefixes.match(prompt);
    loads.push_back(l);
  }
  const int i = replicas::choose_replica(loads, static_cast<std::int64_t>(prompt.size()), router_, route_turn_++);
  return i < 0 ? nullptr : current_->replicas[static_cast<std::size_t>(i)];
}

bool Daemon::submit_choice(Active& a, std::size_t c, const std::shared_ptr<Replica>& r, Status* error) {
  const std::uint64_t key = a.key;
  const int attempt = ++a.attempt[c];
  auto sender = events_->sender();
  auto id = r->service().submit(a.prompt, a.options[c], [sender, key, c, attempt](const engine::RequestEvent& e) {
    sender.push(EngineEvent{key, c, attempt, e});
  });
  if (!id.ok()) {
    *error = id.status();
    return false;
  }
  // Its expected prefill: the prompt less what the replica's prefix cache probably holds.
  const auto pending = static_cast<std::int64_t>(a.prompt.size()) - r->prefixes.match(a.prompt);
  r->prefixes.record(a.prompt);
  a.replica[c] = r;
  a.engine_ids[c] = *id;
  a.pending_tokens[c] = pending;
  r->pending_prompt_tokens += pending;
  ++r->running;
  return true;
}

void Daemon::settle_pending(Active& a, std::size_t c) {
  if (a.pending_tokens[c] == 0 || !a.replica[c]) return;
  a.replica[c]->pending_prompt_tokens -= a.pending_tokens[c];
  a.pending_tokens[c] = 0;
}

void Daemon::mark_failed(Replica& r) {
  if (r.state == ReplicaState::kFailed) return;
  r.state = ReplicaState::kFailed;
  log_error("serve: {} failed (a step failed on its devices): taken out of rotation; its requests that had not "
            "produced a token are retried on another replica", r.name());
}

void Daemon::on_event(EngineEvent e) {
  auto it = active_.find(e.key);
  if (it == active_.end()) return;
  Active& a = *it->second;
  if (e.attempt != a.attempt[e.choice]) return;  // from before a retry
  const engine::RequestEvent& ev = e.event;
  const Clock::time_point now = Clock::now();
  if (!ev.tokens.empty()) {
    a.token_seen[e.choice] = true;
    settle_pending(a, e.choice);
    if (!a.first_token_seen) {
      a.first_token_seen = true;
      metrics_.ttft.observe(std::chrono::duration<double>(now - a.arrival).count());
    } else if (a.started[e.choice]) {
      metrics_.itl.observe(std::chrono::duration<double>(now - a.last_token[e.choice]).count());
    }
    a.last_token[e.choice] = now;
  }
  openai::Choice& choice = a.choices[e.choice];
  if (a.request.stream && a.responder != nullptr && !a.cancelled &&
      a.responder->queued_bytes() > config_.http.max_unsent_stream_bytes) {
    // The client does not read its stream: stop generating for it rather than buffer without end,
    // and end the stream, which it finds after what it has not read yet (or the write timeout
    // closes the connection).
    log_warn("serve: {}: the client is not reading its stream ({} bytes queued): cancelled", a.id.id,
             a.responder->queued_bytes());
    openai::ApiError err;
    err.status = 503;
    err.type = "server_error";
    err.code = "client_not_reading";
    err.message = fmt::format("the client read nothing of this stream while {} bytes waited unsent; the request "
                              "was cancelled", a.responder->queued_bytes());
    end_request(a, err);
  }
  const bool stream = a.request.stream && a.responder != nullptr && !a.cancelled;
  const tokenizer::Tokenizer& tok = a.generation->tokenizer();
  if (!ev.text.empty() || !ev.logprobs.empty()) {
    if (stream && !a.cancelled) {
      a.responder->write_chunk(openai::sse(openai::chunk_json(a.request, a.id, static_cast<std::int64_t>(e.choice),
                                                              !a.started[e.choice], ev.text, ev.logprobs, "", tok,
                                                              a.token_bytes_sent[e.choice])));
      for (const engine::TokenLogprob& lp : ev.logprobs) {
        a.token_bytes_sent[e.choice] += static_cast<std::int64_t>(tok.token_bytes(lp.token).size());
      }
    } else {
      choice.text += ev.text;
      choice.logprobs.insert(choice.logprobs.end(), ev.logprobs.begin(), ev.logprobs.end());
    }
    a.started[e.choice] = true;
  }
  if (!ev.finished) return;
  // The choice leaves its replica.
  Replica& rep = *a.replica[e.choice];
  settle_pending(a, e.choice);
  --rep.running;
  if (ev.finish == engine::RequestFinish::kError) {
    mark_failed(rep);
    // Nothing of it reached the client yet (a stream that has no token, or any answer not sent as
    // a stream): it runs again, from the start, on another replica.
    const bool unseen = !a.request.stream || !a.token_seen[e.choice];
    if (rep.state == ReplicaState::kFailed && unseen && !a.cancelled) {
      if (std::shared_ptr<Replica> other = route(a.prompt, &rep)) {
        Status refused;
        choice = openai::Choice{};
        a.token_seen[e.choice] = false;
        a.started[e.choice] = false;
        if (submit_choice(a, e.choice, other, &refused)) {
          log_warn("serve: {}: choice {} moved from failed {} to {}", a.id.id, e.choice, rep.name(), other->name());
          reap_retired();
          return;
        }
      }
    }
  }
  switch (ev.finish) {
    case engine::RequestFinish::kStop: choice.finish_reason = "stop"; break;
    case engine::RequestFinish::kLength: choice.finish_reason = "length"; break;
    case engine::RequestFinish::kError:
      if (!a.error) a.error = ev.error;
      break;
    default: break;
  }
  a.usage.completion_tokens += ev.completion_tokens;
  a.usage.cached_tokens = std::max(a.usage.cached_tokens, ev.cached_prompt_tokens);
  if (stream && ev.finish != engine::RequestFinish::kError && !choice.finish_reason.empty()) {
    a.responder->write_chunk(openai::sse(openai::chunk_json(a.request, a.id, static_cast<std::int64_t>(e.choice),
                                                            !a.started[e.choice], "", {}, choice.finish_reason, tok)));
    a.started[e.choice] = true;
  }
  a.done[e.choice] = true;
  if (--a.remaining == 0) {
    complete(a);
    active_.erase(it);
    reap_retired();
    maybe_finish_shutdown();
  }
}

void Daemon::complete(Active& a) {
  metrics_.e2e.observe(std::chrono::duration<double>(Clock::now() - a.arrival).count());
  if (a.cancelled) {
    ++metrics_.finished_abort;
    return;
  }
  if (a.error) {
    ++metrics_.finished_error;
  } else {
    for (const openai::Choice& c : a.choices) ++(c.finish_reason == "length" ? metrics_.finished_length : metrics_.finished_stop);
  }
  if (!a.responder) return;
  openai::ApiError err;
  if (a.error) {
    err.status = 500;
    err.type = "internal_error";
    err.message = "the engine failed while generating: " + a.error->to_string();
  }
  if (a.request.stream) {
    if (a.error) {
      a.responder->write_chunk(openai::sse(openai::error_body(err)));
    } else if (a.request.include_usage) {
      a.responder->write_chunk(openai::sse(openai::usage_chunk_json(a.request, a.id, a.usage)));
    }
    a.responder->write_chunk("data: [DONE]\n\n");
    a.responder->end_stream();
    return;
  }
  if (a.error) return send_error(a.responder, err);
  a.responder->respond(200, {{"Content-Type", "application/json"}},
                       openai::completion_body(a.request, a.id, a.choices, a.usage, a.generation->tokenizer()));
}

// ---------------------------------------------------------------------------------------------
// Admin

// The engine figures of one replica, or their sum over several, in the shape `ctl status` shows.
json engine_json(const engine::EngineStats& es, std::uint64_t failed_steps, std::int64_t block_size) {
  return json{{"queue", json{{"running", es.running}, {"waiting", es.waiting}}},
              {"kv_cache", json{{"usage", es.kv_usage},
                                {"free_blocks", es.kv_free_blocks},
                                {"total_blocks", es.kv_total_blocks},
                                {"block_size", block_size}}},
              {"prefix_cache", json{{"queries", es.prefix_queries},
                                    {"hits", es.prefix_hits},
                                    {"hit_rate", es.prefix_queries > 0 ? static_cast<double>(es.prefix_hits) /
                                                                             static_cast<double>(es.prefix_queries)
                                                                       : 0.0}}},
              {"tokens", json{{"prompt", es.prompt_tokens}, {"generated", es.generation_tokens}}},
              {"preemptions", es.preemptions},
              {"failed_steps", failed_steps},
              {"steps", json{{"count", es.steps},
                             {"max_step_ms", es.max_step_ms},
                             {"cost_model", json{{"ready", es.cost_ready},
                                                 {"fixed_ms", es.cost_fixed_ms},
                                                 {"per_decode_token_ms", es.cost_per_decode_ms},
                                                 {"per_prefill_token_ms", es.cost_per_prefill_ms},
                                                 {"per_attended_row_us", es.cost_per_context_row_us}}},
                             {"last", json{{"decode_tokens", es.last_decode_tokens},
                                           {"prefill_tokens", es.last_prefill_tokens},
                                           {"ms", es.last_step_ms}}}}}};
}

Daemon::Health Daemon::health() const {
  Health h;
  h.state = std::string(state_name(state_));
  if (state_ == State::kLoading) h.reason = "the model is still loading";
  if (state_ == State::kDraining || state_ == State::kStopping) h.reason = "the server is draining";
  if (state_ != State::kReady || !current_) return h;
  for (const auto& r : current_->replicas) {
    if (r->state == ReplicaState::kReady) {
      h.ok = true;
      return h;
    }
  }
  // Every replica failed: requests would get 503s, so balancers must not send any.
  h.state = "unavailable";
  h.reason = fmt::format("no replica can serve: all {} replica(s) of generation {} have failed (a step failed on "
                         "their devices); see the log, then reload or restart", current_->replicas.size(),
                         current_->number);
  return h;
}

json Daemon::status_json() {
  const Health h = health();
  json s{{"model", model_name_},
         {"model_path", config_.model.path},
         {"state", h.state},
         {"pid", ::getpid()},
         {"uptime_s", std::chrono::duration<double>(Clock::now() - start_clock_).count()},
         {"http", base_url()},
         {"in_flight", active_.size()}};
  if (!h.reason.empty()) s["reason"] = h.reason;
  if (reloading_) s["reload"] = fmt::format("in progress ({})", reload_source_);
  if (upgrading_ && successor_) {
    s["upgrade"] = json{{"binary", upgrade_binary_},
                        {"pid", successor_->pid()},
                        {"waiting_s", std::chrono::duration<double>(Clock::now() - upgrade_started_).count()},
                        {"timeout_ms", config_.admin.upgrade_timeout_ms}};
  }
  if (!current_) return s;
  s["generation"] = current_->number;
  s["plan"] = current_->replicas.front()->session().plan_summary;
  std::vector<engine::EngineStats> serving;  // the totals are the generation in service's
  std::uint64_t failed_total = 0;
  json list = json::array();
  for (const auto& r : all_replicas()) {
    const engine::EngineStats es = replica_stats(*r);
    const std::uint64_t failed = r->service().failed_steps();
    json one{{"replica", r->label()},
             {"generation", r->generation()},
             {"state", replicas::replica_state_name(r->state)},
             {"devices", r->session().devices_summary()},
             {"outstanding", json{{"requests", r->running}, {"prompt_tokens", r->pending_prompt_tokens}}}};
    one.update(engine_json(es, failed, config_.engine.block_size));
    list.push_back(std::move(one));
    if (r->generation() != current_->number) continue;
    serving.push_back(es);
    failed_total += failed;
  }
  const engine::EngineStats total = sum_engine_stats(serving);
  s["devices"] = current_->replicas.size() == 1 ? current_->replicas.front()->session().devices_summary()
                                                 : fmt::format("{} replicas", current_->replicas.size());
  s.update(engine_json(total, failed_total, config_.engine.block_size));
  s["replicas"] = std::move(list);
  return s;
}

void Daemon::handle_admin(const json& request, admin::Reply reply) {
  const std::string cmd = request.value("cmd", "");
  if (cmd == "status") return reply(status_json());
  if (cmd == "plan") {
    if (!current_) return reply(failed_precondition_error("the model is still loading; no plan yet"));
    // Every replica of a generation has the same layout; the plan of the first stands for all.
    ModelSession& first = current_->replicas.front()->session();
    return reply(json{{"plan", first.plan_text}, {"devices", first.devices_summary()},
                      {"replicas", current_->replicas.size()}});
  }
  if (cmd == "config") return reply(json{{"yaml", config::to_yaml(config_)}});
  if (cmd == "logs") {
    if (g_start_log == nullptr) return reply(failed_precondition_error("this daemon keeps no start log (log.dir: none)"));
    std::int64_t lines = 200;
    if (const auto it = request.find("lines"); it != request.end()) {
      if (!it->is_number_integer() || it->get<std::int64_t>() < 1 || it->get<std::int64_t>() > 100000) {
        return reply(invalid_argument_error("logs: \"lines\" must be an integer from 1 to 100000 (got {})",
                                            admin::dump_line(*it).substr(0, 100)));
      }
      lines = it->get<std::int64_t>();
    }
    return reply(json{{"path", g_start_log->log_path()}, {"log", g_start_log->tail(static_cast<int>(lines))}});
  }
  if (cmd == "drain") {
    begin_drain(false);
    return reply(json{{"state", state_name(state_)}, {"in_flight", active_.size()}});
  }
  if (cmd == "resume") {
    drain_requested_ = false;
    if (state_ == State::kDraining && !shutdown_requested_) state_ = State::kReady;
    if (state_ != State::kReady) {
      return reply(failed_precondition_error("cannot resume while {}", state_name(state_)));
    }
    return reply(json{{"state", state_name(state_)}});
  }
  if (cmd == "shutdown") {
    reply(json{{"state", "stopping"}, {"in_flight", active_.size()}});
    begin_drain(true);
    return;
  }
  if (cmd == "reload") return start_reload(request, std::move(reply), "ctl reload");
  if (cmd == "upgrade") return start_upgrade(request, std::move(reply));
  return reply(invalid_argument_error(
      "unknown command '{}' (status, plan, config, logs, drain, resume, shutdown, reload, upgrade)", cmd));
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

void Daemon::end_in_flight() {
  log_warn("serve: http.drain_timeout_ms ({} ms) passed: ending {} request(s) still in flight",
           config_.http.drain_timeout_ms, active_.size());
  openai::ApiError err;
  err.status = 503;
  err.type = "service_unavailable";
  err.message = "the server is shutting down (http.drain_timeout_ms passed before this request finished)";
  for (auto& [key, a] : active_) end_request(*a, err);
}

void Daemon::end_request(Active& a, const openai::ApiError& err) {
  if (a.cancelled) return;
  a.cancelled = true;
  if (a.responder && !a.responder->finished() && !a.responder->closed()) {
    if (a.responder->streaming()) {
      a.responder->write_chunk(openai::sse(openai::error_body(err)));
      a.responder->write_chunk("data: [DONE]\n\n");
      a.responder->end_stream();
    } else {
      send_error(a.responder, err);
    }
  }
  for (std::size_t c = 0; c < a.replica.size(); ++c) {  // their final events erase the entry
    if (a.replica[c] && !a.done[c]) a.replica[c]->service().cancel(a.engine_ids[c]);
  }
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
  if (loader_.joinable()) {
    // The loader still runs (a failure elsewhere): let its result arrive, then close the queue.
    return;
  }
  if (loaded_queue_) loaded_queue_->close();
  for (const auto& r : all_replicas()) r->stop();
  successor_.reset();  // its handles close; the process (if it is the daemon now) runs on
  if (events_) events_->close();
}

}  // namespace

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
      g_start_log = start_log.get();
    } else {
      log_warn("serve: no start log: {}", opened.status().message());
    }
  }
  int rc = 0;
  {
    Daemon d(config, std::move(serve_args));
    rc = d.run();
  }
  if (start_log) start_log->finish(rc);
  g_start_log = nullptr;
  return rc;
}

}  // namespace sx::daemon::serve
