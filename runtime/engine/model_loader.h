// Opens a model before any device memory is touched: a GGUF file, or a Hugging Face safetensors
// directory (config.json, generation_config.json, tokenizer.json + tokenizer_config.json, shards),
// validated; the model config; the tokenizer; and the tensor check (model_check.h), so that a model
// that cannot load fails here, naming the file and the tensor or key at fault.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "runtime/model/gguf.h"
#include "runtime/model/hf_model.h"
#include "runtime/model/model_check.h"
#include "runtime/model/model_config.h"
#include "runtime/tokenizer/tokenizer.h"

namespace sx::engine {

struct OpenedModel {
  std::unique_ptr<model::TensorSource> weights;  // a GgufFile or an HfModel
  model::ModelConfig config;
  std::unique_ptr<tokenizer::Tokenizer> tokenizer;
  model::ModelCheck check;               // ok() after a successful open_model; warnings may remain
  std::vector<std::int32_t> extra_eos_ids;  // generation_config.json eos_token_id (safetensors)

  // The GGUF file, or nullptr for a safetensors directory.
  const model::GgufFile* gguf() const { return dynamic_cast<const model::GgufFile*>(weights.get()); }
  // The Hugging Face directory, or nullptr for a GGUF file.
  const model::HfModel* hf() const { return dynamic_cast<const model::HfModel*>(weights.get()); }
};

// What open_model does up to the tensor check, for `sextant inspect`: a failure here is structural
// (the file cannot be read as a model at all); `check` holds every tensor-level problem.
Result<OpenedModel> open_model_unchecked(const std::string& path);

// open_model_unchecked + the first error of its check.
Result<OpenedModel> open_model(const std::string& path);

// The tokenizer.ggml.* metadata of a GGUF file as tokenizer data.
Result<tokenizer::TokenizerData> tokenizer_data_from_gguf(const model::GgufFile& file);

}  // namespace sx::engine
