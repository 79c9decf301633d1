// The `sextant serve` daemon's one class and the state it keeps, shared by the files that implement
// it (daemon/serve, private to it: nothing outside includes this). The walk:
//   app.cpp          lifecycle: start-up phases, listening sockets, signals, drain, upgrade, shutdown
//   generations.cpp  the replica sets: loading in the background, reload, switching, retiring
//   requests.cpp     the OpenAI routes: a request's parse and prompt on the thread pool, routing to a
//                    replica, engine events, streamed and whole responses, retries, cancellation
//   status.cpp       /health, ctl status and the admin commands
// Everything runs on the loop thread except TokenizeWork::run (libuv's thread pool),
// TokenizeWork::compile (the compile pool's threads, compile_pool.h) and the loader thread of
// load_in_background.
#pragma once

#include <uv.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <ctime>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <thread>
#include <unordered_map>
#include <vector>

#include <nlohmann/json.hpp>

#include "daemon/admin/admin_server.h"
#include "daemon/admin/protocol.h"
#include "daemon/chat/chat_template.h"
#include "daemon/chat/reasoning.h"
#include "daemon/chat/structured.h"
#include "daemon/chat/tool_calls.h"
#include "daemon/config/serve_config.h"
#include "daemon/http/router.h"
#include "daemon/http/server.h"
#include "daemon/loop/async_queue.h"
#include "daemon/loop/timer.h"
#include "daemon/openai/request.h"
#include "daemon/openai/response.h"
#include "daemon/openai/utility.h"
#include "daemon/replicas/replica.h"
#include "daemon/serve/compile_pool.h"
#include "daemon/serve/handover.h"
#include "daemon/serve/metrics.h"
#include "daemon/serve/start_log.h"
#include "runtime/engine/engine.h"

namespace sx::daemon::serve::detail {

// This start's log (run_daemon), for the admin command "logs"; null when none is kept.
extern StartLog* g_start_log;

using nlohmann::json;
using Clock = std::chrono::steady_clock;

enum class State { kLoading, kReady, kDraining, kStopping };

std::string_view state_name(State s);

using replicas::Replica;
using replicas::ReplicaState;

// A replica's engine figures as status and /metrics count them: a failed replica's KV blocks serve
// nobody, so they count neither as free nor in the total.
engine::EngineStats replica_stats(const Replica& r);

// The replicas of one configuration: the set in service, or the one a reload is building.
struct Generation {
  int number = 0;
  config::ServeConfig config;
  std::string model_name;  // what clients send; kept across reloads unless the config names another
  std::vector<std::shared_ptr<Replica>> replicas;
  std::int64_t max_model_len = 0;  // the smallest of its replicas'
  // Renders chat requests (choose_chat_template); null: the built-in ChatML.
  std::shared_ptr<const chat::ChatTemplate> chat_template;
  std::string chat_template_said;  // which template, from where (the load's log line)
  // Every replica loaded the same files: one tokenizer speaks for all.
  const tokenizer::Tokenizer& tokenizer() const { return replicas.front()->tokenizer(); }
  // Structured output's grammars over this model's vocabulary, built by the first request that
  // asks for one (any thread); null with `error` set when xgrammar refused the vocabulary.
  chat::Grammars* grammars(std::string* error) const;

