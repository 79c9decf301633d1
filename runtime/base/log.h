// Minimal logging sink: leveled lines to stderr ("sextant: [info] ...", or one JSON object per line
// {"ts": seconds since the epoch, "level", "msg"} after set_log_json(true)). Thread-safe.
// A text line never carries a terminal control character: messages quote what users and their
// environment supplied (paths, variables), and an ESC or CR in them must not rewrite a terminal or
// forge a log line, so the sink writes them as \xNN (printable_text).
#pragma once

#include <functional>
#include <string>
#include <string_view>

#include <fmt/format.h>

namespace sx {

enum class LogLevel { kDebug = 0, kInfo = 1, kWarn = 2, kError = 3 };

// "debug", "info", "warn", "error".
const char* log_level_name(LogLevel level);
void set_log_level(LogLevel level);
LogLevel log_level();
void set_log_json(bool json);
void log_line(LogLevel level, std::string_view message);
// `text` with every control character but newline and tab (C0, DEL) written as \xNN: what the
// text sink, the start log and the command-line error printer show.
std::string printable_text(std::string_view text);
// Also hands every line written to `observer` (under the log's lock: keep it short; it must not
// log). Empty: none. The start log of `sextant serve` keeps a copy of each start this way.
void set_log_observer(std::function<void(LogLevel, std::string_view)> observer);

template <typename... Args>
void log_info(fmt::format_string<Args...> f, Args&&... args) {
  if (log_level() <= LogLevel::kInfo) log_line(LogLevel::kInfo, fmt::format(f, std::forward<Args>(args)...));
}
template <typename... Args>
void log_warn(fmt::format_string<Args...> f, Args&&... args) {
  if (log_level() <= LogLevel::kWarn) log_line(LogLevel::kWarn, fmt::format(f, std::forward<Args>(args)...));
}
template <typename... Args>
void log_error(fmt::format_string<Args...> f, Args&&... args) {
  if (log_level() <= LogLevel::kError) log_line(LogLevel::kError, fmt::format(f, std::forward<Args>(args)...));
}
template <typename... Args>
void log_debug(fmt::format_string<Args...> f, Args&&... args) {
  if (log_level() <= LogLevel::kDebug) log_line(LogLevel::kDebug, fmt::format(f, std::forward<Args>(args)...));
}

}  // namespace sx
