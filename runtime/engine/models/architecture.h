// What an architecture is to the engine: which blocks each of its layers uses, and with which
// norms. Every family served here is a pre-norm residual stack,
//   xn = norm(h);  h += mixer(xn);  xn = norm(h);  h += ffn(xn)
// (runtime/engine/shard.cpp runs it, with the tensor-parallel all-reduce after each half), so a
// family is its choice of mixer (attention, with its options, or Gated DeltaNet), of the norm
// before the FFN, and of the FFN (dense, or routed experts with or without a shared expert), per
// layer. Tensor names come from one table (runtime/model/tensor_names.h; model_config.cpp lists
// which of them each architecture's files hold).
//
// Adding an architecture: a file here with its layer() (and a row in architectures.cpp), its
// tensors in model_config.cpp's table, and a block in blocks/ for anything it computes that no
// block does yet.
#pragma once

#include <cstdint>
#include <string_view>

#include "runtime/engine/blocks/attention.h"
#include "runtime/model/model_config.h"
#include "runtime/model/tensor_names.h"

namespace sx::engine {

enum class Mixer { kAttention, kGatedDeltaNet };
enum class Ffn { kDense, kRoutedExperts };

struct LayerSpec {
  Mixer mixer = Mixer::kAttention;
  AttentionSpec attention;  // Mixer::kAttention
  // The norm before the FFN (ffn_norm, or the hybrids' post_attention_norm).
  model::LayerTensor ffn_norm = model::LayerTensor::kFfnNorm;
  Ffn ffn = Ffn::kDense;
  bool shared_expert = false;  // beside the routed experts (held by each stage's tp rank 0)
  bool operator==(const LayerSpec&) const = default;
};

struct Architecture {
  std::string_view name;  // general.architecture
  LayerSpec (*layer)(const model::ModelConfig& c, std::int64_t layer);
};

// The architecture of c.architecture; nullptr for one the engine does not run.
const Architecture* find_architecture(std::string_view name);

// Each family's file.
const Architecture& qwen2_architecture();
const Architecture& qwen3_architecture();
const Architecture& qwen3moe_architecture();
const Architecture& qwen35_architecture();
const Architecture& qwen35moe_architecture();

}  // namespace sx::engine
