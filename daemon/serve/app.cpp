// The `sextant serve` daemon: start-up phases, the OpenAI routes, engine events, drain and shutdown.
#include "daemon/serve/app.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/resource.h>
#include <uv.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <csignal>
#include <cstdio>
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
#include "daemon/commands/model_session.h"
#include "daemon/config/yaml_io.h"
#include "daemon/http/router.h"
#include "daemon/http/server.h"
#include "daemon/loop/async_queue.h"
#include "daemon/loop/timer.h"
#include "daemon/loop/uv_status.h"
#include "daemon/openai/request.h"
#include "daemon/openai/response.h"
#include "daemon/serve/engine_service.h"
#include "daemon/serve/metrics.h"
#include "runtime/base/log.h"
#include "runtime/engine/engine.h"
#include "runtime/engine/model_loader.h"
#include "runtime/tokenizer/chat_template.h"

namespace sx::daemon::serve {

namespace {

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

// What the loader thread hands to the loop.
struct Loaded {
  Status status;
  std::string phase;  // the phase that failed
  std::unique_ptr<ModelSession> session;
  std::unique_ptr<engine::Engine> engine;
};

struct EngineEvent {
  std::uint64_t key = 0;
  std::size_t choice = 0;
  engine::RequestEvent event;
};

// One OpenAI request in flight: its n engine requests (choices) and what was sent so far.
struct Active {
  std::uint64_t key = 0;
  openai::GenerateRequest request;
  openai::ResponseId id;
  http::ResponderPtr responder;
  std::vector<std::uint64_t> engine_ids;
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
// thread pool: a body of up to http.max_body_bytes never costs the loop thread its parse.
struct TokenizeWork {
  uv_work_t req;
  Daemon* self = nullptr;
  const tokenizer::Tokenizer* tok = nullptr;
  openai::Endpoint endpoint = openai::Endpoint::kChat;
  std::string body;
  openai::ParseLimits limits;
  std::string model_name;
  http::ResponderPtr responder;
  openai::GenerateRequest request;       // out
  std::vector<std::int32_t> prompt;      // out
  std::optional<openai::ApiError> error;  // out
  void run();  // thread pool
};

class Daemon {
 public:
  explicit Daemon(const config::ServeConfig& config)
      : config_(config), model_name_(config::effective_served_model_name(config.model)),
        started_(std::time(nullptr)), start_clock_(Clock::now()) {}

  int run();

 private:
  Status start_http();
  // "http://HOST:PORT" of the listener, an IPv6 host in brackets.
  std::string base_url() const;
  Status start_admin();
  void start_signals();
  void load_in_background();
  void on_loaded(Loaded loaded);
  void fail_startup(const std::string& phase, const Status& s);

  http::Router make_router();
  bool authorized(const http::Request& request, const http::ResponderPtr& responder);
  void send_error(const http::ResponderPtr& r, const openai::ApiError& e);
  // 503 for a generation request while loading, draining or stopping (counted in the metrics).
  void refuse_not_ready(const http::ResponderPtr& r);
  void handle_generate(openai::Endpoint endpoint, http::Request request, http::ResponderPtr responder);
  friend struct TokenizeWork;
  // Loop thread, after the prompt was tokenized (status: the work request's, UV_ECANCELED if cancelled).
  void start_generate(TokenizeWork work, int status);
  void on_event(EngineEvent e);
  void complete(Active& a);
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

  std::unique_ptr<ModelSession> session_;
  std::unique_ptr<engine::Engine> engine_;
  std::unique_ptr<EngineService> service_;
  std::int64_t max_model_len_ = 0;

