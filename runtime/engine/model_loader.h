// Opens a model file before any device memory is touched: the GGUF file (validated), the model
// config and the tokenizer from the file's metadata. Qwen2Model::load checks every tensor against
// the config before it allocates.
// Errors name the file and the key or tensor at fault.
#pragma once

#include <memory>
#include <string>

#include "runtime/model/gguf.h"
#include "runtime/model/model_config.h"
#include "runtime/tokenizer/tokenizer.h"

namespace sx::engine {

struct OpenedModel {
  std::unique_ptr<model::GgufFile> file;
  model::ModelConfig config;
  std::unique_ptr<tokenizer::Tokenizer> tokenizer;
};

Result<OpenedModel> open_model(const std::string& path);

// The tokenizer.ggml.* metadata of a GGUF file as tokenizer data.
Result<tokenizer::TokenizerData> tokenizer_data_from_gguf(const model::GgufFile& file);

}  // namespace sx::engine
