// Prometheus metrics of `sextant serve` (GET /metrics), text exposition format 0.0.4.
//
// Names are vLLM's where vLLM has the metric (vllm:num_requests_running, vllm:kv_cache_usage_perc,
// vllm:time_to_first_token_seconds, ...), so dashboards built for vLLM work unchanged; metrics
// vLLM lacks are sextant_*. Every vllm: series carries model_name. The engine's figures (running,
// waiting, KV cache, prefix cache, tokens, preemptions, free blocks) come once per replica with a
// replica label ("1.0": generation 1, replica 0; a reload starts new series) and once more with
// replica="all", their sum over the replicas listed (sum by replica label excluding "all" gives
// the same); sextant_replica_state is 1 for each replica's current state. Request counters and
// latency histograms are the daemon's, for all replicas together.
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

  struct Extra {
    std::int64_t open_connections = 0;
    std::uint64_t http_requests = 0;
  };
  struct ReplicaSample {
    std::string replica;  // "1.0"
    std::string state;    // "ready", "draining", ...
    engine::EngineStats stats;
  };
  std::string render(const std::string& model_name, const std::vector<ReplicaSample>& replicas,
                     const Extra& extra) const;
};

}  // namespace sx::daemon::serve
