// Fuzz target: the Hugging Face config.json reader (parse_hf_config) and, on the same text, the
// generation_config.json reader (ids in 0..2^31-1, top_p in [0, 1]). Invariants after a successful
// parse (hf_config.h): a supported architecture, every size in 1..2^31-1, heads a multiple of KV
// heads, an even head_dim, positive rope_theta and rms_eps; for qwen2 heads x head_dim = hidden.
// (validate_model_config is not asked: it also requires a GGUF-loadable architecture, and qwen3
// configs are valid here for planning.)
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "runtime/model/hf_config.h"
#include "runtime/model/hf_model.h"
#include "tests/fuzz/fuzz_check.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  if (auto g = sx::model::parse_generation_config(text, "fuzz-generation_config.json"); g.ok()) {
    for (std::int32_t id : g->eos_ids) FUZZ_CHECK(id >= 0);
    if (g->bos_id) FUZZ_CHECK(*g->bos_id >= 0);
    if (g->top_p) FUZZ_CHECK(*g->top_p >= 0 && *g->top_p <= 1);
  }
  auto hf = sx::model::parse_hf_config(text, "fuzz-config.json");
  if (!hf.ok()) return 0;
  const sx::model::ModelConfig& c = hf->config;
  FUZZ_CHECK(c.architecture == "qwen2" || c.architecture == "qwen3" || c.architecture == "qwen3moe" ||
             c.architecture == "qwen35" || c.architecture == "qwen35moe");
  // A Qwen3.5 config passed validate_model_config: its DeltaNet sizes and layer pattern agree.
  if (c.is_hybrid()) {
    FUZZ_CHECK(c.ssm_v_grouped && c.ssm_v_heads % c.ssm_k_heads == 0);
    FUZZ_CHECK(static_cast<std::int64_t>(c.recurrent_layers.size()) == c.n_layers);
    FUZZ_CHECK(c.rot_dim >= 0 && c.rot_dim <= c.head_dim && c.rot_dim % 2 == 0);
  }
  constexpr std::int64_t kMax = 2147483647;
  for (std::int64_t v : {c.n_layers, c.hidden, c.n_heads, c.n_kv_heads, c.head_dim, c.ffn, c.vocab,
                         c.context_length}) {
    FUZZ_CHECK(v >= 1 && v <= kMax);
  }
  FUZZ_CHECK(c.n_heads % c.n_kv_heads == 0);
  FUZZ_CHECK(c.head_dim % 2 == 0);
  FUZZ_CHECK(c.rope_theta > 0 && std::isfinite(c.rope_theta));
  FUZZ_CHECK(c.rms_eps > 0 && std::isfinite(c.rms_eps));
  FUZZ_CHECK(hf->quant_group_size >= -1);
  if (c.architecture == "qwen2") FUZZ_CHECK(c.q_dim() == c.hidden);
  return 0;
}
