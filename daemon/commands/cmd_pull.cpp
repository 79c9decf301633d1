// `sextant pull` (a model from the Hugging Face Hub or ModelScope into the shared cache, resumable and
// verified), `sextant ls` (the cached models) and `sextant rm`, and resolve_model_path(): a model
// reference where a path is taken (`serve --model Qwen/Qwen3-8B`).
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <mutex>
#include <string>

#include <fmt/format.h>

#include "daemon/commands/args.h"
#include "daemon/commands/commands.h"
#include "daemon/commands/model_session.h"
#include "runtime/base/log.h"
#include "runtime/hub/hub_cache.h"
#include "runtime/hub/pull.h"

namespace sx::daemon {

namespace {

std::atomic<bool> g_interrupted{false};
extern "C" void on_interrupt(int) { g_interrupted.store(true); }

std::string human(std::uint64_t b) {
  if (b >= (1ull << 30)) return fmt::format("{:.2f} GiB", static_cast<double>(b) / (1ull << 30));
  if (b >= (1ull << 20)) return fmt::format("{:.1f} MiB", static_cast<double>(b) / (1ull << 20));
  if (b >= (1ull << 10)) return fmt::format("{:.1f} KiB", static_cast<double>(b) / (1ull << 10));
  return fmt::format("{} B", b);
}

// Progress on stderr: one line redrawn on a terminal, plain lines every few seconds otherwise.
class Progress {
 public:
  Progress() : tty_(isatty(2) != 0), start_(std::chrono::steady_clock::now()) {}
  void update(std::uint64_t done, std::uint64_t total, int files_done, int files_total) {
    std::lock_guard lock(mu_);
    const auto now = std::chrono::steady_clock::now();
    const bool finished = files_done == files_total;
    if (!finished && now - last_ < (tty_ ? std::chrono::milliseconds(200) : std::chrono::seconds(5)) &&
        files_done == last_files_) {
      return;
    }
    last_ = now;
    last_files_ = files_done;
    const double secs = std::chrono::duration<double>(now - start_).count();
    const std::string line = fmt::format(
        "pull: {}/{} files, {} of {} ({:.0f}%), {}/s", files_done, files_total, human(done), human(total),
        total > 0 ? 100.0 * static_cast<double>(done) / static_cast<double>(total) : 100.0,
        human(secs > 0 ? static_cast<std::uint64_t>(static_cast<double>(done) / secs) : 0));
    if (tty_) {
      std::fprintf(stderr, "\r\033[K%s", line.c_str());
      drawn_ = true;
    } else {
      std::fprintf(stderr, "%s\n", line.c_str());
    }
    std::fflush(stderr);
  }
  void note(const std::string& text) {
    std::lock_guard lock(mu_);
    std::fprintf(stderr, "%s%s\n", tty_ && drawn_ ? "\r\033[K" : "", text.c_str());
    std::fflush(stderr);
  }
  void end() {
    std::lock_guard lock(mu_);
    if (tty_ && drawn_) std::fputc('\n', stderr);
  }

