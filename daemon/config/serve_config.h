// ServeConfig: the validated settings of `sextant serve`, one section per concern (model, engine,
// http, admin, limits, log), every field with the default the daemon uses when it is not set.
//
// The same schema is read from YAML (yaml_io.h), overridden from command-line flags
// (serve_flags.h) and printed back (to_yaml). config/sextant.example.yaml documents every key.
//
// Threading: plain values, safe to copy and move between threads. Errors: validate() returns
// INVALID_ARGUMENT listing every problem, one per line; nothing here throws.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "runtime/base/log.h"
#include "runtime/base/status.h"

namespace sx::daemon::config {

// The backends a config may name ("auto" lets the registry pick the best one present). The
// registry, not this module, knows which of them were compiled in.
inline constexpr std::string_view kBackendChoices[] = {"cpu", "vulkan", "cuda", "auto"};

// The most ranks (tp * pp) one engine may span.
inline constexpr std::int64_t kMaxRanks = 8;

// sizeof(sockaddr_un::sun_path) - 1 on Linux: the longest admin socket path that can be bound.
inline constexpr std::size_t kMaxSocketPathBytes = 107;

// The text the printed config shows in place of every API key.
inline constexpr std::string_view kRedactedKey = "***";

// "$XDG_RUNTIME_DIR/sextant/admin.sock", or "/tmp/sextant-<uid>/admin.sock" when XDG_RUNTIME_DIR
// is unset or empty. The first form reads the environment and getuid() (so a default-constructed
// ServeConfig depends on them); the second is the pure rule. The fallback lies in the shared /tmp,
// so the daemon trusts its directory only after checking it (created 0700, or owned by the daemon's
// uid and not writable by others: daemon/admin/admin_server.h), and `sextant ctl` checks that the
// process answering on it runs as its own uid or root (daemon/admin/admin_client.h).
std::string default_admin_socket_path();
std::string default_admin_socket_path(const char* xdg_runtime_dir, std::uint32_t uid);

struct ModelSection {
  std::string path;                    // model file (GGUF); required to serve
  std::string backend = "cpu";         // one of kBackendChoices
  std::vector<std::int64_t> devices;   // device indexes of that backend; empty = the first tp*pp
  std::int64_t threads = 0;            // CPU threads; 0 = all cores
  std::int64_t tp = 1;                 // tensor-parallel ranks
  std::int64_t pp = 1;                 // pipeline stages
  bool requantize_unaligned = false;   // parallel::PlanOptions::requantize_unaligned
  std::string placement = "auto";      // auto: device groups and rank order from the links; none: in order
  std::string topology;                // a saved `nvidia-smi topo -m` for the placement ("" = the backend's)
  std::string replicas = "1";          // engines serving the model: "N", "per-device" or device groups (replica_spec.h)
  std::string served_model_name;       // the `model` id clients send; empty = file stem of path
  std::string chat_template;           // a Jinja chat template file instead of the model's own ("" = the model's)
  // path may name a model in the Hugging Face cache (ORG/NAME[:QUANT]): "never" loads only what is
  // cached, "missing" pulls it first when it is not (daemon/commands/commands.h resolve_model_path).
  std::string pull = "never";
  bool operator==(const ModelSection&) const = default;
};

struct EngineSection {
  double memory_utilization = 0.9;              // fraction of device memory the engine may take, (0, 1]
  std::int64_t max_model_len = 0;               // tokens per sequence; 0 = the model's context length
  std::int64_t max_num_seqs = 16;               // sequences in one step
  std::int64_t max_num_batched_tokens = 2048;   // tokens in one step (prefill chunk budget)
  std::int64_t block_size = 16;                 // tokens per KV block: 8, 16 or 32
  bool enable_prefix_caching = true;            // reuse KV blocks of shared prompt prefixes
  // A hybrid's prefix cache keeps copies of its DeltaNet states: this many (-1: the memory planner's
  // choice, 0: none, which turns its prefix caching off), and one every this many prompt tokens
  // beside the ends of messages, prompts and answers (0: only those).
  std::int64_t prefix_snapshots = -1;
  std::int64_t prefix_snapshot_interval = 4096;
  // The prefix cache's persistent tier: a directory ("" = none) where KV blocks and snapshots are
  // kept across evictions, reloads and upgrades of the same model, and its bound (unset: 16 GiB).
  std::string prefix_cache_dir;
  std::optional<std::uint64_t> prefix_cache_bytes;
  bool prefix_affinity = true;                  // route a request to the replica that holds its prompt's prefix
  std::optional<std::uint64_t> memory_budget;   // bytes each device may use (backend option); unset = from the device
  std::string smoke_test = "auto";              // the bundled model through the layout first: auto, on, off
  double max_step_ms = 500;                     // paced steps: the step-time target (0: fill each step)
  double max_step_ratio = 2.5;                  // ... and at most this many decode-only steps (0: no such cap)
  bool operator==(const EngineSection&) const = default;
};

struct HttpSection {
  std::string host = "127.0.0.1";
  std::int64_t port = 8000;
  std::vector<std::string> api_keys;            // accepted bearer tokens; empty = no authentication
  std::int64_t max_connections = 1024;
  std::uint64_t max_header_bytes = 16384;
  std::uint64_t max_body_bytes = 8u << 20;      // 8 MiB
  std::int64_t header_timeout_ms = 10000;       // time to receive the whole request head
  std::int64_t body_timeout_ms = 30000;         // time to receive the whole body
  std::int64_t keepalive_timeout_ms = 60000;    // idle time between requests on one connection
  std::int64_t write_timeout_ms = 60000;        // a client that accepts no response byte for this long is closed
  std::uint64_t max_unsent_stream_bytes = 4u << 20;  // a stream with more waiting unread is ended and cancelled
  std::int64_t drain_timeout_ms = 60000;        // shutdown: in-flight requests get this long, then 503 / an error event
  std::int64_t max_queued_requests = 1024;      // requests waiting beyond max_num_seqs before 429s
  bool operator==(const HttpSection&) const = default;
};

struct AdminSection {
  std::string socket = default_admin_socket_path();  // Unix socket of the admin API
  std::uint32_t mode = 0600;                          // permission bits of the socket file
  std::vector<std::int64_t> allowed_uids;             // peers allowed besides the daemon's own uid
  std::int64_t upgrade_timeout_ms = 600000;  // ctl upgrade: the new process is ended if not ready by then
  bool operator==(const AdminSection&) const = default;
};

struct LimitsSection {
  std::int64_t max_tokens_default = 256;  // max_tokens of a request that does not say
  std::int64_t max_stop_strings = 16;     // stop strings one request may give
  std::int64_t max_n = 8;                 // completions one request may ask for
  std::int64_t max_prompt_tokens = 0;     // 0 = engine.max_model_len
  // Structured output: the time one grammar compile may take (past it: a 400 naming the field),
  // the threads that compile (their own, never the pool that tokenizes; read at start) and the
  // compiles that may wait for one (past it: a 429).
  std::int64_t grammar_compile_timeout_ms = 10000;
  std::int64_t grammar_compile_threads = 2;
  std::int64_t max_queued_grammar_compiles = 16;
  bool operator==(const LimitsSection&) const = default;
};

enum class LogFormat { kText, kJson };

struct LogSection {
  LogFormat format = LogFormat::kText;
  LogLevel level = LogLevel::kInfo;
  std::string dir;      // where each start's log and summary are kept ("" = the default, "none" = nowhere)
  std::int64_t keep = 10;  // starts kept in dir
  bool operator==(const LogSection&) const = default;
};

struct ServeConfig {
  ModelSection model;
  EngineSection engine;
  HttpSection http;
  AdminSection admin;
  LimitsSection limits;
  LogSection log;
  bool operator==(const ServeConfig&) const = default;
};

// served_model_name, or the file stem of model.path when it is empty ("/m/qwen2.5-0.5b.gguf" ->
// "qwen2.5-0.5b").
std::string effective_served_model_name(const ModelSection& model);

std::string_view log_format_name(LogFormat format);
std::string_view log_level_name(LogLevel level);

struct ValidateOptions {
  bool require_model = true;  // false for commands that do not load a model (--print-config)
};

// The settings that differ between `before` and `after` and that a running daemon cannot take
// without a new listener or HTTP server (http.host, http.port, the admin socket, the server's
// limits and timeouts), as dotted paths in schema order. A reload refuses them; http.api_keys,
// http.max_queued_requests, http.max_unsent_stream_bytes, http.drain_timeout_ms and every
// model, engine, limits and log setting may change.
std::vector<std::string> settings_needing_restart(const ServeConfig& before, const ServeConfig& after);

// Cross-field checks that single fields cannot make: model.path present (when required), tp * pp
// at most kMaxRanks, devices distinct and enough for tp * pp, max_num_batched_tokens >=
// max_num_seqs, limits within max_model_len, API keys not the redaction placeholder, the admin
// socket path short enough for sun_path. OK, or INVALID_ARGUMENT naming every offending key, one
// per line. (engine.memory_budget is the backend's to take or refuse, at start: device_options.h.)
Status validate(const ServeConfig& config, ValidateOptions options = {});

}  // namespace sx::daemon::config
