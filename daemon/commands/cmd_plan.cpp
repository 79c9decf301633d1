// `sextant plan`: whether a deployment fits, before anything is downloaded or loaded. The model
// comes from a GGUF file's header, a Hugging Face config.json or a Qwen2.5 / Qwen3 shape; the shard
// plan over TP x PP ranks (heads, KV heads with replicas marked, FFN rows, vocab rows, layers, bytes
// per rank), then the memory plan on the devices (weights, workspace, overhead, KV pool, free; KV
// tokens and full-length requests), or the refusal with alternatives.
// Reads no tensor data and touches no device. Exit code: 0 fits, 1 refused (or a model / shard plan
// that cannot work), 2 usage errors.
#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <optional>
#include <set>
#include <string>

#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include "backends/registry.h"
#include "daemon/commands/commands.h"
#include "daemon/commands/model_session.h"
#include "runtime/engine/memory_planner.h"
#include "runtime/model/gguf.h"
#include "runtime/model/hf_config.h"
#include "runtime/model/hf_model.h"
#include "runtime/model/model_config.h"
#include "runtime/model/random_model.h"
#include "runtime/hal/topology_text.h"
#include "runtime/parallel/placement.h"
#include "runtime/parallel/shard_plan.h"
#include "runtime/parallel/weight_recipes.h"

