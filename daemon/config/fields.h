// The schema table behind ServeConfig: one Field per dotted path ("engine.max_num_seqs") with the
// validator that turns text into the value and the printer that turns it back into YAML. The YAML
// loader, the command-line overrides and to_yaml all go through this table, so a setting has one
// rule and one error message wherever it comes from. Internal to daemon/config.
//
// Threading: the table is built once (thread-safe static) and only read afterwards. Errors: the
// validators return the message text ("expected a positive integer, got \"abc\""), callers add
// the source location and the path.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "daemon/config/serve_config.h"
#include "runtime/base/status.h"

namespace sx::daemon::config {

struct Field {
  std::string_view path;       // "section.key"
  std::string_view section() const { return path.substr(0, path.find('.')); }
  std::string_view key() const { return path.substr(path.find('.') + 1); }

  bool is_list = false;        // a YAML sequence; an override gives its items separated by commas
  bool nullable = false;       // YAML null (or an empty override) resets it to "unset"
  // A scalar field that also takes a YAML sequence, handed to set() as its flow text
  // ("[[0, 1], [2, 3]]"): model.replicas' device groups.
  bool accepts_sequence = false;
  std::string expected;        // what a value must be, for messages: "a positive integer"

  // Scalar fields: parse `text` and store it. List fields: parse one item and append it. Returns
  // "" on success, else the message ("expected a positive integer, got \"abc\"").
  std::function<std::string(ServeConfig&, std::string_view text)> set;
  // List fields: remove every item. Nullable fields: reset to unset.
  std::function<void(ServeConfig&)> clear;
  // The value as YAML flow text: 16, "127.0.0.1", [0, 1], null. API keys print as kRedactedKey
  // when `redact` is true.
  std::function<std::string(const ServeConfig&, bool redact)> print;
};

// Every field in schema order (model, engine, http, admin, limits, log; fields in struct order).
const std::vector<Field>& fields();

// The field at `path`, or nullptr.
const Field* find_field(std::string_view path);

// The section names in schema order.
std::vector<std::string_view> section_names();

// The candidate closest to `word` by edit distance when it is close enough to be a likely typo,
// else "".
std::string_view closest_match(std::string_view word, std::span<const std::string_view> candidates);

// `text` as a double-quoted YAML scalar (escapes \, ", control bytes).
std::string quote_yaml(std::string_view text);

// "24GiB", "512MiB", "1.5G", "80GB", "1000" -> bytes, as daemon/commands' parse_size.
std::optional<std::uint64_t> parse_size_text(std::string_view text);

// The most problems an ErrorList keeps; the others are only counted.
inline constexpr std::size_t kMaxErrorLines = 20;

// Collects problems as "where: path: message" lines; `where` is "file:line:column" or a flag. The
// first kMaxErrorLines are kept and the rest counted, so a file of a million unknown keys costs
// twenty messages, not a million.
class ErrorList {
 public:
  // `summary_where` starts the "... and M more problems" line (the config's source name), so
  // that every line of a config error names its file; empty: the line has no prefix.
  explicit ErrorList(std::string summary_where = "") : summary_where_(std::move(summary_where)) {}

  void add(std::string_view where, std::string_view path, std::string_view message);
  bool empty() const { return lines_.empty(); }
  // False once the list keeps no more lines (adding then only counts).
  bool has_room() const { return lines_.size() < kMaxErrorLines; }
  // Appends other's kept lines (up to the cap) and adds its omitted count to ours.
  void append(const ErrorList& other);
  // OK when empty, else INVALID_ARGUMENT with the kept lines joined by '\n', then, when some
  // were omitted, "[summary_where: ]... and M more problem(s)".
  Status to_status() const;

 private:
  std::string summary_where_;
  std::vector<std::string> lines_;
  std::size_t omitted_ = 0;
};

}  // namespace sx::daemon::config
