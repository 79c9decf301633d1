// Random-weight Qwen2 GGUF writer and the Qwen2.5 / Qwen3 size presets.
#include "runtime/base/fnv.h"
#include "runtime/model/random_model.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <memory>
#include <string>

#include <fmt/format.h>

#include "runtime/hal/quant.h"

namespace sx::model {

namespace {

struct Preset {
  std::string_view size;
  std::int64_t n_layers, hidden, n_heads, n_kv_heads, ffn, vocab, context;
  bool tied;
};

constexpr Preset kPresets[] = {
    {"0.5b", 24, 896, 14, 2, 4864, 151936, 32768, true},
    {"1.5b", 28, 1536, 12, 2, 8960, 151936, 32768, true},
    {"3b", 36, 2048, 16, 2, 11008, 151936, 32768, true},
    {"7b", 28, 3584, 28, 4, 18944, 152064, 131072, false},
    {"14b", 48, 5120, 40, 8, 13824, 152064, 131072, false},
    {"32b", 64, 5120, 40, 8, 27648, 152064, 131072, false},
    {"72b", 80, 8192, 64, 8, 29568, 152064, 131072, false},
};

// Qwen3 dense (Hugging Face Qwen/Qwen3-*/config.json): head_dim 128 for every size.
struct Qwen3Preset {
  std::string_view size;
  std::int64_t n_layers, hidden, n_heads, n_kv_heads, ffn;
  bool tied;
};

constexpr Qwen3Preset kQwen3Presets[] = {
    {"0.6b", 28, 1024, 16, 8, 3072, true},
    {"1.7b", 28, 2048, 16, 8, 6144, true},
    {"4b", 36, 2560, 32, 8, 9728, true},
    {"8b", 36, 4096, 32, 8, 12288, false},
    {"14b", 40, 5120, 40, 8, 17408, false},
    {"32b", 64, 5120, 64, 8, 25600, false},
};
constexpr std::int64_t kQwen3HeadDim = 128;

// Qwen3-MoE (Hugging Face Qwen/Qwen3-30B-A3B, Qwen3-235B-A22B config.json): 128 experts, 8 used,
// every layer sparse, norm_topk_prob, untied.
struct Qwen3MoePreset {
  std::string_view size;
  std::int64_t n_layers, hidden, n_heads, n_kv_heads, ffn, expert_ffn;
};
constexpr Qwen3MoePreset kQwen3MoePresets[] = {
    {"30b-a3b", 48, 2048, 32, 4, 6144, 768},
    {"235b-a22b", 94, 4096, 64, 4, 12288, 1536},
};
// Qwen3.5 dense and MoE (docs/research/qwen35-shapes.md). v_heads: Gated DeltaNet value heads.
struct Qwen35Preset {
  std::string_view size;
  std::int64_t n_layers, hidden, n_heads, n_kv_heads, ffn, v_heads;
  bool tied;
};
constexpr Qwen35Preset kQwen35Presets[] = {
    {"0.8b", 24, 1024, 8, 2, 3584, 16, true},  {"2b", 24, 2048, 8, 2, 6144, 16, true},
    {"4b", 32, 2560, 16, 4, 9216, 32, true},   {"9b", 32, 4096, 16, 4, 12288, 32, false},
    {"27b", 64, 5120, 24, 4, 17408, 48, false},
};
struct Qwen35MoePreset {
  std::string_view size;
  std::int64_t n_layers, hidden, n_heads, n_kv_heads, expert_ffn, shared_ffn, n_experts, n_used, v_heads;
};
constexpr Qwen35MoePreset kQwen35MoePresets[] = {
    {"35b-a3b", 40, 2048, 16, 2, 512, 512, 256, 8, 32},
    {"122b-a10b", 48, 3072, 32, 2, 1024, 1024, 256, 8, 64},
    {"397b-a17b", 60, 4096, 32, 2, 1024, 1024, 512, 10, 64},
};
constexpr std::int64_t kQwen3Vocab = 151936;
constexpr std::int64_t kQwen3Context = 40960;

std::string lowercase(std::string_view s) {
  std::string out(s);
  std::transform(out.begin(), out.end(), out.begin(), [](unsigned char ch) { return std::tolower(ch); });
  return out;
}

// "0.5b" -> "0.5B"
std::string display_size(std::string_view size) {
  std::string upper(size);
  upper.back() = 'B';
  return upper;
}

// The size names of a preset table, in its order.
template <class Preset, std::size_t N>
std::vector<std::string_view> sizes_of(const Preset (&presets)[N]) {
  std::vector<std::string_view> v;
  for (const Preset& p : presets) v.push_back(p.size);
  return v;
}

std::string join_sizes(const std::vector<std::string_view>& sizes) {
  std::string known;
  for (std::string_view s : sizes) known += fmt::format("{}{}", known.empty() ? "" : ", ", s);
  return known;
}

constexpr std::string_view kChatMlTemplate =
    "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + "
    "'<|im_end|>' + '\\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}";

std::uint64_t splitmix64(std::uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

std::uint64_t fnv1a64(std::string_view s) { return Fnv1a().add(s).value; }

void append_utf8(std::string& out, std::uint32_t cp) {
  if (cp < 0x80) {
    out += static_cast<char>(cp);
  } else if (cp < 0x800) {
    out += static_cast<char>(0xC0 | (cp >> 6));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else {
    out += static_cast<char>(0xE0 | (cp >> 12));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  }
}

bool is_norm(std::string_view name) { return name.find("norm") != std::string_view::npos; }

Status validate_spec(const RandomModelSpec& spec) {
  const ModelConfig& c = spec.config;
  SX_RETURN_IF_ERROR(validate_model_config(c, "random model spec"));
  const hal::DType t = spec.weight_type;
  if (spec.mix == WeightMix::kUniform && !hal::can_quantize(t)) {
    return invalid_argument_error(
        "random model spec: weight type {} is not one of f32, f16, bf16, q8_0, q4_0, q4_1, q5_0, q5_1, q2_k, q3_k, q4_k, q5_k, q6_k",
        hal::dtype_name(t));
  }
  // Mixes fall back to 32-element blocks (Q5_0, Q8_0) where rows are not whole 256-blocks.
  const int block = spec.mix == WeightMix::kUniform ? hal::dtype_info(t).block_elems : 32;
  const std::pair<std::string_view, std::int64_t> inner[] = {
      {"hidden", c.hidden}, {"ffn", c.is_moe() ? c.expert_ffn : c.ffn}, {"q_dim", c.q_dim()}};
  for (const auto& [what, v] : inner) {
    if (v % block != 0) {
      return invalid_argument_error("random model spec: {} {} is not a multiple of the {} block size {}", what, v,
                                    hal::dtype_name(t), block);
    }
  }
  if (!(spec.init_std >= 0) || !std::isfinite(spec.init_std)) {
    return invalid_argument_error("random model spec: init_std {} must be a finite non-negative number", spec.init_std);
  }
  if (static_cast<std::int64_t>(spec.tokenizer.tokens.size()) > c.vocab) {
    return invalid_argument_error("random model spec: the tokenizer has {} tokens but vocab is {}",
                                  spec.tokenizer.tokens.size(), c.vocab);
  }
  return ok_status();
}

// llama.cpp's use_more_bits(i_layer, n_layers).
bool more_bits(std::int64_t layer, std::int64_t n_layers) {
  return layer < n_layers / 8 || layer >= 7 * n_layers / 8 || (layer - n_layers / 8) % 3 == 2;
}

// llama.cpp's fallback for a K-quant whose rows are not whole 256-blocks.
hal::DType k_quant_or_fallback(hal::DType t, std::int64_t row_len) {
  if (row_len % hal::kQK_K == 0) return t;
  if (t == hal::DType::kQ6_K) return hal::DType::kQ8_0;
  return t == hal::DType::kQ5_K ? hal::DType::kQ5_1 : hal::DType::kQ5_0;
}

std::uint32_t file_type_of(const RandomModelSpec& spec) {
  if (spec.mix == WeightMix::kQ4_K_M) return 15;  // LLAMA_FTYPE_MOSTLY_Q4_K_M
  if (spec.mix == WeightMix::kQ6_K) return 18;    // LLAMA_FTYPE_MOSTLY_Q6_K
  if (spec.mix == WeightMix::kQ5_K) return 16;    // LLAMA_FTYPE_MOSTLY_Q5_K_S
  switch (spec.weight_type) {
    case hal::DType::kQ4_0: return 2;   // LLAMA_FTYPE_MOSTLY_Q4_0
    case hal::DType::kQ4_1: return 3;   // LLAMA_FTYPE_MOSTLY_Q4_1
    case hal::DType::kQ5_0: return 8;   // LLAMA_FTYPE_MOSTLY_Q5_0
    case hal::DType::kQ5_1: return 9;   // LLAMA_FTYPE_MOSTLY_Q5_1
    case hal::DType::kQ4_K: return 14;  // LLAMA_FTYPE_MOSTLY_Q4_K_S (all Q4_K)
    case hal::DType::kQ5_K: return 16;  // LLAMA_FTYPE_MOSTLY_Q5_K_S
    case hal::DType::kQ6_K: return 18;  // LLAMA_FTYPE_MOSTLY_Q6_K
    default: break;
  }
  switch (spec.weight_type) {
    case hal::DType::kF16: return 1;    // LLAMA_FTYPE_MOSTLY_F16
    case hal::DType::kQ8_0: return 7;   // LLAMA_FTYPE_MOSTLY_Q8_0
    case hal::DType::kBF16: return 32;  // LLAMA_FTYPE_MOSTLY_BF16
    default: return 0;                  // LLAMA_FTYPE_ALL_F32
  }
}

// Streams one tensor: generates blocks of rows, converts them and hands them to the sink.
Status produce_tensor(const RandomModelSpec& spec, const std::string& name, std::int64_t row_len,
                      std::int64_t n_rows, hal::DType type, GgufByteSink& sink) {
  constexpr std::int64_t kChunkElems = 1 << 18;  // 1 MiB of floats per step
  const std::int64_t rows_per_chunk = std::max<std::int64_t>(1, kChunkElems / row_len);
  const std::size_t row_bytes = hal::row_bytes(type, row_len);
  std::vector<float> values(static_cast<std::size_t>(rows_per_chunk * row_len));
  std::vector<std::uint8_t> bytes(type == hal::DType::kF32 ? 0 : static_cast<std::size_t>(rows_per_chunk) * row_bytes);
  for (std::int64_t r = 0; r < n_rows; r += rows_per_chunk) {
    const std::int64_t rows = std::min(rows_per_chunk, n_rows - r);
    const std::span<float> chunk(values.data(), static_cast<std::size_t>(rows * row_len));
    random_tensor_values(spec, name, r * row_len, chunk);
    if (type == hal::DType::kF32) {
      SX_RETURN_IF_ERROR(sink.write({reinterpret_cast<const std::uint8_t*>(chunk.data()), chunk.size() * sizeof(float)}));
      continue;
    }
    for (std::int64_t i = 0; i < rows; ++i) {
      hal::quantize_row(type, values.data() + i * row_len, bytes.data() + static_cast<std::size_t>(i) * row_bytes,
                        row_len);
    }
    SX_RETURN_IF_ERROR(sink.write({bytes.data(), static_cast<std::size_t>(rows) * row_bytes}));
  }
  return ok_status();
}

}  // namespace

const std::vector<std::string_view>& qwen2_5_sizes() {
  static const std::vector<std::string_view> kSizes = sizes_of(kPresets);
  return kSizes;
}

Result<ModelConfig> find_qwen2_5_config(std::string_view size) {
  const std::string lower = lowercase(size);
  for (const Preset& p : kPresets) {
    if (p.size != lower) continue;
    ModelConfig c;
    c.architecture = "qwen2";
    c.name = fmt::format("Qwen2.5-{} (random weights)", display_size(p.size));
    c.n_layers = p.n_layers;
    c.hidden = p.hidden;
    c.n_heads = p.n_heads;
    c.n_kv_heads = p.n_kv_heads;
    c.head_dim = p.hidden / p.n_heads;
    c.ffn = p.ffn;
    c.vocab = p.vocab;
    c.context_length = p.context;
    c.rope_theta = 1e6;
    c.rms_eps = 1e-6;
    c.tied_embeddings = p.tied;
    c.qkv_bias = true;
    return c;
  }
  return invalid_argument_error("unknown Qwen2.5 size '{}' (known: {})", size, join_sizes(qwen2_5_sizes()));
}

ModelConfig qwen2_5_config(std::string_view size) {
  auto c = find_qwen2_5_config(size);
  if (!c.ok()) fatal("qwen2_5_config", c.status().message());
  return *std::move(c);
}

const std::vector<std::string_view>& qwen3_sizes() {
  static const std::vector<std::string_view> kSizes = sizes_of(kQwen3Presets);
  return kSizes;
}

// The fields every Qwen3-family shape shares: head_dim 128, vocab 151936, 40960 positions, rope
// theta 1e6, rms eps 1e-6, no qkv bias.
ModelConfig qwen3_family(std::string architecture, std::string name, std::int64_t n_layers, std::int64_t hidden,
                         std::int64_t n_heads, std::int64_t n_kv_heads, std::int64_t ffn, bool tied) {
  ModelConfig c;
  c.architecture = std::move(architecture);
  c.name = std::move(name);
  c.n_layers = n_layers;
  c.hidden = hidden;
  c.n_heads = n_heads;
  c.n_kv_heads = n_kv_heads;
  c.head_dim = kQwen3HeadDim;
  c.ffn = ffn;
  c.vocab = kQwen3Vocab;
  c.context_length = kQwen3Context;
  c.rope_theta = 1e6;
  c.rms_eps = 1e-6;
  c.tied_embeddings = tied;
  c.qkv_bias = false;
  return c;
}

Result<ModelConfig> find_qwen3_config(std::string_view size) {
  const std::string lower = lowercase(size);
  for (const Qwen3Preset& p : kQwen3Presets) {
    if (p.size != lower) continue;
    return qwen3_family("qwen3", fmt::format("Qwen3-{} (shape)", display_size(p.size)), p.n_layers, p.hidden,
                        p.n_heads, p.n_kv_heads, p.ffn, p.tied);
  }
  return invalid_argument_error("unknown Qwen3 size '{}' (known: {})", size, join_sizes(qwen3_sizes()));
}

const std::vector<std::string_view>& qwen3moe_sizes() {
  static const std::vector<std::string_view> kSizes = sizes_of(kQwen3MoePresets);
  return kSizes;
}

Result<ModelConfig> find_qwen3moe_config(std::string_view size) {
  const std::string lower = lowercase(size);
  for (const Qwen3MoePreset& p : kQwen3MoePresets) {
    if (p.size != lower) continue;
    std::string shown(p.size);
    std::transform(shown.begin(), shown.end(), shown.begin(), [](unsigned char ch) { return std::toupper(ch); });
    ModelConfig c = qwen3_family("qwen3moe", fmt::format("Qwen3-{} (shape)", shown), p.n_layers, p.hidden, p.n_heads,
                                 p.n_kv_heads, p.ffn, /*tied=*/false);
    c.n_experts = 128;
    c.n_experts_used = 8;
    c.expert_ffn = p.expert_ffn;
    c.norm_topk_prob = true;
    return c;
  }
  return invalid_argument_error("unknown Qwen3-MoE size '{}' (known: {})", size, join_sizes(qwen3moe_sizes()));
}

void set_hybrid_layers(ModelConfig& c, std::int64_t n_layers, std::int64_t interval) {
  c.n_layers = n_layers;
  c.recurrent_layers.clear();
  for (std::int64_t i = 0; i < n_layers; ++i) c.recurrent_layers.push_back((i + 1) % interval != 0);
}

namespace {

// What every Qwen3.5-family shape shares.
ModelConfig qwen35_family(std::string architecture, std::string name, std::int64_t n_layers, std::int64_t hidden,
                          std::int64_t n_heads, std::int64_t n_kv_heads, std::int64_t ffn, std::int64_t v_heads,
                          bool tied) {
  ModelConfig c = qwen3_family(std::move(architecture), std::move(name), n_layers, hidden, n_heads, n_kv_heads, ffn,
                               tied);
  c.head_dim = 256;
  c.rot_dim = 64;
  c.rope_sections = {11, 11, 10, 0};
  c.rope_theta = 1e7;
  c.vocab = 248320;
  c.context_length = 262144;
  c.ssm_k_heads = 16;
  c.ssm_v_heads = v_heads;
  c.ssm_head_dim = 128;
  c.ssm_conv_kernel = 4;
  set_hybrid_layers(c, n_layers);
  return c;
}

std::string upper_size(std::string_view size) {
  std::string shown(size);
  std::transform(shown.begin(), shown.end(), shown.begin(), [](unsigned char ch) { return std::toupper(ch); });
  return shown;
}

}  // namespace

const std::vector<std::string_view>& qwen35_sizes() {
  static const std::vector<std::string_view> kSizes = sizes_of(kQwen35Presets);
  return kSizes;
}

const std::vector<std::string_view>& qwen35moe_sizes() {
  static const std::vector<std::string_view> kSizes = sizes_of(kQwen35MoePresets);
  return kSizes;
}

Result<ModelConfig> find_qwen35_config(std::string_view size) {
  const std::string lower = lowercase(size);
  for (const Qwen35Preset& p : kQwen35Presets) {
    if (p.size != lower) continue;
    return qwen35_family("qwen35", fmt::format("Qwen3.5-{} (shape)", upper_size(p.size)), p.n_layers, p.hidden,
                         p.n_heads, p.n_kv_heads, p.ffn, p.v_heads, p.tied);
  }
  return invalid_argument_error("unknown Qwen3.5 size '{}' (known: {})", size, join_sizes(qwen35_sizes()));
}

Result<ModelConfig> find_qwen35moe_config(std::string_view size) {
  const std::string lower = lowercase(size);
  for (const Qwen35MoePreset& p : kQwen35MoePresets) {
    if (p.size != lower) continue;
    ModelConfig c = qwen35_family("qwen35moe", fmt::format("Qwen3.5-{} (shape)", upper_size(p.size)), p.n_layers,
                                  p.hidden, p.n_heads, p.n_kv_heads, p.expert_ffn, p.v_heads, /*tied=*/false);
    c.n_experts = p.n_experts;
    c.n_experts_used = p.n_used;
    c.expert_ffn = p.expert_ffn;
    c.shared_expert_ffn = p.shared_ffn;
    c.norm_topk_prob = true;
    return c;
  }
  return invalid_argument_error("unknown Qwen3.5-MoE size '{}' (known: {})", size, join_sizes(qwen35moe_sizes()));
}

ModelConfig qwen3_config(std::string_view size) {
  auto c = find_qwen3_config(size);
  if (!c.ok()) fatal("qwen3_config", c.status().message());
  return *std::move(c);
}

Result<TokenizerMetadata> synthesize_tokenizer(std::int64_t vocab) {
  if (vocab < 259) {
    return invalid_argument_error("cannot synthesize a byte-level vocabulary of {} tokens (need at least 259: 256 "
                                  "bytes + 3 special tokens)",
                                  vocab);
  }
  TokenizerMetadata t;
  t.tokens.reserve(static_cast<std::size_t>(vocab));
  t.token_types.reserve(static_cast<std::size_t>(vocab));
  // GPT-2 bytes_to_unicode, in its own order: printable bytes map to themselves, the rest to 256+n.
  std::vector<std::uint32_t> order;
  for (std::uint32_t b = '!'; b <= '~'; ++b) order.push_back(b);
  for (std::uint32_t b = 0xA1; b <= 0xAC; ++b) order.push_back(b);
  for (std::uint32_t b = 0xAE; b <= 0xFF; ++b) order.push_back(b);
  std::vector<bool> printable(256, false);
  for (std::uint32_t b : order) printable[b] = true;
  std::vector<std::uint32_t> codepoints = order;
  std::uint32_t n = 0;
  for (std::uint32_t b = 0; b < 256; ++b) {
    if (!printable[b]) codepoints.push_back(256 + n++);
  }
  for (std::uint32_t cp : codepoints) {
    std::string s;
    append_utf8(s, cp);
    t.tokens.push_back(std::move(s));
    t.token_types.push_back(kTokenNormal);
  }
  for (std::int64_t i = 256; i < vocab - 3; ++i) {
    t.tokens.push_back(fmt::format("[PAD{}]", i));
    t.token_types.push_back(kTokenUnused);
  }
  for (std::string_view s : {"<|endoftext|>", "<|im_start|>", "<|im_end|>"}) {
    t.tokens.emplace_back(s);
    t.token_types.push_back(kTokenControl);
  }
  t.pad_id = vocab - 3;
  t.bos_id = vocab - 3;
  t.eos_id = vocab - 1;
  t.add_bos = false;
  t.chat_template = std::string(kChatMlTemplate);
  return t;
}

void random_tensor_values(const RandomModelSpec& spec, std::string_view name, std::int64_t first,
                          std::span<float> out) {
  const std::uint64_t key = splitmix64(spec.seed ^ fnv1a64(name));
  const float half_width = spec.init_std * std::sqrt(3.0f);  // uniform(-a, a) has std a / sqrt(3)
  const float base = is_norm(name) ? 1.0f : 0.0f;
  // A DeltaNet layer's ssm_a is -exp(A_log) < 0 (a decay below 1); [-1.1, -0.1) as a trained one's range starts.
  const bool decay = name.ends_with(".ssm_a");
  for (std::size_t i = 0; i < out.size(); ++i) {
    const std::uint64_t h = splitmix64(key + static_cast<std::uint64_t>(first + static_cast<std::int64_t>(i)) *
                                                 0xD1B54A32D192ED03ull);
    const float u = static_cast<float>(h >> 40) * (1.0f / 16777216.0f);  // [0, 1)
    out[i] = decay ? -(0.1f + u) : base + (2.0f * u - 1.0f) * half_width;
  }
}

hal::DType mixed_weight_type(const ModelConfig& c, WeightMix mix, hal::DType uniform, std::string_view name,
                             std::int64_t row_len) {
  switch (mix) {
    case WeightMix::kUniform: return uniform;
    case WeightMix::kQ5_K: return k_quant_or_fallback(hal::DType::kQ5_K, row_len);
    case WeightMix::kQ6_K: return k_quant_or_fallback(hal::DType::kQ6_K, row_len);
    case WeightMix::kQ4_K_M: break;
  }
  const bool head = name == "output.weight" || (c.tied_embeddings && name == "token_embd.weight");
  if (head) return k_quant_or_fallback(hal::DType::kQ6_K, row_len);
  if (name.starts_with("blk.") && (name.ends_with(".attn_v.weight") || name.ends_with(".ffn_down.weight"))) {
    const std::int64_t layer = std::stoll(std::string(name.substr(4, name.find('.', 4) - 4)));
    if (more_bits(layer, c.n_layers)) return k_quant_or_fallback(hal::DType::kQ6_K, row_len);
  }
  return k_quant_or_fallback(hal::DType::kQ4_K, row_len);
}

Status add_random_model(const RandomModelSpec& spec_in, GgufWriter& w) {
  SX_RETURN_IF_ERROR(validate_spec(spec_in));
  auto spec = std::make_shared<RandomModelSpec>(spec_in);
  if (spec->tokenizer.tokens.empty()) {
    SX_ASSIGN_OR_RETURN(spec->tokenizer, synthesize_tokenizer(spec->config.vocab));
  }
  set_model_config_metadata(w, spec->config);
  w.set_uint32("general.quantization_version", 2);
  w.set_uint32("general.file_type", file_type_of(*spec));
  set_tokenizer_metadata(w, spec->tokenizer, spec->config.vocab);
  spec->tokenizer = {};  // the producers need only the config, seed and std

  for (ExpectedTensor& e : expected_tensors(spec->config)) {
    const std::int64_t row_len = e.dims[0];
    // Vectors and a DeltaNet layer's conv taps (rows of 4) stay F32, as llama.cpp's converter keeps them.
    const bool f32 = e.dims.size() == 1 || e.name.ends_with(".ssm_conv1d.weight");
    const hal::DType type = f32 ? hal::DType::kF32
                                : mixed_weight_type(spec->config, spec->mix, spec->weight_type, e.name, row_len);
    std::int64_t n_rows = 1;
    for (std::size_t i = 1; i < e.dims.size(); ++i) n_rows *= e.dims[i];
    std::string name = e.name;
    SX_RETURN_IF_ERROR(w.add_tensor_streamed(
        std::move(e.name), std::move(e.dims), ggml_type_of(type),
        [spec, name = std::move(name), row_len, n_rows, type](GgufByteSink& sink) {
          return produce_tensor(*spec, name, row_len, n_rows, type, sink);
        }));
  }
  return ok_status();
}

Status write_random_gguf(const RandomModelSpec& spec, const std::string& path) {
  GgufWriter w;
  SX_RETURN_IF_ERROR(add_random_model(spec, w));
  return w.write(path);
}

}  // namespace sx::model
