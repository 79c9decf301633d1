// ServeConfig defaults that need the environment, derived values and the cross-field checks.
#include "daemon/config/serve_config.h"

#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <set>

#include "daemon/config/fields.h"
#include "runtime/hub/hub_cache.h"
#include "daemon/config/replica_spec.h"

namespace sx::daemon::config {

std::string default_admin_socket_path(const char* xdg_runtime_dir, std::uint32_t uid) {
  if (xdg_runtime_dir != nullptr && xdg_runtime_dir[0] != '\0') {
    std::string dir = xdg_runtime_dir;
    while (dir.size() > 1 && dir.back() == '/') dir.pop_back();
    return dir + "/sextant/admin.sock";
  }
  return fmt::format("/tmp/sextant-{}/admin.sock", uid);
}

std::string default_admin_socket_path() {
  return default_admin_socket_path(std::getenv("XDG_RUNTIME_DIR"), static_cast<std::uint32_t>(getuid()));
}

std::string effective_served_model_name(const ModelSection& model) {
  if (!model.served_model_name.empty()) return model.served_model_name;
  // A model reference is its own name, as vLLM serves a Hub id ("Qwen/Qwen3-8B").
  if (hub::is_model_ref(model.path)) return hub::parse_model_ref(model.path)->text;
  std::string_view name = model.path;
  while (name.size() > 1 && name.back() == '/') name.remove_suffix(1);
  if (const auto slash = name.rfind('/'); slash != std::string_view::npos && name.size() > 1) {
    name.remove_prefix(slash + 1);
  }
  // Only a model file's own extension goes: "qwen2.5-0.5b.gguf" -> "qwen2.5-0.5b", while a
  // directory "Qwen2.5-0.5B" keeps its dots.
  for (std::string_view ext : {".gguf", ".safetensors"}) {
    if (name.size() > ext.size() && name.ends_with(ext)) name.remove_suffix(ext.size());
  }
  return std::string(name);
}

std::string_view log_format_name(LogFormat format) { return format == LogFormat::kJson ? "json" : "text"; }

std::string_view log_level_name(LogLevel level) {
  switch (level) {
    case LogLevel::kDebug: return "debug";
    case LogLevel::kInfo: return "info";
    case LogLevel::kWarn: return "warn";
    case LogLevel::kError: return "error";
  }
  return "info";
}

std::vector<std::string> settings_needing_restart(const ServeConfig& before, const ServeConfig& after) {
  static constexpr std::string_view kLive[] = {"http.api_keys", "http.max_queued_requests",
                                               "http.max_unsent_stream_bytes", "http.drain_timeout_ms",
                                               "admin.upgrade_timeout_ms"};
  std::vector<std::string> out;
  for (const Field& f : fields()) {
    if (f.section() != "http" && f.section() != "admin") continue;
    if (std::find(std::begin(kLive), std::end(kLive), f.path) != std::end(kLive)) continue;
    if (f.print(before, false) != f.print(after, false)) out.emplace_back(f.path);
  }
  return out;
}

Status validate(const ServeConfig& c, ValidateOptions options) {
  ErrorList errors;
  if (options.require_model && c.model.path.empty()) {
    errors.add("", "model.path", "required to serve: set model.path in the config or pass --model FILE");
  }
  const std::int64_t ranks = c.model.tp * c.model.pp;
  if (ranks > kMaxRanks) {
    errors.add("", "model.tp * model.pp",
               fmt::format("{} * {} = {} ranks, more than the {} one engine may span", c.model.tp, c.model.pp, ranks,
                           kMaxRanks));
  }
  std::set<std::int64_t> seen;
  for (std::size_t i = 0; i < c.model.devices.size(); ++i) {
    if (!seen.insert(c.model.devices[i]).second) {
      errors.add("", fmt::format("model.devices[{}]", i),
                 fmt::format("device {} is listed twice; each rank needs its own device", c.model.devices[i]));
    }
  }
  if (auto spec = parse_replica_spec(c.model.replicas); !spec.ok()) {
    errors.add("", "model.replicas", spec.status().message());
  } else if (!c.model.devices.empty() && ranks <= kMaxRanks && *spec != ReplicaSpec{}) {
    // Every index the groups name must be listed; the backend's own count is checked at start.
    std::int64_t highest = 0;
    for (std::int64_t d : c.model.devices) highest = std::max(highest, d);
    for (const auto& g : spec->groups) {
      for (int d : g) highest = std::max<std::int64_t>(highest, d);
    }
    if (auto groups = replica_device_groups(*spec, static_cast<int>(ranks), static_cast<int>(highest) + 1,
                                            c.model.devices);
        !groups.ok()) {
      errors.add("", "model.replicas", groups.status().message());
    }
  }
  if (!c.model.devices.empty() && static_cast<std::int64_t>(c.model.devices.size()) < ranks) {
    errors.add("", "model.devices",
               fmt::format("lists {} device(s) but tp * pp = {} ranks need {}; list more or leave it empty to use "
                           "the first {}",
                           c.model.devices.size(), ranks, ranks, ranks));
  }
  if (c.engine.max_num_batched_tokens < c.engine.max_num_seqs) {
    errors.add("", "engine.max_num_batched_tokens",
               fmt::format("{} is less than engine.max_num_seqs ({}); every sequence in a step needs a token",
                           c.engine.max_num_batched_tokens, c.engine.max_num_seqs));
  }
  if (c.engine.max_model_len > 0 && c.limits.max_prompt_tokens > c.engine.max_model_len) {
    errors.add("", "limits.max_prompt_tokens",
               fmt::format("{} is more than engine.max_model_len ({})", c.limits.max_prompt_tokens,
                           c.engine.max_model_len));
  }
  for (std::size_t i = 0; i < c.http.api_keys.size(); ++i) {
    if (c.http.api_keys[i] == kRedactedKey) {
      errors.add("", fmt::format("http.api_keys[{}]", i),
                 fmt::format("is the placeholder \"{}\" that a printed config shows in place of a key; write the "
                             "real key",
                             kRedactedKey));
    }
  }
  if (c.admin.socket.size() > kMaxSocketPathBytes) {
    errors.add("", "admin.socket",
               fmt::format("the path is {} bytes, longer than the {} a Unix socket address can hold; choose a "
                           "shorter path",
                           c.admin.socket.size(), kMaxSocketPathBytes));
  }
  return errors.to_status();
}

}  // namespace sx::daemon::config
