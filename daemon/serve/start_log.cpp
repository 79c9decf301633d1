// Logs you can compare (start_log.h).
#include "daemon/serve/start_log.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <cstdlib>
#include <ctime>
#include <deque>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>

#include <fmt/format.h>

#include "runtime/base/log.h"
#include "runtime/base/regular_file.h"

#ifndef SX_VERSION
#define SX_VERSION "unknown"
#endif

namespace sx::daemon::serve {

namespace {

std::string utc_at(std::chrono::system_clock::time_point at, const char* format) {
  const std::time_t t = std::chrono::system_clock::to_time_t(at);
  std::tm tm{};
  gmtime_r(&t, &tm);
  char buf[64];
  std::strftime(buf, sizeof buf, format, &tm);
  return buf;
}

std::string utc_now(const char* format) { return utc_at(std::chrono::system_clock::now(), format); }

// "phase NAME: ok (DETAIL)" -> NAME, DETAIL (after an optional "replica N: " / "WHO: ").
bool parse_phase(std::string_view line, std::string& name, std::string& detail) {
  const std::size_t at = line.find("phase ");
  if (at == std::string_view::npos) return false;
  const std::string_view rest = line.substr(at + 6);
  const std::size_t ok = rest.find(": ok");
  const std::size_t listening = rest.find(": listening on ");
  if (ok != std::string_view::npos && (listening == std::string_view::npos || ok < listening)) {
    name = std::string(rest.substr(0, ok));
    std::string_view d = rest.substr(ok + 4);
    if (d.size() >= 3 && d.substr(0, 2) == " (" && d.back() == ')') d = d.substr(2, d.size() - 3);
    detail = std::string(d);
    return true;
  }
  if (listening != std::string_view::npos) {
    name = std::string(rest.substr(0, listening));
    detail = std::string(rest.substr(listening + 2));
    return true;
  }
  return false;
}

}  // namespace

Status make_log_dir(const std::string& dir) {
  // The parents as any tool would make them (umask applies); the directory itself private.
  std::error_code ec;
  const std::filesystem::path path(dir);
  if (path.has_parent_path()) std::filesystem::create_directories(path.parent_path(), ec);
  if (::mkdir(dir.c_str(), 0700) == 0) return ok_status();
  const int err = errno;
  struct stat st {};
  if (err == EEXIST && ::stat(dir.c_str(), &st) == 0) {
    // There already: used as it is, its mode (and a symlink's target) untouched.
    if (S_ISDIR(st.st_mode)) return ok_status();
    return unavailable_error("log.dir {}: not a directory ({})", dir, file_kind_name(st.st_mode));
  }
  return unavailable_error("log.dir {}: cannot create it: {}", dir, std::strerror(err));
}

std::string default_log_dir() {
  if (const char* x = std::getenv("XDG_STATE_HOME"); x != nullptr && *x == '/') return std::string(x) + "/sextant/logs";
  if (const char* h = std::getenv("HOME"); h != nullptr && *h == '/') return std::string(h) + "/.local/state/sextant/logs";
  return fmt::format("/tmp/sextant-{}/logs", ::getuid());
}

Result<std::unique_ptr<StartLog>> StartLog::open(const std::string& dir, int keep, const std::string& config_yaml,
                                                 const std::vector<std::string>& argv) {
  SX_RETURN_IF_ERROR(make_log_dir(dir));
  std::error_code ec;
  std::unique_ptr<StartLog> s(new StartLog());
  // Names sort in start order: UTC time to the millisecond, then the pid. The seconds and the
  // milliseconds come from one reading of the clock (two readings, or std::time's coarser clock
  // beside system_clock, could name a start "33.999" after a later one's "33.500").
  const auto now = std::chrono::system_clock::now();
  const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(now.time_since_epoch()).count() % 1000;
  const std::string stem =
      fmt::format("{}/start-{}.{:03}-{}", dir, utc_at(now, "%Y%m%dT%H%M%S"), static_cast<int>(ms), ::getpid());
  s->log_path_ = stem + ".log";
  s->summary_path_ = stem + ".json";
  s->log_ = std::fopen(s->log_path_.c_str(), "w");
  if (s->log_ == nullptr) return unavailable_error("log.dir: cannot create {}: {}", s->log_path_, std::strerror(errno));
  s->summary_ = {{"started", utc_now("%Y-%m-%dT%H:%M:%SZ")},
                 {"pid", ::getpid()},
                 {"version", SX_VERSION},
                 {"argv", argv},
                 {"config", config_yaml},
                 {"state", "startup"},
                 {"phases", nlohmann::json::array()},
                 {"devices", ""},
                 {"plan", ""},
                 {"first_error", ""},
                 {"cause", ""},
                 {"exit_status", nullptr},
                 {"log", s->log_path_}};
  {
    std::lock_guard<std::mutex> lock(s->mu_);
    s->write_summary_locked();
  }
  // The oldest starts beyond `keep` (this one included in the count) go.
  const std::vector<std::string> all = list_starts(dir);
  for (std::size_t i = static_cast<std::size_t>(std::max(keep, 1)); i < all.size(); ++i) {
    std::filesystem::remove(all[i], ec);
    std::filesystem::remove(all[i].substr(0, all[i].size() - 5) + ".log", ec);
  }
  StartLog* self = s.get();
  set_log_observer([self](LogLevel level, std::string_view message) {
    std::fprintf(self->log_, "%s [%s] %.*s\n", utc_now("%Y-%m-%dT%H:%M:%SZ").c_str(), log_level_name(level),
                 static_cast<int>(message.size()), message.data());
    std::fflush(self->log_);
    self->observe(message);
  });
  return s;
}

StartLog::~StartLog() {
  set_log_observer({});
  if (log_ != nullptr) std::fclose(log_);
}

void StartLog::observe(std::string_view line) {
  std::lock_guard<std::mutex> lock(mu_);
  std::string name, detail;
  bool changed = false;
  if (line.find("failed in phase ") != std::string_view::npos) {
    if (summary_["first_error"].get<std::string>().empty()) {
      summary_["first_error"] = std::string(line.substr(line.find("failed in phase ")));
      changed = true;
    }
    if (summary_["state"] != "serving") summary_["state"] = "failed";
  } else if (const std::size_t c = line.find("cause: "); c != std::string_view::npos &&
                                                        line.find("; fix: ") != std::string_view::npos) {
    if (summary_["cause"].get<std::string>().empty()) summary_["cause"] = std::string(line.substr(c));
    changed = true;
  } else if (parse_phase(line, name, detail)) {
    summary_["phases"].push_back({{"phase", name}, {"detail", detail}, {"at", utc_now("%Y-%m-%dT%H:%M:%SZ")}});
    if (name == "devices" && summary_["devices"].get<std::string>().empty()) summary_["devices"] = detail;
    if (name == "plan" && summary_["plan"].get<std::string>().empty()) summary_["plan"] = detail;
    if (summary_["state"] == "startup" && name != "config" && name != "http" && name != "admin") {
      summary_["state"] = "loading";
    }
    changed = true;
  } else if (line.find("serve: ready") != std::string_view::npos) {
    summary_["state"] = "serving";
    changed = true;
  }
  if (changed) write_summary_locked();
}

void StartLog::finish(int exit_status) {
  std::lock_guard<std::mutex> lock(mu_);
  summary_["exit_status"] = exit_status;
  if (summary_["state"] != "failed") summary_["state"] = exit_status == 0 ? "stopped" : "failed";
  write_summary_locked();
}

nlohmann::json StartLog::summary() const {
  std::lock_guard<std::mutex> lock(mu_);
  return summary_;
}

void StartLog::write_summary_locked() {
  // Atomically: the whole text to a temporary file, then renamed over the summary. A write that
  // fails (a full disk) leaves the last complete summary in place and no temporary file.
  const std::string text = summary_.dump(2, ' ', false, nlohmann::json::error_handler_t::replace) + "\n";
  if (Status s = write_file_atomically(summary_path_, text); !s.ok() && !summary_write_failed_) {
    summary_write_failed_ = true;  // said once (under the log's lock: not through the log)
    std::fprintf(stderr, "sextant: [warn] start log: %s\n", printable_text(s.message()).c_str());
  }
}

std::string StartLog::tail(int lines) const {
  std::ifstream f(log_path_);
  std::deque<std::string> last;
  for (std::string l; std::getline(f, l);) {
    last.push_back(std::move(l));
    if (static_cast<int>(last.size()) > lines) last.pop_front();
  }
  std::string out;
  for (const std::string& l : last) out += l + "\n";
  return out;
}

std::vector<std::string> list_starts(const std::string& dir) {
  std::vector<std::string> out;
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator(dir, ec)) {
    const std::string name = e.path().filename().string();
    if (name.rfind("start-", 0) == 0 && name.size() > 5 && name.substr(name.size() - 5) == ".json") {
      out.push_back(e.path().string());
    }
  }
  // Names sort by time (then pid); newest first.
  std::sort(out.begin(), out.end(), std::greater<>());
  return out;
}

