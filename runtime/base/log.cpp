// Logging sink implementation.
#include "runtime/base/log.h"

#include <atomic>
#include <chrono>
#include <string>
#include <cstdio>
#include <mutex>

namespace sx {

namespace {
std::atomic<int> g_level{static_cast<int>(LogLevel::kInfo)};
std::atomic<bool> g_json{false};
std::mutex g_mu;
std::function<void(LogLevel, std::string_view)> g_observer;  // guarded by g_mu

// A JSON string literal of `s` (control characters escaped; other bytes as they are).
std::string json_quote(std::string_view s) {
  std::string out = "\"";
  for (const char c : s) {
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      default:
        if (static_cast<unsigned char>(c) < 0x20) {
          out += fmt::format("\\u{:04x}", static_cast<int>(c));
        } else {
          out += c;
        }
    }
  }
  return out + "\"";
}
}  // namespace

std::string printable_text(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  for (const char c : text) {
    const auto u = static_cast<unsigned char>(c);
    if ((u < 0x20 && c != '\n' && c != '\t') || u == 0x7f) {
      out += fmt::format("\\x{:02x}", static_cast<unsigned>(u));
    } else {
      out += c;
    }
  }
  return out;
}

const char* log_level_name(LogLevel l) {
  switch (l) {
    case LogLevel::kDebug: return "debug";
    case LogLevel::kInfo: return "info";
    case LogLevel::kWarn: return "warn";
    case LogLevel::kError: return "error";
  }
  return "?";
}

void set_log_level(LogLevel level) { g_level.store(static_cast<int>(level)); }
LogLevel log_level() { return static_cast<LogLevel>(g_level.load()); }

void set_log_json(bool json) { g_json.store(json); }

void set_log_observer(std::function<void(LogLevel, std::string_view)> observer) {
  std::lock_guard<std::mutex> lock(g_mu);
  g_observer = std::move(observer);
}

void log_line(LogLevel level, std::string_view message) {
  std::lock_guard<std::mutex> lock(g_mu);
  if (g_json.load()) {
    if (g_observer) g_observer(level, printable_text(message));
    const double ts = std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
    std::fprintf(stderr, "{\"ts\": %.3f, \"level\": \"%s\", \"msg\": %s}\n", ts, log_level_name(level),
                 json_quote(message).c_str());
    return;
  }
  const std::string text = printable_text(message);
  if (g_observer) g_observer(level, text);
  std::fprintf(stderr, "sextant: [%s] %s\n", log_level_name(level), text.c_str());
}

}  // namespace sx
