// Qwen3.5 / 3.6 / 3.8 ("qwen35", and "qwen35moe" for the MoE sizes; the Qwen3-Next design): a
// hybrid. The layers the file lists as recurrent (three of every four) are Gated DeltaNet; the
// others gated full attention: attn_q holds [query | gate] per head, q/k norms, rope over a part
// of each head (rope.dimension_count), the output scaled by the gate's sigmoid. No biases. The FFN
// follows post_attention_norm (there is no ffn_norm): dense, or for qwen35moe routed experts with
// a shared expert behind a sigmoid gate.
#include "runtime/engine/models/architecture.h"

namespace sx::engine {

namespace {

LayerSpec qwen35_layer(const model::ModelConfig& c, std::int64_t layer) {
  LayerSpec l;
  l.mixer = c.is_recurrent(layer) ? Mixer::kGatedDeltaNet : Mixer::kAttention;
  l.attention.qk_norm = true;
  l.attention.gated = true;
  l.ffn_norm = model::LayerTensor::kPostAttentionNorm;
  l.ffn = Ffn::kDense;
  return l;
}

LayerSpec qwen35moe_layer(const model::ModelConfig& c, std::int64_t layer) {
  LayerSpec l = qwen35_layer(c, layer);
  l.ffn = Ffn::kRoutedExperts;
  l.shared_expert = true;
  return l;
}

}  // namespace

const Architecture& qwen35_architecture() {
  static const Architecture kQwen35{"qwen35", qwen35_layer};
  return kQwen35;
}

const Architecture& qwen35moe_architecture() {
  static const Architecture kQwen35Moe{"qwen35moe", qwen35moe_layer};
  return kQwen35Moe;
}

}  // namespace sx::engine
