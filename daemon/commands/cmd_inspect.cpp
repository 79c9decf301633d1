// `sextant inspect PATH`: what a model is (format, architecture, hyper-parameters, tokenizer,
// tensors) and whether it can be served, without touching a device. Exit 0: it can be served;
// 1: it cannot (every problem found is listed); 2: usage error.
#include <cstdio>
#include <string>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "daemon/commands/commands.h"
#include "daemon/commands/model_session.h"
#include "runtime/parallel/shard_plan.h"

namespace sx::daemon {

namespace {

using nlohmann::ordered_json;

struct Row {
  std::string name, type, shape, file;
  std::uint64_t bytes = 0;
};

std::vector<Row> tensor_rows(const engine::OpenedModel& m) {
  std::vector<Row> rows;
  if (const model::HfModel* hf = m.hf()) {
    for (const model::SafetensorsTensor* t : hf->weights().tensors()) {
      rows.push_back({t->name, t->dtype_name, t->shape_string(), std::filesystem::path(t->file).filename().string(),
                      t->n_bytes()});
    }
  } else {
    for (const model::TensorInfo& t : m.weights->tensors()) {
      rows.push_back({t.name, t.type_name, t.dims_string(), std::filesystem::path(t.file).filename().string(), t.n_bytes});
    }
  }
  return rows;
}

std::string token_text(const tokenizer::Tokenizer& tok, std::optional<std::int32_t> id) {
  if (!id) return "none";
  return fmt::format("{} ({})", *id, tok.token_string(*id));
}

int inspect(const Args& args) {
  const bool as_json = args.has("--json");
  // ORG/NAME: its cached snapshot (a model not in the cache is reported like any open failure).
  auto resolved = resolve_model_path(args.positional()[0], false);
  const std::string path = resolved.ok() ? *resolved : args.positional()[0];
  auto opened = resolved.ok() ? engine::open_model_unchecked(path) : Result<engine::OpenedModel>(resolved.status());
  if (!opened.ok()) {
    if (as_json) {
      ordered_json j{{"path", path}, {"servable", false}, {"errors", {opened.status().message()}}, {"warnings", ordered_json::array()}};
      std::printf("%s\n", j.dump(2).c_str());
    } else {
      std::printf("%s\nverdict: CANNOT be served\n  error: %s\n", path.c_str(), opened.status().message().c_str());
    }
    return 1;
  }
  engine::OpenedModel& m = *opened;
  model::ModelCheck& check = m.check;
  if (check.ok()) {
    auto types = parallel::weight_types_from_source(*m.weights, m.config, parallel::WeightTypeCheck::kLoadable);
    if (!types.ok()) check.errors.push_back({types.status().code(), types.status().message()});
  }
  if (args.has("--verify-checksums")) {
    std::string last;
    model::verify_checksums(*m.weights, check, [&](const std::string& file, std::uint64_t done, std::uint64_t total) {
      if (as_json) return;
      std::fprintf(stderr, "\rverifying %s: %3.0f%%", std::filesystem::path(file).filename().c_str(),
                   total == 0 ? 100.0 : 100.0 * static_cast<double>(done) / static_cast<double>(total));
      if (done == total) std::fputc('\n', stderr);
    });
  }
  if (args.has("--scan-values")) model::scan_values(*m.weights, check);

  const model::ModelConfig& c = m.config;
  const tokenizer::Tokenizer& tok = *m.tokenizer;
  const std::vector<Row> rows = tensor_rows(m);
  std::uint64_t total = 0;
  for (const Row& r : rows) total += r.bytes;
  const std::vector<std::string> files = m.weights->weight_files();

  if (as_json) {
    ordered_json j;
    j["path"] = path;
    j["format"] = m.weights->format();
    j["files"] = files;
    j["config"] = {{"architecture", c.architecture}, {"name", c.name},       {"n_layers", c.n_layers},
                   {"hidden", c.hidden},             {"n_heads", c.n_heads}, {"n_kv_heads", c.n_kv_heads},
                   {"head_dim", c.head_dim},         {"ffn", c.ffn},         {"vocab", c.vocab},
                   {"context_length", c.context_length}, {"rope_theta", c.rope_theta}, {"rms_eps", c.rms_eps},
                   {"tied_embeddings", c.tied_embeddings}, {"qkv_bias", c.qkv_bias}};
    if (c.is_moe()) {
      j["config"]["experts"] = {{"count", c.n_experts},
                                {"used_per_token", c.n_experts_used},
                                {"ffn", c.expert_ffn},
                                {"norm_topk_prob", c.norm_topk_prob}};
    }
    j["tokenizer"] = {{"tokens", tok.vocab_size()},
                      {"eos_id", tok.eos_id() ? ordered_json(*tok.eos_id()) : ordered_json(nullptr)},
                      {"bos_id", tok.bos_id() ? ordered_json(*tok.bos_id()) : ordered_json(nullptr)},
                      {"add_bos", tok.add_bos()},
                      {"chat_template", !tok.data().chat_template.empty()}};
    if (const model::HfModel* hf = m.hf()) {
      j["generation_config"] = {{"present", hf->generation().present}, {"eos_token_id", hf->generation().eos_ids}};
      j["torch_dtype"] = hf->hf_config().torch_dtype;
      const model::HfConfig& q = hf->hf_config();
      j["quantization"] = q.quant_method.empty()
                              ? ordered_json(nullptr)
                              : ordered_json{{"method", q.quant_method},
                                             {"bits", q.quant_bits},
                                             {"group_size", q.quant_group_size},
                                             {"checkpoint_format", q.quant_checkpoint_format}};
    }
    ordered_json tensors = ordered_json::array();
    for (const Row& r : rows) {
      tensors.push_back({{"name", r.name}, {"type", r.type}, {"shape", r.shape}, {"bytes", r.bytes}, {"file", r.file}});
    }
    j["tensors"] = std::move(tensors);
    j["weight_bytes"] = total;
    j["servable"] = check.ok();
    ordered_json errors = ordered_json::array();
    for (const model::CheckFinding& f : check.errors) errors.push_back(f.message);
    j["errors"] = std::move(errors);
    j["warnings"] = check.warnings;
    std::printf("%s\n", j.dump(2).c_str());
    return check.ok() ? 0 : 1;
  }

  std::string out;
  out += fmt::format("{}\n", path);
  out += fmt::format("format: {} ({} file{})\n", m.weights->format(), files.size(), files.size() == 1 ? "" : "s");
  out += fmt::format("model: {}{}\n", model::model_summary(c), c.name.empty() ? "" : fmt::format(" [{}]", c.name));
  out += fmt::format("  head_dim {}, context {}, rope theta {}, rms eps {}\n", c.head_dim, c.context_length,
                     c.rope_theta, c.rms_eps);
  out += fmt::format("tokenizer: {} tokens, eos {}, bos {}, add_bos {}, chat template {}\n", tok.vocab_size(),
                     token_text(tok, tok.eos_id()), token_text(tok, tok.bos_id()), tok.add_bos() ? "yes" : "no",
                     tok.data().chat_template.empty() ? "none" : "yes");
  if (const model::HfModel* hf = m.hf()) {
    const model::GenerationConfig& g = hf->generation();
    out += fmt::format("generation_config.json: {}", g.present ? "" : "absent");
    if (g.present) out += fmt::format("eos_token_id {}", fmt::join(g.eos_ids, ", "));
    out += fmt::format("; torch_dtype {}\n", hf->hf_config().torch_dtype.empty() ? "unset" : hf->hf_config().torch_dtype);
    const model::HfConfig& q = hf->hf_config();
    if (!q.quant_method.empty()) {
      const std::string format =
          q.quant_checkpoint_format.empty() ? "" : fmt::format(" (checkpoint_format {})", q.quant_checkpoint_format);
      out += fmt::format("quantization: {} {}-bit, groups of {}{}; layer matrices repacked to awq_int4 at load\n",
                         q.quant_method, q.quant_bits, q.quant_group_size, format);
    }
  }
  std::size_t wn = 4, wt = 4, ws = 5;
  for (const Row& r : rows) {
    wn = std::max(wn, r.name.size());
    wt = std::max(wt, r.type.size());
    ws = std::max(ws, r.shape.size());
  }
  out += fmt::format("tensors: {}\n  {:<{}}  {:<{}}  {:<{}}  {:>12}  {}\n", rows.size(), "name", wn, "type", wt,
                     "shape", ws, "bytes", "file");
  for (const Row& r : rows) {
    out += fmt::format("  {:<{}}  {:<{}}  {:<{}}  {:>12}  {}\n", r.name, wn, r.type, wt, r.shape, ws, r.bytes, r.file);
  }
  out += fmt::format("weight bytes: {} ({:.1f} MiB)\n", total, static_cast<double>(total) / (1 << 20));
  for (const std::string& w : check.warnings) out += fmt::format("warning: {}\n", w);
  if (check.ok()) {
    out += "verdict: can be served\n";
  } else {
    out += fmt::format("verdict: CANNOT be served ({} problem{}{})\n", check.errors.size(),
                       check.errors.size() == 1 ? "" : "s", check.truncated ? ", more not shown" : "");
    for (const model::CheckFinding& f : check.errors) out += fmt::format("  error: {}\n", f.message);
  }
  std::fputs(out.c_str(), stdout);
  return check.ok() ? 0 : 1;
}

}  // namespace

int cmd_inspect(int argc, char** argv) {
  Args args("inspect",
            "Show a model's format, architecture, hyper-parameters, tokenizer and tensors, and check that it can be "
            "served (exit 0) or list why not (exit 1). PATH is a GGUF file or a Hugging Face safetensors directory.",
            {
                {{"--json"}, false, false, "print one JSON object instead of text", ""},
                {{"--verify-checksums"}, false, false,
                 "compare each weight file's SHA-256 with SHA256SUMS next to it (or a Hugging Face cache blob name)", ""},
                {{"--scan-values"}, false, false, "check every weight value is finite (no NaN / Inf)", ""},
            },
            "PATH");
  if (Status s = args.parse(argc, argv); !s.ok()) return report_error("inspect", s);
  if (args.has("--help")) {
    std::fputs(args.usage().c_str(), stdout);
    return 0;
  }
  if (args.positional().size() != 1) return report_error("inspect", invalid_argument_error("give exactly one model PATH"));
  return inspect(args);
}

}  // namespace sx::daemon
