// The daemon's OpenAI routes (daemon.h): authorisation, the parse and prompt of a request on the
// thread pool, routing to a replica, engine events, responses (streamed or whole), retries and
// cancellation.
#include "daemon/serve/daemon.h"

#include "daemon/chat/chat_prompt.h"

#include <uv.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <memory>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "daemon/chat/chatml.h"
#include "daemon/http/router.h"
#include "daemon/http/server.h"
#include "daemon/loop/async_queue.h"
#include "daemon/openai/request.h"
#include "daemon/openai/response.h"
#include "daemon/replicas/replica.h"
#include "daemon/serve/metrics.h"
#include "runtime/base/log.h"
#include "runtime/engine/engine.h"
#include "runtime/engine/generator.h"

namespace sx::daemon::serve::detail {

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

bool constant_time_equal(std::string_view given, std::string_view key) {
  if (key.empty()) return false;
  unsigned diff = given.size() == key.size() ? 0u : 1u;
  for (std::size_t i = 0; i < given.size(); ++i) {
    diff |= static_cast<unsigned>(given[i] ^ key[i % key.size()]);
  }
  return diff == 0;
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
  auto utility = [this](openai::UtilityEndpoint ep) {
    return [this, ep](http::Request req, http::ResponderPtr r) { handle_utility(ep, std::move(req), std::move(r)); };
  };
  (void)router.post("/tokenize", utility(openai::UtilityEndpoint::kTokenize));
  (void)router.post("/detokenize", utility(openai::UtilityEndpoint::kDetokenize));
  (void)router.post("/apply-template", utility(openai::UtilityEndpoint::kApplyTemplate));
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
  work->limits.test_hooks = test_hooks_;
  work->responder = std::move(responder);
  queue_tokenize(std::move(work));
}

namespace {

// The 500 for a request libuv's thread pool did not take (uv_queue_work's error `rc`).
openai::ApiError queue_failure(int rc) {
  openai::ApiError err;
  err.status = 500;
  err.type = "internal_error";
  err.message = fmt::format("cannot queue the request: {}", uv_strerror(rc));
  return err;
}

// A /tokenize, /detokenize or /apply-template request on libuv's thread pool: the generation it
// began with keeps its tokenizer and template alive until the answer is sent.
struct UtilityWork {
  uv_work_t req;
  openai::UtilityEndpoint endpoint;
  std::shared_ptr<Generation> generation;
  std::string body;
  openai::UtilityContext context;
  http::ResponderPtr responder;
  std::optional<std::string> answer;  // out
  openai::ApiError error;             // out, when no answer
};

}  // namespace

void Daemon::handle_utility(openai::UtilityEndpoint endpoint, http::Request request, http::ResponderPtr responder) {
  if (!authorized(request, responder)) return;
  if (state_ != State::kReady || current_ == nullptr) return refuse_not_ready(responder);
  auto work = std::make_unique<UtilityWork>();
  work->endpoint = endpoint;
  work->generation = current_;
  work->body = std::move(request.body);
  work->context.tokenizer = &current_->tokenizer();
  work->context.chat_template = current_->chat_template.get();
  work->context.model_name = model_name_;
  work->context.max_model_len = current_->max_model_len;
  work->responder = std::move(responder);
  work->req.data = work.get();
  const int rc = uv_queue_work(
      &loop_, &work->req,
      [](uv_work_t* w) {
        auto* u = static_cast<UtilityWork*>(w->data);
        u->answer = openai::run_utility(u->endpoint, u->body, u->context, &u->error);
      },
      [](uv_work_t* w, int) {
        std::unique_ptr<UtilityWork> u(static_cast<UtilityWork*>(w->data));
        if (u->responder->closed()) return;
        if (!u->answer) {
          u->responder->respond(u->error.status, {{"Content-Type", "application/json"}}, openai::error_body(u->error));
          return;
        }
        u->responder->respond(200, {{"Content-Type", "application/json"}}, std::move(*u->answer));
      });
  if (rc != 0) return send_error(work->responder, queue_failure(rc));
  (void)work.release();  // owned by the work request until its after-work callback
}

void Daemon::queue_tokenize(std::unique_ptr<TokenizeWork> work) {
  work->req.data = work.get();
  const int rc = uv_queue_work(
      &loop_, &work->req, [](uv_work_t* w) { static_cast<TokenizeWork*>(w->data)->run(); },
      [](uv_work_t* w, int status) {
        std::unique_ptr<TokenizeWork> owned(static_cast<TokenizeWork*>(w->data));
        owned->self->start_generate(std::move(*owned), status);
      });
  if (rc != 0) return send_error(work->responder, queue_failure(rc));
  (void)work.release();  // owned by the work request until its after-work callback
}

namespace {

// The answer to a request whose compile stopped because its client left (no one reads it) or the
// server stops.
openai::ApiError cancelled() {
  openai::ApiError err;
  err.status = 503;
  err.type = "service_unavailable";
  err.message = "the request was cancelled: its client left, or the server is stopping";
  return err;
}

// A request's format on a compile pool thread, then back to the loop through `done`. The budget:
// limits.grammar_compile_timeout_ms, and a stop when the client leaves (Responder::closed may be
// read from any thread) or the pool stops.
class CompileJob final : public CompilePool::Job {
 public:
  CompileJob(std::unique_ptr<TokenizeWork> work, loop::AsyncQueue<std::unique_ptr<TokenizeWork>>::Sender done,
             std::chrono::milliseconds timeout)
      : work_(std::move(work)), done_(std::move(done)), timeout_(timeout) {}

