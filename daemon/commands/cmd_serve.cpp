// `sextant serve`: reads the config (file, then flags), then runs the daemon (daemon/serve/app.h).
#include <cstdio>

#include "daemon/commands/commands.h"
#include "daemon/config/serve_config.h"
#include "daemon/config/serve_flags.h"
#include "daemon/config/yaml_io.h"
#include "daemon/serve/app.h"
#include "runtime/hub/hub_cache.h"
#include "runtime/base/log.h"

namespace sx::daemon {

int cmd_serve(int argc, char** argv) {
  auto inv = config::parse_serve_flags(argc, argv);
  if (!inv.ok()) {
    std::fprintf(stderr, "sextant serve: failed in phase config: %s\n", inv.status().to_string().c_str());
    return 2;
  }
  if (inv->help) {
    std::fputs(config::serve_usage().c_str(), stdout);
    return 0;
  }
  if (Status s = config::validate(inv->config, {.require_model = !inv->print_config}); !s.ok()) {
    std::fprintf(stderr, "sextant serve: failed in phase config: %s\n", s.to_string().c_str());
    return 2;
  }
  if (inv->print_config) {
    std::fputs(config::to_yaml(inv->config).c_str(), stdout);
    return 0;
  }
  set_log_level(inv->config.log.level);
  set_log_json(inv->config.log.format == config::LogFormat::kJson);
  if (config::ModelSection& m = inv->config.model; hub::is_model_ref(m.path)) {
    // A model named by its repository: its cached snapshot (pulled first with --pull), served
    // under the repository's name, resolved once before any replica starts.
    if (m.served_model_name.empty()) m.served_model_name = config::effective_served_model_name(m);
    auto path = resolve_model_path(m.path, m.pull == "missing");
    if (!path.ok()) {
      std::fprintf(stderr, "sextant serve: failed in phase config: %s\n", path.status().to_string().c_str());
      return 1;
    }
    log_info("serve: model {} is {}", m.path, *path);
    m.path = *path;
  }
  return serve::run_daemon(inv->config, std::vector<std::string>(argv, argv + argc));
}

}  // namespace sx::daemon
