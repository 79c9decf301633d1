// HTTP header lists with case-insensitive lookup, shared by requests and responses.
//
// Headers keep the order and the spelling they were given (duplicates allowed, as on the wire);
// lookups compare names ASCII-case-insensitively (RFC 9110 §5.1). Values are stored as received,
// without the surrounding whitespace llhttp already strips.
//
// Threading: a plain value type; no internal synchronisation.
#pragma once

#include <cstddef>
#include <initializer_list>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace sx::daemon::http {

// ASCII case-insensitive equality (header names, tokens).
bool iequals(std::string_view a, std::string_view b);

class Headers {
 public:
  using Entry = std::pair<std::string, std::string>;
  using const_iterator = std::vector<Entry>::const_iterator;

  Headers() = default;
  Headers(std::initializer_list<Entry> entries) : entries_(entries) {}

  // Appends a field (keeps any existing ones with the same name).
  void add(std::string name, std::string value);
  // Replaces every field named `name` by one field with `value`.
  void set(std::string name, std::string value);
  // Removes every field named `name`; returns how many were removed.
  size_t remove(std::string_view name);

  // The first value of `name`, if present.
  std::optional<std::string_view> get(std::string_view name) const;
  // Every value of `name`, in order.
  std::vector<std::string_view> get_all(std::string_view name) const;
  bool has(std::string_view name) const { return get(name).has_value(); }
  // True when a comma-separated field `name` lists `token` (case-insensitive), across all of its
  // occurrences, e.g. has_token("Connection", "close").
  bool has_token(std::string_view name, std::string_view token) const;

  size_t size() const { return entries_.size(); }
  bool empty() const { return entries_.empty(); }
  const_iterator begin() const { return entries_.begin(); }
  const_iterator end() const { return entries_.end(); }

 private:
  std::vector<Entry> entries_;
};

}  // namespace sx::daemon::http
