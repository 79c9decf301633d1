// The pieces of `sextant ctl` that are worth testing on their own: turning "key=value" arguments
// into request fields, and printing a result for people.
//
// Threading: pure functions. Errors: returned as values; nothing here throws.
#pragma once

#include <string>
#include <string_view>
#include <utility>

#include <nlohmann/json.hpp>

#include "runtime/base/status.h"

namespace sx::daemon {

// The JSON value of a command-line value: JSON literals are taken as such ("3" -> 3, "0.5" -> 0.5,
// "true" -> true, "null" -> null, "[1,2]" -> an array, "\"7\"" -> the string "7"); anything else is
// the text itself as a string ("draft", "/models/a.gguf", "0600").
nlohmann::json parse_ctl_value(std::string_view text);

// "key=value" -> (key, parse_ctl_value(value)). INVALID_ARGUMENT for a missing '=' or key, and for
// the key "cmd" (the command is the first argument).
Result<std::pair<std::string, nlohmann::json>> parse_ctl_argument(std::string_view argument);

// The human form of a result, ending with a newline:
//   an object: one "key: value" line per field, nested objects indented by two spaces under
//     "key:", arrays of scalars joined with ", ", arrays holding objects or arrays as "- " items
//     (an object item's first field on the "- " line, the others aligned under it), empty arrays
//     and objects as "(none)";
//   a string containing newlines (e.g. the "plan" text): printed as a block under "key:", each line
//     indented by two more spaces;
//   scalars: strings as they are, numbers and booleans as in JSON;
//   null or an empty object at the top: "ok".
std::string format_ctl_human(const nlohmann::json& result);

}  // namespace sx::daemon
