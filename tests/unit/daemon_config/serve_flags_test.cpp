// daemon/config serve flags: dotted-path overrides, the flag table, and parse_serve_flags layering
// defaults <- --config file <- flags, with every error named.
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <set>

#include <gtest/gtest.h>

#include "daemon/config/fields.h"
#include "daemon/config/serve_flags.h"
#include "daemon/config/yaml_io.h"

namespace sx::daemon::config {

void PrintTo(const ServeConfig& c, std::ostream* os);  // config_test.cpp

namespace {

// A YAML file in the test's temporary directory, removed at the end of the test.
class TempConfig {
 public:
  explicit TempConfig(std::string_view text) {
    static int counter = 0;
    path_ = fmt::format("{}/sx_serve_flags_{}_{}.yaml", ::testing::TempDir(), getpid(), counter++);
    std::ofstream(path_) << text;
  }
  ~TempConfig() { std::remove(path_.c_str()); }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

Result<ServeInvocation> parse(std::vector<std::string_view> args) { return parse_serve_flags(args); }

std::string parse_error(std::vector<std::string_view> args) {
  auto r = parse_serve_flags(args);
  EXPECT_FALSE(r.ok());
  if (r.ok()) return "";
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  return r.status().message();
}

TEST(ApplyOverride, SetsTheFieldWithTheSameValidator) {
  ServeConfig c;
  ASSERT_TRUE(apply_override(c, "engine.max_num_seqs", "32").ok());
  EXPECT_EQ(c.engine.max_num_seqs, 32);
  ASSERT_TRUE(apply_override(c, "http.max_body_bytes", "16MiB").ok());
  EXPECT_EQ(c.http.max_body_bytes, 16u << 20);
  ASSERT_TRUE(apply_override(c, "admin.mode", "0640").ok());
  EXPECT_EQ(c.admin.mode, 0640u);
  ASSERT_TRUE(apply_override(c, "log.level", "warn").ok());
  EXPECT_EQ(c.log.level, LogLevel::kWarn);

  const Status bad = apply_override(c, "engine.max_num_seqs", "abc");
  EXPECT_EQ(bad.code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(bad.message(), "--set: engine.max_num_seqs: expected a positive integer, got \"abc\"");
  EXPECT_EQ(c.engine.max_num_seqs, 32);  // unchanged by a refused value
  EXPECT_EQ(apply_override(c, "http.port", "-1", "--port").message(),
            "--port: http.port: expected a port number from 0 (any free port) to 65535, got \"-1\"");
}

TEST(ApplyOverride, ListsTakeCommaSeparatedItemsAndOptionalsUnset) {
  ServeConfig c;
  ASSERT_TRUE(apply_override(c, "model.devices", "2, 3").ok());
  EXPECT_EQ(c.model.devices, (std::vector<std::int64_t>{2, 3}));
  ASSERT_TRUE(apply_override(c, "model.devices", "").ok());
  EXPECT_TRUE(c.model.devices.empty());
  EXPECT_EQ(apply_override(c, "admin.allowed_uids", "1000,x,").message(),
            "--set: admin.allowed_uids[1]: expected a non-negative integer, got \"x\"\n"
            "--set: admin.allowed_uids[2]: expected a non-negative integer, got \"\"");
  ASSERT_TRUE(apply_override(c, "engine.memory_budget", "4GiB").ok());
  EXPECT_EQ(c.engine.memory_budget, std::uint64_t{4} << 30);
  ASSERT_TRUE(apply_override(c, "engine.memory_budget", "").ok());
  EXPECT_FALSE(c.engine.memory_budget.has_value());
}

TEST(ApplyOverride, UnknownPathsAreNamed) {
  ServeConfig c;
  EXPECT_EQ(apply_override(c, "engine.max_num_seq", "4").message(),
            "--set: engine.max_num_seq: unknown setting (did you mean engine.max_num_seqs?)");
  EXPECT_EQ(apply_override(c, "engine", "4").message(),
            "--set: engine: unknown setting (see config/sextant.example.yaml for every key)");
  EXPECT_EQ(c, ServeConfig{});
}

TEST(ServeFlagTable, EveryFlagNamesAFieldAndTheRequiredFlagsArePresent) {
  std::set<std::string_view> flags;
  for (const FlagBinding& b : serve_flag_table()) {
    EXPECT_NE(find_field(b.path), nullptr) << b.flag << " -> " << b.path;
    EXPECT_TRUE(flags.insert(b.flag).second) << b.flag << " twice";
    EXPECT_NE(serve_usage().find(b.flag), std::string::npos) << b.flag;
  }
  for (std::string_view f : {"--model", "--backend", "--tp", "--pp", "--threads", "--host", "--port", "--max-model-len",
                             "--max-num-seqs", "--max-num-batched-tokens", "--block-size", "--memory-utilization",
                             "--api-key", "--admin-socket", "--no-prefix-caching", "--log-format"}) {
    EXPECT_EQ(flags.count(f), 1u) << f;
  }
}

TEST(ParseServeFlags, FlagsAloneOverTheDefaults) {
  auto r = parse({"--model", "/m/q.gguf", "--backend=vulkan", "--tp", "2", "--pp=2", "-t", "6", "--host", "0.0.0.0",
                  "--port", "9000", "--max-model-len", "4096", "--max-num-seqs", "8", "--max-num-batched-tokens",
                  "512", "--block-size", "32", "--memory-utilization", "0.5", "--api-key", "a", "--api-key", "b,c",
                  "--admin-socket", "/run/a.sock", "--no-prefix-caching", "--log-format", "json", "--log-level",
                  "debug"});
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  const ServeConfig& c = r->config;
  EXPECT_EQ(c.model.path, "/m/q.gguf");
  EXPECT_EQ(c.model.backend, "vulkan");
  EXPECT_EQ(c.model.tp, 2);
  EXPECT_EQ(c.model.pp, 2);
  EXPECT_EQ(c.model.threads, 6);
  EXPECT_EQ(c.http.host, "0.0.0.0");
  EXPECT_EQ(c.http.port, 9000);
  EXPECT_EQ(c.engine.max_model_len, 4096);
  EXPECT_EQ(c.engine.max_num_seqs, 8);
  EXPECT_EQ(c.engine.max_num_batched_tokens, 512);
  EXPECT_EQ(c.engine.block_size, 32);
  EXPECT_DOUBLE_EQ(c.engine.memory_utilization, 0.5);
  EXPECT_EQ(c.http.api_keys, (std::vector<std::string>{"a", "b,c"}));  // one key per flag, commas kept
  EXPECT_EQ(c.admin.socket, "/run/a.sock");
  EXPECT_FALSE(c.engine.enable_prefix_caching);
  EXPECT_EQ(c.log.format, LogFormat::kJson);
  EXPECT_EQ(c.log.level, LogLevel::kDebug);
  EXPECT_FALSE(r->print_config);
  EXPECT_FALSE(r->help);
  EXPECT_EQ(r->config_file, "");
  EXPECT_TRUE(validate(c).ok()) << validate(c).to_string();
}

TEST(ParseServeFlags, FlagsBeatTheFileWhereverConfigStands) {
  TempConfig file(
      "model:\n  path: /file.gguf\n  tp: 2\nengine:\n  max_num_seqs: 4\nhttp:\n  port: 7000\n  api_keys: [f1, f2]\n");
  const std::string config_eq = "--config=" + file.path();
  for (const auto& args : std::vector<std::vector<std::string_view>>{
           {"--port", "7001", "--config", file.path(), "--api-key", "cli"},
           {"--config", file.path(), "--port", "7001", "--api-key", "cli"},
           {"--api-key=cli", "--port=7001", config_eq}}) {
    auto r = parse(args);
    ASSERT_TRUE(r.ok()) << r.status().to_string();
    EXPECT_EQ(r->config_file, file.path());
    EXPECT_EQ(r->config.http.port, 7001);                                    // the flag
    EXPECT_EQ(r->config.http.api_keys, (std::vector<std::string>{"cli"}));   // flags replace the list
    EXPECT_EQ(r->config.model.path, "/file.gguf");                           // the file
    EXPECT_EQ(r->config.model.tp, 2);
    EXPECT_EQ(r->config.engine.max_num_seqs, 4);
    EXPECT_EQ(r->config.http.host, "127.0.0.1");                             // the default
  }
}

TEST(ParseServeFlags, SetOverridesAnyKeyInOrder) {
  TempConfig file("engine:\n  max_num_seqs: 4\n");
  auto r = parse({"--set", "engine.max_num_seqs=64", "--config", file.path(), "--set=http.max_body_bytes=1MiB",
                  "--max-num-seqs", "128"});
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_EQ(r->config.engine.max_num_seqs, 128);  // the later of the two overrides
  EXPECT_EQ(r->config.http.max_body_bytes, 1u << 20);
  EXPECT_EQ(parse_error({"--set", "engine.max_num_seqs"}),
            "--set: expected PATH=VALUE such as engine.max_num_seqs=32, got \"engine.max_num_seqs\"");
  EXPECT_EQ(parse_error({"--set", "engine.nope=1"}),
            "--set: engine.nope: unknown setting (see config/sextant.example.yaml for every key)");
}

TEST(ParseServeFlags, PrintConfigAndHelp) {
  auto r = parse({"--print-config", "--port", "8080"});
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_TRUE(r->print_config);
  EXPECT_EQ(r->config.http.port, 8080);
  // What --print-config prints loads back to the same config.
  auto back = load_config_string(to_yaml(r->config), "printed");
  ASSERT_TRUE(back.ok()) << back.status().to_string();
  EXPECT_EQ(*back, r->config);

  auto help = parse({"--port", "nonsense", "--help"});
  ASSERT_TRUE(help.ok()) << help.status().to_string();
  EXPECT_TRUE(help->help);
  EXPECT_NE(serve_usage().find("--config FILE"), std::string::npos);
  EXPECT_NE(serve_usage().find("--print-config"), std::string::npos);
}

TEST(ParseServeFlags, FlagValuesUseTheFieldValidators) {
  EXPECT_EQ(parse_error({"--max-num-seqs", "abc"}),
            "--max-num-seqs: engine.max_num_seqs: expected a positive integer, got \"abc\"");
  EXPECT_EQ(parse_error({"--block-size=12"}), "--block-size: engine.block_size: expected one of 8, 16, 32, got \"12\"");
  EXPECT_EQ(parse_error({"--memory-utilization", "2"}),
            "--memory-utilization: engine.memory_utilization: expected a number in (0, 1], got \"2\"");
}

TEST(ParseServeFlags, HugeFlagValuesAreShownAsGiven) {
  EXPECT_EQ(parse_error({"--max-num-seqs", "18446744073709551615"}),
            "--max-num-seqs: engine.max_num_seqs: expected a positive integer no larger than 65536, got "
            "\"18446744073709551615\"");
  EXPECT_EQ(parse_error({"--set", "engine.max_model_len=9223372036854775808"}),
            "--set: engine.max_model_len: expected a non-negative integer no larger than 16777216, got "
            "\"9223372036854775808\"");
}

TEST(ParseServeFlags, UnknownAndMalformedOptionsAreNamed) {
  EXPECT_EQ(parse_error({"--max-num-seq", "4"}),
            "unknown option --max-num-seq; did you mean --max-num-seqs? (see sextant serve --help)");
  EXPECT_EQ(parse_error({"--frobnicate"}), "unknown option --frobnicate (see sextant serve --help)");
  // An unknown option's value is not reported again as a stray argument.
  EXPECT_EQ(parse_error({"--frobnicate", "7", "--port", "1"}),
            "unknown option --frobnicate (see sextant serve --help)");
  EXPECT_EQ(parse_error({"model.gguf"}),
            "unexpected argument \"model.gguf\" (serve takes only options; the model is --model FILE)");
  EXPECT_EQ(parse_error({"--port"}), "--port: needs a value");
  EXPECT_EQ(parse_error({"--port", "1", "--port", "2"}), "--port: given twice");
  EXPECT_EQ(parse_error({"--no-prefix-caching=yes"}), "--no-prefix-caching: takes no value");
  EXPECT_EQ(parse_error({"--config", "a.yaml", "--config", "b.yaml"}).substr(0, 21), "--config: given twice");
}

TEST(ParseServeFlags, FileAndFlagErrorsAreReportedTogether) {
  TempConfig file("engine:\n  max_num_seqs: lots\n");
  EXPECT_EQ(parse_error({"--config", file.path(), "--port", "-1", "--bogus"}),
            "unknown option --bogus (see sextant serve --help)\n" +
                file.path() + ":2:17: engine.max_num_seqs: expected a positive integer, got \"lots\"\n" +
                "--port: http.port: expected a port number from 0 (any free port) to 65535, got \"-1\"");

  auto missing = parse({"--config", "/nonexistent/sextant.yaml"});
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.status().code(), StatusCode::kNotFound);
  EXPECT_EQ(missing.status().message(),
            "cannot read config file '/nonexistent/sextant.yaml': No such file or directory");
}

TEST(ParseServeFlags, ArgvOverload) {
  const char* argv[] = {"--model", "/m.gguf", "--port", "1234"};
  auto r = parse_serve_flags(4, argv);
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_EQ(r->config.model.path, "/m.gguf");
  EXPECT_EQ(r->config.http.port, 1234);
}

}  // namespace
}  // namespace sx::daemon::config
