// The admin wire format: newline-delimited JSON requests and responses.
#include "daemon/admin/protocol.h"

#include <exception>

#include "runtime/base/json_parse.h"
#include "runtime/base/json_depth.h"

namespace sx::daemon::admin {

namespace {

constexpr StatusCode kAllCodes[] = {
    StatusCode::kCancelled,         StatusCode::kInvalidArgument,  StatusCode::kDeadlineExceeded,
    StatusCode::kNotFound,          StatusCode::kAlreadyExists,    StatusCode::kPermissionDenied,
    StatusCode::kResourceExhausted, StatusCode::kFailedPrecondition, StatusCode::kAborted,
    StatusCode::kOutOfRange,        StatusCode::kUnimplemented,    StatusCode::kInternal,
    StatusCode::kUnavailable,       StatusCode::kDataLoss,
};

// "[json.exception.parse_error.101] parse error at line 1, ..." -> "parse error at line 1, ...".
std::string parser_message(const char* what) {
  std::string_view text(what);
  if (text.starts_with("[json.exception.")) {
    size_t end = text.find("] ");
    if (end != std::string_view::npos) text.remove_prefix(end + 2);
  }
  return std::string(text);
}

std::string_view trim_line(std::string_view line) {
  while (!line.empty() && (line.back() == '\n' || line.back() == '\r')) line.remove_suffix(1);
  return line;
}

}  // namespace

std::optional<StatusCode> status_code_from_name(std::string_view name) {
  for (StatusCode code : kAllCodes) {
    if (status_code_name(code) == name) return code;
  }
  return std::nullopt;
}

std::string dump_line(const nlohmann::json& value) {
  return value.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

std::string encode_error(const Status& status) {
  // An OK status has no place in an error response: report it as the programmer error it is.
  StatusCode code = status.ok() ? StatusCode::kInternal : status.code();
  std::string message = status.ok() ? std::string("an error response was built from an OK status")
                                    : status.message();
  nlohmann::json line = {{"ok", false},
                         {"error", {{"code", std::string(status_code_name(code))}, {"message", message}}}};
  return dump_line(line) + "\n";
}

std::string encode_response(const Result<nlohmann::json>& result) {
  if (!result.ok()) return encode_error(result.status());
  nlohmann::json line = {{"ok", true}, {"result", result.value()}};
  return dump_line(line) + "\n";
}

Result<nlohmann::json> decode_response(std::string_view line) {
  line = trim_line(line);
  if (json_nesting_depth(line) > kMaxJsonDepth) {
    return data_loss_error("the admin socket answered a line nested deeper than {} levels", kMaxJsonDepth);
  }
  nlohmann::json parsed = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
  if (parsed.is_discarded() || !parsed.is_object() || !parsed.contains("ok") || !parsed["ok"].is_boolean()) {
    return data_loss_error("the admin socket answered something that is not a response line: '{}'",
                           line.substr(0, 200));
  }
  if (parsed["ok"].get<bool>()) {
    auto it = parsed.find("result");
    return it == parsed.end() ? nlohmann::json(nullptr) : std::move(*it);
  }
  const nlohmann::json* error = parsed.contains("error") ? &parsed["error"] : nullptr;
  std::string code_name = "INTERNAL";
  std::string message = "the daemon reported an error without a message";
  if (error != nullptr && error->is_object()) {
    if (error->contains("code") && (*error)["code"].is_string()) code_name = (*error)["code"].get<std::string>();
    if (error->contains("message") && (*error)["message"].is_string()) {
      message = (*error)["message"].get<std::string>();
    }
  }
  std::optional<StatusCode> code = status_code_from_name(code_name);
  if (!code) return internal_error("{} (unknown error code '{}')", message, code_name);
  return Status(*code, std::move(message));
}

Result<nlohmann::json> decode_request(std::string_view line) {
  line = trim_line(line);
  if (const std::size_t depth = json_nesting_depth(line); depth > kMaxJsonDepth) {
    return invalid_argument_error("the request nests JSON {} levels deep; at most {} are accepted", depth,
                                  kMaxJsonDepth);
  }
  JsonParse parsed = parse_json(line, /*reject_duplicate_keys=*/true);  // two "cmd"s: which one?
  if (!parsed.ok()) return invalid_argument_error("the request is not valid JSON: {}", parser_message(parsed.error.c_str()));
  nlohmann::json request = std::move(parsed.value);
  if (!request.is_object()) {
    return invalid_argument_error("a request must be a JSON object such as {{\"cmd\": \"status\"}} (got a {})",
                                  request.type_name());
  }
  auto cmd = request.find("cmd");
  if (cmd == request.end()) {
    return invalid_argument_error("the request has no \"cmd\" field (e.g. {{\"cmd\": \"status\"}})");
  }
  if (!cmd->is_string() || cmd->get_ref<const std::string&>().empty()) {
    return invalid_argument_error("\"cmd\" must be a non-empty string naming a command (got {})",
                                  dump_line(*cmd));
  }
  return request;
}

}  // namespace sx::daemon::admin
