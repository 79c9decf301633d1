// OptionReader.
#include "runtime/hal/device_options.h"

#include <algorithm>
#include <charconv>

#include <fmt/ranges.h>

namespace sx::hal {

const std::string* OptionReader::find(std::string_view name) {
  if (std::find(known_.begin(), known_.end(), name) == known_.end()) known_.emplace_back(name);
  const auto it = options_.values().find(name);
  return it == options_.values().end() ? nullptr : &it->second;
}

Result<std::int64_t> OptionReader::integer(std::string_view name, std::int64_t fallback, std::int64_t lo,
                                           std::int64_t hi) {
  const std::string* text = find(name);
  if (text == nullptr) return fallback;
  std::int64_t v = 0;
  const char* end = text->data() + text->size();
  const auto [p, ec] = std::from_chars(text->data(), end, v);
  if (ec != std::errc() || p != end || v < lo || v > hi) {
    return invalid_argument_error("backend '{}': device option '{}' must be an integer in [{}, {}], got '{}'", backend_,
                                  name, lo, hi, *text);
  }
  return v;
}

Result<bool> OptionReader::flag(std::string_view name, bool fallback) {
  const std::string* text = find(name);
  if (text == nullptr) return fallback;
  if (*text == "true") return true;
  if (*text == "false") return false;
  return invalid_argument_error("backend '{}': device option '{}' must be true or false, got '{}'", backend_, name,
                                *text);
}

Result<std::string> OptionReader::choice(std::string_view name, std::string_view fallback,
                                         std::initializer_list<std::string_view> choices) {
  const std::string* text = find(name);
  if (text == nullptr) return std::string(fallback);
  if (std::find(choices.begin(), choices.end(), *text) != choices.end()) return *text;
  return invalid_argument_error("backend '{}': device option '{}' must be one of {}, got '{}'", backend_, name,
                                fmt::join(choices, ", "), *text);
}

Status OptionReader::finish() const {
  for (const auto& [name, value] : options_.values()) {
    if (std::find(known_.begin(), known_.end(), name) == known_.end()) {
      return invalid_argument_error("backend '{}' has no device option '{}' (it takes: {})", backend_, name,
                                    fmt::join(known_, ", "));
    }
  }
  return ok_status();
}

}  // namespace sx::hal
