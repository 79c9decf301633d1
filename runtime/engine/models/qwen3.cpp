// Qwen3 dense ("qwen3") and Qwen3-MoE ("qwen3moe"): attention without biases, every query and key
// head RMS-normalised (attn_q_norm / attn_k_norm) before rope; after ffn_norm a dense SwiGLU FFN,
// or for the MoE a router over stacked experts (the top-k weights renormalised, norm_topk_prob).
#include "runtime/engine/models/architecture.h"

namespace sx::engine {

namespace {

LayerSpec qwen3_layer(const model::ModelConfig&, std::int64_t) {
  LayerSpec l;
  l.mixer = Mixer::kAttention;
  l.attention.qk_norm = true;
  l.ffn_norm = model::LayerTensor::kFfnNorm;
  l.ffn = Ffn::kDense;
  return l;
}

LayerSpec qwen3moe_layer(const model::ModelConfig& c, std::int64_t layer) {
  LayerSpec l = qwen3_layer(c, layer);
  l.ffn = Ffn::kRoutedExperts;
  return l;
}

}  // namespace

const Architecture& qwen3_architecture() {
  static const Architecture kQwen3{"qwen3", qwen3_layer};
  return kQwen3;
}

const Architecture& qwen3moe_architecture() {
  static const Architecture kQwen3Moe{"qwen3moe", qwen3moe_layer};
  return kQwen3Moe;
}

}  // namespace sx::engine
