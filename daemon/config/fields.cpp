// The schema table: one validator and one printer per ServeConfig field.
#include "daemon/config/fields.h"

#include "daemon/config/replica_spec.h"

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <utility>

#include <fmt/ranges.h>

namespace sx::daemon::config {
namespace {

using Int = std::int64_t;

// A reference to one member that works on const and non-const configs alike.
#define SX_AT(member) [](auto& c) -> auto& { return c.member; }

constexpr Int kMaxInt = Int{1} << 40;  // a generous cap for counts and millisecond timeouts

std::string_view trim(std::string_view t) {
  while (!t.empty() && std::isspace(static_cast<unsigned char>(t.front()))) t.remove_prefix(1);
  while (!t.empty() && std::isspace(static_cast<unsigned char>(t.back()))) t.remove_suffix(1);
  return t;
}

// The offending text as shown in messages: quoted, shortened when long.
std::string shown(std::string_view text) {
  constexpr std::size_t kMax = 80;
  if (text.size() <= kMax) return quote_yaml(text);
  return quote_yaml(std::string(text.substr(0, kMax)) + "...");
}

std::string expected_got(std::string_view expected, std::string_view text) {
  return fmt::format("expected {}, got {}", expected, shown(text));
}

// A decimal integer. One beyond int64 is still an integer, only too large (or too small): it
// reads as INT64_MAX (INT64_MIN), outside every field's range, so the field's range message
// applies ("no larger than 65536") and, like every message, shows the text as written.
std::optional<Int> parse_int(std::string_view text) {
  const std::string s(trim(text));
  std::size_t i = (!s.empty() && (s[0] == '+' || s[0] == '-')) ? 1 : 0;
  if (i == s.size()) return std::nullopt;
  for (std::size_t j = i; j < s.size(); ++j) {
    if (!std::isdigit(static_cast<unsigned char>(s[j]))) return std::nullopt;
  }
  errno = 0;
  const long long v = std::strtoll(s.c_str(), nullptr, 10);  // ERANGE: LLONG_MAX / LLONG_MIN
  if (errno != 0 && errno != ERANGE) return std::nullopt;
  return static_cast<Int>(v);
}

std::optional<double> parse_number(std::string_view text) {
  const std::string s(trim(text));
  if (s.empty()) return std::nullopt;
  for (char ch : s) {  // plain decimal notation only: no hex, inf or nan
    if (!std::isdigit(static_cast<unsigned char>(ch)) && ch != '.' && ch != '-' && ch != '+' && ch != 'e' &&
        ch != 'E') {
      return std::nullopt;
    }
  }
  errno = 0;
  char* end = nullptr;
  const double v = std::strtod(s.c_str(), &end);
  if (errno != 0 || end != s.c_str() + s.size() || !std::isfinite(v)) return std::nullopt;
  return v;
}

std::optional<bool> parse_bool(std::string_view text) {
  std::string s(trim(text));
  std::transform(s.begin(), s.end(), s.begin(), [](unsigned char ch) { return std::tolower(ch); });
  if (s == "true" || s == "yes" || s == "on" || s == "1") return true;
  if (s == "false" || s == "no" || s == "off" || s == "0") return false;
  return std::nullopt;
}

// "8GiB" for exact multiples of a binary unit, else the plain number of bytes.
std::string format_size(std::uint64_t bytes) {
  constexpr std::pair<std::uint64_t, std::string_view> kUnits[] = {
      {std::uint64_t{1} << 40, "TiB"}, {std::uint64_t{1} << 30, "GiB"}, {1u << 20, "MiB"}, {1u << 10, "KiB"}};
  for (const auto& [unit, name] : kUnits) {
    if (bytes != 0 && bytes % unit == 0) return fmt::format("{}{}", bytes / unit, name);
  }
  return fmt::format("{}", bytes);
}

std::string int_description(Int min) {
  if (min == 1) return "a positive integer";
  if (min == 0) return "a non-negative integer";
  return fmt::format("an integer of at least {}", min);
}

template <class At>
Field int_field(std::string_view path, At at, Int min, Int max, std::string description = "") {
  const bool custom = !description.empty();
  if (!custom) description = int_description(min);
  const std::string over = custom ? description : fmt::format("{} no larger than {}", description, max);
  Field f;
  f.path = path;
  f.expected = description;
  f.set = [at, min, max, description, over](ServeConfig& c, std::string_view text) -> std::string {
    const auto v = parse_int(text);
    if (!v || *v < min) return expected_got(description, text);
    if (*v > max) return expected_got(over, text);
    at(c) = *v;
    return {};
  };
  f.print = [at](const ServeConfig& c, bool) { return fmt::format("{}", at(c)); };
  return f;
}

// An integer from a fixed set (block_size).
template <class At>
Field int_choice_field(std::string_view path, At at, std::vector<Int> choices) {
  Field f;
  f.path = path;
  f.expected = "one of " + fmt::format("{}", fmt::join(choices, ", "));
  f.set = [at, choices, expected = f.expected](ServeConfig& c, std::string_view text) -> std::string {
    const auto v = parse_int(text);
    if (!v || std::find(choices.begin(), choices.end(), *v) == choices.end()) return expected_got(expected, text);
    at(c) = *v;
    return {};
  };
  f.print = [at](const ServeConfig& c, bool) { return fmt::format("{}", at(c)); };
  return f;
}

// A string from a fixed set, stored as the string (model.backend).
template <class At>
Field string_choice_field(std::string_view path, At at, std::vector<std::string_view> choices) {
  Field f;
  f.path = path;
  f.expected = "one of " + fmt::format("{}", fmt::join(choices, ", "));
  f.set = [at, choices, expected = f.expected](ServeConfig& c, std::string_view text) -> std::string {
    if (std::find(choices.begin(), choices.end(), text) == choices.end()) return expected_got(expected, text);
    at(c) = std::string(text);
    return {};
  };
  f.print = [at](const ServeConfig& c, bool) { return std::string(at(c)); };
  return f;
}

// A string from a fixed set, stored as an enum (log.format, log.level).
template <class E, class At>
Field enum_field(std::string_view path, At at, std::vector<std::pair<std::string_view, E>> names) {
  Field f;
  f.path = path;
  std::vector<std::string_view> keys;
  for (const auto& [name, value] : names) keys.push_back(name);
  f.expected = "one of " + fmt::format("{}", fmt::join(keys, ", "));
  f.set = [at, names, expected = f.expected](ServeConfig& c, std::string_view text) -> std::string {
    for (const auto& [name, value] : names) {
      if (name == text) {
        at(c) = value;
        return {};
      }
    }
    return expected_got(expected, text);
  };
  f.print = [at, names](const ServeConfig& c, bool) {
    for (const auto& [name, value] : names) {
      if (value == at(c)) return std::string(name);
    }
    return std::string("null");
  };
  return f;
}

template <class At>
Field string_field(std::string_view path, At at, bool allow_empty) {
  Field f;
  f.path = path;
  f.nullable = allow_empty;  // null means "not set", the same as the empty default
  f.expected = allow_empty ? "a string" : "a non-empty string";
  f.set = [at, allow_empty, expected = f.expected](ServeConfig& c, std::string_view text) -> std::string {
    if (!allow_empty && trim(text).empty()) return expected_got(expected, text);
    at(c) = std::string(text);
    return {};
  };
  f.clear = [at](ServeConfig& c) { at(c).clear(); };
  f.print = [at](const ServeConfig& c, bool) { return quote_yaml(at(c)); };
  return f;
}

// model.replicas: a count, per-device or device groups (replica_spec.h), kept as its canonical text.
template <class At>
Field replicas_field(std::string_view path, At at) {
  Field f;
  f.path = path;
  f.accepts_sequence = true;
  f.expected = "a replica count, per-device, or device groups such as [[0, 1, 2], [3, 4, 5]]";
  f.set = [at](ServeConfig& c, std::string_view text) -> std::string {
    auto spec = parse_replica_spec(text);
    if (!spec.ok()) return spec.status().message();
    at(c) = replica_spec_text(*spec);
    return {};
  };
  f.clear = [at](ServeConfig& c) { at(c) = "1"; };
  f.print = [at](const ServeConfig& c, bool) {
    const std::string& v = at(c);
    return !v.empty() && v.front() == '[' ? v : quote_yaml(v);
  };
  return f;
}

template <class At>
Field bool_field(std::string_view path, At at) {
  Field f;
  f.path = path;
  f.expected = "true or false";
  f.set = [at](ServeConfig& c, std::string_view text) -> std::string {
    const auto v = parse_bool(text);
    if (!v) return expected_got("true or false", text);
    at(c) = *v;
    return {};
  };
  f.print = [at](const ServeConfig& c, bool) { return std::string(at(c) ? "true" : "false"); };
  return f;
}

// A number in [lo, hi], or (lo, hi] when `open_low` (memory_utilization: (0, 1]; max_step_ms:
// [0, 600000]); `expected` says so in errors.
template <class At>
Field number_field(std::string_view path, At at, double lo, bool open_low, double hi, std::string expected) {
  Field f;
  f.path = path;
  f.expected = expected;
  f.set = [at, lo, open_low, hi, expected](ServeConfig& c, std::string_view text) -> std::string {
    const auto v = parse_number(text);
    if (!v || !((open_low ? *v > lo : *v >= lo) && *v <= hi)) return expected_got(expected, text);
    at(c) = *v;
    return {};
  };
  f.print = [at](const ServeConfig& c, bool) { return fmt::format("{}", at(c)); };
  return f;
}

std::string check_size(std::string_view text, std::uint64_t min, std::uint64_t max, std::uint64_t& out) {
  const auto v = parse_size_text(text);
  if (!v) return expected_got("a size such as 16384, 16KiB or 8MiB", text);
  if (*v < min || *v > max) {
    return expected_got(fmt::format("a size from {} to {}", format_size(min), format_size(max)), text);
  }
  out = *v;
  return {};
}

template <class At>
Field bytes_field(std::string_view path, At at, std::uint64_t min, std::uint64_t max) {
  Field f;
  f.path = path;
  f.expected = "a size such as 16384, 16KiB or 8MiB";
  f.set = [at, min, max](ServeConfig& c, std::string_view text) -> std::string {
    std::uint64_t v = 0;
    std::string error = check_size(text, min, max, v);
    if (error.empty()) at(c) = v;
    return error;
  };
  f.print = [at](const ServeConfig& c, bool) { return format_size(at(c)); };
  return f;
}

// An optional size (engine.memory_budget): YAML null or an empty override unsets it.
template <class At>
Field optional_bytes_field(std::string_view path, At at, std::uint64_t min, std::uint64_t max) {
  Field f;
  f.path = path;
  f.nullable = true;
  f.expected = "a size such as 8GiB";
  f.set = [at, min, max](ServeConfig& c, std::string_view text) -> std::string {
    std::uint64_t v = 0;
    std::string error = check_size(text, min, max, v);
    if (error.empty()) at(c) = v;
    return error;
  };
  f.clear = [at](ServeConfig& c) { at(c).reset(); };
  f.print = [at](const ServeConfig& c, bool) { return at(c) ? format_size(*at(c)) : std::string("null"); };
  return f;
}

// Permission bits written in octal ("0600", "600" or "0o600").
template <class At>
Field mode_field(std::string_view path, At at) {
  Field f;
  f.path = path;
  f.expected = "an octal mode such as \"0600\"";
  f.set = [at, expected = f.expected](ServeConfig& c, std::string_view text) -> std::string {
    std::string_view digits = trim(text);
    if (digits.starts_with("0o") || digits.starts_with("0O")) digits.remove_prefix(2);
    if (digits.empty() || digits.size() > 4) return expected_got(expected, text);
    std::uint32_t v = 0;
    for (char ch : digits) {
      if (ch < '0' || ch > '7') return expected_got(expected, text);
      v = v * 8 + static_cast<std::uint32_t>(ch - '0');
    }
    if (v > 0777) return expected_got("an octal mode no larger than \"0777\"", text);
    at(c) = v;
    return {};
  };
  f.print = [at](const ServeConfig& c, bool) { return fmt::format("\"{:04o}\"", at(c)); };
  return f;
}

template <class At>
Field int_list_field(std::string_view path, At at, Int min, Int max, std::string_view list_description) {
  Field f;
  f.path = path;
  f.is_list = true;
  f.expected = std::string(list_description);
  const std::string item = int_description(min);
  const std::string over = fmt::format("{} no larger than {}", item, max);
  f.set = [at, min, max, item, over](ServeConfig& c, std::string_view text) -> std::string {
    const auto v = parse_int(text);
    if (!v || *v < min) return expected_got(item, text);
    if (*v > max) return expected_got(over, text);
    at(c).push_back(*v);
    return {};
  };
  f.clear = [at](ServeConfig& c) { at(c).clear(); };
  f.print = [at](const ServeConfig& c, bool) { return fmt::format("[{}]", fmt::join(at(c), ", ")); };
  return f;
}

template <class At>
Field string_list_field(std::string_view path, At at, std::string_view list_description, bool secret) {
  Field f;
  f.path = path;
  f.is_list = true;
  f.expected = std::string(list_description);
  f.set = [at](ServeConfig& c, std::string_view text) -> std::string {
    if (trim(text).empty()) return expected_got("a non-empty string", text);
    at(c).emplace_back(text);
    return {};
  };
  f.clear = [at](ServeConfig& c) { at(c).clear(); };
  f.print = [at, secret](const ServeConfig& c, bool redact) {
    std::vector<std::string> items;
    for (const std::string& s : at(c)) items.push_back(quote_yaml(secret && redact ? kRedactedKey : s));
    return fmt::format("[{}]", fmt::join(items, ", "));
  };
  return f;
}

std::vector<Field> build_fields() {
  std::vector<Field> v;
  // model
  v.push_back(string_field("model.path", SX_AT(model.path), /*allow_empty=*/true));
  v.push_back(string_choice_field("model.pull", SX_AT(model.pull), {"never", "missing"}));
  v.push_back(string_choice_field("model.backend", SX_AT(model.backend),
                                  {std::begin(kBackendChoices), std::end(kBackendChoices)}));
  v.push_back(int_list_field("model.devices", SX_AT(model.devices), 0, 1023,
                             "a list of device indexes such as [0, 1]"));
  v.push_back(int_field("model.threads", SX_AT(model.threads), 0, 4096));
  v.push_back(int_field("model.tp", SX_AT(model.tp), 1, kMaxRanks));
  v.push_back(int_field("model.pp", SX_AT(model.pp), 1, kMaxRanks));
  v.push_back(bool_field("model.requantize_unaligned", SX_AT(model.requantize_unaligned)));
  v.push_back(string_choice_field("model.placement", SX_AT(model.placement), {"auto", "none"}));
  v.push_back(string_field("model.topology", SX_AT(model.topology), /*allow_empty=*/true));
  v.push_back(replicas_field("model.replicas", SX_AT(model.replicas)));
  v.push_back(string_field("model.served_model_name", SX_AT(model.served_model_name), /*allow_empty=*/true));
  v.push_back(string_field("model.chat_template", SX_AT(model.chat_template), /*allow_empty=*/true));
  // engine
  v.push_back(number_field("engine.memory_utilization", SX_AT(engine.memory_utilization), 0.0, true, 1.0,
                           "a number in (0, 1]"));
  v.push_back(int_field("engine.max_model_len", SX_AT(engine.max_model_len), 0, Int{1} << 24));
  v.push_back(int_field("engine.max_num_seqs", SX_AT(engine.max_num_seqs), 1, 65536));
  v.push_back(int_field("engine.max_num_batched_tokens", SX_AT(engine.max_num_batched_tokens), 1, Int{1} << 24));
  v.push_back(int_choice_field("engine.block_size", SX_AT(engine.block_size), {8, 16, 32}));
  v.push_back(bool_field("engine.enable_prefix_caching", SX_AT(engine.enable_prefix_caching)));
  v.push_back(bool_field("engine.prefix_affinity", SX_AT(engine.prefix_affinity)));
  v.push_back(int_field("engine.prefix_snapshots", SX_AT(engine.prefix_snapshots), -1, 65536,
                        "-1 (the memory planner's choice), 0 (none) or a count up to 65536"));
  v.push_back(int_field("engine.prefix_snapshot_interval", SX_AT(engine.prefix_snapshot_interval), 0, Int{1} << 24));
  v.push_back(string_field("engine.prefix_cache_dir", SX_AT(engine.prefix_cache_dir), /*allow_empty=*/true));
  v.push_back(optional_bytes_field("engine.prefix_cache_bytes", SX_AT(engine.prefix_cache_bytes), 1u << 20,
                                   std::uint64_t{1} << 50));
  v.push_back(string_choice_field("engine.smoke_test", SX_AT(engine.smoke_test), {"auto", "on", "off"}));
  v.push_back(number_field("engine.max_step_ms", SX_AT(engine.max_step_ms), 0.0, false, 600000.0,
                           "milliseconds from 0 (off) to 600000"));
  v.push_back(number_field("engine.max_step_ratio", SX_AT(engine.max_step_ratio), 0.0, false, 1000.0,
                           "a number from 0 (no such cap) to 1000"));
  v.push_back(optional_bytes_field("engine.memory_budget", SX_AT(engine.memory_budget), 1u << 20,
                                   std::uint64_t{1} << 50));
  // http
  v.push_back(string_field("http.host", SX_AT(http.host), /*allow_empty=*/false));
  v.push_back(int_field("http.port", SX_AT(http.port), 0, 65535, "a port number from 0 (any free port) to 65535"));
  v.push_back(string_list_field("http.api_keys", SX_AT(http.api_keys), "a list of API keys such as [\"secret\"]",
                                /*secret=*/true));
  v.push_back(int_field("http.max_connections", SX_AT(http.max_connections), 1, 1 << 20));
  v.push_back(bytes_field("http.max_header_bytes", SX_AT(http.max_header_bytes), 1024, 1u << 20));
  v.push_back(bytes_field("http.max_body_bytes", SX_AT(http.max_body_bytes), 1024, std::uint64_t{1} << 32));
  v.push_back(int_field("http.header_timeout_ms", SX_AT(http.header_timeout_ms), 1, kMaxInt));
  v.push_back(int_field("http.body_timeout_ms", SX_AT(http.body_timeout_ms), 1, kMaxInt));
  v.push_back(int_field("http.keepalive_timeout_ms", SX_AT(http.keepalive_timeout_ms), 1, kMaxInt));
  v.push_back(int_field("http.write_timeout_ms", SX_AT(http.write_timeout_ms), 1, kMaxInt));
  v.push_back(bytes_field("http.max_unsent_stream_bytes", SX_AT(http.max_unsent_stream_bytes), 1024,
                          std::uint64_t{1} << 30));
  v.push_back(int_field("http.max_queued_requests", SX_AT(http.max_queued_requests), 1, 1 << 20));
  v.push_back(int_field("http.drain_timeout_ms", SX_AT(http.drain_timeout_ms), 0, kMaxInt));
  // admin
  v.push_back(string_field("admin.socket", SX_AT(admin.socket), /*allow_empty=*/false));
  v.push_back(mode_field("admin.mode", SX_AT(admin.mode)));
  v.push_back(int_list_field("admin.allowed_uids", SX_AT(admin.allowed_uids), 0, 4294967294LL,
                             "a list of user ids such as [1000]"));
  v.push_back(int_field("admin.upgrade_timeout_ms", SX_AT(admin.upgrade_timeout_ms), 1, kMaxInt));
  // limits
  v.push_back(int_field("limits.max_tokens_default", SX_AT(limits.max_tokens_default), 1, Int{1} << 24));
  v.push_back(int_field("limits.max_stop_strings", SX_AT(limits.max_stop_strings), 0, 1024));
  v.push_back(int_field("limits.max_n", SX_AT(limits.max_n), 1, 1024));
  v.push_back(int_field("limits.max_prompt_tokens", SX_AT(limits.max_prompt_tokens), 0, Int{1} << 24));
  v.push_back(int_field("limits.grammar_compile_timeout_ms", SX_AT(limits.grammar_compile_timeout_ms), 1, kMaxInt));
  v.push_back(int_field("limits.grammar_compile_threads", SX_AT(limits.grammar_compile_threads), 1, 64));
  v.push_back(int_field("limits.max_queued_grammar_compiles", SX_AT(limits.max_queued_grammar_compiles), 0, 1 << 20));
  // log
  v.push_back(enum_field<LogFormat>("log.format", SX_AT(log.format),
                                    {{"text", LogFormat::kText}, {"json", LogFormat::kJson}}));
  v.push_back(enum_field<LogLevel>("log.level", SX_AT(log.level),
                                   {{"debug", LogLevel::kDebug},
                                    {"info", LogLevel::kInfo},
                                    {"warn", LogLevel::kWarn},
                                    {"error", LogLevel::kError}}));
  v.push_back(string_field("log.dir", SX_AT(log.dir), /*allow_empty=*/true));
  v.push_back(int_field("log.keep", SX_AT(log.keep), 1, 1000));
  return v;
}

#undef SX_AT

}  // namespace

const std::vector<Field>& fields() {
  static const std::vector<Field> kFields = build_fields();
  return kFields;
}

const Field* find_field(std::string_view path) {
  for (const Field& f : fields()) {
    if (f.path == path) return &f;
  }
  return nullptr;
}

std::vector<std::string_view> section_names() {
  std::vector<std::string_view> out;
  for (const Field& f : fields()) {
    if (out.empty() || out.back() != f.section()) out.push_back(f.section());
  }
  return out;
}

std::string_view closest_match(std::string_view word, std::span<const std::string_view> candidates) {
  // Optimal string alignment distance (insertions, deletions, substitutions, transpositions).
  auto distance = [](std::string_view a, std::string_view b) {
    std::vector<std::vector<std::size_t>> d(a.size() + 1, std::vector<std::size_t>(b.size() + 1));
    for (std::size_t i = 0; i <= a.size(); ++i) d[i][0] = i;
    for (std::size_t j = 0; j <= b.size(); ++j) d[0][j] = j;
    for (std::size_t i = 1; i <= a.size(); ++i) {
      for (std::size_t j = 1; j <= b.size(); ++j) {
        const std::size_t cost = a[i - 1] == b[j - 1] ? 0 : 1;
        d[i][j] = std::min({d[i - 1][j] + 1, d[i][j - 1] + 1, d[i - 1][j - 1] + cost});
        if (i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1]) {
          d[i][j] = std::min(d[i][j], d[i - 2][j - 2] + 1);
        }
      }
    }
    return d[a.size()][b.size()];
  };
  std::string_view best;
  std::size_t best_distance = 3;  // more than two edits away is not a typo
  for (std::string_view c : candidates) {
    const std::size_t dist = distance(word, c);
    if (dist < best_distance && dist < word.size()) {
      best = c;
      best_distance = dist;
    }
  }
  return best;
}

