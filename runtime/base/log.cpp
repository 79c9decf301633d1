// Logging sink implementation.
#include "runtime/base/log.h"

#include <atomic>
#include <cstdio>
#include <mutex>

namespace sx {

namespace {
std::atomic<int> g_level{static_cast<int>(LogLevel::kInfo)};
std::mutex g_mu;
const char* level_name(LogLevel l) {
  switch (l) {
    case LogLevel::kDebug: return "debug";
    case LogLevel::kInfo: return "info";
    case LogLevel::kWarn: return "warn";
    case LogLevel::kError: return "error";
  }
  return "?";
}
}  // namespace

void set_log_level(LogLevel level) { g_level.store(static_cast<int>(level)); }
LogLevel log_level() { return static_cast<LogLevel>(g_level.load()); }

void log_line(LogLevel level, std::string_view message) {
  std::lock_guard<std::mutex> lock(g_mu);
  std::fprintf(stderr, "sextant: [%s] %.*s\n", level_name(level), static_cast<int>(message.size()),
               message.data());
}

}  // namespace sx
