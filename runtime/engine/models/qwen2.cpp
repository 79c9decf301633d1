// Qwen2 / Qwen2.5 (general.architecture "qwen2"): attention with q, k, v biases, rope over the
// whole head; a dense SwiGLU FFN after ffn_norm.
#include "runtime/engine/models/architecture.h"

namespace sx::engine {

namespace {

LayerSpec qwen2_layer(const model::ModelConfig& c, std::int64_t) {
  LayerSpec l;
  l.mixer = Mixer::kAttention;
  l.attention.bias = c.qkv_bias;  // every published Qwen2 has them; the file says (blk.0.attn_q.bias)
  l.ffn_norm = model::LayerTensor::kFfnNorm;
  l.ffn = Ffn::kDense;
  return l;
}

}  // namespace

const Architecture& qwen2_architecture() {
  static const Architecture kQwen2{"qwen2", qwen2_layer};
  return kQwen2;
}

}  // namespace sx::engine
