// The bundled model moved between formats: written as a Hugging Face safetensors directory (F32 in
// one file and in 4 shards, F16, BF16) and converted back to GGUF (F32, F16, Q8_0) from the sharded
// directory. The F32 variants give bit-identical logits to memorise-f32.gguf; F16 / BF16 stay
// within their rounding; greedy decoding reproduces the memorised text from safetensors and from
// the converted files.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

#include "backends/cpu/kernels/kernel_table.h"
#include "runtime/engine/model_export.h"
#include "runtime/model/random_model.h"
#include "tests/e2e/memorise_util.h"

namespace sx {
namespace {

namespace fs = std::filesystem;

// Made once for the whole suite.
class Variants : public testing::Environment {
 public:
  static std::string dir() { return (fs::path(testing::TempDir()) / ("sx_formats_" + std::to_string(::getpid()))).string(); }
  static std::string path(const std::string& name) { return dir() + "/" + name; }

  void SetUp() override {
    fs::create_directories(dir());
    auto f32 = engine::open_model(models_dir() + "/memorise-f32.gguf");
    ASSERT_TRUE(f32.ok()) << f32.status().to_string();
    struct St {
      const char* name;
      hal::DType type;
      int shards;
    };
    for (St s : {St{"st-f32", hal::DType::kF32, 1}, St{"st-f32x4", hal::DType::kF32, 4},
                 St{"st-f16", hal::DType::kF16, 2}, St{"st-bf16", hal::DType::kBF16, 1}}) {
      const Status st = engine::export_safetensors(*f32, s.type, s.shards, path(s.name));
      ASSERT_TRUE(st.ok()) << st.to_string();
    }
    auto sharded = engine::open_model(path("st-f32x4"));
    ASSERT_TRUE(sharded.ok()) << sharded.status().to_string();
    for (hal::DType t : {hal::DType::kF32, hal::DType::kF16, hal::DType::kQ8_0}) {
      const Status st = engine::convert_to_gguf(*sharded, t, path(std::string("converted-") +
                                                                  std::string(hal::dtype_name(t)) + ".gguf"));
      ASSERT_TRUE(st.ok()) << st.to_string();
    }
  }
  void TearDown() override {
    std::error_code ec;
    fs::remove_all(dir(), ec);
  }
};

const testing::Environment* const kVariants = testing::AddGlobalTestEnvironment(new Variants);

std::vector<float> last_logits(const std::string& path) {
  std::ifstream in(models_dir() + "/reference.json");
  const auto prompt = nlohmann::json::parse(in)["prompt_ids"].get<std::vector<std::int32_t>>();
  auto opened = engine::open_model(path);
  EXPECT_TRUE(opened.ok()) << opened.status().to_string();
  if (!opened.ok()) return {};
  auto device = std::move((*backends::default_registry().find("cpu"))->create_device(0, hal::DeviceOptions{})).value();
  engine::ModelOptions mo;
  mo.kv.num_blocks = 4;
  mo.max_logit_rows = 1;
  auto m = engine::Model::load(*opened->weights, opened->config, *device, mo);
  EXPECT_TRUE(m.ok()) << m.status().to_string();
  if (!m.ok()) return {};
  std::vector<float> logits;
  EXPECT_TRUE((*m)->forward(engine::single_sequence_batch(prompt, 0, mo.kv.num_blocks), logits).ok());
  return logits;
}

// Largest |a - b| over the largest |a|; infinite when either holds a NaN or Inf.
double relative_diff(const std::vector<float>& a, const std::vector<float>& b) {
  double worst = 0, scale = 0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    if (!std::isfinite(a[i]) || !std::isfinite(b[i])) return INFINITY;
    worst = std::max(worst, std::fabs(double(a[i]) - b[i]));
    scale = std::max(scale, std::fabs(double(a[i])));
  }
  return worst / scale;
}

TEST(MemoriseFormats, F32IsBitIdenticalEverywhere) {
  const std::vector<float> ref = last_logits(models_dir() + "/memorise-f32.gguf");
  ASSERT_EQ(ref.size(), 515u);
  for (const char* v : {"st-f32", "st-f32x4", "converted-f32.gguf"}) {
    const std::vector<float> got = last_logits(Variants::path(v));
    EXPECT_EQ(got, ref) << v;
    std::printf("%s: logits %s memorise-f32.gguf's\n", v, got == ref ? "bit-identical to" : "DIFFER from");
  }
}

TEST(MemoriseFormats, HalfFormatsStayWithinTheirRounding) {
  const std::vector<float> ref = last_logits(models_dir() + "/memorise-f32.gguf");
  const std::vector<float> gguf_f16 = last_logits(models_dir() + "/memorise-f16.gguf");
  struct Case {
    const char* name;
    double bound;
  };
  // F16 keeps 11 significant bits, BF16 8; the bounds leave room over what was measured (printed).
  // On a level with BF16 dot products F16 weights meet x rounded to BF16, as BF16 ones do
  // (kernel_table.h), in every step: BF16's bound.
  const double f16 = cpu::kernels().bf16_dot_gemm ? 5e-3 : 1e-3;
  for (Case c : {Case{"st-f16", f16}, Case{"converted-f16.gguf", f16}, Case{"st-bf16", 5e-3},
                 Case{"converted-q8_0.gguf", 1e-2}}) {
    const std::vector<float> got = last_logits(Variants::path(c.name));
    ASSERT_EQ(got.size(), ref.size()) << c.name;
    const double d = relative_diff(ref, got);
    std::printf("%s: max |logit - f32 logit| / max |f32 logit| = %.3g (bound %.0e)\n", c.name, d, c.bound);
    EXPECT_LE(d, c.bound) << c.name;
    EXPECT_EQ(engine::argmax(got), engine::argmax(ref)) << c.name;
  }
  // F16 from the converter equals the bundled F16 file (the same rounding of the same weights).
  EXPECT_EQ(last_logits(Variants::path("converted-f16.gguf")), gguf_f16);
}

TEST(MemoriseFormats, GreedyTextFromSafetensorsAndConvertedFiles) {
  for (const char* v : {"st-f32x4", "st-f16", "st-bf16", "converted-f16.gguf", "converted-q8_0.gguf"}) {
    const std::size_t kept = greedy_tokens_kept(Variants::path(v));
    std::printf("%s: %zu of 256 continuation tokens reproduced\n", v, kept);
    EXPECT_EQ(kept, 256u) << v;
  }
}

// AWQ and GPTQ need layer inputs in whole groups of 128, which the bundled model (224 / 608) does
// not have: a random qwen2 of hidden 256 and FFN 384 written as a 4-bit checkpoint, against its
// dequantised F32 twin (`convert --type f32` of the directory) and against the F32 model it was
// quantized from.
void check_int4_checkpoint(model::Int4Checkpoint format) {
  const bool gptq = format == model::Int4Checkpoint::kGptq;
  const std::string tag = gptq ? "gptq" : "awq";
  model::RandomModelSpec spec;
  spec.config = model::qwen2_5_config("0.5b");
  spec.config.n_layers = 2;
  spec.config.hidden = 256;
  spec.config.n_heads = 4;
  spec.config.n_kv_heads = 2;
  spec.config.head_dim = 64;
  spec.config.ffn = 384;
  spec.config.vocab = 512;
  spec.config.context_length = 256;
  spec.weight_type = hal::DType::kF32;
  spec.init_std = 0.08f;
  spec.seed = 3;
  const std::string f32 = Variants::path(tag + "-source.gguf");
  ASSERT_TRUE(model::write_random_gguf(spec, f32).ok());
  auto source = engine::open_model(f32);
  ASSERT_TRUE(source.ok()) << source.status().to_string();
  const Status written = engine::export_safetensors(*source, hal::DType::kF16, 2, Variants::path(tag), format);
  ASSERT_TRUE(written.ok()) << written.to_string();
  auto awq = engine::open_model(Variants::path(tag));
  ASSERT_TRUE(awq.ok()) << awq.status().to_string();
  const model::TensorInfo* q = awq->weights->find_tensor("blk.1.ffn_down.weight");
  ASSERT_NE(q, nullptr);
  EXPECT_EQ(q->dtype, hal::DType::kAwqInt4);
  EXPECT_EQ(q->dims, (std::vector<std::int64_t>{384, 256}));
  EXPECT_EQ(awq->weights->find_tensor("token_embd.weight")->dtype, hal::DType::kF16);
  ASSERT_TRUE(engine::convert_to_gguf(*awq, hal::DType::kF32, Variants::path(tag + "-twin.gguf")).ok());
  // Every dequantised weight within one quantisation step of its source (half a step from rounding,
  // up to a whole one where the zero point's rounding pushes the group's largest value past 15). The
  // step: (max - min) / 15 for AWQ, 2 max |w| / 15 for symmetric GPTQ.
  for (const model::TensorInfo& t : awq->weights->tensors()) {
    if (t.dtype != hal::DType::kAwqInt4) continue;
    const model::TensorInfo* ref = source->weights->find_tensor(t.name);
    const std::int64_t in = t.dims[0];
    std::vector<float> got(static_cast<std::size_t>(in));
    double worst = 0;
    for (std::int64_t n = 0; n < t.dims[1]; ++n) {
      hal::dequantize_row(hal::DType::kAwqInt4, t.data.data() + hal::row_bytes(t.dtype.value(), in) * n, got.data(), in);
      const float* want = reinterpret_cast<const float*>(ref->data.data()) + n * in;
      for (std::int64_t g = 0; g < in; g += 128) {
        const auto [lo, hi] = std::minmax_element(want + g, want + g + 128);
        const double span = gptq ? 2.0 * std::max(std::fabs(*lo), std::fabs(*hi)) : *hi - *lo;
        const double step = span / 15.0 * 1.001;
        for (std::int64_t i = g; i < g + 128; ++i) worst = std::max(worst, std::fabs(got[i] - want[i]) / step);
      }
    }
    EXPECT_LE(worst, 1.0) << t.name;
  }

  const std::vector<std::int32_t> prompt = {1, 17, 200, 33, 4, 480, 9, 64};
  auto logits = [&](const std::string& path) {
    auto m = engine::open_model(path);
    EXPECT_TRUE(m.ok()) << m.status().to_string();
    auto device = std::move((*backends::default_registry().find("cpu"))->create_device(0, hal::DeviceOptions{})).value();
    engine::ModelOptions mo;
    mo.kv.num_blocks = 4;
    mo.max_logit_rows = 1;
    auto model = engine::Model::load(*m->weights, m->config, *device, mo);
    EXPECT_TRUE(model.ok()) << model.status().to_string();
    std::vector<float> out;
    EXPECT_TRUE((*model)->forward(engine::single_sequence_batch(prompt, 0, mo.kv.num_blocks), out).ok());
    return out;
  };
  const std::vector<float> a = logits(Variants::path(tag));
  const std::vector<float> twin = logits(Variants::path(tag + "-twin.gguf"));
  const std::vector<float> orig = logits(f32);
  ASSERT_TRUE(engine::convert_to_gguf(*source, hal::DType::kQ4_1, Variants::path(tag + "-q4_1.gguf")).ok());
  const std::vector<float> q4_1 = logits(Variants::path(tag + "-q4_1.gguf"));
  ASSERT_EQ(a.size(), 512u);
  const double vs_twin = relative_diff(twin, a), vs_f32 = relative_diff(orig, a);
  const double q4_1_vs_f32 = relative_diff(orig, q4_1);
  std::printf("%s: logits vs dequantised f32 twin %.3g, vs the unquantised f32 model %.3g; q4_1 (groups of 32) vs "
              "f32 %.3g (relative to max |logit|)\n",
              tag.c_str(), vs_twin, vs_f32, q4_1_vs_f32);
  // The same values; only the order of the sums differs, but for the checkpoint's F16 embedding
  // (tied: the logits' matrix), which a level with BF16 dot products multiplies by x rounded to
  // BF16 (kernel_table.h), where the twin's F32 copy is exact.
  EXPECT_LE(vs_twin, cpu::kernels().bf16_dot_gemm ? 5e-3 : 1e-5);
  // 4-bit quantisation of every layer matrix moves the logits of this random model about as much as
  // ggml's Q4_1 does (finer groups of 32 with an fp16 minimum: smaller steps).
  EXPECT_LE(vs_f32, 3 * q4_1_vs_f32);
  EXPECT_GT(vs_f32, vs_twin);
}

TEST(MemoriseFormats, AwqCheckpointMatchesItsDequantisedTwin) { check_int4_checkpoint(model::Int4Checkpoint::kAwq); }

TEST(MemoriseFormats, GptqCheckpointMatchesItsDequantisedTwin) { check_int4_checkpoint(model::Int4Checkpoint::kGptq); }

TEST(MemoriseFormats, WrongKindOfPathIsAClearError) {
  // A shard handed over as if it were a GGUF file, and a missing directory.
  auto shard = engine::open_model(Variants::path("st-f32x4/model-00001-of-00004.safetensors"));
  ASSERT_FALSE(shard.ok());
  EXPECT_NE(shard.status().message().find("safetensors"), std::string::npos) << shard.status().to_string();
  auto missing = engine::open_model(Variants::path("no-such-model"));
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.status().message().find("no-such-model"), std::string::npos) << missing.status().to_string();
  // A directory without its tokenizer.
  fs::remove(Variants::path("st-f32/tokenizer.json"));
  auto no_tok = engine::open_model(Variants::path("st-f32"));
  ASSERT_FALSE(no_tok.ok());
  EXPECT_NE(no_tok.status().message().find("tokenizer.json is missing"), std::string::npos) << no_tok.status().to_string();
}

}  // namespace
}  // namespace sx
