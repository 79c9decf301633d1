// Options for the devices of one backend, by name (DESIGN.md §4): what only that backend means
// (the CPU's threads, memory budget, strict mode and fault injection) passes through the engine and
// the daemon as text they do not interpret. Each backend documents the names it takes and refuses
// any other, with INVALID_ARGUMENT naming it and the names it knows, so that a setting meant for
// another backend is never silently dropped. Integers are decimal, booleans "true" / "false";
// setting a name again replaces its value.
//
// Threading: a value type; OptionReader is used by one thread.
#pragma once

#include <cstdint>
#include <functional>
#include <initializer_list>
#include <map>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include "runtime/base/status.h"

namespace sx::hal {

class DeviceOptions {
 public:
  template <typename T>
  DeviceOptions& set(std::string_view name, const T& value) {
    if constexpr (std::is_same_v<T, bool>) {
      values_[std::string(name)] = value ? "true" : "false";
    } else if constexpr (std::is_integral_v<T>) {
      values_[std::string(name)] = std::to_string(value);
    } else {
      values_[std::string(name)] = std::string(value);
    }
    return *this;
  }
  const std::map<std::string, std::string, std::less<>>& values() const { return values_; }

 private:
  std::map<std::string, std::string, std::less<>> values_;
};

// How a backend reads its options: each getter returns the value of a name (or its default) and
// marks the name known; finish() then refuses every name that was set but is not known.
class OptionReader {
 public:
  OptionReader(std::string_view backend, const DeviceOptions& options) : backend_(backend), options_(options) {}
  // An integer in [lo, hi]; INVALID_ARGUMENT naming the backend, the option and the range otherwise.
  Result<std::int64_t> integer(std::string_view name, std::int64_t fallback, std::int64_t lo, std::int64_t hi);
  Result<bool> flag(std::string_view name, bool fallback);
  // One of `choices`; INVALID_ARGUMENT listing them otherwise.
  Result<std::string> choice(std::string_view name, std::string_view fallback,
                             std::initializer_list<std::string_view> choices);
  Status finish() const;

 private:
  const std::string* find(std::string_view name);
  std::string backend_;
  const DeviceOptions& options_;
  std::vector<std::string> known_;
};

}  // namespace sx::hal