 private:
  std::mutex mu_;
  bool tty_;
  bool drawn_ = false;
  int last_files_ = -1;
  std::chrono::steady_clock::time_point start_, last_{};
};

Result<hub::PullResult> run_pull(const hub::ModelRef& ref, const std::string& revision,
                                 const std::vector<std::string>& includes, const std::string& local_dir, int parallel,
                                 const std::string& token) {
  hub::PullOptions o;
  o.ref = ref;
  o.revision = revision;
  o.includes = includes;
  o.local_dir = local_dir;
  o.parallel = parallel;
  o.hub = hub::hub_options_from_env(ref.source);
  if (!token.empty()) o.hub.token = token;
  auto progress = std::make_shared<Progress>();
  o.hub.note = [progress](const std::string& s) { progress->note(s); };
  o.hub.cancel = &g_interrupted;
  o.progress = [progress](std::uint64_t d, std::uint64_t t, int fd, int ft) { progress->update(d, t, fd, ft); };
  progress->note(fmt::format("pull: {} from {} ({})", ref.text, hub::source_name(ref.source), o.hub.endpoint));
  auto prev_int = std::signal(SIGINT, on_interrupt);
  auto prev_term = std::signal(SIGTERM, on_interrupt);
  auto r = hub::pull_model(o);
  std::signal(SIGINT, prev_int);
  std::signal(SIGTERM, prev_term);
  progress->end();
  return r;
}

Status pull(const Args& args) {
  if (args.positional().size() != 1) {
    return invalid_argument_error("pull takes one model: ORG/NAME or ORG/NAME:QUANT (e.g. Qwen/Qwen3-8B-GGUF:Q4_K_M)");
  }
  SX_ASSIGN_OR_RETURN(hub::ModelRef ref, hub::parse_model_ref(args.positional()[0]));
  SX_ASSIGN_OR_RETURN(std::string source, args.get_string("--source", ref.source == hub::HubSource::kModelScope
                                                                         ? "modelscope" : "huggingface"));
  if (source == "modelscope" || source == "ms") {
    ref.source = hub::HubSource::kModelScope;
  } else if (source != "huggingface" && source != "hf") {
    return invalid_argument_error("--source must be huggingface or modelscope, got '{}'", source);
  }
  SX_ASSIGN_OR_RETURN(std::string revision, args.get_string("--revision", ""));
  if (args.has("--revision")) {  // it names a file in the cache (refs/REVISION): refused before any request
    if (Status s = hub::check_revision(revision); !s.ok()) return invalid_argument_error("--revision: {}", s.message());
  }
  SX_ASSIGN_OR_RETURN(std::string local_dir, args.get_string("--local-dir", ""));
  SX_ASSIGN_OR_RETURN(std::int64_t parallel, args.get_int("--parallel", 3, 1, 16));
  SX_ASSIGN_OR_RETURN(std::string token, args.get_string("--token", ""));
  SX_ASSIGN_OR_RETURN(hub::PullResult r, run_pull(ref, revision, args.get_all("--include"), local_dir,
                                                  static_cast<int>(parallel), token));
  std::printf("pulled %s at %s: %d files, %s (%d fetched, %s received%s%s) in %s\n", ref.text.c_str(),
              r.commit.c_str(), r.files, human(r.bytes).c_str(), r.files_fetched, human(r.bytes_fetched).c_str(),
              r.resumes > 0 ? fmt::format(", {} resumed", r.resumes).c_str() : "",
              r.checksum_failures > 0 ? fmt::format(", {} corrupt and fetched again", r.checksum_failures).c_str() : "",
              r.dir.c_str());
  if (!r.path.empty()) {
    std::printf("serve it with: sextant serve --model %s%s\n",
                local_dir.empty() ? args.positional()[0].c_str() : r.path.c_str(), "");
  }
  return ok_status();
}

Status list(const Args&) {
  const std::string cache = hub::hub_cache_dir();
  const auto models = hub::list_cached_models(cache);
  if (models.empty()) {
    std::printf("no models in %s (sextant pull ORG/NAME fetches one)\n", cache.c_str());
    return ok_status();
  }
  std::printf("%-48s %10s %6s  %-12s %-10s %s\n", "MODEL", "SIZE", "FILES", "REVISION", "STATE", "REFS");
  for (const hub::CachedModel& m : models) {
    std::string state = m.state;
    if (m.partial_files > 0) state += fmt::format(" (+{} partial)", m.partial_files);
    std::printf("%-48s %10s %6lld  %-12s %-10s %s\n", m.repo.c_str(), human(m.bytes).c_str(),
                static_cast<long long>(m.files), m.commit.substr(0, 12).c_str(), state.c_str(),
                fmt::format("{}", fmt::join(m.refs, ",")).c_str());
  }
  std::printf("cache: %s\n", cache.c_str());
  return ok_status();
}

Status remove(const Args& args) {
  if (args.positional().empty()) return invalid_argument_error("rm takes the models to remove: ORG/NAME ...");
  const std::string cache = hub::hub_cache_dir();
  for (const std::string& text : args.positional()) {
    SX_ASSIGN_OR_RETURN(hub::ModelRef ref, hub::parse_model_ref(text));
    SX_RETURN_IF_ERROR(hub::remove_cached_model(cache, ref.repo));
    std::printf("removed %s from %s\n", ref.repo.c_str(), cache.c_str());
  }
  return ok_status();
}

int run(const char* name, Args& args, int argc, char** argv, Status (*fn)(const Args&)) {
  if (Status s = args.parse(argc, argv); !s.ok()) return report_error(name, s);
  if (args.has("--help")) {
    std::fputs(args.usage().c_str(), stdout);
    return 0;
  }
  if (Status s = fn(args); !s.ok()) return report_error(name, s);
  return 0;
}

}  // namespace

Result<std::string> resolve_model_path(const std::string& text, bool pull_if_missing) {
  if (!hub::is_model_ref(text)) return text;
  SX_ASSIGN_OR_RETURN(hub::ModelRef ref, hub::parse_model_ref(text));
  const std::string cache = hub::hub_cache_dir();
  const std::string revision = ref.source == hub::HubSource::kModelScope ? "master" : "main";
  if (auto snapshot = hub::find_snapshot(cache, ref.repo, revision)) {
    auto path = hub::model_path_in_snapshot(*snapshot, ref);
    if (path.ok() || !pull_if_missing) return path;
  }
  if (!pull_if_missing) {
    return not_found_error("model {} is not in the cache ({}); fetch it with: sextant pull {} (or serve with --pull)",
                           text, cache, text);
  }
  log_info("model {} is not in the cache ({}): pulling it", text, cache);
  SX_ASSIGN_OR_RETURN(hub::PullResult r, run_pull(ref, "", {}, "", 3, ""));
  if (r.path.empty()) return not_found_error("{}: pulled, but it holds no model Sextant loads", text);
  return r.path;
}

int cmd_pull(int argc, char** argv) {
  Args args("pull",
            "Fetch a model from the Hugging Face Hub (or ModelScope) into the shared Hugging Face cache "
            "($HF_HUB_CACHE, $HF_HOME/hub or ~/.cache/huggingface/hub), resumably (interrupted files continue "
            "from their .partial) and verified (size and SHA-256 before a file gets its name). HF_ENDPOINT names a "
            "mirror, HF_TOKEN a token for gated repositories, HTTPS_PROXY a proxy.",
            {
                {{"--revision"}, true, false, "branch, tag or commit (default main; ModelScope: master)", "REV"},
                {{"--include"}, true, true, "fetch only the files matching this glob (repeatable)", "GLOB"},
                {{"--source"}, true, false, "huggingface (default) or modelscope (or an ms: prefix)", "HUB"},
                {{"--local-dir"}, true, false, "a plain folder instead of the cache", "DIR"},
                {{"--parallel"}, true, false, "files fetched at once (default 3)", "N"},
                {{"--token"}, true, false, "access token (default $HF_TOKEN or huggingface-cli's)", "TOKEN"},
            },
            "ORG/NAME[:QUANT]");
  return run("pull", args, argc, argv, pull);
}

int cmd_ls(int argc, char** argv) {
  Args args("ls", "List the models in the Hugging Face cache: size, revision, whether every file is verified.", {});
  return run("ls", args, argc, argv, list);
}

int cmd_rm(int argc, char** argv) {
  Args args("rm", "Remove models from the Hugging Face cache.", {}, "ORG/NAME...");
  return run("rm", args, argc, argv, remove);
}

}  // namespace sx::daemon