std::string summary_field(const nlohmann::json& summary, const char* key, const char* fallback) {
  const auto it = summary.find(key);
  if (it == summary.end() || it->is_null()) return fallback;
  if (it->is_string()) return it->get<std::string>();
  return it->dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

std::string diff_starts(const nlohmann::json& older, const nlohmann::json& newer) {
  std::string out;
  auto text = [](const nlohmann::json& j, const char* key) {
    const std::string s = summary_field(j, key, "");
    return s.empty() ? std::string("(none)") : s;
  };
  for (const char* key : {"version", "argv", "devices", "plan", "first_error", "cause", "state", "exit_status"}) {
    const std::string a = text(older, key), b = text(newer, key);
    if (a != b) out += fmt::format("{}:\n  before: {}\n  now:    {}\n", key, a, b);
  }
  // The config, as the lines only one of the two has.
  auto lines = [](const nlohmann::json& j) {
    std::vector<std::string> v;
    const auto config = j.find("config");  // a summary anyone may have edited: any type
    std::istringstream in(config != j.end() && config->is_string() ? config->get<std::string>() : std::string());
    for (std::string l; std::getline(in, l);) v.push_back(l);
    return v;
  };
  const std::vector<std::string> a = lines(older), b = lines(newer);
  const std::multiset<std::string> sa(a.begin(), a.end()), sb(b.begin(), b.end());
  std::string removed, added;
  for (const std::string& l : a) {
    if (sb.count(l) == 0) removed += "  - " + l + "\n";
  }
  for (const std::string& l : b) {
    if (sa.count(l) == 0) added += "  + " + l + "\n";
  }
  if (!removed.empty() || !added.empty()) out += "config:\n" + removed + added;
  return out;
}

}  // namespace sx::daemon::serve
