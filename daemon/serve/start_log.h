// Logs you can compare (issue 22 item 5): every start of `sextant serve` keeps its log and a
// summary in a log directory (log.dir; the last log.keep starts are kept):
//   start-20261205T110403.120-4242.log    every log line of the start, with UTC timestamps
//   start-20261205T110403.120-4242.json   {started, pid, version, argv, config (YAML), state
//                                      (startup / loading / serving / stopped / failed), phases
//                                      [{phase, detail, at}], devices, plan, first_error, cause,
//                                      exit_status}
// The summary follows the daemon's own log lines ("phase X: ok (...)", "failed in phase X: ...",
// the catalogue's "cause: ...; fix: ...", "ready", "stopped (exit status N)"), so every phase the
// daemon reports is in it, replicas' and reloads' included. `sextant ctl logs` shows the current
// start's log; `sextant logs` lists the starts and `sextant logs --diff` says what changed
// between the last two (config, version, devices, plan, first error).
//
// Threading: the observer runs under the log's lock, from any thread; finish() from the main one.
#pragma once

#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "runtime/base/status.h"

namespace sx::daemon::serve {

// Makes the log directory: its parents as usual, the directory itself with mode 0700 when this
// call creates it; an existing directory (or a symlink to one) is used as it is, its mode never
// changed (a shared 1777 /tmp stays 1777). Not a directory, or not creatable: UNAVAILABLE.
Status make_log_dir(const std::string& dir);

// $XDG_STATE_HOME/sextant/logs, else $HOME/.local/state/sextant/logs, else /tmp/sextant-<uid>/logs.
std::string default_log_dir();

class StartLog {
 public:
  // Makes `dir` (make_log_dir) and this start's two files, removes the oldest starts beyond `keep`, and
  // observes the log from now on. `config_yaml` and `argv` go into the summary.
  static Result<std::unique_ptr<StartLog>> open(const std::string& dir, int keep, const std::string& config_yaml,
                                                const std::vector<std::string>& argv);
  ~StartLog();  // stops observing
  StartLog(const StartLog&) = delete;
  StartLog& operator=(const StartLog&) = delete;

  const std::string& log_path() const { return log_path_; }
  // The last `lines` lines of this start's log.
  std::string tail(int lines) const;
  // Records the exit status and writes the summary a last time.
  void finish(int exit_status);

  // For tests: what a log line does to the summary.
  void observe(std::string_view line);
  nlohmann::json summary() const;

 private:
  StartLog() = default;
  void write_summary_locked();

  std::string log_path_, summary_path_;
  std::FILE* log_ = nullptr;
  mutable std::mutex mu_;
  nlohmann::json summary_;
  bool summary_write_failed_ = false;
};

// The starts in `dir`, newest first (their summary paths).
std::vector<std::string> list_starts(const std::string& dir);
// A field of a summary as text, whatever its type (a summary is a file anyone may have edited): a
// string as it is, anything else as JSON, `fallback` when absent or null.
std::string summary_field(const nlohmann::json& summary, const char* key, const char* fallback);
// What changed between two summaries, one "key: old -> new" block per changed field (config as
// the lines only one of them has); empty when nothing did.
std::string diff_starts(const nlohmann::json& older, const nlohmann::json& newer);

}  // namespace sx::daemon::serve
