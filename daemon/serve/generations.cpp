// The daemon's replica sets (daemon.h): built on the loader thread, put in service, reloaded, retired.
#include "daemon/serve/daemon.h"

#include <uv.h>

#if defined(__GLIBC__)
#include <malloc.h>
#endif

#include <algorithm>
#include <atomic>
#include <chrono>
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
#include "daemon/loop/async_queue.h"
#include "daemon/loop/uv_status.h"
#include "daemon/config/serve_flags.h"
#include "daemon/replicas/replica.h"
#include "daemon/serve/handover.h"
#include "daemon/serve/metrics.h"
#include "runtime/base/log.h"
#include "runtime/engine/engine.h"

namespace sx::daemon::serve::detail {

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
      // A chat template file given instead of the model's is read and parsed before any weight.
      std::string said;
      Result<std::shared_ptr<const chat::ChatTemplate>> given = std::shared_ptr<const chat::ChatTemplate>();
      if (!config.model.chat_template.empty()) given = chat::choose_chat_template(config.model.chat_template, "", "", &said);
      auto loaded = given.ok() ? replicas::load_replicas(config, number, &load_cancel_, &l.phase)
                               : Result<std::vector<std::unique_ptr<Replica>>>(given.status());
      if (!given.ok()) l.phase = "chat template";
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
        if (g->config.model.chat_template.empty()) {  // the model's own, or ChatML
          given = chat::choose_chat_template("", g->tokenizer().data().chat_template, g->config.model.path, &said);
        }
        g->chat_template = *given;
        g->chat_template_said = said;
        log_info("serve: generation {}: {}", number, said);
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
    stop_compiles(/*close_queue=*/true);
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
  bool reaped = false;
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
    reaped = true;
  }
  if (reaped) trim_heap();
}

void Daemon::trim_heap() {
#if defined(__GLIBC__)
  // What the retired replicas' host side (tokenizer, grammar caches, scheduler, staging) freed goes
  // back to the system instead of staying in malloc's arenas (issue 53: RSS grew with every reload;
  // the device buffers are mappings of their own, backends/cpu/cpu_device.cpp). malloc_trim walks
  // every arena under its lock: on libuv's pool, never on the loop.
  auto work = std::make_unique<uv_work_t>();
  const int rc = uv_queue_work(&loop_, work.get(), [](uv_work_t*) { malloc_trim(0); },
                               [](uv_work_t* w, int) { std::unique_ptr<uv_work_t> done(w); });
  if (rc == 0) (void)work.release();  // owned by the request until its after-work callback
#endif
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

}  // namespace sx::daemon::serve::detail
