// The bundled model (models/memorise) requantised from its F32 file into llama.cpp's Q4_K_M, Q5_K
// and Q6_K mixes (model::mixed_weight_type, the rules of `sextant make-model --type q4_k_m / q5_k /
// q6_k`) must keep the F32 greedy continuation for at least 100 tokens; prints how many it keeps.
//
// Note: this model's rows are 224 (hidden) and 608 (ffn) wide, not whole 256-blocks, so both mixes
// take llama.cpp's fallbacks here: Q4_K_M becomes Q5_0 (most matrices) + Q8_0 (the tied LM head and
// the attn_v / ffn_down of the layers with more bits), Q5_K becomes Q5_1, Q6_K becomes Q8_0. The K-quant kernels are
// covered by tests/unit/cpu_kernels and the Qwen2.5-0.5B-shaped random models.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "backends/registry.h"
#include "runtime/engine/generator.h"
#include "runtime/engine/model_loader.h"
#include "runtime/engine/model.h"
#include "runtime/hal/dtype.h"
#include "runtime/model/gguf.h"
#include "runtime/model/gguf_types.h"
#include "runtime/model/gguf_writer.h"
#include "runtime/model/random_model.h"
#include "tests/e2e/memorise_util.h"

namespace sx {
namespace {

// memorise-f32.gguf with every 2-D tensor requantised under `mix`; returns the type counts.
std::map<std::string, int> requantise(model::WeightMix mix, const std::string& out) {
  std::map<std::string, int> counts;
  auto opened = engine::open_model(models_dir() + "/memorise-f32.gguf");
  EXPECT_TRUE(opened.ok()) << opened.status().to_string();
  if (!opened.ok()) return counts;
  const model::GgufFile* f = opened->gguf();
  model::GgufWriter w;
  for (const auto& [key, value] : f->metadata()) w.set(key, value);
  w.set_uint32("general.file_type", mix == model::WeightMix::kQ4_K_M ? 15 : mix == model::WeightMix::kQ5_K ? 16 : 18);
  for (const model::TensorInfo& t : f->tensors()) {
    std::vector<std::uint8_t> bytes(t.data.begin(), t.data.end());
    hal::DType type = *t.dtype;
    if (t.dims.size() == 2) {
      type = model::mixed_weight_type(opened->config, mix, hal::DType::kF32, t.name, t.dims[0]);
      const std::int64_t k = t.dims[0], rows = t.dims[1];
      bytes.assign(hal::row_bytes(type, k) * static_cast<std::size_t>(rows), 0);
      hal::convert_rows(*t.dtype, t.data.data(), type, bytes.data(), rows, k);
    }
    ++counts[std::string(hal::dtype_name(type))];
    EXPECT_TRUE(w.add_tensor(t.name, t.dims, model::ggml_type_of(type), std::move(bytes)).ok()) << t.name;
  }
  const Status s = w.write(out);
  EXPECT_TRUE(s.ok()) << s.to_string();
  return counts;
}

TEST(MemoriseQuant, RequantisedMixesKeepTheGreedyText) {
  const std::string dir = testing::TempDir();
  for (auto [mix, name] : {std::pair{model::WeightMix::kQ4_K_M, "q4_k_m"}, std::pair{model::WeightMix::kQ5_K, "q5_k"},
                           std::pair{model::WeightMix::kQ6_K, "q6_k"}}) {
    const std::string path = dir + "/memorise-" + name + ".gguf";
    const auto counts = requantise(mix, path);
    std::string desc;
    for (const auto& [t, c] : counts) desc += " " + t + " x" + std::to_string(c);
    const std::size_t kept = greedy_tokens_kept(path);
    std::printf("memorise %s (%s): %zu of 256 F32 greedy tokens kept\n", name, desc.c_str() + 1, kept);
    EXPECT_GE(kept, 100u) << name;
    std::filesystem::remove(path);
  }
}

}  // namespace
}  // namespace sx
