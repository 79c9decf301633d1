// Writes a model as a Hugging Face directory: config.json, generation_config.json, the tokenizer
// files given as text, and the weights as model.safetensors or N shards with
// model.safetensors.index.json (names model-0000i-of-0000N.safetensors, split by bytes in
// checkpoint order). Tensors get their HF names (gguf_to_hf_name) and row-major shapes; every
// tensor is stored in `dtype` (as Hugging Face checkpoints do, norms included), converted through
// F32 when the source holds another format, so an F32 source written as F32 keeps every bit.
//
// Memory: one shard's tensors at a time. Errors: INVALID_ARGUMENT for options out of range (shards
// outside 1..tensor count, a dtype other than F32/F16/BF16), an architecture Sextant does not run;
// NOT_FOUND for a tensor the config needs that the source lacks; I/O errors name the path.
//
// Qwen3.5 (qwen35, qwen35moe) is written as its Hugging Face checkpoints are: config.json of
// Qwen3_5(Moe)ForConditionalGeneration with the keys in text_config; tensors under
// model.language_model.; llama.cpp's converter undone (V heads regrouped by K head, norms as
// w - 1, ssm_a as A_log, conv1d [channels][1][kernel], the shared expert's gate [1][hidden]);
// experts fused as transformers 5 stores them (mlp.experts.gate_up_proj, mlp.experts.down_proj).
// Threading: not thread-safe with respect to `dir`.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "runtime/base/status.h"
#include "runtime/hal/dtype.h"
#include "runtime/model/model_config.h"
#include "runtime/model/tensor_source.h"

namespace sx::model {

enum class Int4Checkpoint { kNone, kAwq, kGptq };

struct HfWriteOptions {
  hal::DType dtype = hal::DType::kF32;  // F32, F16 or BF16
  int shards = 1;
  std::string tokenizer_json;            // written as is when not empty
  std::string tokenizer_config_json;     // written as is when not empty
  std::vector<std::int32_t> eos_ids;     // generation_config.json eos_token_id
  // A 4-bit checkpoint (groups of 128; see hf_model.h): every layer matrix as .qweight / .qzeros /
  // .scales (GPTQ adds .g_idx), the embedding, LM head, norms and biases in F16. Every layer
  // matrix's input size must be a multiple of 128.
  //   kAwq:  AutoAWQ's GEMM packing and zero-point rule (scale = (max - min) / 15 in fp16,
  //          zero = clamp(round(-min / scale), 0, 15), q = clamp(round(w / scale) + zero, 0, 15)).
  //   kGptq: AutoGPTQ's packing (checkpoint_format "gptq": zeros stored minus one), symmetric
  //          (sym = true, desc_act = false: scale = max |w| / 7.5 in fp16, zero 8,
  //          q = clamp(round(w / scale) + 8, 0, 15)), g_idx = input / 128.
  Int4Checkpoint int4 = Int4Checkpoint::kNone;
  // Adds small zero tensors under model.visual.* and mtp.* (a Qwen3.5 checkpoint's vision tower
  // and multi-token-prediction layer, which the loader skips), to test that skipping.
  bool skipped_stand_ins = false;
};

// config.json text for a Qwen2 config (torch_dtype from `dtype`; for a 4-bit checkpoint, its
// quantization_config).
std::string hf_config_json(const ModelConfig& c, hal::DType dtype, Int4Checkpoint int4 = Int4Checkpoint::kNone);

Status write_hf_model(const TensorSource& source, const ModelConfig& c, const HfWriteOptions& options,
                      const std::string& dir);

}  // namespace sx::model
