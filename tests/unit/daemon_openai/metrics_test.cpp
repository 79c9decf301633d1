// daemon/serve metrics: Histogram's cumulative buckets (+Inf, _sum, _count), label escaping, and
// ServeMetrics::render's every series (vllm: names with model_name, sextant_* extras) with the
// values it was given, in Prometheus text exposition format 0.0.4.
#include <cstdint>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "daemon/serve/metrics.h"

namespace sx::daemon::serve {
namespace {

// One sample line: `series value`, where series is name{labels}.
struct Exposition {
  std::map<std::string, std::string> samples;      // series -> value text
  std::map<std::string, std::string> types;        // family -> type
  std::map<std::string, std::string> helps;        // family -> help
  std::vector<std::string> sample_order;           // series in order
  std::vector<std::string> errors;
};

std::string family_of(const std::string& series) { return series.substr(0, series.find('{')); }

// Parses the text format strictly enough for these tests: every line is "# HELP", "# TYPE" or a
// sample whose family was typed earlier; no blank lines; the text ends with a newline.
Exposition parse_exposition(const std::string& text) {
  Exposition e;
  if (text.empty() || text.back() != '\n') e.errors.push_back("text does not end with a newline");
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) {
    if (line.empty()) {
      e.errors.push_back("blank line");
      continue;
    }
    if (line.rfind("# HELP ", 0) == 0) {
      const std::string rest = line.substr(7);
      const std::string name = rest.substr(0, rest.find(' '));
      if (e.helps.count(name)) e.errors.push_back("second HELP for " + name);
      e.helps[name] = rest.substr(name.size() + 1);
      continue;
    }
    if (line.rfind("# TYPE ", 0) == 0) {
      const std::string rest = line.substr(7);
      const std::string name = rest.substr(0, rest.find(' '));
      if (e.types.count(name)) e.errors.push_back("second TYPE for " + name);
      e.types[name] = rest.substr(name.size() + 1);
      continue;
    }
    if (line[0] == '#') {
      e.errors.push_back("unexpected comment: " + line);
      continue;
    }
    const std::size_t sp = line.rfind(' ');
    if (sp == std::string::npos) {
      e.errors.push_back("no value: " + line);
      continue;
    }
    const std::string series = line.substr(0, sp);
    std::string family = family_of(series);
    for (const char* suffix : {"_bucket", "_sum", "_count"}) {
      const std::string s = suffix;
      if (family.size() > s.size() && family.compare(family.size() - s.size(), s.size(), s) == 0) {
        const std::string base = family.substr(0, family.size() - s.size());
        if (e.types.count(base) && e.types[base] == "histogram") family = base;
      }
    }
    if (!e.types.count(family)) e.errors.push_back("sample before its TYPE: " + line);
    if (e.samples.count(series)) e.errors.push_back("duplicate series: " + series);
    e.samples[series] = line.substr(sp + 1);
    e.sample_order.push_back(series);
  }
  return e;
}

// ------------------------------------------------------------------------------------------------
// Histogram

TEST(Histogram, RendersCumulativeBucketsSumAndCount) {
  Histogram h({0.5, 1.0, 10.0});
  for (double v : {0.25, 0.5, 0.75, 2.0, 100.0}) h.observe(v);
  EXPECT_EQ(h.render("x_seconds", "Some help.", "model_name=\"m\""),
            "# HELP x_seconds Some help.\n"
            "# TYPE x_seconds histogram\n"
            "x_seconds_bucket{model_name=\"m\",le=\"0.5\"} 2\n"
            "x_seconds_bucket{model_name=\"m\",le=\"1\"} 3\n"
            "x_seconds_bucket{model_name=\"m\",le=\"10\"} 4\n"
            "x_seconds_bucket{model_name=\"m\",le=\"+Inf\"} 5\n"
            "x_seconds_sum{model_name=\"m\"} 103.5\n"
            "x_seconds_count{model_name=\"m\"} 5\n");
}

TEST(Histogram, EmptyHistogramIsAllZero) {
  Histogram h({0.001, 0.25});
  EXPECT_EQ(h.render("y", "h", "model_name=\"q\""),
            "# HELP y h\n# TYPE y histogram\n"
            "y_bucket{model_name=\"q\",le=\"0.001\"} 0\n"
            "y_bucket{model_name=\"q\",le=\"0.25\"} 0\n"
            "y_bucket{model_name=\"q\",le=\"+Inf\"} 0\n"
            "y_sum{model_name=\"q\"} 0\n"
            "y_count{model_name=\"q\"} 0\n");
}

TEST(Histogram, BoundaryValueFallsInItsBucket) {
  // Prometheus buckets are "less than or equal": an observation equal to a bound counts there.
  Histogram h({1.0, 2.0});
  h.observe(1.0);
  h.observe(2.0);
  h.observe(0.0);
  const Exposition e = parse_exposition(h.render("z", "h", "a=\"b\""));
  EXPECT_TRUE(e.errors.empty()) << e.errors.front();
  EXPECT_EQ(e.samples.at("z_bucket{a=\"b\",le=\"1\"}"), "2");
  EXPECT_EQ(e.samples.at("z_bucket{a=\"b\",le=\"2\"}"), "3");
  EXPECT_EQ(e.samples.at("z_bucket{a=\"b\",le=\"+Inf\"}"), "3");
  EXPECT_EQ(e.samples.at("z_sum{a=\"b\"}"), "3");
  EXPECT_EQ(e.samples.at("z_count{a=\"b\"}"), "3");
}

TEST(Histogram, NoBoundsHasOnlyInf) {
  Histogram h({});
  h.observe(4.0);
  h.observe(0.5);
  EXPECT_EQ(h.render("w", "h", "l=\"v\""),
            "# HELP w h\n# TYPE w histogram\n"
            "w_bucket{l=\"v\",le=\"+Inf\"} 2\n"
            "w_sum{l=\"v\"} 4.5\n"
            "w_count{l=\"v\"} 2\n");
}

// ------------------------------------------------------------------------------------------------
// ServeMetrics

engine::EngineStats sample_stats() {
  engine::EngineStats s;
  s.running = 3;
  s.waiting = 2;
  s.kv_usage = 0.25;
  s.kv_free_blocks = 17;
  s.kv_total_blocks = 64;
  s.prefix_queries = 100;
  s.prefix_hits = 40;
  s.preemptions = 5;
  s.steps = 999;
  s.prompt_tokens = 1000;
  s.generation_tokens = 500;
  s.cost_per_context_row_us = 2.5;
  return s;
}

// One replica, slot 0, ready, with these figures.
std::vector<ServeMetrics::ReplicaSample> one(const engine::EngineStats& s) { return {{0, "ready", s}}; }

TEST(ServeMetrics, EverySeriesWithItsValue) {
  ServeMetrics m;
  m.finished_stop = 7;
  m.finished_length = 2;
  m.finished_abort = 1;
  m.finished_error = 4;
  m.http_rejected_busy = 6;
  m.tool_calls = 4;
  m.tool_call_parse_failures = 1;
  m.ttft.observe(0.03);
  m.itl.observe(0.01);
  m.itl.observe(0.2);
  m.e2e.observe(1.5);
  m.e2e.observe(9000.0);
  ServeMetrics::Extra extra;
  extra.open_connections = 9;
  extra.http_requests = 42;
  const std::string text = m.render("qwen", {{0, "ready", sample_stats()}}, extra);
  const Exposition e = parse_exposition(text);
  for (const std::string& err : e.errors) ADD_FAILURE() << err;

  const std::string L = "{model_name=\"qwen\"}";
  std::map<std::string, std::pair<std::string, std::string>> want{
      // series -> (type, value)
      {"sextant_requests_failed_total" + L, {"counter", "4"}},
      {"sextant_http_rejected_busy_total" + L, {"counter", "6"}},
      {"sextant_tool_calls_total" + L, {"counter", "4"}},
      {"sextant_tool_call_parse_failures_total" + L, {"counter", "1"}},
      {"sextant_http_open_connections" + L, {"gauge", "9"}},
      {"sextant_http_requests_total" + L, {"counter", "42"}},
      {"sextant_replica_state{model_name=\"qwen\",replica=\"0\",state=\"ready\"}", {"gauge", "1"}},
      {"sextant_ready" + L, {"gauge", "1"}},
  };
  // The engine's figures: the replica's and their sum over the one replica.
  for (const char* r : {"0", "all"}) {
    const std::string R = fmt::format("{{model_name=\"qwen\",replica=\"{}\"}}", r);
    want["vllm:num_requests_running" + R] = {"gauge", "3"};
    want["vllm:num_requests_waiting" + R] = {"gauge", "2"};
    want["vllm:kv_cache_usage_perc" + R] = {"gauge", r == std::string("all") ? "0.734375" : "0.25"};
    want["vllm:prefix_cache_queries_total" + R] = {"counter", "100"};
    want["vllm:prefix_cache_hits_total" + R] = {"counter", "40"};
    want["vllm:num_preemptions_total" + R] = {"counter", "5"};
    want["vllm:prompt_tokens_total" + R] = {"counter", "1000"};
    want["vllm:generation_tokens_total" + R] = {"counter", "500"};
    want["sextant_kv_cache_free_blocks" + R] = {"gauge", "17"};
  }
  for (const auto& [series, tv] : want) {
    SCOPED_TRACE(series);
    ASSERT_TRUE(e.samples.count(series)) << text;
    EXPECT_EQ(e.samples.at(series), tv.second);
    const std::string family = family_of(series);
    EXPECT_EQ(e.types.at(family), tv.first);
    EXPECT_FALSE(e.helps.at(family).empty());
  }
  EXPECT_EQ(e.types.at("vllm:request_success_total"), "counter");
  EXPECT_EQ(e.samples.at("vllm:request_success_total{model_name=\"qwen\",finished_reason=\"stop\"}"), "7");
  EXPECT_EQ(e.samples.at("vllm:request_success_total{model_name=\"qwen\",finished_reason=\"length\"}"), "2");
  EXPECT_EQ(e.samples.at("vllm:request_success_total{model_name=\"qwen\",finished_reason=\"abort\"}"), "1");

  // The histograms: 0.03 lies between the 0.02 and 0.04 bounds of TTFT.
  EXPECT_EQ(e.types.at("vllm:time_to_first_token_seconds"), "histogram");
  EXPECT_EQ(e.samples.at("vllm:time_to_first_token_seconds_bucket{model_name=\"qwen\",le=\"0.02\"}"), "0");
  EXPECT_EQ(e.samples.at("vllm:time_to_first_token_seconds_bucket{model_name=\"qwen\",le=\"0.04\"}"), "1");
  EXPECT_EQ(e.samples.at("vllm:time_to_first_token_seconds_bucket{model_name=\"qwen\",le=\"+Inf\"}"), "1");
  EXPECT_EQ(e.samples.at("vllm:time_to_first_token_seconds_sum" + L), "0.03");
  EXPECT_EQ(e.samples.at("vllm:time_to_first_token_seconds_count" + L), "1");
  EXPECT_EQ(e.types.at("vllm:inter_token_latency_seconds"), "histogram");
  EXPECT_EQ(e.samples.at("vllm:inter_token_latency_seconds_bucket{model_name=\"qwen\",le=\"0.01\"}"), "1");
  EXPECT_EQ(e.samples.at("vllm:inter_token_latency_seconds_bucket{model_name=\"qwen\",le=\"0.15\"}"), "1");
  EXPECT_EQ(e.samples.at("vllm:inter_token_latency_seconds_bucket{model_name=\"qwen\",le=\"0.2\"}"), "2");
  EXPECT_EQ(e.samples.at("vllm:inter_token_latency_seconds_bucket{model_name=\"qwen\",le=\"+Inf\"}"), "2");
  EXPECT_EQ(e.samples.at("vllm:inter_token_latency_seconds_count" + L), "2");
  EXPECT_EQ(e.types.at("vllm:e2e_request_latency_seconds"), "histogram");
  EXPECT_EQ(e.samples.at("vllm:e2e_request_latency_seconds_bucket{model_name=\"qwen\",le=\"1.5\"}"), "1");
  EXPECT_EQ(e.samples.at("vllm:e2e_request_latency_seconds_bucket{model_name=\"qwen\",le=\"7680\"}"), "1");
  EXPECT_EQ(e.samples.at("vllm:e2e_request_latency_seconds_bucket{model_name=\"qwen\",le=\"+Inf\"}"), "2");
  EXPECT_EQ(e.samples.at("vllm:e2e_request_latency_seconds_sum" + L), "9001.5");
  EXPECT_EQ(e.samples.at("vllm:e2e_request_latency_seconds_count" + L), "2");

  EXPECT_EQ(e.samples.at("sextant_step_cost_attention_seconds_per_row{model_name=\"qwen\",replica=\"0\"}"),
            "2.5e-06");
  // The families are exactly these (a dashboard built for vLLM finds its names).
  std::set<std::string> families;
  for (const auto& [name, _] : e.types) families.insert(name);
  EXPECT_EQ(families, (std::set<std::string>{
                          "vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc",
                          "vllm:prefix_cache_queries_total", "vllm:prefix_cache_hits_total",
                          "sextant_prefix_snapshots", "sextant_prefix_snapshot_bytes",
                          "sextant_prefix_snapshots_taken_total", "sextant_prefix_snapshots_restored_total",
                          "sextant_prefix_snapshots_evicted_total", "sextant_prefix_store_bytes",
                          "sextant_prefix_store_written_total", "sextant_prefix_store_read_total",
                          "vllm:num_preemptions_total", "vllm:prompt_tokens_total", "vllm:generation_tokens_total",
                          "vllm:request_success_total", "vllm:time_to_first_token_seconds",
                          "vllm:inter_token_latency_seconds", "vllm:e2e_request_latency_seconds",
                          "sextant_requests_failed_total", "sextant_http_rejected_busy_total",
                          "sextant_tool_calls_total", "sextant_tool_call_parse_failures_total",
                          "sextant_http_open_connections", "sextant_http_requests_total",
                          "sextant_kv_cache_free_blocks", "sextant_state_slots_free", "sextant_replica_state",
                          "vllm:iteration_tokens_total",
                          "sextant_step_seconds", "sextant_step_target_seconds",
                          "sextant_step_cost_prefill_seconds_per_token",
                          "sextant_step_cost_attention_seconds_per_row", "sextant_ready"}));
  for (const auto& [name, _] : e.types) EXPECT_TRUE(e.helps.count(name)) << name;
}

TEST(ServeMetrics, ReplicasEachHaveSeriesAndAllIsTheirSum) {
  ServeMetrics m;
  engine::EngineStats a = sample_stats(), b;
  b.running = 4;
  b.kv_free_blocks = 64;
  b.kv_total_blocks = 64;
  b.prefix_queries = 10;
  b.prefix_hits = 10;
  // Generation 2's replicas 0 and 1, and generation 1's replica 0 draining beside them: slot 0 shows both.
  const Exposition e = parse_exposition(m.render("q", {{0, "ready", a}, {1, "failed", b}, {0, "draining", b}}, {}));
  for (const std::string& err : e.errors) ADD_FAILURE() << err;
  EXPECT_EQ(e.samples.at("vllm:num_requests_running{model_name=\"q\",replica=\"0\"}"), "7");
  EXPECT_EQ(e.samples.at("vllm:num_requests_running{model_name=\"q\",replica=\"1\"}"), "4");
  EXPECT_EQ(e.samples.at("vllm:num_requests_running{model_name=\"q\",replica=\"all\"}"), "11");
  EXPECT_EQ(e.samples.at("vllm:prefix_cache_hits_total{model_name=\"q\",replica=\"all\"}"), "60");
  // 17 + 64 + 64 of 64 * 3 blocks free.
  EXPECT_EQ(e.samples.at("vllm:kv_cache_usage_perc{model_name=\"q\",replica=\"all\"}"), "0.24479166666666663");
  EXPECT_EQ(e.samples.at("sextant_replica_state{model_name=\"q\",replica=\"1\",state=\"failed\"}"), "1");
  EXPECT_EQ(e.samples.at("sextant_replica_state{model_name=\"q\",replica=\"0\",state=\"draining\"}"), "1");
  EXPECT_EQ(e.samples.at("sextant_replica_state{model_name=\"q\",replica=\"0\",state=\"ready\"}"), "1");
}

// Issue 39 item 6: a reload retires replicas; their counts stay in their slot's counters (which never go
// down), the new engines count on from there, and the series are the slots', not one set per reload.
TEST(ServeMetrics, CountersOfRetiredReplicasStayInTheirSlot) {
  ServeMetrics m;
  engine::EngineStats old0, old1, new0, new1;
  old0.generation_tokens = 86;
  old0.prefix_queries = 5;
  old0.steps = 9;
  old0.step_tokens_counts[0] = 9;
  old1.generation_tokens = 40;
  old0.kv_free_blocks = old0.kv_total_blocks = 8;  // gauges: gone with the replica
  new0.generation_tokens = 14;
  new1.generation_tokens = 3;
  auto value = [&](const std::vector<ServeMetrics::ReplicaSample>& live, const std::string& series) {
    const Exposition e = parse_exposition(m.render("q", live, {}));
    for (const std::string& err : e.errors) ADD_FAILURE() << err;
    return std::stod(e.samples.at(series));
  };
  const std::string all = "vllm:generation_tokens_total{model_name=\"q\",replica=\"all\"}";
  EXPECT_EQ(value({{0, "ready", old0}, {1, "ready", old1}}, all), 126);
  // The reload: generation 2 serves while generation 1 drains; then generation 1 is retired.
  EXPECT_EQ(value({{0, "ready", new0}, {1, "ready", new1}, {0, "draining", old0}, {1, "draining", old1}}, all), 143);
  m.retire(0, old0);
  m.retire(1, old1);
  const std::vector<ServeMetrics::ReplicaSample> after{{0, "ready", new0}, {1, "ready", new1}};
  EXPECT_EQ(value(after, all), 143);
  EXPECT_EQ(value(after, "vllm:generation_tokens_total{model_name=\"q\",replica=\"0\"}"), 100);
  EXPECT_EQ(value(after, "vllm:prefix_cache_queries_total{model_name=\"q\",replica=\"0\"}"), 5);
  EXPECT_EQ(value(after, "vllm:iteration_tokens_total_count{model_name=\"q\"}"), 9);
  EXPECT_EQ(value(after, "sextant_kv_cache_free_blocks{model_name=\"q\",replica=\"all\"}"), 0);
  // A later generation of one replica: slot 1's counts stay, with no live replica behind them.
  m.retire(0, new0);
  m.retire(1, new1);
  const std::string text = m.render("q", {{0, "ready", engine::EngineStats{}}}, {});
  const Exposition e = parse_exposition(text);
  EXPECT_EQ(e.samples.at(all), "143");
  EXPECT_EQ(e.samples.at("vllm:generation_tokens_total{model_name=\"q\",replica=\"1\"}"), "43");
  EXPECT_EQ(e.samples.count("sextant_replica_state{model_name=\"q\",replica=\"1\",state=\"ready\"}"), 0u);
  std::set<std::string> labels;
  for (const std::string& series : e.sample_order) {
    if (const std::size_t at = series.find("replica=\""); at != std::string::npos) {
      labels.insert(series.substr(at + 9, series.find('"', at + 9) - at - 9));
    }
  }
  EXPECT_EQ(labels, (std::set<std::string>{"0", "1", "all"}));
}

TEST(ServeMetrics, ReadyIsZeroWhenNothingCanServe) {
  ServeMetrics m;
  ServeMetrics::Extra extra;
  extra.ready = false;
  const Exposition e = parse_exposition(m.render("q", one(engine::EngineStats{}), extra));
  EXPECT_EQ(e.samples.at("sextant_ready{model_name=\"q\"}"), "0");
}

TEST(ServeMetrics, EverySampleCarriesModelName) {
  ServeMetrics m;
  const Exposition e = parse_exposition(m.render("my-model", one(engine::EngineStats{}), {}));
  for (const std::string& err : e.errors) ADD_FAILURE() << err;
  ASSERT_FALSE(e.sample_order.empty());
  for (const std::string& series : e.sample_order) {
    EXPECT_EQ(series.rfind(family_of(series) + "{model_name=\"my-model\"", 0), 0u) << series;
  }
}

TEST(ServeMetrics, DefaultsAreZero) {
  ServeMetrics m;
  const Exposition e = parse_exposition(m.render("m", one(engine::EngineStats{}), {}));
  for (const auto& [series, value] : e.samples) {
    if (series.rfind("sextant_replica_state{", 0) == 0) continue;  // 1 for the state the replica is in
    if (series.rfind("sextant_ready{", 0) == 0) continue;          // 1: nothing said it cannot serve
    if (series.rfind("sextant_ready{", 0) == 0) continue;          // 1: nothing said it cannot serve
    EXPECT_EQ(value, "0") << series;
  }
}

TEST(ServeMetrics, HistogramsAreCumulativeAndEndAtInf) {
  ServeMetrics m;
  const std::vector<double> values{0.0005, 0.003, 0.07, 0.3, 1.2, 3.0, 12.0, 50.0, 700.0, 5000.0};
  for (double v : values) {
    m.ttft.observe(v);
    m.itl.observe(v);
    m.e2e.observe(v);
  }
  const Exposition e = parse_exposition(m.render("m", one(engine::EngineStats{}), {}));
  for (const std::string& err : e.errors) ADD_FAILURE() << err;
  for (const std::string family : {"vllm:time_to_first_token_seconds", "vllm:inter_token_latency_seconds",
                                   "vllm:e2e_request_latency_seconds"}) {
    SCOPED_TRACE(family);
    std::vector<double> bounds;
    std::vector<std::uint64_t> counts;
    std::string last_le;
    for (const std::string& series : e.sample_order) {
      if (series.rfind(family + "_bucket{", 0) != 0) continue;
      const std::size_t le = series.find("le=\"");
      ASSERT_NE(le, std::string::npos);
      last_le = series.substr(le + 4, series.size() - (le + 4) - 2);
      if (last_le != "+Inf") bounds.push_back(std::stod(last_le));
      counts.push_back(std::stoull(e.samples.at(series)));
    }
    ASSERT_GE(counts.size(), 2u);
    EXPECT_EQ(last_le, "+Inf");
    for (std::size_t i = 1; i < bounds.size(); ++i) EXPECT_LT(bounds[i - 1], bounds[i]);
    for (std::size_t i = 1; i < counts.size(); ++i) EXPECT_LE(counts[i - 1], counts[i]);
    EXPECT_EQ(counts.back(), 10u);
    EXPECT_EQ(e.samples.at(family + "_count{model_name=\"m\"}"), "10");
    // Each bucket counts exactly the observations at or below its bound.
    for (std::size_t i = 0; i < bounds.size(); ++i) {
      std::uint64_t at_or_below = 0;
      for (double v : values) at_or_below += v <= bounds[i] ? 1 : 0;
      EXPECT_EQ(counts[i], at_or_below) << "le=" << bounds[i];
    }
  }
}

TEST(ServeMetrics, ModelNameIsEscaped) {
  ServeMetrics m;
  const std::string text = m.render("a\"b\\c\nd", one(engine::EngineStats{}), {});
  const std::string want = "model_name=\"a\\\"b\\\\c\\nd\"";
  EXPECT_NE(text.find("vllm:num_requests_running{" + want + ",replica=\"0\"} 0\n"), std::string::npos) << text;
  EXPECT_NE(text.find("vllm:request_success_total{" + want + ",finished_reason=\"stop\"} 0\n"), std::string::npos);
  EXPECT_NE(text.find("vllm:time_to_first_token_seconds_bucket{" + want + ",le=\"+Inf\"} 0\n"), std::string::npos);
  // No raw newline sneaks into a sample line: every line is a comment or has the escaped label.
  const Exposition e = parse_exposition(text);
  for (const std::string& err : e.errors) ADD_FAILURE() << err;
  for (const std::string& series : e.sample_order) EXPECT_NE(series.find(want), std::string::npos) << series;
}

TEST(ServeMetrics, LargeCountersAndFractions) {
  ServeMetrics m;
  m.finished_stop = 123456789;
  engine::EngineStats s;
  s.kv_usage = 1.0;
  s.generation_tokens = 9876543210ull;
  s.running = 0;
  const Exposition e = parse_exposition(m.render("m", one(s), {}));
  EXPECT_EQ(e.samples.at("vllm:kv_cache_usage_perc{model_name=\"m\",replica=\"0\"}"), "1");
  EXPECT_EQ(e.samples.at("vllm:generation_tokens_total{model_name=\"m\",replica=\"0\"}"), "9876543210");
  EXPECT_EQ(e.samples.at("vllm:request_success_total{model_name=\"m\",finished_reason=\"stop\"}"), "123456789");
}

}  // namespace
}  // namespace sx::daemon::serve
