// Reading ServeConfig from YAML and printing it back as YAML.
//
// Errors: INVALID_ARGUMENT whose message lists every problem found, one per line, each as
// "<source>:<line>:<column>: <yaml path>: <what is wrong>", e.g.
//   sextant.yaml:12:3: engine.max_num_seqs: expected a positive integer, got "abc"
// Problems: YAML syntax, a top level that is not a map, unknown sections and keys (with a
// did-you-mean), duplicate keys, wrong shapes (a list where a number goes) and values that a
// field's validator refuses. A file that cannot be read is NOT_FOUND / PERMISSION_DENIED /
// INVALID_ARGUMENT "cannot read config file '<path>': <reason>"; a path that is not a regular file
// is refused at once, without blocking: "...: not a regular file (a FIFO)" (a directory, a
// character device such as /dev/zero, ...; runtime/base/regular_file.h). yaml-cpp exceptions are
// caught here and never leave this module.
//
// Bounds: a config of more than kMaxConfigBytes is refused before it is read or parsed, with its
// size and the limit; text nested deeper than kMaxConfigNesting levels (flow brackets [ { and block
// indentation or "- " together; a config needs 4) is refused before yaml-cpp, which recurses, sees
// it: "<source>:<line>:<column>: nested more than 64 levels deep ..."; the message keeps the first
// kMaxErrorLines problems (fields.h) and ends "<source>: ... and M more problems". A control
// byte YAML does not allow (anything below 0x20 but tab, LF, CR; and 0x7f) is a syntax error
// naming its position, key names and yaml-cpp's messages are shown with control bytes as \xNN, so
// every problem is one line starting with the source; and input on which yaml-cpp 0.7 stops making
// progress (a ',' at the top level: its LoadAll would loop until memory runs out) is "YAML syntax
// error: unexpected ','" at that position.
//
// Threading: the functions are reentrant; they share no state.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "daemon/config/serve_config.h"
#include "runtime/base/status.h"

namespace sx::daemon::config {

// The largest config file (or string) read: 1 MiB, far above any real config (a few KiB).
inline constexpr std::uint64_t kMaxConfigBytes = std::uint64_t{1} << 20;
// The deepest nesting handed to yaml-cpp.
inline constexpr int kMaxConfigNesting = 64;

// Parses `text` over the defaults. An empty document (or one with only comments) is a valid
// all-defaults config. `source_name` (usually the file name) prefixes every message. Fields are
// checked one by one; the cross-field rules are validate()'s.
Result<ServeConfig> load_config_string(std::string_view text, std::string_view source_name);

// Reads the file at `path` and parses it as load_config_string(text, path).
Result<ServeConfig> load_config_file(const std::string& path);

struct PrintOptions {
  bool redact_secrets = true;  // API keys print as kRedactedKey
};

// The whole config as YAML, every key present, sections in schema order. Loading the result gives
// back an equal config (with redact_secrets, equal except that each API key reads kRedactedKey).
std::string to_yaml(const ServeConfig& config, PrintOptions options = {});

}  // namespace sx::daemon::config