namespace sx::daemon {

namespace {

constexpr std::string_view kQwen25Prefix = "qwen2.5-";
constexpr std::string_view kQwen3Prefix = "qwen3-";
// A CUDA context and the runtime's own allocations on a GPU; CPU ranks have none.
constexpr std::uint64_t kGpuOverheadBytes = std::uint64_t{512} << 20;
constexpr int kMaxDevices = 64;

std::string lowercase(std::string_view s) {
  std::string out(s);
  for (char& ch : out) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
  return out;
}

// Qwen3.5 sizes; Qwen3.6 and 3.8 name the same shapes (27b, 35b-a3b).
constexpr std::string_view kHybridPrefixes[] = {"qwen3.5-", "qwen3.6-", "qwen3.8-"};

std::string shape_names() {
  std::string out;
  for (std::string_view s : model::qwen2_5_sizes()) out += fmt::format("{}{}{}", out.empty() ? "" : ", ", kQwen25Prefix, s);
  for (std::string_view s : model::qwen3_sizes()) out += fmt::format(", {}{}", kQwen3Prefix, s);
  for (std::string_view s : model::qwen3moe_sizes()) out += fmt::format(", {}{}", kQwen3Prefix, s);
  for (std::string_view s : model::qwen35_sizes()) out += fmt::format(", qwen3.5-{}", s);
  for (std::string_view s : model::qwen35moe_sizes()) out += fmt::format(", qwen3.5-{}", s);
  return out + ", qwen3.6-27b, qwen3.6-35b-a3b, qwen3.8-27b";
}

Result<model::ModelConfig> shape_config(std::string_view name) {
  const std::string lower = lowercase(name);
  Result<model::ModelConfig> c = invalid_argument_error("unknown shape");
  if (lower.starts_with(kQwen25Prefix)) {
    c = model::find_qwen2_5_config(std::string_view(lower).substr(kQwen25Prefix.size()));
  } else if (lower.starts_with(kQwen3Prefix)) {
    const std::string_view size = std::string_view(lower).substr(kQwen3Prefix.size());
    c = model::find_qwen3_config(size);
    if (!c.ok()) c = model::find_qwen3moe_config(size);
  }
  for (std::string_view prefix : kHybridPrefixes) {
    if (!lower.starts_with(prefix)) continue;
    const std::string_view size = std::string_view(lower).substr(prefix.size());
    const bool later = prefix != kHybridPrefixes[0];  // 3.6 / 3.8: the 27B and 35B-A3B shapes only
    if (later && size != "27b" && !(prefix == "qwen3.6-" && size == "35b-a3b")) break;
    c = model::find_qwen35_config(size);
    if (!c.ok()) c = model::find_qwen35moe_config(size);
    if (c.ok() && later) c->name = fmt::format("Qwen{}-{} (shape)", prefix.substr(4, 3), size);
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
  const std::string ffn = c.is_moe() ? fmt::format("{} experts of {} ({} used per token)", c.n_experts, c.expert_ffn,
                                                    c.n_experts_used)
                                      : fmt::format("FFN {}", c.ffn);
  return fmt::format(
      "{}: {} layers, hidden {}, {} heads / {} KV heads, head_dim {}, {}, vocab {} ({}), {}, {} KV cache\n", what,
      c.n_layers, c.hidden, c.n_heads, c.n_kv_heads, c.head_dim, ffn, c.vocab,
      c.tied_embeddings ? "tied LM head" : "separate LM head", describe_types(c, w), hal::dtype_name(kv));
}

struct Loaded {
  std::string what;
  model::ModelConfig config;
  parallel::WeightTypes types;
  std::string note;  // printed under the model line when not empty
};

// Why the experts are split whole rather than each one across the ranks.
std::string expert_parallel_why(const model::ModelConfig& c, int tp) {
  const std::int64_t share = c.expert_ffn / tp;
  return fmt::format("; whole experts rather than a share of each: an expert's {} rows over {} ranks would be {}{} "
                     "each{}, and a whole expert needs no all-reduce of its own (splitting inside experts is not "
                     "offered yet)",
                     c.expert_ffn, tp, c.expert_ffn % tp == 0 ? "" : "about ", share,
                     share % 256 != 0 ? " (not whole 256-element K-quant blocks)" : "");
}

Result<Loaded> load_model(const std::string& path) {
  std::unique_ptr<model::TensorSource> file;
  model::ModelConfig c;
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec)) {
    SX_ASSIGN_OR_RETURN(std::unique_ptr<model::HfModel> hf, model::HfModel::open(path));
    c = hf->config();
    file = std::move(hf);
  } else {
    SX_ASSIGN_OR_RETURN(std::unique_ptr<model::GgufFile> gguf, model::GgufFile::open(path));
    SX_ASSIGN_OR_RETURN(c, model::model_config_from_gguf(*gguf));
    file = std::move(gguf);
  }
  SX_RETURN_IF_ERROR(model::check_model_tensors(*file, c));
  SX_ASSIGN_OR_RETURN(parallel::WeightTypes w,
                      parallel::weight_types_from_source(*file, c, parallel::WeightTypeCheck::kSized));
  std::string what = c.name.empty() ? path : fmt::format("{} ({})", path, c.name);
  return Loaded{std::move(what), std::move(c), std::move(w), ""};
}

// The checkpoint's own format: AWQ / GPTQ 4-bit in groups of 128 -> awq-int4; else torch_dtype.
Result<parallel::WeightRecipe> checkpoint_recipe(const model::HfConfig& hf, const std::string& path) {
  if (!hf.quant_method.empty()) {
    const std::string m = lowercase(hf.quant_method);
    if ((m == "awq" || m == "gptq") && hf.quant_bits == 4 && hf.quant_group_size == 128) {
      return parallel::WeightRecipe::kAwqInt4;
    }
    return invalid_argument_error(
        "{}: the checkpoint is quantized with {} ({} bits, group size {}), which Sextant cannot plan from the config "
        "alone; give --weights ({})",
        path, hf.quant_method, hf.quant_bits, hf.quant_group_size, parallel::recipe_names());
  }
  const std::string d = lowercase(hf.torch_dtype);
  if (d == "bfloat16" || d.empty()) return parallel::WeightRecipe::kBF16;
  if (d == "float16") return parallel::WeightRecipe::kF16;
  if (d == "float32") return parallel::WeightRecipe::kF32;
  return invalid_argument_error("{}: torch_dtype '{}' is not a weight format Sextant knows; give --weights ({})", path,
                                hf.torch_dtype, parallel::recipe_names());
}

Result<parallel::WeightRecipe> recipe_arg(const std::string& name) {
  const auto r = parallel::recipe_from_name(name);
  if (!r) return invalid_argument_error("--weights must be one of {}, got '{}'", parallel::recipe_names(), name);
  return *r;
}

// "6x24GiB", "24GiB,24GiB", "2x24GiB,2x48GiB" -> one budget per device, named dev0, dev1, ...
Result<std::vector<engine::DeviceBudget>> parse_devices(const std::string& text, std::uint64_t overhead) {
  std::vector<engine::DeviceBudget> out;
  std::size_t p = 0;
  while (p <= text.size()) {
    const std::size_t q = std::min(text.find(',', p), text.size());
    const std::string item = text.substr(p, q - p);
    std::int64_t count = 1;
    std::string size = item;
    if (const std::size_t x = item.find_first_of("xX"); x != std::string::npos && x > 0 &&
                                                         item.find_first_not_of("0123456789") == x) {
      count = x > 3 ? kMaxDevices + 1 : std::stoll(item.substr(0, x));  // at most 3 digits: no overflow
      size = item.substr(x + 1);
    }
    auto bytes = parse_size(size);
    if (item.empty() || !bytes.ok() || *bytes == 0 || count < 1) {
      return invalid_argument_error("--devices: '{}' is not a device list such as 6x24GiB or 24GiB,24GiB,48GiB{}",
                                    text, bytes.ok() || item.empty() ? "" : fmt::format(" ('{}' {})", size,
                                                                                         bytes.status().message()));
    }
    if (count > kMaxDevices || static_cast<std::int64_t>(out.size()) + count > kMaxDevices) {
      return invalid_argument_error("--devices: '{}' lists more than {} devices", text, kMaxDevices);
    }
    for (std::int64_t i = 0; i < count; ++i) {
      out.push_back({fmt::format("dev{}", out.size()), *bytes, overhead});
    }
    p = q + 1;
  }
  return out;
}

// Prints "sextant plan: <message>" and returns 1: the inputs were well-formed but the model or the
// plan is not.
int plan_failure(const Status& s) {
  std::fprintf(stderr, "sextant plan: %s\n", s.message().c_str());
  return 1;
}

}  // namespace

