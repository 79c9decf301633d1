// open_model(): GGUF + config + tokenizer.
#include "runtime/engine/model_loader.h"

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

Result<OpenedModel> open_model(const std::string& path) {
  OpenedModel m;
  SX_ASSIGN_OR_RETURN(m.file, model::GgufFile::open(path));
  SX_ASSIGN_OR_RETURN(m.config, model::model_config_from_gguf(*m.file));
  SX_ASSIGN_OR_RETURN(tokenizer::TokenizerData data, tokenizer_data_from_gguf(*m.file));
  auto tok = tokenizer::Tokenizer::from_data(std::move(data));
  if (!tok.ok()) return tok.status().with_context(path + ": tokenizer");
  m.tokenizer = std::move(tok).value();
  if (m.tokenizer->vocab_size() > m.config.vocab) {
    return invalid_argument_error("{}: the tokenizer has {} tokens but token_embd.weight has only {} rows", path,
                                  m.tokenizer->vocab_size(), m.config.vocab);
  }
  return m;
}

}  // namespace sx::engine
