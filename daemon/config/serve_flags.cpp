// Serve flags -> dotted-path overrides over the --config file, through the schema table.
#include "daemon/config/serve_flags.h"

#include <algorithm>
#include <cctype>
#include <map>
#include <optional>

#include "daemon/config/fields.h"
#include "daemon/config/yaml_io.h"

namespace sx::daemon::config {
namespace {

constexpr FlagBinding kServeFlags[] = {
    {"--model", "-m", "model.path", true, "", false, "PATH",
     "model to serve: a GGUF file, a Hugging Face safetensors directory, or ORG/NAME[:QUANT] in the Hugging Face cache"},
    {"--pull", "", "model.pull", false, "missing", false, "",
     "pull an ORG/NAME --model that is not in the cache before loading (model.pull: missing)"},
    {"--backend", "", "model.backend", true, "", false, "NAME", "cpu (default), vulkan, cuda or auto"},
    {"--tp", "", "model.tp", true, "", false, "N", "tensor-parallel ranks (default 1)"},
    {"--pp", "", "model.pp", true, "", false, "N", "pipeline stages (default 1)"},
    {"--placement", "", "model.placement", true, "", false, "MODE",
     "auto (default: TP groups from the GPUs' links) or none (the devices in order)"},
    {"--topology", "", "model.topology", true, "", false, "FILE", "a saved `nvidia-smi topo -m` for the placement"},
    {"--smoke-test", "", "engine.smoke_test", false, "on", false, "",
     "run the bundled model through the TP x PP layout and check its text before loading (engine.smoke_test)"},
    {"--requantize-unaligned", "", "model.requantize_unaligned", false, "true", false, "",
     "re-quantise o / down weights to Q8_0 at load where their blocks allow no split for tp"},
    {"--replicas", "", "model.replicas", true, "", false, "SPEC",
     "engines serving the model: N (the devices split into N groups), per-device, or groups like [[0,1],[2,3]] (default 1)"},
    {"--threads", "-t", "model.threads", true, "", false, "N", "CPU threads (default 0: all cores)"},
    {"--host", "", "http.host", true, "", false, "ADDR", "address to listen on (default 127.0.0.1)"},
    {"--port", "", "http.port", true, "", false, "PORT", "port to listen on (default 8000; 0: any free port, logged)"},
    {"--served-model-name", "", "model.served_model_name", true, "", false, "NAME",
     "the model id clients send (default: the file name without .gguf)"},
    {"--chat-template", "", "model.chat_template", true, "", false, "FILE",
     "a Jinja chat template for /v1/chat/completions instead of the model's own"},
    {"--max-model-len", "", "engine.max_model_len", true, "", false, "N",
     "tokens per sequence (default 0: the model's context)"},
    {"--max-num-seqs", "", "engine.max_num_seqs", true, "", false, "N", "sequences per step (default 16)"},
    {"--max-num-batched-tokens", "", "engine.max_num_batched_tokens", true, "", false, "N",
     "tokens per step (default 2048)"},
    {"--block-size", "", "engine.block_size", true, "", false, "N", "tokens per KV block: 8, 16 (default) or 32"},
    {"--max-step-ms", "", "engine.max_step_ms", true, "", false, "MS",
     "step-time target: prefill chunks fit beside the running decodes (default 500; 0: fill each step)"},
    {"--max-step-ratio", "", "engine.max_step_ratio", true, "", false, "X",
     "a step takes at most X decode-only steps (default 2.5; 0: max_step_ms alone)"},
    {"--memory-utilization", "", "engine.memory_utilization", true, "", false, "X",
     "fraction of device memory to use, (0, 1] (default 0.9)"},
    {"--api-key", "", "http.api_keys", true, "", true, "KEY", "accepted bearer token (repeatable; default: no auth)"},
    {"--admin-socket", "", "admin.socket", true, "", false, "PATH", "admin API Unix socket"},
    {"--no-prefix-caching", "", "engine.enable_prefix_caching", false, "false", false, "",
     "do not reuse KV blocks of shared prefixes"},
    {"--log-format", "", "log.format", true, "", false, "FORMAT", "text (default) or json"},
    {"--log-level", "", "log.level", true, "", false, "LEVEL", "debug, info (default), warn or error"},
    {"--log-dir", "", "log.dir", true, "", false, "DIR", "where each start's log is kept (none: nowhere)"},
};

// Options that are not overrides.
constexpr std::string_view kConfigFlag = "--config";
constexpr std::string_view kPrintFlag = "--print-config";
constexpr std::string_view kSetFlag = "--set";
constexpr std::string_view kHelpFlags[] = {"-h", "--help"};

std::string quoted(std::string_view s) { return quote_yaml(s); }

// Applies one override text to a field: lists split on commas, "" unsets optional fields.
void apply_text(ServeConfig& config, const Field& field, std::string_view value, std::string_view source,
                ErrorList& errors) {
  if (field.is_list) {
    field.clear(config);
    std::size_t index = 0;
    std::size_t start = 0;
    while (!value.empty() && start <= value.size()) {
      const std::size_t comma = std::min(value.find(',', start), value.size());
      std::string_view item = value.substr(start, comma - start);
      while (!item.empty() && std::isspace(static_cast<unsigned char>(item.front()))) item.remove_prefix(1);
      while (!item.empty() && std::isspace(static_cast<unsigned char>(item.back()))) item.remove_suffix(1);
      if (std::string error = field.set(config, item); !error.empty()) {
        errors.add(source, fmt::format("{}[{}]", field.path, index), error);
      }
      ++index;
      start = comma + 1;
    }
    return;
  }
  if (field.nullable && value.empty()) {
    field.clear(config);
    return;
  }
  if (std::string error = field.set(config, value); !error.empty()) errors.add(source, field.path, error);
}

void apply_path(ServeConfig& config, std::string_view path, std::string_view value, std::string_view source,
                ErrorList& errors) {
  const Field* field = find_field(path);
  if (field == nullptr) {
    std::vector<std::string_view> paths;
    for (const Field& f : fields()) paths.push_back(f.path);
    const std::string_view guess = closest_match(path, paths);
    errors.add(source, path,
               guess.empty() ? std::string("unknown setting (see config/sextant.example.yaml for every key)")
                             : fmt::format("unknown setting (did you mean {}?)", guess));
    return;
  }
  apply_text(config, *field, value, source, errors);
}

// One option as given on the line, in order.
struct Given {
  const FlagBinding* binding = nullptr;  // null for --set
  std::string flag;                      // canonical name
  std::string value;
};

}  // namespace

std::span<const FlagBinding> serve_flag_table() { return kServeFlags; }

Status apply_override(ServeConfig& config, std::string_view path, std::string_view value, std::string_view source) {
  ErrorList errors;
  apply_path(config, path, value, source, errors);
  return errors.to_status();
}

Result<ServeInvocation> parse_serve_flags(std::span<const std::string_view> args) {
  ServeInvocation inv;
  ErrorList errors;  // problems with the options themselves, then (below) with their values
  std::vector<Given> given;
  std::map<std::string, int, std::less<>> counts;
  std::optional<std::string> config_file;

  std::vector<std::string_view> known = {kConfigFlag, kPrintFlag, kSetFlag, "--help"};
  for (const FlagBinding& b : kServeFlags) known.push_back(b.flag);

  for (std::size_t i = 0; i < args.size(); ++i) {
    const std::string_view arg = args[i];
    if (arg.size() < 2 || arg[0] != '-') {
      errors.add("", "",
                 fmt::format("unexpected argument {} (serve takes only options; the model is --model FILE)",
                             quoted(arg)));
      continue;
    }
    std::string_view name = arg;
    std::optional<std::string_view> inline_value;
    if (const auto eq = arg.find('='); arg.starts_with("--") && eq != std::string_view::npos) {
      name = arg.substr(0, eq);
      inline_value = arg.substr(eq + 1);
    }
    if (std::find(std::begin(kHelpFlags), std::end(kHelpFlags), name) != std::end(kHelpFlags)) {
      inv.help = true;
      continue;
    }
    const FlagBinding* binding = nullptr;
    for (const FlagBinding& b : kServeFlags) {
      if (name == b.flag || (!b.alias.empty() && name == b.alias)) binding = &b;
    }
    if (binding == nullptr && name != kConfigFlag && name != kPrintFlag && name != kSetFlag) {
      const std::string_view guess = closest_match(name, known);
      errors.add("", "",
                 fmt::format("unknown option {}{} (see sextant serve --help)", name,
                             guess.empty() ? "" : fmt::format("; did you mean {}?", guess)));
      // "--unknown VALUE": skip the value too, so it is not reported as a stray argument.
      if (!inline_value && i + 1 < args.size() && !args[i + 1].starts_with("-")) ++i;
      continue;
    }
    const std::string canonical(binding != nullptr ? binding->flag : name);
    const bool takes_value = binding != nullptr ? binding->takes_value : name != kPrintFlag;
    const bool repeatable = (binding != nullptr && binding->repeatable) || name == kSetFlag;
    if (++counts[canonical] == 2 && !repeatable) errors.add(canonical, "", "given twice");
    std::string value;
    if (!takes_value) {
      if (inline_value) {
        errors.add(canonical, "", "takes no value");
        continue;
      }
      value = binding != nullptr ? std::string(binding->fixed_value) : "";
    } else if (inline_value) {
      value = std::string(*inline_value);
    } else if (i + 1 < args.size()) {
      value = std::string(args[++i]);
    } else {
      errors.add(canonical, "", "needs a value");
      continue;
    }
    if (canonical == kConfigFlag) {
      config_file = value;
    } else if (canonical == kPrintFlag) {
      inv.print_config = true;
    } else {
      given.push_back({binding, canonical, std::move(value)});
    }
  }
  if (inv.help) {
    ServeInvocation help;
    help.help = true;
    return help;
  }

  // The file first, whatever its place on the line; then the flags in the order given.
  Status file_status;
  if (config_file) {
    inv.config_file = *config_file;
    auto loaded = load_config_file(*config_file);
    if (loaded.ok()) {
      inv.config = std::move(loaded).value();
    } else {
      file_status = loaded.status();
    }
  }
  ErrorList value_errors;
  std::map<std::string_view, bool> list_started;  // repeatable flags replace the file's list once
  for (const Given& g : given) {
    if (g.binding == nullptr) {  // --set PATH=VALUE
      const auto eq = g.value.find('=');
      if (eq == std::string::npos) {
        value_errors.add(g.flag, "",
                         fmt::format("expected PATH=VALUE such as engine.max_num_seqs=32, got {}", quoted(g.value)));
        continue;
      }
      apply_path(inv.config, std::string_view(g.value).substr(0, eq), std::string_view(g.value).substr(eq + 1),
                 g.flag, value_errors);
      continue;
    }
    const Field* field = find_field(g.binding->path);
    if (field == nullptr) fatal("parse_serve_flags", fmt::format("flag {} names no field", g.flag));
    if (g.binding->repeatable) {
      if (!list_started[g.binding->path]) field->clear(inv.config);
      list_started[g.binding->path] = true;
      if (std::string error = field->set(inv.config, g.value); !error.empty()) {
        value_errors.add(g.flag, field->path, error);
      }
      continue;
    }
    apply_text(inv.config, *field, g.value, g.flag, value_errors);
  }

  // Option problems first, then the file's, then the values the flags gave.
  if (!file_status.ok() && errors.empty() && value_errors.empty()) return file_status;
  if (!file_status.ok()) errors.add("", "", file_status.message());
  errors.append(value_errors);
  if (!errors.empty()) return errors.to_status();
  return inv;
}

Result<ServeInvocation> parse_serve_flags(int argc, const char* const* argv) {
  std::vector<std::string_view> args;
  for (int i = 0; i < argc; ++i) args.emplace_back(argv[i]);
  return parse_serve_flags(args);
}

std::string serve_usage() {
  std::string out =
      "usage: sextant serve [--config FILE] [options]\n"
      "Serve a model over the OpenAI-compatible HTTP API and the admin socket. Settings come from the\n"
      "defaults, then the --config file, then the options below (options win).\n\noptions:\n";
  auto line = [&out](std::string names, std::string_view help) { out += fmt::format("  {:<36} {}\n", names, help); };
  line("--config FILE", "YAML config (see config/sextant.example.yaml)");
  for (const FlagBinding& b : kServeFlags) {
    std::string names = b.alias.empty() ? std::string(b.flag) : fmt::format("{}, {}", b.alias, b.flag);
    if (b.takes_value) names += fmt::format(" {}", b.metavar);
    line(names, fmt::format("{} [{}]", b.help, b.path));
  }
  line("--set PATH=VALUE", "set any key, e.g. --set http.max_body_bytes=16MiB (repeatable)");
  line("--print-config", "print the merged config as YAML (API keys redacted) and exit");
  line("-h, --help", "show this help");
  return out;
}

}  // namespace sx::daemon::config
