// A small command-line parser for the sextant subcommands: declared options with values or flags,
// positional arguments, and errors that name the option at fault.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "runtime/base/status.h"

namespace sx::daemon {

class Args {
 public:
  struct Spec {
    std::vector<std::string> names;  // e.g. {"-n", "--max-tokens"}; the last is the canonical name
    bool takes_value = true;
    bool repeatable = false;
    std::string help;
    std::string metavar = "VALUE";
  };

  Args(std::string command, std::string summary, std::vector<Spec> specs, std::string positional_help = "");

  // Parses argv (without the program and command names). "--name=value" is accepted.
  Status parse(int argc, char** argv);
  std::string usage() const;

  // Any of an option's names may be used; asking for an undeclared option is a programmer error.
  bool has(std::string_view name) const;
  std::optional<std::string> get(std::string_view name) const;
  std::vector<std::string> get_all(std::string_view name) const;
  const std::vector<std::string>& positional() const { return positional_; }

  // Typed getters: the default when absent, INVALID_ARGUMENT naming the option when malformed.
  Result<std::string> get_string(std::string_view canonical, std::string fallback) const;
  Result<std::int64_t> get_int(std::string_view canonical, std::int64_t fallback, std::int64_t min_value,
                               std::int64_t max_value) const;
  Result<double> get_double(std::string_view canonical, double fallback) const;
  Result<std::uint64_t> get_bytes(std::string_view canonical, std::uint64_t fallback) const;  // 8GiB, 512MiB, 1000

 private:
  const Spec* find(std::string_view name) const;
  std::string_view canonical_name(std::string_view name) const;
  std::string command_, summary_, positional_help_;
  std::vector<Spec> specs_;
  std::map<std::string, std::vector<std::string>, std::less<>> values_;
  std::vector<std::string> positional_;
};

// "24GiB", "512MiB", "1.5G", "80GB", "1000" -> bytes (KiB/K, MiB/M, GiB/G, TiB/T are powers of 1024;
// KB, MB, GB, TB powers of 1000). INVALID_ARGUMENT ("has an unknown unit in ...", "expects a size
// such as 8GiB, ...") for anything else.
Result<std::uint64_t> parse_size(std::string_view text);

}  // namespace sx::daemon
