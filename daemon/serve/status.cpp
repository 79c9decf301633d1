// The daemon's state as others see it (daemon.h): /health, ctl status and the admin commands.
#include "daemon/serve/daemon.h"

#include <uv.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <memory>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "daemon/admin/admin_server.h"
#include "daemon/admin/protocol.h"
#include "daemon/config/yaml_io.h"
#include "daemon/serve/start_log.h"
#include "daemon/openai/response.h"
#include "daemon/replicas/replica.h"
#include "daemon/serve/handover.h"
#include "daemon/serve/metrics.h"
#include "runtime/base/log.h"
#include "runtime/engine/engine.h"

namespace sx::daemon::serve::detail {

std::string_view state_name(State s) {
  switch (s) {
    case State::kLoading: return "loading";
    case State::kReady: return "ready";
    case State::kDraining: return "draining";
    case State::kStopping: return "stopping";
  }
  return "?";
}

engine::EngineStats replica_stats(const Replica& r) {
  engine::EngineStats es = r.stats();
  if (r.state == ReplicaState::kFailed) {
    es.kv_free_blocks = 0;
    es.kv_total_blocks = 0;
    es.kv_usage = 0;
  }
  return es;
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
              {"state_slots", json{{"free", es.state_slots_free}, {"total", es.state_slots_total}}},
              {"prefix_cache", json{{"enabled", es.prefix_caching},
                                    {"queries", es.prefix_queries},
                                    {"hits", es.prefix_hits},
                                    {"snapshots", json{{"held", es.snapshots_held},
                                                       {"total", es.snapshots_total},
                                                       {"bytes_each", es.snapshot_bytes},
                                                       {"bytes_held", es.snapshot_bytes * static_cast<std::uint64_t>(es.snapshots_held)},
                                                       {"taken", es.snapshots_taken},
                                                       {"restored", es.snapshots_restored},
                                                       {"evicted", es.snapshots_evicted}}},
                                    {"store", json{{"enabled", es.prefix_store},
                                                   {"blocks", es.store_blocks},
                                                   {"snapshots", es.store_snapshots},
                                                   {"bytes", es.store_bytes},
                                                   {"written", es.store_written},
                                                   {"read", es.store_read}}},
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

}  // namespace sx::daemon::serve::detail
