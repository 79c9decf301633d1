// daemon/config: defaults, every field parsed from YAML, every kind of error with its path and line,
// errors collected, printing and round trips, cross-field validation, the annotated example file.
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <ostream>
#include <sstream>

#include <gtest/gtest.h>

#include "daemon/config/fields.h"
#include "daemon/config/serve_config.h"
#include "daemon/config/yaml_io.h"

namespace sx::daemon::config {

// gtest prints a config as its YAML.
void PrintTo(const ServeConfig& c, std::ostream* os) { *os << "\n" << to_yaml(c, {.redact_secrets = false}); }

namespace {

ServeConfig load_ok(std::string_view text) {
  auto r = load_config_string(text, "sextant.yaml");
  EXPECT_TRUE(r.ok()) << r.status().to_string();
  return r.ok() ? *r : ServeConfig{};
}

// The error message of loading `text` (which must fail with INVALID_ARGUMENT).
std::string load_error(std::string_view text) {
  auto r = load_config_string(text, "sextant.yaml");
  EXPECT_FALSE(r.ok()) << "loaded without error:\n" << text;
  if (r.ok()) return "";
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  return r.status().message();
}

std::string read_text(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

TEST(ServeConfigDefaults, MatchTheDocumentedValues) {
  const ServeConfig c;
  EXPECT_EQ(c.model.path, "");
  EXPECT_EQ(c.model.backend, "cpu");
  EXPECT_TRUE(c.model.devices.empty());
  EXPECT_EQ(c.model.threads, 0);
  EXPECT_EQ(c.model.tp, 1);
  EXPECT_EQ(c.model.pp, 1);
  EXPECT_EQ(c.model.served_model_name, "");
  EXPECT_DOUBLE_EQ(c.engine.memory_utilization, 0.9);
  EXPECT_EQ(c.engine.max_model_len, 0);
  EXPECT_EQ(c.engine.max_num_seqs, 16);
  EXPECT_EQ(c.engine.max_num_batched_tokens, 2048);
  EXPECT_EQ(c.engine.block_size, 16);
  EXPECT_TRUE(c.engine.enable_prefix_caching);
  EXPECT_FALSE(c.engine.memory_budget.has_value());
  EXPECT_EQ(c.http.host, "127.0.0.1");
  EXPECT_EQ(c.http.port, 8000);
  EXPECT_TRUE(c.http.api_keys.empty());
  EXPECT_EQ(c.http.max_connections, 1024);
  EXPECT_EQ(c.http.max_header_bytes, 16384u);
  EXPECT_EQ(c.http.max_body_bytes, 8u * 1024 * 1024);
  EXPECT_EQ(c.http.header_timeout_ms, 10000);
  EXPECT_EQ(c.http.body_timeout_ms, 30000);
  EXPECT_EQ(c.http.keepalive_timeout_ms, 60000);
  EXPECT_EQ(c.http.max_queued_requests, 1024);
  EXPECT_EQ(c.admin.socket, default_admin_socket_path());
  EXPECT_EQ(c.admin.mode, 0600u);
  EXPECT_TRUE(c.admin.allowed_uids.empty());
  EXPECT_EQ(c.limits.max_tokens_default, 256);
  EXPECT_EQ(c.limits.max_stop_strings, 16);
  EXPECT_EQ(c.limits.max_n, 8);
  EXPECT_EQ(c.limits.max_prompt_tokens, 0);
  EXPECT_EQ(c.limits.grammar_compile_timeout_ms, 10000);
  EXPECT_EQ(c.limits.grammar_compile_threads, 2);
  EXPECT_EQ(c.limits.max_queued_grammar_compiles, 16);
  EXPECT_EQ(c.log.format, LogFormat::kText);
  EXPECT_EQ(c.log.level, LogLevel::kInfo);
  EXPECT_TRUE(validate(c, {.require_model = false}).ok());
}

TEST(ServeConfigDefaults, AdminSocketFollowsXdgRuntimeDir) {
  EXPECT_EQ(default_admin_socket_path("/run/user/1000", 1000), "/run/user/1000/sextant/admin.sock");
  EXPECT_EQ(default_admin_socket_path("/run/user/1000/", 1000), "/run/user/1000/sextant/admin.sock");
  EXPECT_EQ(default_admin_socket_path(nullptr, 42), "/tmp/sextant-42/admin.sock");
  EXPECT_EQ(default_admin_socket_path("", 42), "/tmp/sextant-42/admin.sock");

  const char* old = std::getenv("XDG_RUNTIME_DIR");
  const std::string saved = old != nullptr ? old : "";
  setenv("XDG_RUNTIME_DIR", "/run/user/77", 1);
  EXPECT_EQ(ServeConfig{}.admin.socket, "/run/user/77/sextant/admin.sock");
  unsetenv("XDG_RUNTIME_DIR");
  EXPECT_EQ(ServeConfig{}.admin.socket, fmt::format("/tmp/sextant-{}/admin.sock", getuid()));
  if (old != nullptr) setenv("XDG_RUNTIME_DIR", saved.c_str(), 1);
}

TEST(ServeConfigDefaults, ServedModelNameIsTheFileStem) {
  ModelSection m;
  m.path = "/models/qwen2.5-0.5b-instruct-q8_0.gguf";
  EXPECT_EQ(effective_served_model_name(m), "qwen2.5-0.5b-instruct-q8_0");
  m.path = "/models/Qwen2.5-0.5B/";
  EXPECT_EQ(effective_served_model_name(m), "Qwen2.5-0.5B");
  m.path = "model.safetensors";
  EXPECT_EQ(effective_served_model_name(m), "model");
  m.served_model_name = "mine";
  EXPECT_EQ(effective_served_model_name(m), "mine");
}

TEST(LoadConfig, EmptyDocumentsAreAllDefaults) {
  EXPECT_EQ(load_ok(""), ServeConfig{});
  EXPECT_EQ(load_ok("# only a comment\n\n"), ServeConfig{});
  EXPECT_EQ(load_ok("---\n"), ServeConfig{});
  EXPECT_EQ(load_ok("engine:\nhttp:\n"), ServeConfig{});  // empty sections keep their defaults
  EXPECT_EQ(load_ok("engine: {}\n"), ServeConfig{});
}

TEST(LoadConfig, EveryFieldIsParsed) {
  const ServeConfig c = load_ok(R"(
model:
  path: /m/qwen.gguf
  backend: cuda
  devices: [2, 3]
  threads: 12
  tp: 2
  pp: 2
  served_model_name: qwen-test
engine:
  memory_utilization: 0.75
  max_model_len: 4096
  max_num_seqs: 32
  max_num_batched_tokens: 8192
  block_size: 32
  enable_prefix_caching: false
  memory_budget: 8GiB
http:
  host: 0.0.0.0
  port: 9000
  api_keys: [k1, "k2,with,commas"]
  max_connections: 10
  max_header_bytes: 32KiB
  max_body_bytes: 1048576
  header_timeout_ms: 1
  body_timeout_ms: 2
  keepalive_timeout_ms: 3
  max_queued_requests: 4
admin:
  socket: /run/sx/a.sock
  mode: "0660"
  allowed_uids: [0, 1000]
limits:
  max_tokens_default: 100
  max_stop_strings: 0
  max_n: 2
  max_prompt_tokens: 1000
log:
  format: json
  level: debug
)");
  EXPECT_EQ(c.model.path, "/m/qwen.gguf");
  EXPECT_EQ(c.model.backend, "cuda");
  EXPECT_EQ(c.model.devices, (std::vector<std::int64_t>{2, 3}));
  EXPECT_EQ(c.model.threads, 12);
  EXPECT_EQ(c.model.tp, 2);
  EXPECT_EQ(c.model.pp, 2);
  EXPECT_EQ(c.model.served_model_name, "qwen-test");
  EXPECT_DOUBLE_EQ(c.engine.memory_utilization, 0.75);
  EXPECT_EQ(c.engine.max_model_len, 4096);
  EXPECT_EQ(c.engine.max_num_seqs, 32);
  EXPECT_EQ(c.engine.max_num_batched_tokens, 8192);
  EXPECT_EQ(c.engine.block_size, 32);
  EXPECT_FALSE(c.engine.enable_prefix_caching);
  EXPECT_EQ(c.engine.memory_budget, std::optional<std::uint64_t>(std::uint64_t{8} << 30));
  EXPECT_EQ(c.http.host, "0.0.0.0");
  EXPECT_EQ(c.http.port, 9000);
  EXPECT_EQ(c.http.api_keys, (std::vector<std::string>{"k1", "k2,with,commas"}));
  EXPECT_EQ(c.http.max_connections, 10);
  EXPECT_EQ(c.http.max_header_bytes, 32u * 1024);
  EXPECT_EQ(c.http.max_body_bytes, 1048576u);
  EXPECT_EQ(c.http.header_timeout_ms, 1);
  EXPECT_EQ(c.http.body_timeout_ms, 2);
  EXPECT_EQ(c.http.keepalive_timeout_ms, 3);
  EXPECT_EQ(c.http.max_queued_requests, 4);
  EXPECT_EQ(c.admin.socket, "/run/sx/a.sock");
  EXPECT_EQ(c.admin.mode, 0660u);
  EXPECT_EQ(c.admin.allowed_uids, (std::vector<std::int64_t>{0, 1000}));
  EXPECT_EQ(c.limits.max_tokens_default, 100);
  EXPECT_EQ(c.limits.max_stop_strings, 0);
  EXPECT_EQ(c.limits.max_n, 2);
  EXPECT_EQ(c.limits.max_prompt_tokens, 1000);
  EXPECT_EQ(c.log.format, LogFormat::kJson);
  EXPECT_EQ(c.log.level, LogLevel::kDebug);
}

TEST(LoadConfig, ScalarSpellings) {
  // YAML's unquoted octal, quoted numbers, yes/no booleans, sizes with units, nulls.
  EXPECT_EQ(load_ok("admin:\n  mode: 0640\n").admin.mode, 0640u);
  EXPECT_EQ(load_ok("admin:\n  mode: 0o600\n").admin.mode, 0600u);
  EXPECT_EQ(load_ok("http:\n  port: \"8080\"\n").http.port, 8080);
  EXPECT_FALSE(load_ok("engine:\n  enable_prefix_caching: no\n").engine.enable_prefix_caching);
  EXPECT_EQ(load_ok("engine:\n  memory_budget: 1.5GiB\n").engine.memory_budget, std::uint64_t{3} << 29);
  EXPECT_EQ(load_ok("engine:\n  memory_budget: 2 GB\n").engine.memory_budget, std::uint64_t{2000000000});
  EXPECT_EQ(load_ok("engine:\n  memory_budget: ~\n").engine.memory_budget, std::nullopt);
  EXPECT_EQ(load_ok("model:\n  served_model_name:\n").model.served_model_name, "");
  EXPECT_TRUE(load_ok("http:\n  api_keys:\n").http.api_keys.empty());
  EXPECT_EQ(load_ok("model:\n  devices:\n    - 1\n    - 0\n").model.devices, (std::vector<std::int64_t>{1, 0}));
}

TEST(LoadConfigErrors, WrongValueNamesFileLinePathAndValue) {
  EXPECT_EQ(load_error("engine:\n  max_num_seqs: abc\n"),
            "sextant.yaml:2:17: engine.max_num_seqs: expected a positive integer, got \"abc\"");
  EXPECT_EQ(load_error("engine:\n  max_num_seqs: 0\n"),
            "sextant.yaml:2:17: engine.max_num_seqs: expected a positive integer, got \"0\"");
  EXPECT_EQ(load_error("engine:\n  max_num_seqs: 100000\n"),
            "sextant.yaml:2:17: engine.max_num_seqs: expected a positive integer no larger than 65536, got "
            "\"100000\"");
  EXPECT_EQ(load_error("engine:\n  max_num_seqs: 1.5\n"),
            "sextant.yaml:2:17: engine.max_num_seqs: expected a positive integer, got \"1.5\"");
  EXPECT_EQ(load_error("http:\n  port: 70000\n"),
            "sextant.yaml:2:9: http.port: expected a port number from 0 (any free port) to 65535, got \"70000\"");
  EXPECT_EQ(load_error("model:\n  threads: -1\n"),
            "sextant.yaml:2:12: model.threads: expected a non-negative integer, got \"-1\"");
  EXPECT_EQ(load_error("model:\n  tp: 9\n"),
            "sextant.yaml:2:7: model.tp: expected a positive integer no larger than 8, got \"9\"");
}

TEST(LoadConfigErrors, IntegersAtOrAbove2To63AreTooLargeAndShownAsWritten) {
  // Past int64 they are integers too large for the field, not "not an integer"; and never wrapped.
  EXPECT_EQ(load_error("engine:\n  max_num_seqs: 18446744073709551615\n"),
            "sextant.yaml:2:17: engine.max_num_seqs: expected a positive integer no larger than 65536, got "
            "\"18446744073709551615\"");
  EXPECT_EQ(load_error("engine:\n  max_num_seqs: 9223372036854775808\n"),
            "sextant.yaml:2:17: engine.max_num_seqs: expected a positive integer no larger than 65536, got "
            "\"9223372036854775808\"");
  EXPECT_EQ(load_error("model:\n  threads: -9223372036854775809\n"),
            "sextant.yaml:2:12: model.threads: expected a non-negative integer, got \"-9223372036854775809\"");
  EXPECT_EQ(load_error("http:\n  port: 18446744073709551616\n"),
            "sextant.yaml:2:9: http.port: expected a port number from 0 (any free port) to 65535, got "
            "\"18446744073709551616\"");
}

TEST(LoadConfigErrors, EveryValidatorKind) {
  EXPECT_EQ(load_error("model:\n  backend: tpu\n"),
            "sextant.yaml:2:12: model.backend: expected one of cpu, vulkan, cuda, auto, got \"tpu\"");
  EXPECT_EQ(load_error("engine:\n  enable_prefix_caching: maybe\n"),
            "sextant.yaml:2:26: engine.enable_prefix_caching: expected true or false, got \"maybe\"");
  EXPECT_EQ(load_error("engine:\n  memory_utilization: 1.5\n"),
            "sextant.yaml:2:23: engine.memory_utilization: expected a number in (0, 1], got \"1.5\"");
  EXPECT_EQ(load_error("engine:\n  memory_utilization: 0\n"),
            "sextant.yaml:2:23: engine.memory_utilization: expected a number in (0, 1], got \"0\"");
  EXPECT_EQ(load_error("engine:\n  memory_utilization: nan\n"),
            "sextant.yaml:2:23: engine.memory_utilization: expected a number in (0, 1], got \"nan\"");
  EXPECT_EQ(load_error("engine:\n  block_size: 12\n"),
            "sextant.yaml:2:15: engine.block_size: expected one of 8, 16, 32, got \"12\"");
  EXPECT_EQ(load_error("engine:\n  memory_budget: lots\n"),
            "sextant.yaml:2:18: engine.memory_budget: expected a size such as 16384, 16KiB or 8MiB, got \"lots\"");
  EXPECT_EQ(load_error("http:\n  max_body_bytes: 8 gigs\n"),
            "sextant.yaml:2:19: http.max_body_bytes: expected a size such as 16384, 16KiB or 8MiB, got \"8 gigs\"");
  EXPECT_EQ(load_error("http:\n  max_header_bytes: 512\n"),
            "sextant.yaml:2:21: http.max_header_bytes: expected a size from 1KiB to 1MiB, got \"512\"");
  EXPECT_EQ(load_error("http:\n  host: \"\"\n"), "sextant.yaml:2:9: http.host: expected a non-empty string, got \"\"");
  EXPECT_EQ(load_error("http:\n  api_keys: [\"\"]\n"),
            "sextant.yaml:2:14: http.api_keys[0]: expected a non-empty string, got \"\"");
  EXPECT_EQ(load_error("admin:\n  mode: \"0800\"\n"),
            "sextant.yaml:2:9: admin.mode: expected an octal mode such as \"0600\", got \"0800\"");
  EXPECT_EQ(load_error("admin:\n  mode: \"1777\"\n"),
            "sextant.yaml:2:9: admin.mode: expected an octal mode no larger than \"0777\", got \"1777\"");
  EXPECT_EQ(load_error("log:\n  level: verbose\n"),
            "sextant.yaml:2:10: log.level: expected one of debug, info, warn, error, got \"verbose\"");
  EXPECT_EQ(load_error("log:\n  format: xml\n"),
            "sextant.yaml:2:11: log.format: expected one of text, json, got \"xml\"");
}

TEST(LoadConfigErrors, WrongShapes) {
  EXPECT_EQ(load_error("http:\n  port: {a: 1}\n"),
            "sextant.yaml:2:9: http.port: expected a port number from 0 (any free port) to 65535, got a map");
  EXPECT_EQ(load_error("model:\n  tp: [1]\n"), "sextant.yaml:2:7: model.tp: expected a positive integer, got a list");
  EXPECT_EQ(load_error("http:\n  api_keys: secret\n"),
            "sextant.yaml:2:13: http.api_keys: expected a list of API keys such as [\"secret\"], got \"secret\"");
  // A value left empty is null; its position is its key's.
  EXPECT_EQ(load_error("http:\n  port:\n"),
            "sextant.yaml:2:3: http.port: expected a port number from 0 (any free port) to 65535, got null");
  EXPECT_EQ(load_error("engine: 5\n"), "sextant.yaml:1:9: engine: expected a map of engine settings, got \"5\"");
  EXPECT_EQ(load_error("log: [text]\n"), "sextant.yaml:1:6: log: expected a map of log settings, got a list");
}

TEST(LoadConfigErrors, ListItemsNameTheirIndex) {
  EXPECT_EQ(load_error("model:\n  devices: [0, x, -1]\n"),
            "sextant.yaml:2:16: model.devices[1]: expected a non-negative integer, got \"x\"\n"
            "sextant.yaml:2:19: model.devices[2]: expected a non-negative integer, got \"-1\"");
  EXPECT_EQ(load_error("admin:\n  allowed_uids:\n    - 5\n    - [1]\n"),
            "sextant.yaml:4:7: admin.allowed_uids[1]: expected a single value, got a list");
}

TEST(LoadConfigErrors, UnknownKeysAndSections) {
  EXPECT_EQ(load_error("engine:\n  max_num_seq: 4\n"),
            "sextant.yaml:2:3: engine.max_num_seq: unknown key (did you mean max_num_seqs?)");
  EXPECT_EQ(load_error("log:\n  colour: red\n"), "sextant.yaml:2:3: log.colour: unknown key (log has: format, level, dir, keep)");
  EXPECT_EQ(load_error("modle:\n  path: x\n"),
            "sextant.yaml:1:1: modle: unknown section (expected one of model, engine, http, admin, limits, log; did "
            "you mean model?)");
  EXPECT_EQ(load_error("server:\n  port: 1\n"),
            "sextant.yaml:1:1: server: unknown section (expected one of model, engine, http, admin, limits, log)");
}

TEST(LoadConfigErrors, TopLevelMustBeAMap) {
  EXPECT_EQ(load_error("- 1\n- 2\n"),
            "sextant.yaml:1:1: expected a map of sections (model, engine, http, admin, limits, log) at the top "
            "level, got a list");
  EXPECT_EQ(load_error("hello\n"),
            "sextant.yaml:1:1: expected a map of sections (model, engine, http, admin, limits, log) at the top "
            "level, got \"hello\"");
}

TEST(LoadConfigErrors, DuplicateKeys) {
  EXPECT_EQ(load_error("http:\n  port: 1\n  port: 2\n"),
            "sextant.yaml:3:3: http.port: duplicate key, first set on line 2");
  EXPECT_EQ(load_error("log: {}\nlog: {}\n"), "sextant.yaml:2:1: log: duplicate key, first set on line 1");
}

TEST(LoadConfigErrors, SyntaxErrorsAndExtraDocuments) {
  EXPECT_EQ(load_error("model:\n  devices: [1\nhttp:\n  port: 1\n"),
            "sextant.yaml:3:5: YAML syntax error: end of sequence flow not found");
  EXPECT_EQ(load_error("http:\n  port: 1\n host: x\n"), "sextant.yaml:3:2: YAML syntax error: end of map not found");
  EXPECT_EQ(load_error("http:\n  port: 1\n\tbad: 2\n"),
            "sextant.yaml:3:1: YAML syntax error: illegal tab when looking for indentation");
  EXPECT_EQ(load_error("log: {}\n---\nlog: {}\n"), "sextant.yaml:3:1: expected one YAML document, found 2");
}

TEST(LoadConfigErrors, AllErrorsAreCollectedInDocumentOrder) {
  const std::string message = load_error(R"(model:
  tp: zero
  colour: blue
engine:
  block_size: 7
  max_num_seqs: 4
http:
  port: -1
  port: 80
extra: 1
)");
  EXPECT_EQ(message,
            "sextant.yaml:2:7: model.tp: expected a positive integer, got \"zero\"\n"
            "sextant.yaml:3:3: model.colour: unknown key (model has: path, pull, backend, devices, threads, tp, pp, requantize_unaligned, placement, topology, "
            "replicas, served_model_name, chat_template)\n"
            "sextant.yaml:5:15: engine.block_size: expected one of 8, 16, 32, got \"7\"\n"
            "sextant.yaml:8:9: http.port: expected a port number from 0 (any free port) to 65535, got \"-1\"\n"
            "sextant.yaml:9:3: http.port: duplicate key, first set on line 8\n"
            "sextant.yaml:10:1: extra: unknown section (expected one of model, engine, http, admin, limits, log)");
}

TEST(LoadConfigFile, ReadsTheFileAndNamesItInErrors) {
  const std::string dir = ::testing::TempDir();
  const std::string path = dir + "/sx_config_test_" + std::to_string(getpid()) + ".yaml";
  {
    std::ofstream out(path);
    out << "http:\n  port: 9001\n";
  }
  auto ok = load_config_file(path);
  ASSERT_TRUE(ok.ok()) << ok.status().to_string();
  EXPECT_EQ(ok->http.port, 9001);
  {
    std::ofstream out(path);
    out << "# comment\nhttp:\n  port: none\n";
  }
  auto bad = load_config_file(path);
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().message(), path + ":3:9: http.port: expected a port number from 0 (any free port) to 65535, got \"none\"");
  std::remove(path.c_str());

  auto missing = load_config_file(path);
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.status().code(), StatusCode::kNotFound);
  EXPECT_EQ(missing.status().message(), "cannot read config file '" + path + "': No such file or directory");