int cmd_plan(int argc, char** argv) {
  Args args(
      "plan",
      "Whether a deployment fits, before anything is downloaded: which heads, KV heads, FFN rows, vocab rows and\n"
      "layers every rank of a TP x PP group holds, then per device the weights, activation workspace, runtime\n"
      "overhead and KV-cache pool against capacity x utilisation, how many requests of max_model_len fit at once,\n"
      "or why it does not fit and what would. Reads a GGUF header or a config.json only (no tensor data).\n"
      "Exit code: 0 fits, 1 refused, 2 usage error.",
      {
          {{"-m", "--model"}, true, false, "model: GGUF file (its header only) or safetensors directory (headers only)", "PATH"},
          {{"--config"}, true, false, "a Hugging Face config.json (Qwen2, Qwen3, Qwen3-MoE, Qwen3.5 / 3.6 / 3.8) instead",
           "FILE"},
          {{"--shape"}, true, false, "a model shape instead: qwen2.5-0.5b ... qwen2.5-72b, qwen3-0.6b ... qwen3-32b, qwen3-30b-a3b, qwen3-235b-a22b, "
           "qwen3.5-0.8b ... qwen3.5-27b, qwen3.5-35b-a3b, qwen3.5-122b-a10b, qwen3.5-397b-a17b, qwen3.6-27b, "
           "qwen3.6-35b-a3b, qwen3.8-27b",
           "NAME"},
          {{"--weights"}, true, false,
           "weight format of --config / --shape: f32, f16, bf16, q8_0, q4_0, q4_k_m (llama.cpp's), awq-int4 "
           "(default: the checkpoint's own; --shape: f16)",
           "FORMAT"},
          {{"--type"}, true, false, "weight format of --shape, one format for every matrix: f32, f16, bf16, q8_0",
           "TYPE"},
          {{"--tp"}, true, false, "tensor-parallel ranks per stage (default 1; with --devices: devices / pp)", "N"},
          {{"--pp"}, true, false, "pipeline stages (default 1)", "M"},
          {{"--requantize-unaligned"}, false, false,
           "where the o / down weights' blocks allow no split for --tp, plan them re-quantised to Q8_0", ""},
          {{"--devices"}, true, false,
           "one per rank: 6x24GiB, or 24GiB,24GiB,... (default: the devices of --backend)",
           "LIST"},
          {{"--backend"}, true, false,
           "plan for this backend's devices: cpu (default; tp x pp logical devices sharing the system memory), "
           "vulkan, cuda or auto",
           "NAME"},
          {{"--device-overhead"}, true, false,
           "runtime overhead per device (default: 512MiB with --devices, a CUDA context; CPU: 0)",
           "BYTES"},
          {{"--memory-utilization"}, true, false, "fraction of each device Sextant may use (default 0.9)", "F"},
          {{"--max-model-len"}, true, false, "longest request in tokens (default: the model's context length)", "N"},
          {{"--max-num-seqs"}, true, false, "sequences running at once (default 64)", "N"},
          {{"--max-num-batched-tokens"}, true, false, "tokens per step, which sizes the workspace (default 2048)",
           "N"},
          {{"--block-size"}, true, false, "tokens per KV-cache block (default 16)", "N"},
          {{"--kv-dtype"}, true, false,
           "KV-cache format: f32, f16, bf16 (default: bf16 with --devices, as GPU deployments store it; "
           "else f32, the CPU engine's)",
           "TYPE"},
          {{"--topology"}, true, false,
           "a saved `nvidia-smi topo -m` of the machine: choose the TP groups, rank order and replicas from its "
           "links (needs --devices; --tp, --pp, --replicas fix parts of the choice)",
           "FILE"},
          {{"--replicas"}, true, false, "engines serving the model, each on its own devices (with --topology)", "N"},
          {{"--json"}, false, false, "print the plan as JSON (placement.groups: each TP group's devices in rank order)",
           ""},
          {{"-v", "--verbose"}, false, false, "also the workspace parts and the KV bytes of every layer", ""},
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
  const int sources = static_cast<int>(args.has("--model")) + static_cast<int>(args.has("--shape")) +
                      static_cast<int>(args.has("--config"));
  if (sources != 1) {
    return usage_error(invalid_argument_error("give exactly one of --model FILE, --config config.json or --shape NAME"));
  }
  if (!args.has("--shape") && args.has("--type")) {
    return usage_error(invalid_argument_error("--type applies to --shape only (use --weights with --config)"));
  }
  if (args.has("--model") && args.has("--weights")) {
    return usage_error(invalid_argument_error("--weights applies to --config and --shape; a model file's formats are "
                                              "its own"));
  }
  if (args.has("--type") && args.has("--weights")) {
    return usage_error(invalid_argument_error("give --weights or --type, not both"));
  }

  // Devices first: their count is the default tp.
  const bool explicit_devices = args.has("--devices");
  auto overhead = args.get_bytes("--device-overhead", explicit_devices ? kGpuOverheadBytes : 0);
  if (!overhead.ok()) return usage_error(overhead.status());
  std::vector<engine::DeviceBudget> devices;
  if (explicit_devices) {
    auto d = parse_devices(*args.get("--devices"), *overhead);
    if (!d.ok()) return usage_error(d.status());
    devices = *std::move(d);
  }
  // The machine's links: the placement chooses what --tp / --pp / --replicas leave open.
  std::optional<hal::Topology> topology;
  if (auto file = args.get("--topology")) {
    if (!explicit_devices) {
      return usage_error(invalid_argument_error("--topology needs --devices (the memory of each GPU, e.g. 6x24GiB)"));
    }
    auto t = hal::read_nvidia_smi_topo(*file);
    if (!t.ok()) return usage_error(t.status());
    if (static_cast<int>(devices.size()) > t->size()) {
      return usage_error(invalid_argument_error("--devices lists {} devices but {} has {} GPUs", devices.size(), *file,
                                                t->size()));
    }
    topology = *std::move(t);
  } else if (args.has("--replicas")) {
    return usage_error(invalid_argument_error("--replicas applies to --topology (sextant serve takes model.replicas)"));
  }
  auto replicas = args.get_int("--replicas", 0, 1, 64);
  if (!replicas.ok()) return usage_error(replicas.status());
  // Any integer is passed on: the planner says what is wrong with a count and what to change.
  auto pp = args.get_int("--pp", topology && !args.has("--pp") ? 0 : 1, -(1 << 30), 1 << 30);
  if (!pp.ok()) return usage_error(pp.status());
  // With --devices and no --tp, every device is a rank: tp = devices / pp.
  const auto n_devices = static_cast<std::int64_t>(devices.size());
  auto tp = args.get_int("--tp",
                         topology                                             ? 0
                         : explicit_devices && *pp >= 1 && n_devices % *pp == 0 ? n_devices / *pp
                                                                                : 1,
                         -(1 << 30), 1 << 30);
  if (!tp.ok()) return usage_error(tp.status());
  auto kv_name = args.get_string("--kv-dtype", explicit_devices ? "bf16" : "f32");
  if (!kv_name.ok()) return usage_error(kv_name.status());
  const auto kv = hal::dtype_from_name(*kv_name);
  if (!kv || (*kv != hal::DType::kF32 && *kv != hal::DType::kF16 && *kv != hal::DType::kBF16)) {
    return usage_error(invalid_argument_error("--kv-dtype must be f32, f16 or bf16, got '{}'", *kv_name));
  }
  engine::MemoryPlanOptions mo;
  constexpr std::int64_t kBig = std::int64_t{1} << 40;
  auto util = args.get_double("--memory-utilization", mo.memory_utilization);
  if (!util.ok()) return usage_error(util.status());
  mo.memory_utilization = *util;
  auto len = args.get_int("--max-model-len", 0, 1, kBig);
  auto seqs = args.get_int("--max-num-seqs", mo.max_num_seqs, 1, kBig);
  auto batched = args.get_int("--max-num-batched-tokens", mo.max_num_batched_tokens, 1, kBig);
  auto block = args.get_int("--block-size", mo.block_size, 1, 1 << 20);
  for (const auto* r : {&len, &seqs, &batched, &block}) {
    if (!r->ok()) return usage_error(r->status());
  }
  mo.max_model_len = *len;
  mo.max_num_seqs = *seqs;
  mo.max_num_batched_tokens = *batched;
  mo.block_size = *block;

  Loaded m;
  if (auto shape = args.get("--shape")) {
    auto c = shape_config(*shape);
    if (!c.ok()) return usage_error(c.status());
    m.config = *std::move(c);
    if (args.has("--weights")) {
      auto r = recipe_arg(*args.get("--weights"));
      if (!r.ok()) return usage_error(r.status());
      m.types = parallel::recipe_weight_types(m.config, *r);
    } else {
      auto type_name = args.get_string("--type", "f16");
      if (!type_name.ok()) return usage_error(type_name.status());
      const auto type = hal::dtype_from_name(*type_name);
      if (!type || (*type != hal::DType::kF32 && *type != hal::DType::kF16 && *type != hal::DType::kBF16 &&
                    *type != hal::DType::kQ8_0)) {
        return usage_error(invalid_argument_error("--type must be f32, f16, bf16 or q8_0, got '{}' (other formats: "
                                                  "--weights)",
                                                  *type_name));
      }
      m.types = parallel::uniform_weight_types(m.config, *type);
    }
    m.what = fmt::format("shape {}", lowercase(*shape));
  } else if (auto path = args.get("--config")) {
    auto hf = model::read_hf_config(*path);
    if (!hf.ok()) return plan_failure(hf.status());
    m.config = hf->config;
    Result<parallel::WeightRecipe> r = args.has("--weights") ? recipe_arg(*args.get("--weights"))
                                                             : checkpoint_recipe(*hf, *path);
    if (!r.ok()) return usage_error(r.status());
    m.types = parallel::recipe_weight_types(m.config, *r);
    m.what = m.config.name.empty() ? *path : fmt::format("{} ({})", *path, m.config.name);
    m.note = fmt::format("weights: {}{}", parallel::recipe_description(*r),
                         args.has("--weights") ? "" : " (the checkpoint's own format; --weights to change)");
  } else {
    auto resolved = resolve_model_path(*args.get("--model"), false);  // ORG/NAME: its cached snapshot
    if (!resolved.ok()) return plan_failure(resolved.status());
    auto loaded = load_model(*resolved);
    if (!loaded.ok()) return plan_failure(loaded.status());
    m = *std::move(loaded);
  }

  parallel::PlanOptions options;
  options.tp = static_cast<int>(*tp);
  options.pp = static_cast<int>(*pp);
  options.requantize_unaligned = args.has("--requantize-unaligned");
  options.kv_dtype = *kv;
  std::optional<parallel::Placement> placement;
  if (topology) {
    // A replica of tp x pp ranks fits when the shard plan allows it and its memory plan fits on
    // devices as small as the smallest listed.
    const engine::DeviceBudget smallest = *std::min_element(
        devices.begin(), devices.end(),
        [](const engine::DeviceBudget& a, const engine::DeviceBudget& b) { return a.capacity_bytes < b.capacity_bytes; });
    parallel::PlacementRequest request;
    request.devices = static_cast<int>(devices.size());
    request.tp = options.tp;
    request.pp = options.pp;
    request.replicas = static_cast<int>(*replicas);
    request.fits = [&](int t, int p) {
      parallel::PlanOptions o = options;
      o.tp = t;
      o.pp = p;
      auto shards = parallel::plan_shards(m.config, m.types, o);
      if (!shards.ok()) return false;
      std::vector<engine::DeviceBudget> group(static_cast<std::size_t>(t * p), smallest);
      auto memory = engine::plan_memory(m.config, m.types, *shards, group, mo);
      return memory.ok() && memory->fits;
    };
    auto placed = parallel::place(*topology, request);
    if (!placed.ok()) return plan_failure(placed.status());
    placement = *std::move(placed);
    options.tp = placement->chosen.tp;
    options.pp = placement->chosen.pp;
    // The memory plan below is replica 0's, on its devices in rank order.
    std::vector<engine::DeviceBudget> mine;
    for (int s = 0; s < options.pp; ++s) {
      for (const int d : placement->chosen.groups[static_cast<std::size_t>(s)]) mine.push_back(devices[static_cast<std::size_t>(d)]);
    }
    devices = std::move(mine);
  }
  auto plan = parallel::plan_shards(m.config, m.types, options);
  if (!plan.ok()) return plan_failure(plan.status());
  const int ranks = plan->tp * plan->pp;

  std::string devices_line, links;
  if (explicit_devices) {
    if (!topology && static_cast<int>(devices.size()) != ranks) {
      return usage_error(invalid_argument_error("--devices lists {} device{} but tp {} x pp {} has {} ranks (one device "
                                                "per rank)",
                                                devices.size(), devices.size() == 1 ? "" : "s", plan->tp, plan->pp,
                                                ranks));
    }
    devices_line = fmt::format("Devices: {} ({}), {} overhead each", *args.get("--devices"),
                               devices.size() == 1 ? "1 device" : fmt::format("{} devices", devices.size()),
                               engine::gib(*overhead));
  } else {
    auto backend_name = args.get_string("--backend", "cpu");
    if (!backend_name.ok()) return usage_error(backend_name.status());
    auto backend = backends::default_registry().pick(*backend_name);
    if (!backend.ok()) return plan_failure(backend.status());
    auto infos = hal::list_devices(**backend);
    if (!infos.ok()) return plan_failure(infos.status());
    // The GPUs' links where the backend knows them (CUDA: NVML's matrix, peer access, P2P rank).
    if (auto topo = (*backend)->topology(); topo.ok() && topo->size() > 1) links = hal::format_topology(*topo);
    auto budgets = engine::group_budgets(*infos, ranks, *overhead);
    if (!budgets.ok()) return plan_failure(budgets.status());
    devices = *std::move(budgets);
    const hal::DeviceInfo& first = infos->front();
    if (first.shared_memory && ranks == 1) {
      devices_line = fmt::format("Devices: 1 {} device with all of its memory ({}) (--devices to plan for others)",
                                 first.backend, engine::gib(first.memory_bytes));
    } else if (first.shared_memory) {
      devices_line = fmt::format("Devices: {} {} device{} sharing one memory ({}): {} each (--devices to plan for "
                                 "others)",
                                 ranks, first.backend, ranks == 1 ? "" : "s", engine::gib(first.memory_bytes),
                                 engine::gib(first.memory_bytes / static_cast<std::uint64_t>(ranks)));
    } else {
      std::vector<std::string> each;
      for (const engine::DeviceBudget& d : devices) each.push_back(fmt::format("{} {}", d.name, engine::gib(d.capacity_bytes)));
      devices_line = fmt::format("Devices: {} (--devices to plan for others)", fmt::join(each, ", "));
    }
  }
  auto memory = engine::plan_memory(m.config, m.types, *plan, devices, mo);
  if (!memory.ok()) return usage_error(memory.status());
  if (placement) {
    std::vector<std::string> gpus;
    for (int s = 0; s < plan->pp; ++s) {
      for (const int d : placement->chosen.groups[static_cast<std::size_t>(s)]) {
        gpus.push_back(topology->gpus[static_cast<std::size_t>(d)]);
      }
    }
    devices_line += fmt::format("; the table is replica 0's, on {}", fmt::join(gpus, ", "));
  }

  if (args.has("--json")) {
    nlohmann::json j;
    j["model"] = m.what;
    j["tp"] = plan->tp;
    j["pp"] = plan->pp;
    j["replicas"] = placement ? placement->chosen.replicas : 1;
    j["fits"] = memory->fits;
    if (!memory->fits) j["refusal"] = memory->refusal;
    if (!plan->requantized.empty()) j["requantized"] = plan->requantized;
    j["ranks"] = nlohmann::json::array();
    for (const parallel::RankPlan& r : plan->ranks) {
      j["ranks"].push_back({{"rank", r.rank},
                            {"stage", r.stage},
                            {"tp_rank", r.tp_rank},
                            {"q_heads", {r.q_heads.begin, r.q_heads.end}},
                            {"kv_heads", {r.kv_heads.begin, r.kv_heads.end}},
                            {"ffn_rows", {r.ffn.begin, r.ffn.end}},
                            {"vocab_rows", {r.vocab.begin, r.vocab.end}},
                            {"layers", {r.layers.begin, r.layers.end}},
                            {"weight_bytes", r.weight_bytes}});
    }
    j["devices"] = nlohmann::json::array();
    for (const engine::DeviceMemory& d : memory->devices) {
      j["devices"].push_back({{"name", d.name},
                              {"capacity_bytes", d.capacity},
                              {"weight_bytes", d.weights},
                              {"workspace_bytes", d.workspace},
                              {"overhead_bytes", d.overhead},
                              {"kv_pool_bytes", d.kv_pool},
                              {"free_bytes", d.free}});
    }
    j["kv_tokens"] = memory->kv_tokens;
    nlohmann::json pl;
    if (placement) {
      const parallel::Layout& c = placement->chosen;
      pl["groups"] = c.groups;
      pl["layout"] = c.describe();
      pl["why"] = placement->why;
      pl["worst_link_in_a_tp_group"] = c.worst_link;
      pl["topology"] = topology->source;
      pl["layouts_compared"] = placement->candidates;
      if (placement->has_alternative) {
        pl["alternative"] = {{"layout", placement->alternative.describe()},
                             {"groups", placement->alternative.groups},
                             {"cost", placement->alternative_cost}};
      }
    } else {
      // Without --topology: the devices in the order given, a TP group per stage.
      std::vector<std::vector<int>> groups(static_cast<std::size_t>(plan->pp));
      for (const parallel::RankPlan& r : plan->ranks) groups[static_cast<std::size_t>(r.stage)].push_back(r.rank);
      pl["groups"] = groups;
      pl["why"] = "the devices in the order given (--topology FILE to choose them from the machine's links)";
    }
    j["placement"] = pl;
    std::fputs((j.dump(2) + "\n").c_str(), stdout);
    return memory->fits ? 0 : 1;
  }

  std::fputs(describe_model(m.what, m.config, m.types, *kv).c_str(), stdout);
  if (!m.note.empty()) std::fputs((m.note + "\n").c_str(), stdout);
  const std::string ffn_split =
      m.config.is_moe()
          ? fmt::format("{} experts of {} rows per layer split whole across the ranks (expert parallelism: each "
                        "token's {} experts run where they are held; the FFN's all-reduce sums the ranks' shares); "
                        "the router on every rank",
                        m.config.n_experts, m.config.expert_ffn, m.config.n_experts_used) +
                (plan->tp > 1 ? expert_parallel_why(m.config, plan->tp) : std::string())
          : fmt::format("FFN rows split {}", plan->ffn_unit == 1 ? std::string("row by row")
                                                                 : fmt::format("in whole {}-row blocks of the down "
                                                                               "weights", plan->ffn_unit));
  std::fputs(fmt::format("TP {} x PP {} = {} ranks; {}\n\n", plan->tp, plan->pp, ranks, ffn_split).c_str(), stdout);
  std::fputs(parallel::format_plan(*plan, m.config).c_str(), stdout);
  std::fputs(fmt::format("\n{}\n", devices_line).c_str(), stdout);
  if (!links.empty()) std::fputs(fmt::format("GPU links:\n{}", links).c_str(), stdout);
  if (placement) {
    std::string text = fmt::format("Placement from {} ({} layouts compared): {}\n  why: {}\n", topology->source,
                                   placement->candidates, placement->chosen.describe(), placement->why);
    if (placement->has_alternative) {
      text += fmt::format("  instead of {}: {}\n", placement->alternative.describe(), placement->alternative_cost);
    }
    text += "GPU links:\n" + hal::format_topology(*topology);
    std::fputs(text.c_str(), stdout);
  }
  std::fputs(engine::format_memory_plan(*memory, args.has("--verbose")).c_str(), stdout);
  std::fflush(stdout);
  if (!memory->fits) {
    std::fprintf(stderr, "sextant plan: refused: %s\n", memory->refusal.c_str());
    return 1;
  }
  return 0;
}

}  // namespace sx::daemon