 private:
  mutable std::once_flag grammars_once_;
  mutable std::unique_ptr<chat::Grammars> grammars_;
  mutable std::string grammars_error_;
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

// A streamed chat choice's tool calls (request.tool_syntax set): the parsers of its reasoning and
// its content, numbering calls together, and the ids given to calls begun.
struct ToolStream {
  std::size_t counter = 0;
  chat::ToolCallParser reasoning, content;
  std::vector<std::string> ids;  // by call index
  std::size_t ended_ok = 0;
  ToolStream(chat::ToolSyntax syntax, const nlohmann::ordered_json& tools)
      : reasoning(syntax, tools, &counter), content(syntax, tools, &counter) {}
  ToolStream(const ToolStream&) = delete;
  ToolStream& operator=(const ToolStream&) = delete;
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
  std::vector<chat::ReasoningSplitter> reasoning;  // per choice, streamed chat with split_reasoning
  std::vector<std::unique_ptr<ToolStream>> tool_streams;  // per choice, streamed chat with tool_syntax
  // Structured output: the compiled format each choice's constraint starts from (again on a retry).
  std::shared_ptr<const chat::CompiledFormat> format;
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

// requests.cpp
std::string random_hex(std::size_t n);
// Compares a client's key with a configured one in time that depends only on the client's key
// length. An empty configured key never matches.
bool constant_time_equal(std::string_view given, std::string_view key);

class Daemon;

// A request whose body is being parsed and whose prompt is rendered and tokenized on libuv's
// thread pool: a body of up to http.max_body_bytes never costs the loop thread its parse. When a
// reload put another generation in service meanwhile, the parsed request is tokenized again with
// the new generation's tokenizer (`parsed` set: run() skips the parse).
// A request with a format (structured output, a forced tool call) then has it compiled on the
// compile pool (compile(); the loop hands it over, its answer comes back through the loop's
// compiled_ queue): libuv's pool, which every request needs, never waits for a compile.
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
  std::vector<std::int32_t> script;      // out: request.test_script's tokens
  bool needs_format = false;  // out of run(): a format to compile (compile() not run yet)
  std::shared_ptr<const chat::CompiledFormat> format;  // out of compile(): the answer's grammar
  std::optional<openai::ApiError> error;  // out
  void run();  // libuv's thread pool
  // The compile pool: the format within `budget` (its timeout, for the message too), or the error.
  void compile(const chat::CompileBudget& budget);
  // tool_choice "required" or named, with tools shown: the answer is a call held to their schemas.
  bool call_required() const;
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
  // Returns the host memory malloc keeps free to the system, on libuv's pool (glibc only).
  void trim_heap();
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
  // /tokenize, /detokenize, /apply-template (openai/utility.h), on the thread pool.
  void handle_utility(openai::UtilityEndpoint endpoint, http::Request request, http::ResponderPtr responder);
  void queue_tokenize(std::unique_ptr<TokenizeWork> work);
  // Hands a tokenized request's format to the compile pool (a 429 when as many compiles as
  // limits.max_queued_grammar_compiles wait already); it comes back to start_generate through
  // compiled_.
  void queue_compile(std::unique_ptr<TokenizeWork> work);
  // Shutdown: the compile pool stops (what it still holds comes back to the loop at once, and is
  // answered); then, with `close_queue`, the queue that brings compiles back closes behind them.
  void stop_compiles(bool close_queue);
  friend struct TokenizeWork;
  // Loop thread, after the prompt was tokenized (status: the work request's, UV_ECANCELED if cancelled).
  void start_generate(TokenizeWork work, int status);
  void on_event(EngineEvent e);
  // A streamed chat choice with tools: `parts` of its answer (reasoning and content, as the
  // splitter told them) through its tool-call parsers (finished too when `at_end`), written as
  // deltas; `logprobs` ride on the first.
  void stream_with_tools(Active& a, std::size_t c, const chat::ReasoningSplitter::Parts& parts,
                         const std::vector<engine::TokenLogprob>& logprobs, bool at_end);
  // A whole chat choice's calls out of its reasoning and content (request.tool_syntax set).
  void take_tool_calls(const Active& a, openai::Choice& c);
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

  // SEXTANT_TEST_HOOKS=1 in the environment: requests may carry sextant_test_script (tests only).
  bool test_hooks_ = false;
  std::unordered_map<std::uint64_t, std::unique_ptr<Active>> active_;
  std::uint64_t next_key_ = 1;
  ServeMetrics metrics_;
  // Structured output's compiles: requests come back from the pool through compiled_. Declared
  // last: the pool's threads are joined first, while what their jobs use is still alive.
  std::unique_ptr<loop::AsyncQueue<std::unique_ptr<TokenizeWork>>> compiled_;
  std::unique_ptr<CompilePool> compiles_;
};

}  // namespace sx::daemon::serve::detail
