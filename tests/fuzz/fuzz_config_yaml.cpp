// Fuzz target: the `sextant serve` YAML config reader (daemon/config/yaml_io.h,
// load_config_string) on arbitrary text. Invariants (yaml_io.h, serve_config.h):
// * failure: INVALID_ARGUMENT whose message is one problem per line, every line starting with
//   the source name ("fuzz.yaml:12:3: ..." or "fuzz.yaml: ..."), none from an exception other
//   than yaml-cpp's (such as std::bad_alloc);
// * success: every field inside the range its validator allows; to_yaml (secrets shown) loads
//   again to an equal config and prints the same text again; to_yaml with redaction loads to the
//   same config except that every API key reads kRedactedKey; validate() answers the same for the
//   printed config, is OK exactly when its cross-field rules hold, names a known key at the start
//   of every line when it is not, and with require_model also asks for model.path.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <set>
#include <string>
#include <string_view>

#include "daemon/config/serve_config.h"
#include "daemon/config/yaml_io.h"
#include "runtime/base/status.h"
#include "tests/fuzz/fuzz_check.h"

namespace {

namespace config = sx::daemon::config;
constexpr std::string_view kSource = "fuzz.yaml";

bool every_line_starts_with(std::string_view text, std::string_view prefix) {
  while (true) {
    if (!text.starts_with(prefix)) return false;
    const std::size_t nl = text.find('\n');
    if (nl == std::string_view::npos) return true;
    text.remove_prefix(nl + 1);
  }
}

bool has_line_starting_with(std::string_view text, std::string_view prefix) {
  while (true) {
    if (text.starts_with(prefix)) return true;
    const std::size_t nl = text.find('\n');
    if (nl == std::string_view::npos) return false;
    text.remove_prefix(nl + 1);
  }
}

bool blank(std::string_view s) {
  return std::all_of(s.begin(), s.end(), [](unsigned char ch) { return ch == ' ' || (ch >= '\t' && ch <= '\r'); });
}

void check_fields(const config::ServeConfig& c) {
  const auto& m = c.model;
  FUZZ_CHECK(std::find(std::begin(config::kBackendChoices), std::end(config::kBackendChoices), m.backend) !=
             std::end(config::kBackendChoices));
  for (std::int64_t d : m.devices) FUZZ_CHECK(d >= 0 && d <= 1023);
  FUZZ_CHECK(m.threads >= 0 && m.threads <= 4096);
  FUZZ_CHECK(m.tp >= 1 && m.tp <= config::kMaxRanks && m.pp >= 1 && m.pp <= config::kMaxRanks);
  const auto& e = c.engine;
  FUZZ_CHECK(e.memory_utilization > 0.0 && e.memory_utilization <= 1.0);
  FUZZ_CHECK(e.max_model_len >= 0 && e.max_model_len <= (std::int64_t{1} << 24));
  FUZZ_CHECK(e.max_num_seqs >= 1 && e.max_num_seqs <= 65536);
  FUZZ_CHECK(e.max_num_batched_tokens >= 1 && e.max_num_batched_tokens <= (std::int64_t{1} << 24));
  FUZZ_CHECK(e.block_size == 8 || e.block_size == 16 || e.block_size == 32);
  if (e.memory_budget) FUZZ_CHECK(*e.memory_budget >= (1u << 20) && *e.memory_budget <= (std::uint64_t{1} << 50));
  const auto& h = c.http;
  FUZZ_CHECK(!blank(h.host));
  FUZZ_CHECK(h.port >= 0 && h.port <= 65535);
  for (const std::string& k : h.api_keys) FUZZ_CHECK(!blank(k));
  FUZZ_CHECK(h.max_connections >= 1 && h.max_connections <= (1 << 20));
  FUZZ_CHECK(h.max_header_bytes >= 1024 && h.max_header_bytes <= (1u << 20));
  FUZZ_CHECK(h.max_body_bytes >= 1024 && h.max_body_bytes <= (std::uint64_t{1} << 32));
  constexpr std::int64_t kMaxMs = std::int64_t{1} << 40;
  for (std::int64_t ms : {h.header_timeout_ms, h.body_timeout_ms, h.keepalive_timeout_ms}) {
    FUZZ_CHECK(ms >= 1 && ms <= kMaxMs);
  }
  FUZZ_CHECK(h.drain_timeout_ms >= 0 && h.drain_timeout_ms <= kMaxMs);
  FUZZ_CHECK(h.max_queued_requests >= 1 && h.max_queued_requests <= (1 << 20));
  FUZZ_CHECK(!blank(c.admin.socket));
  FUZZ_CHECK(c.admin.mode <= 0777);
  for (std::int64_t uid : c.admin.allowed_uids) FUZZ_CHECK(uid >= 0 && uid <= 4294967294LL);
  const auto& l = c.limits;
  FUZZ_CHECK(l.max_tokens_default >= 1 && l.max_tokens_default <= (std::int64_t{1} << 24));
  FUZZ_CHECK(l.max_stop_strings >= 0 && l.max_stop_strings <= 1024);
  FUZZ_CHECK(l.max_n >= 1 && l.max_n <= 1024);
  FUZZ_CHECK(l.max_prompt_tokens >= 0 && l.max_prompt_tokens <= (std::int64_t{1} << 24));
}

// The cross-field rules of validate() (serve_config.h), restated.
bool cross_field_rules_hold(const config::ServeConfig& c) {
  const std::int64_t ranks = c.model.tp * c.model.pp;
  if (ranks > config::kMaxRanks) return false;
  const std::set<std::int64_t> distinct(c.model.devices.begin(), c.model.devices.end());
  if (distinct.size() != c.model.devices.size()) return false;
  if (!c.model.devices.empty() && static_cast<std::int64_t>(c.model.devices.size()) < ranks) return false;
  if (c.engine.max_num_batched_tokens < c.engine.max_num_seqs) return false;
  if (c.engine.max_model_len > 0 && c.limits.max_prompt_tokens > c.engine.max_model_len) return false;
  for (const std::string& k : c.http.api_keys) {
    if (k == config::kRedactedKey) return false;
  }
  return c.admin.socket.size() <= config::kMaxSocketPathBytes;
}

// Every line of a validate() error starts with the key it is about.
bool lines_name_keys(std::string_view message) {
  static constexpr std::string_view kKeys[] = {
      "model.path: ", "model.tp * model.pp: ", "model.devices[", "model.devices: ", "engine.max_num_batched_tokens: ",
      "limits.max_prompt_tokens: ", "http.api_keys[", "admin.socket: "};
  while (true) {
    if (std::none_of(std::begin(kKeys), std::end(kKeys), [&](std::string_view k) { return message.starts_with(k); })) {
      return false;
    }
    const std::size_t nl = message.find('\n');
    if (nl == std::string_view::npos) return true;
    message.remove_prefix(nl + 1);
  }
}

void check_validate(const config::ServeConfig& c, const config::ServeConfig& reloaded) {
  const sx::Status v = config::validate(c, {.require_model = false});
  const sx::Status v2 = config::validate(reloaded, {.require_model = false});
  FUZZ_CHECK(v.code() == v2.code() && v.message() == v2.message());
  FUZZ_CHECK(v.ok() == cross_field_rules_hold(c));
  if (!v.ok()) {
    FUZZ_CHECK(v.code() == sx::StatusCode::kInvalidArgument);
    FUZZ_CHECK(lines_name_keys(v.message()));
  }
  const sx::Status with_model = config::validate(c);
  FUZZ_CHECK(with_model.ok() == (v.ok() && !c.model.path.empty()));
  if (c.model.path.empty()) FUZZ_CHECK(with_model.message().starts_with("model.path: "));
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  const sx::Result<config::ServeConfig> loaded = config::load_config_string(text, kSource);
  if (!loaded.ok()) {
    FUZZ_CHECK(loaded.status().code() == sx::StatusCode::kInvalidArgument);
    FUZZ_CHECK(!loaded.status().message().empty());
    FUZZ_CHECK(every_line_starts_with(loaded.status().message(), std::string(kSource) + ":"));
    // Only yaml-cpp's exceptions are expected: "cannot parse: <what()>" is the catch-all for any
    // other (std::bad_alloc from a parser that allocates without bound, when the replay driver's
    // memory cap stops it; libFuzzer reports that as out-of-memory first).
    FUZZ_CHECK(!has_line_starting_with(loaded.status().message(), std::string(kSource) + ": cannot parse: "));
    return 0;
  }
  const config::ServeConfig& c = *loaded;
  check_fields(c);

  const std::string printed = config::to_yaml(c, {.redact_secrets = false});
  const sx::Result<config::ServeConfig> reloaded = config::load_config_string(printed, "fuzz-printed.yaml");
  FUZZ_CHECK(reloaded.ok());
  FUZZ_CHECK(*reloaded == c);
  FUZZ_CHECK(config::to_yaml(*reloaded, {.redact_secrets = false}) == printed);

  const std::string redacted_text = config::to_yaml(c);
  if (c.http.api_keys.empty()) {
    // Nothing to redact: the same text but for the first line (saves a third parse per input).
    FUZZ_CHECK(redacted_text.substr(redacted_text.find('\n')) == printed.substr(printed.find('\n')));
  } else {
    const sx::Result<config::ServeConfig> redacted = config::load_config_string(redacted_text, "fuzz-redacted.yaml");
    FUZZ_CHECK(redacted.ok());
    config::ServeConfig expected = c;
    for (std::string& k : expected.http.api_keys) k = std::string(config::kRedactedKey);
    FUZZ_CHECK(*redacted == expected);
  }

  check_validate(c, *reloaded);
  return 0;
}
