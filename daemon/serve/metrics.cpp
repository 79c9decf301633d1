// Prometheus metrics.
#include "daemon/serve/metrics.h"

#include <algorithm>
#include <limits>
#include <map>

#include <fmt/format.h>

namespace sx::daemon::serve {

namespace {

// Label values escape backslash, quote and newline.
std::string label_value(const std::string& v) {
  std::string out;
  for (char c : v) {
    if (c == '\\' || c == '"') out += '\\';
    if (c == '\n') {
      out += "\\n";
      continue;
    }
    out += c;
  }
  return out;
}

std::string number(double v) { return fmt::format("{}", v); }

void metric(std::string& out, const std::string& name, const char* type, const std::string& help,
            const std::string& labels, double value) {
  out += fmt::format("# HELP {} {}\n# TYPE {} {}\n{}{{{}}} {}\n", name, help, name, type, name, labels, number(value));
}

}  // namespace

Histogram::Histogram(std::vector<double> bounds) : bounds_(std::move(bounds)), counts_(bounds_.size() + 1, 0) {}

Histogram::Histogram(std::vector<double> bounds, std::vector<std::uint64_t> counts, double sum)
    : bounds_(std::move(bounds)), counts_(std::move(counts)), sum_(sum) {
  counts_.resize(bounds_.size() + 1, 0);
  for (std::uint64_t c : counts_) count_ += c;
}

void Histogram::observe(double value) {
  const auto it = std::lower_bound(bounds_.begin(), bounds_.end(), value);
  ++counts_[static_cast<std::size_t>(it - bounds_.begin())];
  sum_ += value;
  ++count_;
}

std::string Histogram::render(const std::string& name, const std::string& help, const std::string& labels) const {
  std::string out = fmt::format("# HELP {} {}\n# TYPE {} histogram\n", name, help, name);
  std::uint64_t cumulative = 0;
  for (std::size_t i = 0; i <= bounds_.size(); ++i) {
    cumulative += counts_[i];
    const std::string le = i < bounds_.size() ? number(bounds_[i]) : "+Inf";
    out += fmt::format("{}_bucket{{{},le=\"{}\"}} {}\n", name, labels, le, cumulative);
  }
  out += fmt::format("{}_sum{{{}}} {}\n{}_count{{{}}} {}\n", name, labels, number(sum_), name, labels, count_);
  return out;
}

ServeMetrics::ServeMetrics()
    : ttft({0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0,
            80.0, 160.0, 640.0, 2560.0}),
      itl({0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0}),
      e2e({0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0, 480.0,
           960.0, 1920.0, 7680.0}) {}

void add_engine_counters(engine::EngineStats& into, const engine::EngineStats& s) {
  into.prefix_queries += s.prefix_queries;
  into.prefix_hits += s.prefix_hits;
  into.snapshots_taken += s.snapshots_taken;
  into.snapshots_restored += s.snapshots_restored;
  into.snapshots_evicted += s.snapshots_evicted;
  into.store_written += s.store_written;
  into.store_read += s.store_read;
  into.preemptions += s.preemptions;
  into.prompt_tokens += s.prompt_tokens;
  into.generation_tokens += s.generation_tokens;
  into.steps += s.steps;
  for (std::size_t i = 0; i < into.step_tokens_counts.size() && i < s.step_tokens_counts.size(); ++i) {
    into.step_tokens_counts[i] += s.step_tokens_counts[i];
  }
  for (std::size_t i = 0; i < into.step_seconds_counts.size() && i < s.step_seconds_counts.size(); ++i) {
    into.step_seconds_counts[i] += s.step_seconds_counts[i];
  }
  into.step_tokens_sum += s.step_tokens_sum;
  into.step_seconds_sum += s.step_seconds_sum;
}

engine::EngineStats sum_engine_stats(std::span<const engine::EngineStats> stats) {
  engine::EngineStats all;
  for (const engine::EngineStats& s : stats) {
    all.running += s.running;
    all.waiting += s.waiting;
    all.kv_free_blocks += s.kv_free_blocks;
    all.kv_total_blocks += s.kv_total_blocks;
    all.state_slots_free += s.state_slots_free;
    all.state_slots_total += s.state_slots_total;
    all.snapshots_held += s.snapshots_held;
    all.snapshots_total += s.snapshots_total;
    all.snapshot_bytes = std::max(all.snapshot_bytes, s.snapshot_bytes);
    all.prefix_store = all.prefix_store || s.prefix_store;
    all.store_blocks = std::max(all.store_blocks, s.store_blocks);  // one directory, shared
    all.store_snapshots = std::max(all.store_snapshots, s.store_snapshots);
    all.store_bytes = std::max(all.store_bytes, s.store_bytes);
    add_engine_counters(all, s);
  }
  // The step target, cost model and last step are each engine's own: the first replica's stand for
  // the totals (every replica's are listed with it).
  if (!stats.empty()) {
    const engine::EngineStats& f = stats.front();
    all.max_step_ms = f.max_step_ms;
    all.cost_ready = f.cost_ready;
    all.cost_fixed_ms = f.cost_fixed_ms;
    all.cost_per_decode_ms = f.cost_per_decode_ms;
    all.cost_per_prefill_ms = f.cost_per_prefill_ms;
    all.cost_per_context_row_us = f.cost_per_context_row_us;
    all.last_decode_tokens = f.last_decode_tokens;
    all.last_prefill_tokens = f.last_prefill_tokens;
    all.last_step_ms = f.last_step_ms;
  }
  all.kv_usage = all.kv_total_blocks > 0
                     ? 1.0 - static_cast<double>(all.kv_free_blocks) / static_cast<double>(all.kv_total_blocks)
                     : 0.0;
  return all;
}

void ServeMetrics::retire(int slot, const engine::EngineStats& final_stats) {
  if (slot < 0) return;
  if (retired_.size() <= static_cast<std::size_t>(slot)) retired_.resize(static_cast<std::size_t>(slot) + 1);
  add_engine_counters(retired_[static_cast<std::size_t>(slot)], final_stats);
}

std::string ServeMetrics::render(const std::string& model_name, const std::vector<ReplicaSample>& replicas,
                                 const Extra& extra) const {
  const std::string labels = fmt::format("model_name=\"{}\"", label_value(model_name));
  std::string out;
  // Per slot: the live replicas' figures, plus the counters of those gone from it.
  std::map<int, std::vector<engine::EngineStats>> live;
  std::map<int, std::map<std::string, int>> states;
  for (const ReplicaSample& r : replicas) {
    live[r.slot].push_back(r.stats);
    ++states[r.slot][r.state];
  }
  for (std::size_t i = 0; i < retired_.size(); ++i) live[static_cast<int>(i)];
  std::vector<std::pair<int, engine::EngineStats>> slots;
  std::vector<engine::EngineStats> each;
  for (const auto& [slot, list] : live) {
    engine::EngineStats shown = sum_engine_stats(list);
    if (list.size() == 1) shown.kv_usage = list.front().kv_usage;  // the engine's own figure
    if (static_cast<std::size_t>(slot) < retired_.size()) add_engine_counters(shown, retired_[static_cast<std::size_t>(slot)]);
    slots.emplace_back(slot, shown);
    each.push_back(shown);
  }
  const engine::EngineStats all = sum_engine_stats(each);
  // One engine figure: its HELP and TYPE, a line per slot, then the sum.
  auto per_replica = [&](const char* name, const char* type, const char* help, auto value) {
    out += fmt::format("# HELP {} {}\n# TYPE {} {}\n", name, help, name, type);
    for (const auto& [slot, shown] : slots) {
      out += fmt::format("{}{{{},replica=\"{}\"}} {}\n", name, labels, slot, number(value(shown)));
    }
    out += fmt::format("{}{{{},replica=\"all\"}} {}\n", name, labels, number(value(all)));
  };
  using S = const engine::EngineStats&;
  per_replica("vllm:num_requests_running", "gauge", "Number of requests in model execution batches.",
              [](S s) { return static_cast<double>(s.running); });
  per_replica("vllm:num_requests_waiting", "gauge", "Number of requests waiting to be processed.",
              [](S s) { return static_cast<double>(s.waiting); });
  per_replica("vllm:kv_cache_usage_perc", "gauge", "KV-cache usage. 1 means 100 percent usage.",
              [](S s) { return s.kv_usage; });
  per_replica("vllm:prefix_cache_queries_total", "counter",
              "Prefix cache queries, in terms of number of queried tokens.",
              [](S s) { return static_cast<double>(s.prefix_queries); });
  per_replica("vllm:prefix_cache_hits_total", "counter", "Prefix cache hits, in terms of number of cached tokens.",
              [](S s) { return static_cast<double>(s.prefix_hits); });
  per_replica("vllm:num_preemptions_total", "counter", "Cumulative number of preemptions from the engine.",
              [](S s) { return static_cast<double>(s.preemptions); });
  per_replica("vllm:prompt_tokens_total", "counter", "Number of prefill tokens processed.",
              [](S s) { return static_cast<double>(s.prompt_tokens); });
  per_replica("vllm:generation_tokens_total", "counter", "Number of generation tokens processed.",
              [](S s) { return static_cast<double>(s.generation_tokens); });
  per_replica("sextant_kv_cache_free_blocks", "gauge", "KV cache blocks with no request holding them.",
              [](S s) { return static_cast<double>(s.kv_free_blocks); });
  per_replica("sextant_state_slots_free", "gauge",
              "DeltaNet state slots (hybrid models) with no request holding them.",
              [](S s) { return static_cast<double>(s.state_slots_free); });
  per_replica("sextant_prefix_snapshots", "gauge",
              "State snapshots (a hybrid model's prefix cache) held.",
              [](S s) { return static_cast<double>(s.snapshots_held); });
  per_replica("sextant_prefix_snapshot_bytes", "gauge", "Bytes of the state snapshots held (all ranks).",
              [](S s) { return static_cast<double>(s.snapshot_bytes * static_cast<std::uint64_t>(s.snapshots_held)); });
  per_replica("sextant_prefix_snapshots_taken_total", "counter", "State snapshots taken.",
              [](S s) { return static_cast<double>(s.snapshots_taken); });
  per_replica("sextant_prefix_snapshots_restored_total", "counter",
              "State snapshots restored (prefix-cache hits of a hybrid model).",
              [](S s) { return static_cast<double>(s.snapshots_restored); });
  per_replica("sextant_prefix_snapshots_evicted_total", "counter", "State snapshots reused for another prefix.",
              [](S s) { return static_cast<double>(s.snapshots_evicted); });
  per_replica("sextant_prefix_store_bytes", "gauge",
              "Bytes of the prefix cache's directory (engine.prefix_cache_dir).",
              [](S s) { return static_cast<double>(s.store_bytes); });
  per_replica("sextant_prefix_store_written_total", "counter", "Prefix-cache files written (blocks and snapshots).",
              [](S s) { return static_cast<double>(s.store_written); });
  per_replica("sextant_prefix_store_read_total", "counter", "Prefix-cache files read back instead of computed.",
              [](S s) { return static_cast<double>(s.store_read); });
  // Steps, over all replicas (issue 24): tokens per step as vLLM counts them, and step seconds.
  out += Histogram(std::vector<double>(std::begin(engine::kStepTokenBounds), std::end(engine::kStepTokenBounds)),
                   all.step_tokens_counts, all.step_tokens_sum)
             .render("vllm:iteration_tokens_total", "Histogram of number of tokens per engine_step.", labels);
  out += Histogram(std::vector<double>(std::begin(engine::kStepSecondsBounds), std::end(engine::kStepSecondsBounds)),
                   all.step_seconds_counts, all.step_seconds_sum)
             .render("sextant_step_seconds", "Histogram of engine step times in seconds (forward and sampling).",
                     labels);
  per_replica("sextant_step_target_seconds", "gauge", "The scheduler's step-time target (0: unpaced).",
              [](S s) { return s.max_step_ms / 1000.0; });
  per_replica("sextant_step_cost_prefill_seconds_per_token", "gauge",
              "The cost model's time per prefill token (0 until measured).",
              [](S s) { return s.cost_per_prefill_ms / 1000.0; });
  per_replica("sextant_step_cost_attention_seconds_per_row", "gauge",
              "The cost model's time per row a prefill token attends to (0 until measured).",
              [](S s) { return s.cost_per_context_row_us / 1e6; });
  out += "# HELP sextant_replica_state Replicas of each slot in each state (a draining one beside its successor).\n"
         "# TYPE sextant_replica_state gauge\n";
  for (const auto& [slot, counts] : states) {
    for (const auto& [state, n] : counts) {
      out += fmt::format("sextant_replica_state{{{},replica=\"{}\",state=\"{}\"}} {}\n", labels, slot,
                         label_value(state), n);
    }
  }
  metric(out, "sextant_ready", "gauge",
         "1 when the server can serve (GET /health answers 200), 0 while loading, draining, or with no replica left.",
         labels, extra.ready ? 1.0 : 0.0);
  out += "# HELP vllm:request_success_total Count of successfully processed requests.\n"
         "# TYPE vllm:request_success_total counter\n";
  out += fmt::format("vllm:request_success_total{{{},finished_reason=\"stop\"}} {}\n", labels, finished_stop);
  out += fmt::format("vllm:request_success_total{{{},finished_reason=\"length\"}} {}\n", labels, finished_length);
  out += fmt::format("vllm:request_success_total{{{},finished_reason=\"abort\"}} {}\n", labels, finished_abort);
  out += ttft.render("vllm:time_to_first_token_seconds", "Histogram of time to first token in seconds.", labels);
  out += itl.render("vllm:inter_token_latency_seconds", "Histogram of inter-token latency in seconds.", labels);
  out += e2e.render("vllm:e2e_request_latency_seconds", "Histogram of end to end request latency in seconds.", labels);
  metric(out, "sextant_requests_failed_total", "counter", "Requests that ended with an engine error.", labels,
         static_cast<double>(finished_error));
  metric(out, "sextant_http_rejected_busy_total", "counter",
         "Requests refused because the queue was full or the server was draining (429/503).", labels,
         static_cast<double>(http_rejected_busy));
  metric(out, "sextant_tool_calls_total", "counter", "Tool calls parsed out of answers.", labels,
         static_cast<double>(tool_calls));
  metric(out, "sextant_tool_call_parse_failures_total", "counter",
         "Tool calls that did not follow the chat template's syntax, returned as content.", labels,
         static_cast<double>(tool_call_parse_failures));
  metric(out, "sextant_http_open_connections", "gauge", "Open HTTP connections.", labels,
         static_cast<double>(extra.open_connections));
  metric(out, "sextant_http_requests_total", "counter", "HTTP requests received.", labels,
         static_cast<double>(extra.http_requests));
  return out;
}

}  // namespace sx::daemon::serve