  auto directory = load_config_file(dir);
  ASSERT_FALSE(directory.ok());
  EXPECT_NE(directory.status().message().find("cannot read config file"), std::string::npos);
}

ServeConfig non_default_config() {
  ServeConfig c;
  c.model.path = "/models/a \"quoted\" path: with # and \\ and\ttab.gguf";
  c.model.backend = "auto";
  c.model.devices = {1, 0};
  c.model.threads = 3;
  c.model.tp = 2;
  c.model.served_model_name = "名前";
  c.engine.memory_utilization = 0.123456789;
  c.engine.max_model_len = 1000;
  c.engine.block_size = 8;
  c.engine.enable_prefix_caching = false;
  c.engine.memory_budget = 12345678;
  c.http.host = "::1";
  c.http.port = 1;
  c.http.api_keys = {"sk-1", "sk,2", "with \"quote\"\n"};
  c.http.max_body_bytes = 3u << 20;
  c.http.max_header_bytes = 5000;
  c.admin.socket = "/tmp/x.sock";
  c.admin.mode = 0;
  c.admin.allowed_uids = {0, 4294967294LL};
  c.limits.max_prompt_tokens = 7;
  c.log.format = LogFormat::kJson;
  c.log.level = LogLevel::kError;
  return c;
}

TEST(ToYaml, RoundTripsToAnEqualConfig) {
  const ServeConfig defaults;
  EXPECT_EQ(load_ok(to_yaml(defaults)), defaults);
  const ServeConfig c = non_default_config();
  const std::string yaml = to_yaml(c, {.redact_secrets = false});
  EXPECT_EQ(load_ok(yaml), c) << yaml;
}

TEST(ToYaml, RedactsApiKeys) {
  const ServeConfig c = non_default_config();
  const std::string yaml = to_yaml(c);
  EXPECT_EQ(yaml.find("sk-1"), std::string::npos) << yaml;
  EXPECT_NE(yaml.find("  api_keys: [\"***\", \"***\", \"***\"]\n"), std::string::npos) << yaml;
  ServeConfig expected = c;
  expected.http.api_keys = {"***", "***", "***"};
  const ServeConfig back = load_ok(yaml);
  EXPECT_EQ(back, expected);
  // ...and a redacted config cannot be served by mistake.
  EXPECT_EQ(validate(back, {.require_model = false}).message(),
            "http.api_keys[0]: is the placeholder \"***\" that a printed config shows in place of a key; write the "
            "real key\n"
            "http.api_keys[1]: is the placeholder \"***\" that a printed config shows in place of a key; write the "
            "real key\n"
            "http.api_keys[2]: is the placeholder \"***\" that a printed config shows in place of a key; write the "
            "real key");
}

TEST(ToYaml, PrintsEveryKeyReadably) {
  ServeConfig c;
  c.model.path = "/m/qwen.gguf";
  const std::string yaml = to_yaml(c);
  for (const Field& f : fields()) {
    EXPECT_NE(yaml.find(fmt::format("\n  {}: ", f.key())), std::string::npos) << f.path;
  }
  EXPECT_NE(yaml.find("\nmodel:\n  path: \"/m/qwen.gguf\"\n  pull: never\n  backend: cpu\n  devices: []\n"), std::string::npos)
      << yaml;
  EXPECT_NE(yaml.find("  served_model_name: \"\"  # empty: the file stem of model.path (\"qwen\")\n"),
            std::string::npos)
      << yaml;
  EXPECT_NE(yaml.find("  memory_utilization: 0.9\n"), std::string::npos) << yaml;
  EXPECT_NE(yaml.find("  memory_budget: null\n"), std::string::npos) << yaml;
  EXPECT_NE(yaml.find("  max_header_bytes: 16KiB\n  max_body_bytes: 8MiB\n"), std::string::npos) << yaml;
  EXPECT_NE(yaml.find("  mode: \"0600\"\n"), std::string::npos) << yaml;
  EXPECT_NE(yaml.find("log:\n  format: text\n  level: info\n"), std::string::npos) << yaml;
}

TEST(Validate, CrossFieldRules) {
  ServeConfig c;
  EXPECT_EQ(validate(c).message(),
            "model.path: required to serve: set model.path in the config or pass --model FILE");
  c.model.path = "/m.gguf";
  EXPECT_TRUE(validate(c).ok());

  ServeConfig wide = c;
  wide.model.tp = 4;
  wide.model.pp = 3;
  EXPECT_EQ(validate(wide).message(), "model.tp * model.pp: 4 * 3 = 12 ranks, more than the 8 one engine may span");
  wide.model.pp = 2;
  EXPECT_TRUE(validate(wide).ok());

  ServeConfig devices = c;
  devices.model.tp = 4;
  devices.model.devices = {0, 1, 1};
  EXPECT_EQ(validate(devices).message(),
            "model.devices[2]: device 1 is listed twice; each rank needs its own device\n"
            "model.devices: lists 3 device(s) but tp * pp = 4 ranks need 4; list more or leave it empty to use the "
            "first 4");

  ServeConfig batch = c;
  batch.engine.max_num_batched_tokens = 8;
  EXPECT_EQ(validate(batch).message(),
            "engine.max_num_batched_tokens: 8 is less than engine.max_num_seqs (16); every sequence in a step needs a "
            "token");

  ServeConfig prompt = c;
  prompt.engine.max_model_len = 512;
  prompt.limits.max_prompt_tokens = 1024;
  EXPECT_EQ(validate(prompt).message(), "limits.max_prompt_tokens: 1024 is more than engine.max_model_len (512)");

  ServeConfig budget = c;
  budget.engine.memory_budget = std::uint64_t{1} << 30;
  EXPECT_TRUE(validate(budget).ok());
  budget.model.backend = "cuda";  // the backend takes the budget or refuses it by name (device_options.h)
  EXPECT_TRUE(validate(budget).ok());

  ServeConfig socket = c;
  socket.admin.socket = "/" + std::string(106, 's');  // 107 bytes: fits
  EXPECT_TRUE(validate(socket).ok());
  socket.admin.socket += "s";
  EXPECT_EQ(validate(socket).message(),
            "admin.socket: the path is 108 bytes, longer than the 107 a Unix socket address can hold; choose a "
            "shorter path");
}

TEST(Validate, CollectsEveryProblemAndCanSkipTheModel) {
  ServeConfig c;
  c.model.tp = 8;
  c.model.pp = 2;
  c.engine.max_num_batched_tokens = 1;
  const Status s = validate(c);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(std::count(s.message().begin(), s.message().end(), '\n'), 2) << s.message();
  EXPECT_TRUE(s.message().starts_with("model.path: required to serve")) << s.message();
  EXPECT_FALSE(validate(c, {.require_model = false}).message().starts_with("model.path")) << s.message();
}

TEST(ExampleConfig, IsValidAndDocumentsEveryKeyWithItsDefault) {
  const std::string path = SX_EXAMPLE_CONFIG;
  auto loaded = load_config_file(path);
  ASSERT_TRUE(loaded.ok()) << loaded.status().to_string();
  // The example sets model.path only; every other value it shows is the default.
  ServeConfig expected;
  expected.model.path = "/models/qwen2.5-0.5b-instruct-q8_0.gguf";
  EXPECT_EQ(*loaded, expected);
  EXPECT_TRUE(validate(*loaded).ok()) << validate(*loaded).to_string();

  // Every key appears under its section (admin.socket commented out: its default depends on the
  // environment), each after a comment line that explains it.
  const std::string text = read_text(path);
  for (const std::string_view section : section_names()) {
    EXPECT_NE(text.find(fmt::format("\n{}:\n", section)), std::string::npos) << section;
  }
  for (const Field& f : fields()) {
    const std::string set = fmt::format("\n  {}: ", f.key());
    const std::string commented = fmt::format("\n  # {}: ", f.key());
    const std::size_t at = text.find(set) != std::string::npos ? text.find(set) : text.find(commented);
    ASSERT_NE(at, std::string::npos) << f.path << " is not documented in " << path;
    const std::size_t line_start = text.rfind('\n', at - 1);
    EXPECT_EQ(text.substr(line_start + 1, 3), "  #") << f.path << " has no comment above it";
  }
}

}  // namespace
}  // namespace sx::daemon::config