  void run(const std::atomic<bool>& stopping) override {
    chat::CompileBudget budget;
    budget.timeout = timeout_;
    const http::ResponderPtr& responder = work_->responder;
    budget.cancelled = [&stopping, &responder] { return stopping.load() || responder->closed(); };
    if (!budget.cancelled()) {
      work_->compile(budget);
    } else {  // a client that left while its compile waited costs nothing
      work_->error = cancelled();
    }
    // Refused only once the loop closed the queue, which it does after stopping the pool: never.
    (void)done_.push(std::move(work_));
  }
  // Its client left (asked while queued: work_ is still here).
  bool abandoned() const override { return work_->responder->closed(); }

 private:
  std::unique_ptr<TokenizeWork> work_;
  loop::AsyncQueue<std::unique_ptr<TokenizeWork>>::Sender done_;
  std::chrono::milliseconds timeout_;
};

}  // namespace

void Daemon::queue_compile(std::unique_ptr<TokenizeWork> work) {
  http::ResponderPtr responder = work->responder;
  Status queued = compiles_ && compiled_ ? ok_status() : unavailable_error("the server is stopping");
  if (queued.ok()) {
    queued = compiles_->submit(std::make_unique<CompileJob>(std::move(work), compiled_->sender(),
                                                            std::chrono::milliseconds(
                                                                config_.limits.grammar_compile_timeout_ms)),
                               static_cast<std::size_t>(config_.limits.max_queued_grammar_compiles));
  }
  if (queued.ok()) return;
  openai::ApiError err;
  if (queued.code() == StatusCode::kResourceExhausted) {
    err.status = 429;
    err.type = "rate_limit_error";
    err.message = fmt::format("{} (limits.max_queued_grammar_compiles = {}); retry later", queued.message(),
                              config_.limits.max_queued_grammar_compiles);
    ++metrics_.http_rejected_busy;
  } else {
    err.status = 503;
    err.type = "service_unavailable";
    err.message = std::string(queued.message());
  }
  send_error(responder, err);
}

void Daemon::stop_compiles(bool close_queue) {
  if (compiles_) compiles_->stop();
  // The pool's jobs have all come back into compiled_: each is answered (503: stopping; an unanswered
  // request would keep its connection, and the HTTP server, open) before the null behind them closes
  // the queue.
  if (close_queue && compiled_ && !compiled_->closed()) (void)compiled_->push(nullptr);
}

chat::Grammars* Generation::grammars(std::string* error) const {
  std::call_once(grammars_once_, [this] {
    try {
      grammars_ = std::make_unique<chat::Grammars>(tokenizer(), engine::default_stop_ids(tokenizer()));
    } catch (const std::exception& e) {
      grammars_error_ = e.what();
    }
  });
  if (!grammars_ && error != nullptr) *error = grammars_error_;
  return grammars_.get();
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
    error = openai::model_not_found(req.model, model_name);
    return;
  }
  if (req.endpoint == openai::Endpoint::kChat) {
    const chat::ChatTemplate* tmpl = generation->chat_template.get();
    // tool_choice none: the tools are not shown, and no call is looked for (as vLLM).
    const bool with_tools = req.tool_choice != openai::ToolChoice::kNone && req.tools.is_array() && !req.tools.empty();
    const chat::ToolSyntax syntax = tmpl != nullptr ? chat::tool_syntax_of(tmpl->source()) : chat::ToolSyntax::kNone;
    if (with_tools && tmpl != nullptr && syntax == chat::ToolSyntax::kNone) {
      error = openai::ApiError{};
      error->param = "tools";
      error->message = fmt::format("{} shows no tool calls (neither <tool_call> nor <function=): the model was not "
                                   "taught to call tools; serve it with a template that does (--chat-template FILE) "
                                   "or send tool_choice \"none\"", tmpl->origin());
      return;
    }
    auto text = chat::render_chat_prompt(tmpl, req.messages, with_tools ? req.tools : nlohmann::ordered_json(),
                                         req.chat_template_kwargs, /*add_generation_prompt=*/true, *tok);
    if (!text.ok()) {
      error = openai::chat_prompt_error(text.status());
      return;
    }
    prompt = tok->encode(*text);
    request.tool_syntax = with_tools ? syntax : chat::ToolSyntax::kNone;
    if (!req.test_script.empty()) script = tok->encode(req.test_script);
    request.split_reasoning = tmpl != nullptr && chat::template_thinks(tmpl->source());
    request.prompt_in_thinking = request.split_reasoning && chat::prompt_opens_thinking(*text);
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
  // Structured output: the format is compiled next, on the compile pool (compile()).
  needs_format = req.output_format.kind != chat::OutputFormat::Kind::kText || call_required();
}

bool TokenizeWork::call_required() const {
  return request.tool_syntax != chat::ToolSyntax::kNone && (request.tool_choice == openai::ToolChoice::kRequired ||
                                                            request.tool_choice == openai::ToolChoice::kNamed);
}

void TokenizeWork::compile(const chat::CompileBudget& budget) {
  // The format compiled (xgrammar caches it) before the request is queued, so a format that cannot
  // be compiled is a 400 and the engine only ever asks for masks.
  const openai::GenerateRequest& req = request;
  const bool call_required = this->call_required();
  std::string why;
  chat::Grammars* grammars = generation->grammars(&why);
  if (grammars == nullptr) {
    error = openai::ApiError{};
    error->status = 500;
    error->type = "internal_error";
    error->message = "structured output is unavailable for this model: xgrammar refused its vocabulary: " + why;
    return;
  }
  // A prompt left in thinking (Qwen3.5, 3.6) is closed first, so the format lands in content.
  const bool close_thinking = request.prompt_in_thinking;
  auto compiled = call_required ? grammars->compile_tool_call(request.tool_syntax, req.tools,
                                                               req.tool_choice == openai::ToolChoice::kNamed
                                                                   ? req.tool_choice_name
                                                                   : std::string(),
                                                               close_thinking, budget)
                                : grammars->compile(req.output_format, close_thinking, budget);
  if (!compiled.ok()) {
    error = openai::ApiError{};
    error->param = call_required ? "tools" : req.output_format.param;
    error->message = std::string(compiled.status().message());
    switch (compiled.status().code()) {
      case StatusCode::kDeadlineExceeded:
        error->code = "grammar_compile_timeout";
        error->message += fmt::format(" (limits.grammar_compile_timeout_ms = {})", budget.timeout.count());
        break;
      case StatusCode::kCancelled: error = cancelled(); break;
      case StatusCode::kUnavailable:
        error->status = 503;
        error->type = "service_unavailable";
        break;
      default: break;
    }
    return;
  }
  format = *compiled;
}

void Daemon::start_generate(TokenizeWork w, int status) {
  http::ResponderPtr responder = std::move(w.responder);
  if (responder->closed()) return;  // the client left while its prompt was tokenized
  openai::ApiError err;
  if (w.error) return send_error(responder, *w.error);
  // The state may have changed while the prompt was tokenized.
  if (status != 0 || state_ != State::kReady) return refuse_not_ready(responder);
  if (w.generation != current_) {
    // A reload put another generation in service meanwhile: its tokenizer makes the prompt (and its
    // vocabulary the format's grammar).
    auto again = std::make_unique<TokenizeWork>(std::move(w));
    again->generation = current_;
    again->responder = std::move(responder);
    again->prompt.clear();
    again->format.reset();
    return queue_tokenize(std::move(again));
  }
  if (w.needs_format && !w.format) {  // tokenized: the format's compile comes next
    auto next = std::make_unique<TokenizeWork>(std::move(w));
    next->responder = std::move(responder);
    return queue_compile(std::move(next));
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
  if (req.split_reasoning && req.stream) a->reasoning.assign(n, chat::ReasoningSplitter(req.prompt_in_thinking));
  if (req.tool_syntax != chat::ToolSyntax::kNone && req.stream) {
    for (std::size_t c = 0; c < n; ++c) a->tool_streams.push_back(std::make_unique<ToolStream>(req.tool_syntax, req.tools));
  }
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
  o.script = std::move(w.script);
  o.snapshot_hints = chat::message_starts(prompt, a->generation->tokenizer());
  a->format = std::move(w.format);
  for (std::size_t c = 0; c < n; ++c) {
    a->options.push_back(o);
    if (a->options.back().sampling.seed && c > 0) *a->options.back().sampling.seed += c;  // n samples, not n copies
    if (a->format) {
      auto constraint = g.grammars(nullptr)->constraint(*a->format);
      if (!constraint.ok()) {
        err.status = 500;
        err.type = "internal_error";
        err.message = std::string(constraint.status().message());
        return send_error(responder, err);
      }
      a->options.back().constraint = *constraint;
    }
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
    if (stream && !a.cancelled && !a.tool_streams.empty()) {
      const chat::ReasoningSplitter::Parts parts =
          a.reasoning.empty() ? chat::ReasoningSplitter::Parts{{}, ev.text} : a.reasoning[e.choice].feed(ev.text);
      stream_with_tools(a, e.choice, parts, ev.logprobs, /*at_end=*/false);
    } else if (stream && !a.cancelled) {
      if (a.reasoning.empty()) {
        a.responder->write_chunk(openai::sse(openai::chunk_json(a.request, a.id, static_cast<std::int64_t>(e.choice),
                                                                !a.started[e.choice], ev.text, ev.logprobs, "", tok,
                                                                a.token_bytes_sent[e.choice])));
      } else {  // thinking as reasoning_content deltas, the rest as content
        const chat::ReasoningSplitter::Parts parts = a.reasoning[e.choice].feed(ev.text);
        a.responder->write_chunk(openai::sse(openai::chunk_json(a.request, a.id, static_cast<std::int64_t>(e.choice),
                                                                !a.started[e.choice], parts.content, ev.logprobs, "",
                                                                tok, a.token_bytes_sent[e.choice], parts.reasoning)));
      }
      for (const engine::TokenLogprob& lp : ev.logprobs) {
        a.token_bytes_sent[e.choice] += static_cast<std::int64_t>(tok.token_bytes(lp.token).size());
      }
    } else {
      choice.text += ev.text;
      choice.logprobs.insert(choice.logprobs.end(), ev.logprobs.begin(), ev.logprobs.end());
    }
    // stream_with_tools marks a choice started when it writes: a piece it held back (a call's head,
    // an opening <think>) leaves the role for the first chunk it does write.
    if (a.tool_streams.empty() || !stream) a.started[e.choice] = true;
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
        if (!a.reasoning.empty()) a.reasoning[e.choice] = chat::ReasoningSplitter(a.request.prompt_in_thinking);
        if (!a.tool_streams.empty()) {
          a.tool_streams[e.choice] = std::make_unique<ToolStream>(a.request.tool_syntax, a.request.tools);
        }
        bool ready = true;
        if (a.format) {  // a new matcher at the grammar's start (none: the retry is not made)
          auto constraint = a.generation->grammars(nullptr)->constraint(*a.format);
          if (constraint.ok()) a.options[e.choice].constraint = *constraint;
          ready = constraint.ok();
        }
        a.token_seen[e.choice] = false;
        a.started[e.choice] = false;
        if (ready && submit_choice(a, e.choice, other, &refused)) {
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
  if (stream && ev.finish != engine::RequestFinish::kError && !choice.finish_reason.empty() &&
      !a.tool_streams.empty()) {
    // What the splitter and the parsers held back; a choice that made a call ends with "tool_calls".
    const chat::ReasoningSplitter::Parts rest =
        a.reasoning.empty() ? chat::ReasoningSplitter::Parts{} : a.reasoning[e.choice].finish();
    stream_with_tools(a, e.choice, rest, {}, /*at_end=*/true);
    if (a.tool_streams[e.choice]->ended_ok > 0 && choice.finish_reason == "stop") choice.finish_reason = "tool_calls";
    a.responder->write_chunk(openai::sse(openai::delta_chunk_json(a.request, a.id, static_cast<std::int64_t>(e.choice),
                                                                  !a.started[e.choice], json::object(), {},
                                                                  choice.finish_reason, tok)));
    a.started[e.choice] = true;
  } else if (stream && ev.finish != engine::RequestFinish::kError && !choice.finish_reason.empty()) {
    if (!a.reasoning.empty()) {  // what the splitter held back (a partial tag, unclosed thinking)
      const chat::ReasoningSplitter::Parts rest = a.reasoning[e.choice].finish();
      if (!rest.content.empty() || !rest.reasoning.empty()) {
        a.responder->write_chunk(openai::sse(openai::chunk_json(a.request, a.id, static_cast<std::int64_t>(e.choice),
                                                                !a.started[e.choice], rest.content, {}, "", tok, 0,
                                                                rest.reasoning)));
        a.started[e.choice] = true;
      }
    }
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

void Daemon::stream_with_tools(Active& a, std::size_t c, const chat::ReasoningSplitter::Parts& parts,
                               const std::vector<engine::TokenLogprob>& logprobs, bool at_end) {
  ToolStream& ts = *a.tool_streams[c];
  std::vector<json> deltas;
  auto add_text = [&](const char* field, const std::string& text) {
    if (text.empty()) return;
    if (!deltas.empty() && deltas.back().size() == 1 && deltas.back().contains(field)) {
      deltas.back()[field] = deltas.back()[field].get<std::string>() + text;
    } else {
      deltas.push_back(json{{field, text}});
    }
  };
  auto take = [&](const chat::ToolCallParser::Output& out, const char* text_field) {
    for (const chat::ToolCallEvent& ev : out) {
      // parallel_tool_calls false: the first call only (as vLLM).
      if (ev.kind != chat::ToolCallEvent::Kind::kText && ev.index > 0 && !a.request.parallel_tool_calls) continue;
      switch (ev.kind) {
        case chat::ToolCallEvent::Kind::kText: add_text(text_field, ev.text); break;
        case chat::ToolCallEvent::Kind::kBegin:
          ts.ids.resize(std::max(ts.ids.size(), ev.index + 1));
          ts.ids[ev.index] = "call_" + random_hex(24);
          deltas.push_back(json{{"tool_calls", json::array({openai::tool_call_begin_delta(ev.index, ts.ids[ev.index],
                                                                                          ev.name)})}});
          break;
        case chat::ToolCallEvent::Kind::kArguments:
          deltas.push_back(json{{"tool_calls", json::array({openai::tool_call_arguments_delta(ev.index, ev.text)})}});
          break;
        case chat::ToolCallEvent::Kind::kEnd:
          if (ev.ok) {
            ++ts.ended_ok;
            ++metrics_.tool_calls;
          }
          break;
      }
    }
  };
  take(ts.reasoning.feed(parts.reasoning), "reasoning_content");
  if (at_end) take(ts.reasoning.finish(), "reasoning_content");
  take(ts.content.feed(parts.content), "content");
  if (at_end) {
    take(ts.content.finish(), "content");
    metrics_.tool_call_parse_failures += ts.reasoning.malformed() + ts.content.malformed();
  }
  if (deltas.empty() && !logprobs.empty()) deltas.push_back(json::object());
  const tokenizer::Tokenizer& tok = a.generation->tokenizer();
  for (std::size_t i = 0; i < deltas.size(); ++i) {
    a.responder->write_chunk(openai::sse(openai::delta_chunk_json(
        a.request, a.id, static_cast<std::int64_t>(c), !a.started[c], std::move(deltas[i]),
        i == 0 ? logprobs : std::vector<engine::TokenLogprob>{}, "", tok)));
    a.started[c] = true;
  }
}

void Daemon::take_tool_calls(const Active& a, openai::Choice& c) {
  const auto syntax = a.request.tool_syntax;
  std::vector<chat::ToolCallParser::Call> calls;
  std::size_t malformed = 0;
  if (c.reasoning) {  // a call written while thinking is a call
    chat::ToolCallParser::Whole r = chat::ToolCallParser::parse(*c.reasoning, syntax, a.request.tools);
    c.reasoning = std::move(r.text);
    calls = std::move(r.calls);
    malformed += r.malformed;
  }
  chat::ToolCallParser::Whole w = chat::ToolCallParser::parse(c.text, syntax, a.request.tools);
  c.text = std::move(w.text);
  calls.insert(calls.end(), std::make_move_iterator(w.calls.begin()), std::make_move_iterator(w.calls.end()));
  malformed += w.malformed;
  if (!a.request.parallel_tool_calls && calls.size() > 1) calls.resize(1);
  for (chat::ToolCallParser::Call& call : calls) {
    c.tool_calls.push_back({"call_" + random_hex(24), std::move(call.name), std::move(call.arguments)});
  }
  metrics_.tool_calls += c.tool_calls.size();
  metrics_.tool_call_parse_failures += malformed;
  if (!c.tool_calls.empty() && c.finish_reason == "stop") c.finish_reason = "tool_calls";
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
  for (openai::Choice& c : a.choices) {
    if (a.request.split_reasoning) {
      chat::ReasoningSplitter::Whole whole = chat::ReasoningSplitter::split(c.text, a.request.prompt_in_thinking);
      c.text = std::move(whole.content);
      c.reasoning = std::move(whole.reasoning);
    }
    if (a.request.tool_syntax != chat::ToolSyntax::kNone) take_tool_calls(a, c);
  }
  a.responder->respond(200, {{"Content-Type", "application/json"}},
                       openai::completion_body(a.request, a.id, a.choices, a.usage, a.generation->tokenizer()));
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

}  // namespace sx::daemon::serve::detail