std::string quote_yaml(std::string_view text) {
  std::string out = "\"";
  for (char ch : text) {
    const auto u = static_cast<unsigned char>(ch);
    switch (ch) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\t': out += "\\t"; break;
      case '\r': out += "\\r"; break;
      default:
        if (u < 0x20 || u == 0x7f) {
          out += fmt::format("\\x{:02X}", u);
        } else {
          out += ch;
        }
    }
  }
  out += '"';
  return out;
}

std::optional<std::uint64_t> parse_size_text(std::string_view text) {
  const std::string_view t = trim(text);
  std::size_t n = 0;
  bool seen_dot = false;
  while (n < t.size() && (std::isdigit(static_cast<unsigned char>(t[n])) || (t[n] == '.' && !seen_dot))) {
    seen_dot = seen_dot || t[n] == '.';
    ++n;
  }
  const std::string number(t.substr(0, n));
  if (number.empty() || number == ".") return std::nullopt;
  const std::string_view unit = trim(t.substr(n));
  double mult = 0;
  constexpr std::pair<std::string_view, double> kUnits[] = {
      {"", 1},         {"B", 1},         {"KiB", 0x1p10}, {"K", 0x1p10}, {"MiB", 0x1p20}, {"M", 0x1p20},
      {"GiB", 0x1p30}, {"G", 0x1p30},    {"TiB", 0x1p40}, {"T", 0x1p40}, {"KB", 1e3},     {"MB", 1e6},
      {"GB", 1e9},     {"TB", 1e12}};
  for (const auto& [name, m] : kUnits) {
    if (unit == name) mult = m;
  }
  if (mult == 0) return std::nullopt;
  const double bytes = std::strtod(number.c_str(), nullptr) * mult;
  if (!std::isfinite(bytes) || bytes >= 0x1p64) return std::nullopt;
  return static_cast<std::uint64_t>(bytes);
}

void ErrorList::add(std::string_view where, std::string_view path, std::string_view message) {
  if (!has_room()) {
    ++omitted_;
    return;
  }
  std::string line;
  if (!where.empty()) line += fmt::format("{}: ", where);
  if (!path.empty()) line += fmt::format("{}: ", path);
  line += message;
  lines_.push_back(std::move(line));
}

void ErrorList::append(const ErrorList& other) {
  for (const std::string& line : other.lines_) {
    if (has_room()) {
      lines_.push_back(line);
    } else {
      ++omitted_;
    }
  }
  omitted_ += other.omitted_;
}

Status ErrorList::to_status() const {
  if (lines_.empty()) return ok_status();
  if (omitted_ == 0) return invalid_argument_error("{}", fmt::join(lines_, "\n"));
  return invalid_argument_error("{}\n{}... and {} more problem{}", fmt::join(lines_, "\n"),
                                summary_where_.empty() ? "" : summary_where_ + ": ", omitted_,
                                omitted_ == 1 ? "" : "s");
}

}  // namespace sx::daemon::config
