// Args implementation.
#include "daemon/commands/args.h"

#include <cerrno>
#include <cmath>
#include <cstdlib>

namespace sx::daemon {

Args::Args(std::string command, std::string summary, std::vector<Spec> specs, std::string positional_help)
    : command_(std::move(command)),
      summary_(std::move(summary)),
      positional_help_(std::move(positional_help)),
      specs_(std::move(specs)) {
  specs_.push_back({{"-h", "--help"}, false, false, "show this help", ""});
}

const Args::Spec* Args::find(std::string_view name) const {
  for (const Spec& s : specs_) {
    for (const std::string& n : s.names) {
      if (n == name) return &s;
    }
  }
  return nullptr;
}

Status Args::parse(int argc, char** argv) {
  for (int i = 0; i < argc; ++i) {
    std::string_view a = argv[i];
    if (a == "--") {
      for (++i; i < argc; ++i) positional_.emplace_back(argv[i]);
      break;
    }
    if (a.size() < 2 || a[0] != '-' || (a[1] >= '0' && a[1] <= '9')) {
      positional_.emplace_back(a);
      continue;
    }
    std::string_view name = a;
    std::optional<std::string> inline_value;
    if (const auto eq = a.find('='); a.starts_with("--") && eq != std::string_view::npos) {
      name = a.substr(0, eq);
      inline_value = std::string(a.substr(eq + 1));
    }
    const Spec* spec = find(name);
    if (spec == nullptr) {
      return invalid_argument_error("sextant {}: unknown option '{}' (see sextant {} --help)", command_, name, command_);
    }
    const std::string& canonical = spec->names.back();
    if (!spec->repeatable && values_.count(canonical) != 0) {
      return invalid_argument_error("sextant {}: option {} given twice", command_, canonical);
    }
    if (!spec->takes_value) {
      if (inline_value) return invalid_argument_error("sextant {}: option {} takes no value", command_, canonical);
      values_[canonical].emplace_back("");
      continue;
    }
    if (inline_value) {
      values_[canonical].push_back(*inline_value);
    } else {
      if (i + 1 >= argc) return invalid_argument_error("sextant {}: option {} needs a value", command_, canonical);
      values_[canonical].emplace_back(argv[++i]);
    }
  }
  return ok_status();
}

std::string Args::usage() const {
  std::string out = fmt::format("usage: sextant {} [options] {}\n{}\n\noptions:\n", command_, positional_help_, summary_);
  for (const Spec& s : specs_) {
    std::string names;
    for (const std::string& n : s.names) names += (names.empty() ? "" : ", ") + n;
    if (s.takes_value) names += " " + s.metavar;
    out += fmt::format("  {:<28} {}\n", names, s.help);
  }
  return out;
}

std::string_view Args::canonical_name(std::string_view name) const {
  const Spec* spec = find(name);
  if (spec == nullptr) fatal("Args", fmt::format("sextant {}: option {} was never declared", command_, name));
  return spec->names.back();
}

bool Args::has(std::string_view name) const { return values_.find(canonical_name(name)) != values_.end(); }

std::optional<std::string> Args::get(std::string_view name) const {
  auto it = values_.find(canonical_name(name));
  if (it == values_.end()) return std::nullopt;
  return it->second.back();
}

std::vector<std::string> Args::get_all(std::string_view name) const {
  auto it = values_.find(canonical_name(name));
  return it == values_.end() ? std::vector<std::string>{} : it->second;
}

Result<std::string> Args::get_string(std::string_view canonical, std::string fallback) const {
  auto v = get(canonical);
  return v ? *v : fallback;
}

Result<std::int64_t> Args::get_int(std::string_view canonical, std::int64_t fallback, std::int64_t min_value,
                                   std::int64_t max_value) const {
  auto v = get(canonical);
  if (!v) return fallback;
  errno = 0;
  char* end = nullptr;
  const long long x = std::strtoll(v->c_str(), &end, 10);
  if (v->empty() || *end != '\0' || errno != 0) {
    return invalid_argument_error("sextant {}: {} expects an integer, got '{}'", command_, canonical, *v);
  }
  if (x < min_value || x > max_value) {
    return invalid_argument_error("sextant {}: {} must be in [{}, {}], got {}", command_, canonical, min_value,
                                  max_value, x);
  }
  return static_cast<std::int64_t>(x);
}

Result<double> Args::get_double(std::string_view canonical, double fallback) const {
  auto v = get(canonical);
  if (!v) return fallback;
  errno = 0;
  char* end = nullptr;
  const double x = std::strtod(v->c_str(), &end);
  if (v->empty() || *end != '\0' || errno != 0 || !std::isfinite(x)) {
    return invalid_argument_error("sextant {}: {} expects a number, got '{}'", command_, canonical, *v);
  }
  return x;
}

Result<std::uint64_t> Args::get_bytes(std::string_view canonical, std::uint64_t fallback) const {
  auto v = get(canonical);
  if (!v) return fallback;
  auto bytes = parse_size(*v);
  if (!bytes.ok()) return invalid_argument_error("sextant {}: {} {}", command_, canonical, bytes.status().message());
  return *bytes;
}

Result<std::uint64_t> parse_size(std::string_view text) {
  const std::string s(text);
  char* end = nullptr;
  errno = 0;
  const double x = std::strtod(s.c_str(), &end);
  const std::string_view unit = end;
  double mult = 1;
  if (unit == "" || unit == "B") mult = 1;
  else if (unit == "KiB" || unit == "K") mult = 1024.0;
  else if (unit == "MiB" || unit == "M") mult = 1024.0 * 1024;
  else if (unit == "GiB" || unit == "G") mult = 1024.0 * 1024 * 1024;
  else if (unit == "TiB" || unit == "T") mult = 1024.0 * 1024 * 1024 * 1024;
  else if (unit == "KB") mult = 1e3;
  else if (unit == "MB") mult = 1e6;
  else if (unit == "GB") mult = 1e9;
  else if (unit == "TB") mult = 1e12;
  else return invalid_argument_error("has an unknown unit in '{}' (use B, KiB, MiB, GiB, TiB, KB, MB, GB, TB)", text);
  if (s.empty() || end == s.c_str() || errno != 0 || !(x >= 0) || !std::isfinite(x) || x * mult >= 0x1p64) {
    return invalid_argument_error("expects a size such as 8GiB, got '{}'", text);
  }
  return static_cast<std::uint64_t>(x * mult);
}

}  // namespace sx::daemon
