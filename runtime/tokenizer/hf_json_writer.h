// The inverse of Tokenizer::from_hf_json: a Hugging Face tokenizer.json and tokenizer_config.json
// for a byte-level BPE tokenizer, so a GGUF model's tokenizer can travel into a safetensors
// directory (`sextant make-model --format safetensors`). from_hf_json on the output gives back the
// same tokens, merges, token types, added-token options, special ids, add_bos and chat template;
// unused ids (holes, "[PAD]" fillers of type unused) are left out of the vocabulary, so they come
// back as holes.
// Errors: UNIMPLEMENTED for a pre-tokenizer other than qwen2 or an explicit regex.
// Threading: pure.
#pragma once

#include <string>

#include "runtime/base/status.h"
#include "runtime/tokenizer/tokenizer.h"

namespace sx::tokenizer {

Result<std::string> tokenizer_json_from_data(const TokenizerData& data);
std::string tokenizer_config_json_from_data(const TokenizerData& data);

}  // namespace sx::tokenizer
