// Writes the binary seed inputs of tests/fuzz/corpus with the project's own writers, so the seeds
// follow the formats exactly as Sextant writes them (the JSON seeds are plain text files, edited
// by hand). Not part of the test run: rebuild the seeds with
//   ninja -C build tests/fuzz/fuzz_make_seeds && build/tests/fuzz/fuzz_make_seeds tests/fuzz/corpus
// Output: corpus/gguf/{qwen2-tiny,all-types-v2,quant-aligned}.gguf, corpus/safetensors/*.safetensors.
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include "runtime/model/gguf.h"
#include "runtime/model/gguf_writer.h"
#include "runtime/model/model_config.h"
#include "runtime/model/random_model.h"
#include "runtime/model/safetensors_writer.h"

namespace {

using namespace sx::model;

bool save(const std::string& path, const std::vector<std::uint8_t>& bytes) {
  std::ofstream out(path, std::ios::binary);
  out.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
  std::printf("%s: %zu bytes\n", path.c_str(), bytes.size());
  return static_cast<bool>(out);
}

bool check(const sx::Status& s) {
  if (!s.ok()) std::fprintf(stderr, "make_seeds: %s\n", s.to_string().c_str());
  return s.ok();
}

// A whole (tiny) qwen2 model: every key model_config_from_gguf and tokenizer_metadata_from_gguf
// read, every tensor check_model_tensors expects.
bool tiny_model(const std::string& dir) {
  RandomModelSpec spec;
  ModelConfig& c = spec.config;
  c.architecture = "qwen2";
  c.name = "tiny";
  c.n_layers = 1;
  c.hidden = 4;
  c.n_heads = 2;
  c.n_kv_heads = 1;
  c.head_dim = 2;
  c.ffn = 4;
  c.vocab = 6;
  c.context_length = 64;
  c.qkv_bias = true;
  c.tied_embeddings = true;
  spec.weight_type = sx::hal::DType::kF16;
  TokenizerMetadata& t = spec.tokenizer;
  t.tokens = {"a", "b", "ab", "<|endoftext|>", "<|im_start|>", "<|im_end|>"};
  t.merges = {"a b"};
  t.token_types = {1, 1, 1, 3, 3, 3};
  t.eos_id = 5;
  t.bos_id = 3;
  t.pad_id = 3;
  t.chat_template = "{{ m }}";
  GgufWriter w;
  if (!check(add_random_model(spec, w))) return false;
  auto bytes = w.to_bytes();
  if (!check(bytes.status())) return false;
  // The seed must get through every reader, or the fuzzer starts far from the interesting paths.
  auto f = GgufFile::parse(*bytes, "qwen2-tiny.gguf");
  if (!check(f.status())) return false;
  auto cfg = model_config_from_gguf(**f);
  if (!check(cfg.status()) || !check(check_model_tensors(**f, *cfg)) ||
      !check(tokenizer_metadata_from_gguf(**f).status())) {
    return false;
  }
  return save(dir + "/gguf/qwen2-tiny.gguf", *bytes);
}

// Every metadata value type, nested arrays, version 2, two small tensors.
bool all_types(const std::string& dir) {
  GgufWriter w;
  w.set_version(2);
  w.set_uint8("u8", 200);
  w.set_int8("i8", -3);
  w.set_uint16("u16", 60000);
  w.set_int16("i16", -30000);
  w.set_uint32("u32", 4000000000u);
  w.set_int32("i32", -2000000000);
  w.set_uint64("u64", 1ull << 63);
  w.set_int64("i64", -(1ll << 62));
  w.set_float32("f32", 1.5f);
  w.set_float64("f64", -2.25);
  w.set_bool("b", true);
  w.set_string("s", "text");
  w.set_string_array("sa", {"x", "", "yz"});
  w.set_int32_array("ia", {1, -1, 7});
  w.set_float32_array("fa", {0.5f, -1.0f});
  w.set("aa", GgufValue::array_of_arrays({GgufValue::int64_array({1, 2}), GgufValue::string_array({"q"})}));
  if (!check(w.add_tensor("f32", {2, 2}, static_cast<std::uint32_t>(GgmlType::kF32), std::vector<std::uint8_t>(16, 0))))
    return false;
  if (!check(w.add_tensor("i8", {3}, static_cast<std::uint32_t>(GgmlType::kI8), std::vector<std::uint8_t>{1, 2, 3})))
    return false;
  auto bytes = w.to_bytes();
  return check(bytes.status()) && save(dir + "/gguf/all-types-v2.gguf", *bytes);
}

// Block-quantized tensors (q8_0: 32 elements in 34 bytes; q4_k: 256 in 144) and a custom alignment.
bool quant(const std::string& dir) {
  GgufWriter w;
  w.set_uint32("general.alignment", 64);
  w.set_string("general.architecture", "qwen2");
  if (!check(w.add_tensor("q8", {32, 2}, static_cast<std::uint32_t>(GgmlType::kQ8_0), std::vector<std::uint8_t>(68, 1))))
    return false;
  if (!check(w.add_tensor("q4k", {256}, static_cast<std::uint32_t>(GgmlType::kQ4_K), std::vector<std::uint8_t>(144, 2))))
    return false;
  if (!check(w.add_tensor("bf", {3}, static_cast<std::uint32_t>(GgmlType::kBF16), std::vector<std::uint8_t>(6, 3))))
    return false;
  auto bytes = w.to_bytes();
  return check(bytes.status()) && save(dir + "/gguf/quant-aligned.gguf", *bytes);
}

bool safetensors(const std::string& dir) {
  {
    SafetensorsWriter w;
    w.set_metadata("format", "pt");
    const std::vector<std::uint8_t> f32(24, 1), bf16(4, 2), i64(8, 3);
    if (!check(w.add_tensor("model.embed_tokens.weight", "F32", {2, 3}, f32))) return false;
    if (!check(w.add_tensor("model.norm.weight", "BF16", {2}, bf16))) return false;
    if (!check(w.add_tensor("scalar", "I64", {}, i64))) return false;
    if (!check(w.add_tensor("empty", "F16", {0, 4}, {}))) return false;
    if (!save(dir + "/safetensors/mixed.safetensors", w.to_bytes())) return false;
  }
  {
    SafetensorsWriter w;
    const std::vector<std::uint8_t> u8(5, 9), f8(2, 7);
    if (!check(w.add_tensor("a", "U8", {5}, u8))) return false;
    if (!check(w.add_tensor("b", "F8_E4M3", {1, 2}, f8))) return false;
    if (!save(dir + "/safetensors/small.safetensors", w.to_bytes())) return false;
  }
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: fuzz_make_seeds CORPUS_DIR\n");
    return 2;
  }
  const std::string dir = argv[1];
  return tiny_model(dir) && all_types(dir) && quant(dir) && safetensors(dir) ? 0 : 1;
}
