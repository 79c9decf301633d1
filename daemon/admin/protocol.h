// The wire format of the admin API (daemon/admin): newline-delimited JSON, one request object per
// line ({"cmd": "<name>", ...args}), exactly one response line per request, in order:
//   success  {"ok": true, "result": <any JSON>}
//   error    {"ok": false, "error": {"code": "<canonical code name>", "message": "..."}}
// The code name is the one sx::status_code_name() gives (INVALID_ARGUMENT, NOT_FOUND, ...).
//
// Shared by the server (admin_server.h) and the blocking client (admin_client.h).
//
// Threading: pure functions. Errors: returned as values; nothing here throws.
#pragma once

#include <optional>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "runtime/base/status.h"

namespace sx::daemon::admin {

// The inverse of sx::status_code_name(): "INVALID_ARGUMENT" -> kInvalidArgument; nullopt for a
// name that is not a canonical code (OK included: an error response never carries it).
std::optional<StatusCode> status_code_from_name(std::string_view name);

// Serialises a JSON value on one line (invalid UTF-8 in strings is replaced, never thrown).
std::string dump_line(const nlohmann::json& value);

// The response line for `result`, newline included.
std::string encode_response(const Result<nlohmann::json>& result);
std::string encode_error(const Status& status);

// Parses one response line (with or without its newline) back into what the server meant: the
// "result" (null when absent) or the error as a Status (an unknown code name becomes INTERNAL with
// the name kept in the message). A line that is not a response object is DATA_LOSS.
Result<nlohmann::json> decode_response(std::string_view line);

// Parses one request line: a JSON object whose "cmd" is a non-empty string. INVALID_ARGUMENT
// saying what is wrong (malformed JSON with the parser's position, not an object, no "cmd").
Result<nlohmann::json> decode_request(std::string_view line);

}  // namespace sx::daemon::admin
