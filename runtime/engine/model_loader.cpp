// open_model(): GGUF file or safetensors directory + config + tokenizer + tensor check.
#include "runtime/engine/model_loader.h"

#include <filesystem>

namespace sx::engine {

Result<tokenizer::TokenizerData> tokenizer_data_from_gguf(const model::GgufFile& file) {
  SX_ASSIGN_OR_RETURN(model::TokenizerMetadata meta, model::tokenizer_metadata_from_gguf(file));
  if (meta.model != "gpt2") {
    return unimplemented_error("{}: tokenizer.ggml.model is '{}'; only byte-level BPE ('gpt2') is supported",
                               file.path(), meta.model);
  }
  tokenizer::TokenizerData d;
  d.tokens = std::move(meta.tokens);
  d.merges = std::move(meta.merges);
  d.token_types = std::move(meta.token_types);
  d.pre = std::move(meta.pre);
  auto id = [](std::int64_t v) { return v >= 0 ? std::optional<std::int32_t>(static_cast<std::int32_t>(v)) : std::nullopt; };
  d.eos_id = id(meta.eos_id);
  d.bos_id = id(meta.bos_id);
  d.pad_id = id(meta.pad_id);
  d.add_bos = meta.add_bos;
  d.chat_template = std::move(meta.chat_template);
  return d;
}

namespace {

Result<OpenedModel> open_gguf(const std::string& path) {
  OpenedModel m;
  SX_ASSIGN_OR_RETURN(std::unique_ptr<model::GgufFile> file, model::GgufFile::open(path));
  SX_ASSIGN_OR_RETURN(m.config, model::model_config_from_gguf(*file));
  SX_ASSIGN_OR_RETURN(tokenizer::TokenizerData data, tokenizer_data_from_gguf(*file));
  auto tok = tokenizer::Tokenizer::from_data(std::move(data));
  if (!tok.ok()) return tok.status().with_context(path + ": tokenizer");
  m.tokenizer = std::move(tok).value();
  m.weights = std::move(file);
  return m;
}

Result<OpenedModel> open_hf(const std::string& dir) {
  OpenedModel m;
  SX_ASSIGN_OR_RETURN(std::unique_ptr<model::HfModel> hf, model::HfModel::open(dir));
  m.config = hf->config();
  const std::string tokenizer_path = hf->tokenizer_path();
  std::error_code ec;
  if (!std::filesystem::exists(tokenizer_path, ec)) {
    return not_found_error("{}: {} is missing; Sextant needs the Hugging Face tokenizer next to the weights", dir,
                           model::kHfTokenizerFile);
  }
  SX_ASSIGN_OR_RETURN(m.tokenizer, tokenizer::Tokenizer::from_hf_json(tokenizer_path));
  for (std::int32_t id : hf->generation().eos_ids) {
    if (id >= m.config.vocab) {
      return invalid_argument_error("{}/{}: eos_token_id {} is outside the vocabulary of {} tokens", dir,
                                    model::kHfGenerationConfigFile, id, m.config.vocab);
    }
    m.extra_eos_ids.push_back(id);
  }
  m.weights = std::move(hf);
  return m;
}

}  // namespace

Result<OpenedModel> open_model_unchecked(const std::string& path) {
  std::error_code ec;
  const bool dir = std::filesystem::is_directory(path, ec);
  SX_ASSIGN_OR_RETURN(OpenedModel m, dir ? open_hf(path) : open_gguf(path));
  if (m.tokenizer->vocab_size() > m.config.vocab) {
    return invalid_argument_error("{}: the tokenizer has {} tokens but the model's vocabulary has only {}", path,
                                  m.tokenizer->vocab_size(), m.config.vocab);
  }
  m.check = model::check_model(*m.weights, m.config);
  if (const model::HfModel* hf = m.hf()) {
    m.check.warnings.insert(m.check.warnings.begin(), hf->warnings().begin(), hf->warnings().end());
  }
  return m;
}

Result<OpenedModel> open_model(const std::string& path) {
  SX_ASSIGN_OR_RETURN(OpenedModel m, open_model_unchecked(path));
  SX_RETURN_IF_ERROR(m.check.status());
  return m;
}

}  // namespace sx::engine
