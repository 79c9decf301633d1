// Shared by the bundled-model tests that load a variant of it (requantised, converted,
// safetensors): where the model lives and how far greedy decoding of a variant follows the
// reference continuation.
#pragma once

#include <gtest/gtest.h>

#include <cstdlib>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "backends/registry.h"
#include "runtime/engine/generator.h"
#include "runtime/engine/model_loader.h"
#include "runtime/engine/model.h"

namespace sx {

inline std::string models_dir() {
  const char* d = std::getenv("SX_MODELS_DIR");
  return d != nullptr ? d : "models/memorise";
}

// Greedy continuation of the reference prompt by the model at `path` (GGUF file or safetensors
// directory): how many of the 256 reference tokens it reproduces before the first difference.
inline std::size_t greedy_tokens_kept(const std::string& path) {
  std::ifstream in(models_dir() + "/reference.json");
  const auto ref = nlohmann::json::parse(in);
  const auto prompt = ref["prompt_ids"].get<std::vector<std::int32_t>>();
  const auto expect = ref["continuation_ids"].get<std::vector<std::int32_t>>();
  auto opened = engine::open_model(path);
  EXPECT_TRUE(opened.ok()) << opened.status().to_string();
  if (!opened.ok()) return 0;
  auto backend = backends::default_registry().find("cpu");
  EXPECT_TRUE(backend.ok());
  hal::DeviceOptions o;
  o.set("threads", 2);
  auto device = std::move((*backend)->create_device(0, o)).value();
  engine::ModelOptions mo;
  mo.kv.num_blocks = static_cast<std::int64_t>(prompt.size() + expect.size() + 15) / 16 + 1;
  mo.max_batch_tokens = 64;
  mo.max_logit_rows = 1;
  auto m = engine::Model::load(*opened->weights, opened->config, *device, mo);
  EXPECT_TRUE(m.ok()) << m.status().to_string();
  if (!m.ok()) return 0;
  engine::GenerateOptions g;
  g.sampling.temperature = 0.0f;
  g.max_tokens = static_cast<std::int64_t>(expect.size());
  g.ignore_eos = true;
  auto r = engine::generate(**m, *opened->tokenizer, prompt, g);
  EXPECT_TRUE(r.ok()) << r.status().to_string();
  if (!r.ok()) return 0;
  std::size_t same = 0;
  while (same < expect.size() && same < r->tokens.size() && r->tokens[same] == expect[same]) ++same;
  return same;
}

}  // namespace sx
