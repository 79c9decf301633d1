// Moving an opened model between the two worlds: a GGUF file or a Hugging Face directory out of
// any model open_model() accepts (`sextant convert`, `sextant make-model --format safetensors`).
//
// convert_to_gguf: norms and biases stay F32; every matrix becomes `type` (F32, F16, BF16, Q8_0 or
// a K-quant such as Q4_K / Q6_K). A matrix whose rows are not whole blocks of `type` falls back as
// llama.cpp's quantizer does: a K-quant to Q5_0 (Q6_K to Q8_0) when rows are whole 32-blocks, and
// to F16 otherwise. Rows are converted through F32 one at a time while the file is written, so
// memory stays small whatever the model's size. The tokenizer goes into tokenizer.ggml.* (it must
// use the qwen2 pre-tokenizer); general.file_type is set for the uniform types.
//
// export_safetensors: write_hf_model (hf_writer.h) with tokenizer.json / tokenizer_config.json from
// the model's tokenizer and generation_config.json's eos_token_id from its EOS ids.
//
// Errors: INVALID_ARGUMENT for a type that cannot hold weights or an unsupported tokenizer; I/O
// errors name the path. Threading: reads the model; safe alongside other readers.
#pragma once

#include <string>

#include "runtime/base/status.h"
#include "runtime/model/hf_writer.h"
#include "runtime/engine/model_loader.h"
#include "runtime/hal/dtype.h"

namespace sx::engine {

// The tokenizer as GGUF tokenizer.ggml.* metadata.
Result<model::TokenizerMetadata> tokenizer_metadata_from_data(const tokenizer::TokenizerData& d);

// The format convert_to_gguf gives a [rows][cols] matrix asked to be `type`.
hal::DType gguf_weight_type(hal::DType type, std::int64_t cols);

Status convert_to_gguf(const OpenedModel& m, hal::DType type, const std::string& out_path);

// int4: an AWQ or GPTQ checkpoint (HfWriteOptions::int4; dtype must then be F16).
Status export_safetensors(const OpenedModel& m, hal::DType dtype, int shards, const std::string& dir,
                          model::Int4Checkpoint int4 = model::Int4Checkpoint::kNone);

}  // namespace sx::engine