  std::unordered_map<std::uint64_t, std::unique_ptr<Active>> active_;
  std::uint64_t next_key_ = 1;
  ServeMetrics metrics_;
};

// ---------------------------------------------------------------------------------------------
// Start-up

int Daemon::run() {
  std::signal(SIGPIPE, SIG_IGN);
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
  if (Status s = start_http(); !s.ok()) {
    fail_startup("http", s);
  } else if (Status a = start_admin(); !a.ok()) {
    fail_startup("admin", a);
  } else {
    load_in_background();
  }
  uv_run(&loop_, UV_RUN_DEFAULT);
  if (loader_.joinable()) loader_.join();
  if (service_) service_->stop();
  // Handles closed by close_everything(); a last run frees what their close callbacks own.
  uv_run(&loop_, UV_RUN_DEFAULT);
  const int rc = uv_loop_close(&loop_);
  if (rc != 0) log_warn("serve: the event loop still had open handles at exit ({})", uv_strerror(rc));
  log_info("serve: stopped (exit status {})", exit_code_);
  return exit_code_;
}

void Daemon::fail_startup(const std::string& phase, const Status& s) {
  log_error("serve: failed in phase {}: {}", phase, s.to_string());
  exit_code_ = 1;
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
  log_info("serve: phase http: listening on {}", base_url());
  if (config_.http.api_keys.empty() && !is_loopback_address(config_.http.host)) {
    log_warn("serve: http.host {} is reachable from other machines and no API key is set: anyone who can connect may "
             "generate; set http.api_keys (or --api-key), or listen on 127.0.0.1",
             config_.http.host);
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
  // No other signal a daemon is sent by its tools is fatal: SIGHUP (which will reload the config)
  // and SIGUSR1/SIGUSR2 are logged and ignored; SIGPIPE is ignored (run()).
  for (int signum : {SIGHUP, SIGUSR1, SIGUSR2}) {
    auto sig = loop::Signal::create(&loop_);
    Status s = sig.ok() ? sig->start(signum, [](int got) {
      if (got == SIGHUP) {
        log_warn("serve: SIGHUP: reloading is not supported yet; ignored (the daemon keeps serving)");
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

void Daemon::load_in_background() {
  loader_ = std::thread([this, sender = loaded_queue_->sender()] {
    Loaded l;
    std::string phase = "model check";
    auto fail = [&](Status s) {
      l.status = std::move(s);
      l.phase = phase;
      sender.push(std::move(l));
    };
    // Between phases (and inside the weight upload, per layer) a shutdown stops the load.
    auto cancelled = [&] { return load_cancel_.load(std::memory_order_relaxed); };
    auto opened = engine::open_model(config_.model.path);
    if (!opened.ok()) return fail(opened.status());
    if (cancelled()) return fail(cancelled_error("shutdown requested after the model check"));
    log_info("serve: phase model check: ok ({}, {} layers, context {})", config_.model.path, opened->config.n_layers,
             opened->config.context_length);
    phase = "devices";
    if (!config_.model.devices.empty()) {
      return fail(unimplemented_error("model.devices: choosing device indexes is not supported yet; the ranks take "
                                      "the backend's first tp x pp devices (remove model.devices)"));
    }
    SessionOptions so;
    so.backend = config_.model.backend;  // "auto": open_session picks and logs why
    so.threads = static_cast<int>(config_.model.threads);
    so.tp = static_cast<int>(config_.model.tp);
    so.pp = static_cast<int>(config_.model.pp);
    so.context_tokens = config_.engine.max_model_len;
    so.max_seqs = config_.engine.max_num_seqs;
    so.max_batch_tokens = config_.engine.max_num_batched_tokens;
    so.block_size = config_.engine.block_size;
    so.memory_utilization = config_.engine.memory_utilization;
    so.memory_budget = config_.engine.memory_budget.value_or(0);
    so.cancel = &load_cancel_;
    so.on_phase = [&](std::string_view done, const std::string& detail) {
      log_info("serve: phase {}: ok ({})", done, detail);
      phase = done == "devices" ? "plan or load" : "load";
    };
    auto session = open_session(so, std::move(opened).value());
    if (!session.ok()) return fail(session.status());
    l.session = std::make_unique<ModelSession>(std::move(session).value());
    if (cancelled()) return fail(cancelled_error("shutdown requested after the weights were loaded"));
    log_info("serve: phase load: ok ({} MB of weights; KV cache for {} requests of {} tokens)",
             l.session->model->weight_bytes() / 1000000, l.session->max_seqs, l.session->context_tokens);
    phase = "engine";
    engine::EngineConfig ec;
    ec.scheduler.max_num_batched_tokens = l.session->model->options().max_batch_tokens;
    ec.scheduler.max_num_seqs = config_.engine.max_num_seqs;
    ec.scheduler.max_model_len = std::min(l.session->model->max_request_tokens(), l.session->context_tokens);
    ec.prefix_caching = config_.engine.enable_prefix_caching;
    ec.eos_ids = l.session->opened.extra_eos_ids;
    auto eng = engine::Engine::create(*l.session->model, *l.session->opened.tokenizer, ec);
    if (!eng.ok()) return fail(eng.status());
    l.engine = std::move(eng).value();
    if (cancelled()) return fail(cancelled_error("shutdown requested before the warm-up"));
    phase = "warm-up";
    // One token through every layer: the first client does not pay for first-touch costs.
    engine::RequestOptions wo;
    wo.max_tokens = 1;
    wo.sampling.temperature = 0;
    Status warm_error;
    auto id = l.engine->submit({0}, wo, [&](const engine::RequestEvent& e) {
      if (e.finished && e.finish == engine::RequestFinish::kError) warm_error = e.error;
    });
    if (!id.ok()) return fail(id.status());
    if (Status s = l.engine->run_until_idle(); !s.ok()) return fail(s);
    if (!warm_error.ok()) return fail(warm_error);
    log_info("serve: phase warm-up: ok");
    sender.push(std::move(l));
  });
}

void Daemon::on_loaded(Loaded l) {
  if (loader_.joinable()) loader_.join();
  if (closing_) {  // start-up already failed elsewhere: the result is not wanted
    loaded_queue_->close();
    events_->close();
    return;
  }
  if (l.status.code() == StatusCode::kCancelled && shutdown_requested_) {
    log_info("serve: the load stopped in phase {} for the shutdown ({})", l.phase, l.status.message());
    state_ = State::kStopping;
    close_everything();
    return;
  }
  if (!l.status.ok()) return fail_startup(l.phase, l.status);
  session_ = std::move(l.session);
  engine_ = std::move(l.engine);
  max_model_len_ = std::min(session_->model->max_request_tokens(), session_->context_tokens);
  service_ = std::make_unique<EngineService>(*engine_);
  if (shutdown_requested_) {  // a SIGTERM arrived while loading
    state_ = State::kDraining;
    maybe_finish_shutdown();
    return;
  }
  state_ = drain_requested_ ? State::kDraining : State::kReady;
  log_info("serve: {}: model '{}' at {}/v1 (admin: {})", drain_requested_ ? "ready but draining" : "ready",
           model_name_, base_url(), config_.admin.socket);
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
    if (max_model_len_ > 0) model["max_model_len"] = max_model_len_;
    r->respond(200, {{"Content-Type", "application/json"}},
               openai::dump_json(json{{"object", "list"}, {"data", json::array({model})}}));
  });
  (void)router.get("/health", [this](http::Request, http::ResponderPtr r) {
    const bool ready = state_ == State::kReady;
    r->respond(ready ? 200 : 503, {{"Content-Type", "application/json"}},
               openai::dump_json(json{{"status", ready ? "ok" : std::string(state_name(state_))}}));
  });
  (void)router.get("/metrics", [this](http::Request, http::ResponderPtr r) {
    ServeMetrics::Extra extra;
    if (http_) {
      const http::ServerStats hs = http_->stats();
      extra.open_connections = static_cast<std::int64_t>(hs.open_connections);
      extra.http_requests = hs.requests;
    }
    const engine::EngineStats es = service_ ? service_->stats() : engine::EngineStats{};
    r->respond(200, {{"Content-Type", "text/plain; version=0.0.4; charset=utf-8"}},
               metrics_.render(model_name_, es, extra));
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
  work->tok = session_->opened.tokenizer.get();
  work->endpoint = endpoint;
  work->body = std::move(request.body);
  work->limits = {config_.limits.max_stop_strings, config_.limits.max_n};
  work->model_name = model_name_;
  work->responder = std::move(responder);
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
  openai::ApiError err;
  std::optional<openai::GenerateRequest> parsed = openai::parse_request(endpoint, body, limits, &err);
  std::string().swap(body);  // the text is not needed any more
  if (!parsed) {
    error = std::move(err);
    return;
  }
  request = std::move(*parsed);
  const openai::GenerateRequest& req = request;
  if (req.model != model_name) {
    error = openai::ApiError{};
    error->status = 404;
    error->code = "model_not_found";
    error->param = "model";
    error->message = fmt::format("The model '{}' does not exist; this server serves '{}'.", req.model, model_name);
    return;
  }
  if (req.endpoint == openai::Endpoint::kChat) {
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
  openai::GenerateRequest& req = w.request;
  const openai::Endpoint endpoint = req.endpoint;
  std::vector<std::int32_t> prompt = std::move(w.prompt);
  if (responder->closed()) return;  // the client left while its prompt was tokenized
  openai::ApiError err;
  if (w.error) return send_error(responder, *w.error);
  // The state may have changed while the prompt was tokenized.
  if (status != 0 || state_ != State::kReady) return refuse_not_ready(responder);
  // Engine requests that cannot run yet: beyond max_num_seqs (counted here; the engine's own
  // figures lag by a step, and a burst arrives within one).
  std::int64_t outstanding = 0;
  for (const auto& [k, act] : active_) outstanding += static_cast<std::int64_t>(act->remaining);
  const std::int64_t waiting = std::max<std::int64_t>(0, outstanding - config_.engine.max_num_seqs);
  if (waiting + req.n > config_.http.max_queued_requests) {
    err.status = 429;
    err.type = "rate_limit_error";
    err.message = fmt::format("{} requests are already waiting (http.max_queued_requests = {}); retry later", waiting,
                              config_.http.max_queued_requests);
    ++metrics_.http_rejected_busy;
    return send_error(responder, err);
  }
  const auto n_prompt = static_cast<std::int64_t>(prompt.size());
  const std::int64_t max_prompt = config_.limits.max_prompt_tokens > 0
                                      ? std::min(config_.limits.max_prompt_tokens, max_model_len_ - 1)
                                      : max_model_len_ - 1;
  if (n_prompt == 0) {
    err.param = endpoint == openai::Endpoint::kChat ? "messages" : "prompt";
    err.message = "the prompt is empty";
    return send_error(responder, err);
  }
  if (n_prompt > max_prompt || (req.max_tokens && n_prompt + *req.max_tokens > max_model_len_)) {
    err.param = n_prompt > max_prompt ? (endpoint == openai::Endpoint::kChat ? "messages" : "prompt") : "max_tokens";
    err.code = "context_length_exceeded";
    if (n_prompt > max_prompt && max_prompt < max_model_len_ - 1) {
      err.message = fmt::format("The prompt has {} tokens; this server accepts at most {} (limits.max_prompt_tokens).",
                                n_prompt, max_prompt);
    } else {
      err.message = fmt::format(
          "This model's maximum context length is {} tokens. However, you requested {} tokens ({} in the prompt, {} "
          "for the completion). Please reduce the length of the prompt or the completion.",
          max_model_len_, n_prompt + req.max_tokens.value_or(0), n_prompt, req.max_tokens.value_or(0));
    }
    return send_error(responder, err);
  }

  auto a = std::make_unique<Active>();
  a->key = next_key_++;
  a->id = {fmt::format("{}-{}", endpoint == openai::Endpoint::kChat ? "chatcmpl" : "cmpl", random_hex(24)),
           static_cast<std::int64_t>(std::time(nullptr)), model_name_};
  a->responder = responder;
  a->arrival = Clock::now();
  const auto n = static_cast<std::size_t>(req.n);
  a->choices.resize(n);
  a->done.assign(n, false);
  a->started.assign(n, false);
  a->token_bytes_sent.assign(n, 0);
  a->last_token.assign(n, a->arrival);
  a->remaining = n;
  a->usage.prompt_tokens = n_prompt;

  engine::RequestOptions o;
  o.sampling = req.sampling;
  o.max_tokens = req.max_tokens.value_or(std::min(config_.limits.max_tokens_default, max_model_len_ - n_prompt));
  o.stop_strings = req.stop;
  o.ignore_eos = req.ignore_eos;
  o.top_logprobs = req.top_logprobs;
  a->request = std::move(req);
  Active& ref = *a;
  const std::uint64_t key = a->key;
  active_.emplace(key, std::move(a));
  for (std::size_t c = 0; c < n; ++c) {
    engine::RequestOptions oc = o;
    if (oc.sampling.seed && c > 0) *oc.sampling.seed += c;  // n samples, not n copies of one
    auto sender = events_->sender();
    auto id = service_->submit(prompt, oc, [sender, key, c](const engine::RequestEvent& e) {
      sender.push(EngineEvent{key, c, e});
    });
    if (!id.ok()) {
      for (std::uint64_t started : ref.engine_ids) service_->cancel(started);
      err.message = id.status().message();
      if (id.status().code() == StatusCode::kUnavailable) {
        err.status = 503;
        err.type = "service_unavailable";
      }
      ref.responder.reset();
      if (ref.engine_ids.empty()) {
        active_.erase(key);
      } else {  // the final events of the choices already submitted (cancelled) erase it
        ref.cancelled = true;
        ref.remaining = ref.engine_ids.size();
      }
      return send_error(responder, err);
    }
    ref.engine_ids.push_back(*id);
  }
  if (ref.request.stream) {
    responder->start_stream(200, {{"Content-Type", "text/event-stream"}, {"Cache-Control", "no-cache"}});
  }
  // A client that leaves cancels its engine requests; their final events then erase the entry.
  responder->on_close([this, key] {
    auto it = active_.find(key);
    if (it == active_.end() || it->second->cancelled) return;
    it->second->cancelled = true;
    for (std::uint64_t id : it->second->engine_ids) service_->cancel(id);
  });
}

void Daemon::on_event(EngineEvent e) {
  auto it = active_.find(e.key);
  if (it == active_.end()) return;
  Active& a = *it->second;
  const engine::RequestEvent& ev = e.event;
  const Clock::time_point now = Clock::now();
  if (!ev.tokens.empty()) {
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
  const tokenizer::Tokenizer& tok = *session_->opened.tokenizer;
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
                       openai::completion_body(a.request, a.id, a.choices, a.usage, *session_->opened.tokenizer));
}

// ---------------------------------------------------------------------------------------------
// Admin

json Daemon::status_json() {
  json s{{"model", model_name_},
         {"model_path", config_.model.path},
         {"state", state_name(state_)},
         {"uptime_s", std::chrono::duration<double>(Clock::now() - start_clock_).count()},
         {"http", base_url()},
         {"in_flight", active_.size()}};
  if (session_) {
    s["devices"] = session_->devices_summary();
    s["plan"] = session_->plan_summary;
  }
  if (service_) {
    const engine::EngineStats es = service_->stats();
    s["queue"] = json{{"running", es.running}, {"waiting", es.waiting}};
    s["kv_cache"] = json{{"usage", es.kv_usage},
                         {"free_blocks", es.kv_free_blocks},
                         {"total_blocks", es.kv_total_blocks},
                         {"block_size", config_.engine.block_size}};
    s["prefix_cache"] = json{{"queries", es.prefix_queries},
                             {"hits", es.prefix_hits},
                             {"hit_rate", es.prefix_queries > 0 ? static_cast<double>(es.prefix_hits) /
                                                                      static_cast<double>(es.prefix_queries)
                                                                : 0.0}};
    s["tokens"] = json{{"prompt", es.prompt_tokens}, {"generated", es.generation_tokens}};
    s["preemptions"] = es.preemptions;
    s["failed_steps"] = service_->failed_steps();
  }
  return s;
}

void Daemon::handle_admin(const json& request, admin::Reply reply) {
  const std::string cmd = request.value("cmd", "");
  if (cmd == "status") return reply(status_json());
  if (cmd == "plan") {
    if (!session_) return reply(failed_precondition_error("the model is still loading; no plan yet"));
    return reply(json{{"plan", session_->plan_text}, {"devices", session_->devices_summary()}});
  }
  if (cmd == "config") return reply(json{{"yaml", config::to_yaml(config_)}});
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
  if (cmd == "reload") return reply(unimplemented_error("reload is not supported yet"));
  return reply(invalid_argument_error("unknown command '{}' (status, plan, config, drain, resume, shutdown, reload)",
                                      cmd));
}

// ---------------------------------------------------------------------------------------------
// Drain and shutdown

void Daemon::begin_drain(bool then_shutdown) {
  if (then_shutdown) shutdown_requested_ = true;
  if (state_ == State::kReady) state_ = State::kDraining;
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
  for (std::uint64_t id : a.engine_ids) service_->cancel(id);  // their final events erase the entry
}

void Daemon::maybe_finish_shutdown() {
  if (!shutdown_requested_ || !active_.empty() || state_ == State::kLoading || closing_) return;
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
  if (service_) service_->stop();
  if (events_) events_->close();
}

}  // namespace

int run_daemon(const config::ServeConfig& config) {
  Daemon d(config);
  return d.run();
}

}  // namespace sx::daemon::serve
