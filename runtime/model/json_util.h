// Small helpers shared by the readers of JSON model files (safetensors headers and indexes,
// config.json, generation_config.json). Pure; thread-safe.
#pragma once

#include <set>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

namespace sx::model {

// "null", "a boolean", "an integer", "a number", "a string", "an array", "an object" (for messages).
inline std::string_view json_type_name(const nlohmann::json& v) {
  if (v.is_null()) return "null";
  if (v.is_boolean()) return "a boolean";
  if (v.is_number_integer()) return "an integer";
  if (v.is_number()) return "a number";
  if (v.is_string()) return "a string";
  if (v.is_array()) return "an array";
  return "an object";
}

// nlohmann::json::parse without exceptions that also catches what it would let pass: an object
// naming a key twice (the last would silently win). Returns a discarded value for invalid JSON;
// sets *duplicate to the first repeated key (the value is then still parsed).
inline nlohmann::json parse_json_unique_keys(std::string_view text, std::string* duplicate) {
  using nlohmann::json;
  std::vector<std::set<std::string, std::less<>>> open;
  auto callback = [&](int, json::parse_event_t event, json& parsed) {
    if (event == json::parse_event_t::object_start) {
      open.emplace_back();
    } else if (event == json::parse_event_t::object_end) {
      if (!open.empty()) open.pop_back();
    } else if (event == json::parse_event_t::key && !open.empty()) {
      const std::string& key = parsed.get_ref<const std::string&>();
      if (!open.back().insert(key).second && duplicate->empty()) *duplicate = key.empty() ? "\"\"" : key;
    }
    return true;
  };
  return json::parse(text.begin(), text.end(), callback, /*allow_exceptions=*/false);
}

}  // namespace sx::model
