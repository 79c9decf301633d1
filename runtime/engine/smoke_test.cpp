// The smoke test before the big load (smoke_test.h).
#include "runtime/engine/smoke_test.h"

#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "runtime/engine/model_loader.h"
#include "runtime/engine/model.h"
#include "runtime/engine/sampler.h"

namespace sx::engine {

namespace {

constexpr int kPromptTokens = 8;

std::string binary_dir() {
  std::error_code ec;
  const std::filesystem::path exe = std::filesystem::read_symlink("/proc/self/exe", ec);
  return ec ? std::string() : exe.parent_path().string();
}

}  // namespace

std::string find_smoke_model() {
  if (const char* env = std::getenv("SEXTANT_SMOKE_MODEL"); env != nullptr && *env != '\0') return env;
  const std::string dir = binary_dir();
  if (dir.empty()) return {};
  for (const char* rel : {"../share/sextant/memorise-f16.gguf", "../../models/memorise/memorise-f16.gguf",
                          "../models/memorise/memorise-f16.gguf"}) {
    const std::filesystem::path p = std::filesystem::path(dir) / rel;
    std::error_code ec;
    if (std::filesystem::is_regular_file(p, ec)) return std::filesystem::weakly_canonical(p, ec).string();
  }
  return {};
}

Result<SmokeResult> run_smoke_test(const std::string& model_path, hal::Backend& backend,
                                   std::span<hal::Device* const> devices, int tp, int pp, int steps) {
  const auto t0 = std::chrono::steady_clock::now();
  SmokeResult r;
  SX_ASSIGN_OR_RETURN(OpenedModel m, open_model(model_path));
  const model::ModelConfig& c = m.config;
  if (tp > c.n_heads || pp > c.n_layers) {
    r.skipped = fmt::format("the bundled model has {} heads and {} layers; tp {} x pp {} needs more", c.n_heads,
                            c.n_layers, tp, pp);
    return r;
  }
  const std::filesystem::path text_path = std::filesystem::path(model_path).parent_path() / "text.txt";
  std::ifstream text_file(text_path);
  if (!text_file) return not_found_error("smoke test: {} (the bundled model's text) is missing", text_path.string());
  std::stringstream text;
  text << text_file.rdbuf();
  const std::vector<std::int32_t> ids = m.tokenizer->encode(text.str());
  if (static_cast<int>(ids.size()) < kPromptTokens + steps) {
    return invalid_argument_error("smoke test: {} has {} tokens, fewer than {}", text_path.string(), ids.size(),
                                  kPromptTokens + steps);
  }
  ModelOptions mo;
  mo.kv.block_size = 16;
  mo.kv.num_blocks = (kPromptTokens + steps + 15) / 16 + 1;
  mo.max_batch_tokens = kPromptTokens;
  mo.max_logit_rows = 1;
  mo.max_blocks_per_seq = mo.kv.num_blocks - 1;
  ParallelOptions po;
  po.tp = tp;
  po.pp = pp;
  std::unique_ptr<Model> model;
  if (devices.size() == 1 && tp == 1 && pp == 1) {
    SX_ASSIGN_OR_RETURN(model, Model::load(*m.weights, c, *devices[0], mo));
  } else {
    SX_ASSIGN_OR_RETURN(model, Model::load(*m.weights, c, backend, devices, po, mo));
  }
  std::vector<std::string> names;
  for (const hal::Device* d : devices) names.push_back(d->info().name);
  std::vector<float> logits;
  const std::span<const std::int32_t> prompt(ids.data(), kPromptTokens);
  SX_RETURN_IF_ERROR(model->forward(single_sequence_batch(prompt, 0, mo.blocks_per_seq()), logits));
  for (int s = 0; s < steps; ++s) {
    const std::int32_t got = argmax(logits);
    const std::int32_t want = ids[static_cast<std::size_t>(kPromptTokens + s)];
    if (got != want) {
      return failed_precondition_error(
          "smoke test: the bundled model through tp {} x pp {} on {} gave token {} ({:?}) at step {} where its text "
          "has {} ({:?}): a rank computes wrong results, or a collective moves wrong data; run `sextant doctor` with "
          "this layout, and compare with --tp 1",
          tp, pp, fmt::join(names, ", "), got, m.tokenizer->decode(std::span(&got, 1)), s + 1, want,
          m.tokenizer->decode(std::span(&want, 1)));
    }
    const std::int32_t one[1] = {got};
    SX_RETURN_IF_ERROR(model->forward(
        single_sequence_batch(one, static_cast<std::int32_t>(kPromptTokens + s), mo.blocks_per_seq()), logits));
  }
  r.steps = steps;
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return r;
}

}  // namespace sx::engine
