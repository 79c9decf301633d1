// HTTP header lists with case-insensitive lookup.
#include "daemon/http/headers.h"

#include <algorithm>

namespace sx::daemon::http {

namespace {

char lower(char c) { return (c >= 'A' && c <= 'Z') ? static_cast<char>(c - 'A' + 'a') : c; }

std::string_view trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t')) s.remove_suffix(1);
  return s;
}

}  // namespace

bool iequals(std::string_view a, std::string_view b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i) {
    if (lower(a[i]) != lower(b[i])) return false;
  }
  return true;
}

void Headers::add(std::string name, std::string value) {
  entries_.emplace_back(std::move(name), std::move(value));
}

void Headers::set(std::string name, std::string value) {
  remove(name);
  add(std::move(name), std::move(value));
}

size_t Headers::remove(std::string_view name) {
  auto it = std::remove_if(entries_.begin(), entries_.end(),
                           [&](const Entry& e) { return iequals(e.first, name); });
  size_t n = static_cast<size_t>(entries_.end() - it);
  entries_.erase(it, entries_.end());
  return n;
}

std::optional<std::string_view> Headers::get(std::string_view name) const {
  for (const Entry& e : entries_) {
    if (iequals(e.first, name)) return std::string_view(e.second);
  }
  return std::nullopt;
}

std::vector<std::string_view> Headers::get_all(std::string_view name) const {
  std::vector<std::string_view> out;
  for (const Entry& e : entries_) {
    if (iequals(e.first, name)) out.emplace_back(e.second);
  }
  return out;
}

bool Headers::has_token(std::string_view name, std::string_view token) const {
  for (const Entry& e : entries_) {
    if (!iequals(e.first, name)) continue;
    std::string_view rest = e.second;
    while (!rest.empty()) {
      size_t comma = rest.find(',');
      std::string_view item = trim(rest.substr(0, comma));
      if (iequals(item, token)) return true;
      if (comma == std::string_view::npos) break;
      rest.remove_prefix(comma + 1);
    }
  }
  return false;
}

}  // namespace sx::daemon::http
