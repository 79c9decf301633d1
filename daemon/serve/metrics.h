// Prometheus metrics of `sextant serve` (GET /metrics), text exposition format 0.0.4.
//
// Names are vLLM's where vLLM has the metric (vllm:num_requests_running, vllm:kv_cache_usage_perc,
// vllm:time_to_first_token_seconds, ...), so dashboards built for vLLM work unchanged; metrics
// vLLM lacks are sextant_*. Every vllm: series carries model_name. The engine's figures (running,
// waiting, KV cache, prefix cache, tokens, preemptions, free blocks) come once per replica slot
// with a replica label ("0", "1": the replica's index in its generation, the same label across
// reloads) and once more with replica="all", their sum. A slot's gauges are those of the replicas
// alive in it (the generation in service's, and an older one draining beside it); its counters
// also keep what the replicas that held the slot before counted, so no counter ever goes down
// within a process (a reload retires replicas, it does not reset counters) and the set of series
// is bounded by the largest replica count, not by the number of reloads. sextant_replica_state
// counts a slot's replicas per state; sextant_ready is 1 when /health answers 200 (some replica
// of the generation in service can serve). Request counters and latency histograms are the
// daemon's, for all replicas together.
//
// Threading: loop thread only (observations are made where engine events are delivered).
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "runtime/engine/engine.h"

namespace sx::daemon::serve {

// The engine figures of several replicas as one: counts summed, KV usage from the summed blocks.
engine::EngineStats sum_engine_stats(std::span<const engine::EngineStats> stats);

class Histogram {
 public:
  explicit Histogram(std::vector<double> bounds);
  // One already counted: `counts` per bucket (not cumulative; the last is +Inf), their `sum`.
  Histogram(std::vector<double> bounds, std::vector<std::uint64_t> counts, double sum);
  void observe(double value);
  // The _bucket/_sum/_count lines of `name` with `labels` ("model_name=\"m\"").
  std::string render(const std::string& name, const std::string& help, const std::string& labels) const;

 private:
  std::vector<double> bounds_;
  std::vector<std::uint64_t> counts_;  // per bucket (not cumulative); the last is +Inf
  double sum_ = 0;
  std::uint64_t count_ = 0;
};

struct ServeMetrics {
  ServeMetrics();
  Histogram ttft, itl, e2e;
  std::uint64_t finished_stop = 0, finished_length = 0, finished_abort = 0, finished_error = 0;
  std::uint64_t http_rejected_busy = 0;  // 429 / 503 answers for a full queue or a drain
  // Tool calls parsed out of answers, and calls that did not follow the template's syntax (given
  // back as content).
  std::uint64_t tool_calls = 0, tool_call_parse_failures = 0;

  struct Extra {
    std::int64_t open_connections = 0;
    std::uint64_t http_requests = 0;
    bool ready = true;  // /health would answer 200
  };
  struct ReplicaSample {
    int slot = 0;       // the replica's index in its generation
    std::string state;  // "ready", "draining", ...
    engine::EngineStats stats;
  };
  // A replica of slot `slot` is gone (drained after a reload): its counters stay in the slot's.
  void retire(int slot, const engine::EngineStats& final_stats);
  std::string render(const std::string& model_name, const std::vector<ReplicaSample>& replicas,
                     const Extra& extra) const;

 private:
  std::vector<engine::EngineStats> retired_;  // per slot: the counters of replicas gone from it
};

// Adds the counters of `from` (prefix cache, tokens, preemptions, steps and their histograms) to
// `into`; gauges are left.
void add_engine_counters(engine::EngineStats& into, const engine::EngineStats& from);

}  // namespace sx::daemon::serve
