// `sextant ctl`: argument values and the human form of results.
#include "daemon/commands/ctl_format.h"

namespace sx::daemon {

namespace {

using nlohmann::json;

bool is_multiline(const json& v) {
  return v.is_string() && v.get_ref<const std::string&>().find('\n') != std::string::npos;
}

bool is_plain_scalar(const json& v) { return !v.is_structured() && !is_multiline(v); }

std::string scalar_text(const json& v) {
  if (v.is_string()) return v.get<std::string>();
  return v.dump(-1, ' ', false, json::error_handler_t::replace);
}

std::string joined(const json& array) {
  std::string out;
  for (const json& item : array) {
    if (!out.empty()) out += ", ";
    out += scalar_text(item);
  }
  return out;
}

bool all_plain_scalars(const json& array) {
  for (const json& item : array) {
    if (!is_plain_scalar(item)) return false;
  }
  return true;
}

void append_block(std::string_view text, size_t indent, std::string& out) {
  if (text.ends_with('\n')) text.remove_suffix(1);
  const std::string pad(indent, ' ');
  for (;;) {
    size_t newline = text.find('\n');
    std::string_view line = text.substr(0, newline);
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    if (!line.empty()) out += pad;
    out.append(line);
    out += '\n';
    if (newline == std::string_view::npos) break;
    text.remove_prefix(newline + 1);
  }
}

void append_items(const json& array, size_t indent, std::string& out);

void append_object(const json& object, size_t indent, std::string& out) {
  const std::string pad(indent, ' ');
  for (const auto& [key, value] : object.items()) {
    if (value.is_structured() && value.empty()) {
      out += pad + key + ": (none)\n";
    } else if (value.is_object()) {
      out += pad + key + ":\n";
      append_object(value, indent + 2, out);
    } else if (value.is_array()) {
      if (all_plain_scalars(value)) {
        out += pad + key + ": " + joined(value) + "\n";
      } else {
        out += pad + key + ":\n";
        append_items(value, indent + 2, out);
      }
    } else if (is_multiline(value)) {
      out += pad + key + ":\n";
      append_block(value.get_ref<const std::string&>(), indent + 2, out);
    } else {
      out += pad + key + ": " + scalar_text(value) + "\n";
    }
  }
}

void append_items(const json& array, size_t indent, std::string& out) {
  const std::string pad(indent, ' ');
  for (const json& item : array) {
    if (item.is_structured() && item.empty()) {
      out += pad + "- (none)\n";
    } else if (item.is_object()) {
      // The object's fields one level deeper, its first line starting with the dash.
      std::string nested;
      append_object(item, indent + 2, nested);
      out += pad + "- " + nested.substr(indent + 2);
    } else if (item.is_array()) {
      if (all_plain_scalars(item)) {
        out += pad + "- " + joined(item) + "\n";
      } else {
        out += pad + "-\n";
        append_items(item, indent + 2, out);
      }
    } else if (is_multiline(item)) {
      out += pad + "-\n";
      append_block(item.get_ref<const std::string&>(), indent + 2, out);
    } else {
      out += pad + "- " + scalar_text(item) + "\n";
    }
  }
}

}  // namespace

nlohmann::json parse_ctl_value(std::string_view text) {
  json value = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (value.is_discarded()) return std::string(text);
  return value;
}

Result<std::pair<std::string, nlohmann::json>> parse_ctl_argument(std::string_view argument) {
  size_t eq = argument.find('=');
  if (eq == std::string_view::npos) {
    return invalid_argument_error("expected key=value after the command, got '{}'", argument);
  }
  if (eq == 0) return invalid_argument_error("'{}' has no key before '='", argument);
  std::string key(argument.substr(0, eq));
  if (key == "cmd") {
    return invalid_argument_error("'cmd' cannot be set with key=value: the command is the first argument");
  }
  return std::make_pair(std::move(key), parse_ctl_value(argument.substr(eq + 1)));
}

std::string format_ctl_human(const nlohmann::json& result) {
  std::string out;
  if (result.is_null() || (result.is_object() && result.empty())) return "ok\n";
  if (result.is_object()) {
    append_object(result, 0, out);
  } else if (result.is_array()) {
    if (result.empty()) return "(none)\n";
    append_items(result, 0, out);
  } else if (is_multiline(result)) {
    append_block(result.get_ref<const std::string&>(), 0, out);
  } else {
    out = scalar_text(result) + "\n";
  }
  return out;
}

}  // namespace sx::daemon
