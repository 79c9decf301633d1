// Command-line overrides for `sextant serve`: dotted-path overrides ("engine.max_num_seqs=32"),
// the table of serve flags and the settings they set, and the parser that layers defaults <- the
// --config file <- flags (flags win regardless of where --config stands on the line).
//
// Errors: INVALID_ARGUMENT listing every problem, one per line, as "<flag>: <yaml path>: <what is
// wrong>" with the same validators and wording as the YAML loader, e.g.
//   --max-num-seqs: engine.max_num_seqs: expected a positive integer, got "abc"
// plus the --config file's own errors (yaml_io.h). Unknown options are named, with a did-you-mean.
//
// Threading: the functions are reentrant; the flag table is immutable.
#pragma once

#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "daemon/config/serve_config.h"
#include "runtime/base/status.h"

namespace sx::daemon::config {

// One serve flag and the setting it overrides.
struct FlagBinding {
  std::string_view flag;         // "--max-num-seqs"
  std::string_view alias;        // a short form ("-m"), or ""
  std::string_view path;         // "engine.max_num_seqs"
  bool takes_value = true;       // false: the flag alone sets fixed_value
  std::string_view fixed_value;  // the value a flag without one sets ("--no-prefix-caching" -> "false")
  bool repeatable = false;       // each occurrence adds one list item; together they replace the list
  std::string_view metavar;
  std::string_view help;
};

// --model, --backend, --tp, --pp, --threads, --host, --port, --max-model-len, --max-num-seqs,
// --max-num-batched-tokens, --block-size, --memory-utilization, --api-key (repeatable),
// --admin-socket, --no-prefix-caching, --log-format, --log-level.
std::span<const FlagBinding> serve_flag_table();

// Sets the field at the dotted `path` from `value` with the field's validator. A list takes its
// items separated by commas ("0,1"; "" empties it); an optional field is unset by "". Errors name
// `source`, the path and the value; an unknown path is named with a did-you-mean.
Status apply_override(ServeConfig& config, std::string_view path, std::string_view value,
                      std::string_view source = "--set");

// What `sextant serve ARGS...` asks for.
struct ServeInvocation {
  ServeConfig config;        // defaults <- --config file <- flags, each field checked (not validate())
  std::string config_file;   // the --config path, "" when none
  bool print_config = false; // --print-config: print to_yaml(config) and exit
  bool help = false;         // -h/--help: print serve_usage() and exit (nothing else was read)
};

// Parses the arguments after `serve`: --config FILE, --print-config, --set PATH=VALUE
// (repeatable), -h/--help and the flags of serve_flag_table(); "--flag=value" and "--flag value"
// both work. Positional arguments, unknown options, missing values and a non-repeatable flag given
// twice are errors. The cross-field validate() is left to the caller (it depends on whether a
// model is needed, e.g. not for --print-config).
Result<ServeInvocation> parse_serve_flags(std::span<const std::string_view> args);
Result<ServeInvocation> parse_serve_flags(int argc, const char* const* argv);

// The help text of `sextant serve`.
std::string serve_usage();

}  // namespace sx::daemon::config
