// `sextant plan`: the shard plan of a model (a GGUF file's header, or a Qwen2.5 / Qwen3 shape) over
// TP x PP ranks: heads, KV heads (replicas marked), FFN rows, vocab rows, layers and bytes per rank.
// Reads no tensor data and touches no device.
#include <cstdio>
#include <set>
#include <string>

#include "daemon/commands/commands.h"
#include "daemon/commands/model_session.h"
#include "runtime/model/gguf.h"
#include "runtime/model/model_config.h"
#include "runtime/model/random_model.h"
#include "runtime/parallel/shard_plan.h"

namespace sx::daemon {

namespace {

constexpr std::string_view kQwen25Prefix = "qwen2.5-";
constexpr std::string_view kQwen3Prefix = "qwen3-";

std::string shape_names() {
  std::string out;
  for (std::string_view s : model::qwen2_5_sizes()) out += fmt::format("{}{}{}", out.empty() ? "" : ", ", kQwen25Prefix, s);
  for (std::string_view s : model::qwen3_sizes()) out += fmt::format(", {}{}", kQwen3Prefix, s);
  return out;
}

Result<model::ModelConfig> shape_config(std::string_view name) {
  std::string lower(name);
  for (char& ch : lower) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
  Result<model::ModelConfig> c = invalid_argument_error("unknown shape");
  if (lower.starts_with(kQwen25Prefix)) {
    c = model::find_qwen2_5_config(std::string_view(lower).substr(kQwen25Prefix.size()));
  } else if (lower.starts_with(kQwen3Prefix)) {
    c = model::find_qwen3_config(std::string_view(lower).substr(kQwen3Prefix.size()));
  }
  if (!c.ok()) return invalid_argument_error("--shape: unknown shape '{}' (known: {})", name, shape_names());
  return c;
}

// "f16", or "mixed: q8_0 (q/k/v/o/gate/up/down), f32 (output)" style summary of the formats.
std::string describe_types(const model::ModelConfig& c, const parallel::WeightTypes& w) {
  std::set<std::string_view> names;
  names.insert(hal::dtype_name(w.token_embd));
  if (!c.tied_embeddings) names.insert(hal::dtype_name(w.output));
  for (const parallel::LayerWeightTypes& l : w.layers) {
    for (hal::DType t : {l.q, l.k, l.v, l.o, l.gate, l.up, l.down}) names.insert(hal::dtype_name(t));
  }
  if (names.size() == 1) return fmt::format("{} weights", *names.begin());
  std::string out = "mixed weights (";
  bool first = true;
  for (std::string_view n : names) {
    out += fmt::format("{}{}", first ? "" : ", ", n);
    first = false;
  }
  return out + fmt::format("; token_embd {}{})", hal::dtype_name(w.token_embd),
                           c.tied_embeddings ? "" : fmt::format(", output {}", hal::dtype_name(w.output)));
}

std::string describe_model(std::string_view what, const model::ModelConfig& c, const parallel::WeightTypes& w,
                           hal::DType kv) {
  return fmt::format(
      "{}: {} layers, hidden {}, {} heads / {} KV heads, head_dim {}, FFN {}, vocab {} ({}), {}, {} KV cache\n", what,
      c.n_layers, c.hidden, c.n_heads, c.n_kv_heads, c.head_dim, c.ffn, c.vocab,
      c.tied_embeddings ? "tied LM head" : "separate LM head", describe_types(c, w), hal::dtype_name(kv));
}

struct Loaded {
  std::string what;
  model::ModelConfig config;
  parallel::WeightTypes types;
};

Result<Loaded> load_model(const std::string& path) {
  SX_ASSIGN_OR_RETURN(auto file, model::GgufFile::open(path));
  SX_ASSIGN_OR_RETURN(model::ModelConfig c, model::model_config_from_gguf(*file));
  SX_RETURN_IF_ERROR(model::check_model_tensors(*file, c));
  SX_ASSIGN_OR_RETURN(parallel::WeightTypes w,
                      parallel::weight_types_from_gguf(*file, c, parallel::GgufTypeCheck::kSized));
  std::string what = c.name.empty() ? path : fmt::format("{} ({})", path, c.name);
  return Loaded{std::move(what), std::move(c), std::move(w)};
}

// Prints "sextant plan: <message>" and returns 1: the inputs were well-formed but the model or the
// plan is not.
int plan_failure(const Status& s) {
  std::fprintf(stderr, "sextant plan: %s\n", s.message().c_str());
  return 1;
}

}  // namespace

int cmd_plan(int argc, char** argv) {
  Args args("plan",
            "Print which heads, KV heads, FFN rows, vocab rows and layers every rank of a TP x PP group holds,\n"
            "with its weight bytes and KV-cache bytes per token. Reads a GGUF file's header only (no tensor data).",
            {
                {{"-m", "--model"}, true, false, "model file (GGUF)", "FILE"},
                {{"--shape"}, true, false, "a model shape instead: qwen2.5-0.5b ... qwen2.5-72b, qwen3-0.6b ... qwen3-32b",
                 "NAME"},
                {{"--type"}, true, false, "weight format of --shape: f32, f16 (default), bf16, q8_0", "TYPE"},
                {{"--tp"}, true, false, "tensor-parallel ranks per stage (default 1)", "N"},
                {{"--pp"}, true, false, "pipeline stages (default 1)", "M"},
                {{"--kv-dtype"}, true, false, "KV-cache format for the bytes per token: f32 (default), f16, bf16",
                 "TYPE"},
            });
  if (Status s = args.parse(argc, argv); !s.ok()) return report_error("plan", s);
  if (args.has("--help")) {
    std::fputs(args.usage().c_str(), stdout);
    return 0;
  }
  auto usage_error = [](const Status& s) { return report_error("plan", s); };
  if (!args.positional().empty()) {
    return usage_error(invalid_argument_error("unexpected argument '{}'", args.positional().front()));
  }
  if (args.has("--model") == args.has("--shape")) {
    return usage_error(invalid_argument_error("give exactly one of --model FILE or --shape NAME"));
  }
  if (args.has("--model") && args.has("--type")) {
    return usage_error(invalid_argument_error("--type applies to --shape only; a model file's formats are its own"));
  }
  // Any integer is passed on: the planner says what is wrong with a count and what to change.
  auto tp = args.get_int("--tp", 1, -(1 << 30), 1 << 30);
  if (!tp.ok()) return usage_error(tp.status());
  auto pp = args.get_int("--pp", 1, -(1 << 30), 1 << 30);
  if (!pp.ok()) return usage_error(pp.status());
  auto kv_name = args.get_string("--kv-dtype", "f32");
  if (!kv_name.ok()) return usage_error(kv_name.status());
  const auto kv = hal::dtype_from_name(*kv_name);
  if (!kv || hal::dtype_info(*kv).block_elems != 1 || *kv == hal::DType::kI32) {
    return usage_error(invalid_argument_error("--kv-dtype must be f32, f16 or bf16, got '{}'", *kv_name));
  }

  Loaded m;
  if (auto shape = args.get("--shape")) {
    auto c = shape_config(*shape);
    if (!c.ok()) return usage_error(c.status());
    auto type_name = args.get_string("--type", "f16");
    if (!type_name.ok()) return usage_error(type_name.status());
    const auto type = hal::dtype_from_name(*type_name);
    if (!type || (*type != hal::DType::kF32 && *type != hal::DType::kF16 && *type != hal::DType::kBF16 &&
                  *type != hal::DType::kQ8_0)) {
      return usage_error(invalid_argument_error("--type must be f32, f16, bf16 or q8_0, got '{}'", *type_name));
    }
    m.config = *std::move(c);
    m.types = parallel::uniform_weight_types(m.config, *type);
    std::string lower(*shape);
    for (char& ch : lower) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
    m.what = fmt::format("shape {}", lower);
  } else {
    auto loaded = load_model(*args.get("--model"));
    if (!loaded.ok()) return plan_failure(loaded.status());
    m = *std::move(loaded);
  }

  parallel::PlanOptions options;
  options.tp = static_cast<int>(*tp);
  options.pp = static_cast<int>(*pp);
  options.kv_dtype = *kv;
  auto plan = parallel::plan_shards(m.config, m.types, options);
  if (!plan.ok()) return plan_failure(plan.status());
  std::fputs(describe_model(m.what, m.config, m.types, *kv).c_str(), stdout);
  std::fputs(fmt::format("TP {} x PP {} = {} ranks; FFN rows split {}\n\n", plan->tp, plan->pp, plan->tp * plan->pp,
                         plan->ffn_unit == 1 ? std::string("row by row")
                                             : fmt::format("in whole {}-row blocks of the down weights", plan->ffn_unit))
                 .c_str(),
             stdout);
  std::fputs(parallel::format_plan(*plan, m.config).c_str(), stdout);
  return 0;
}

}  // namespace sx::daemon
