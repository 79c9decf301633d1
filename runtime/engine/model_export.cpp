// convert_to_gguf / export_safetensors.
#include "runtime/engine/model_export.h"

#include <algorithm>
#include <vector>

#include "runtime/model/gguf_writer.h"
#include "runtime/model/hf_writer.h"
#include "runtime/tokenizer/hf_json_writer.h"
#include "runtime/tokenizer/pretokenizer.h"

namespace sx::engine {

namespace {

bool is_k_quant(hal::DType t) {
  return t == hal::DType::kQ2_K || t == hal::DType::kQ3_K || t == hal::DType::kQ4_K || t == hal::DType::kQ5_K ||
         t == hal::DType::kQ6_K;
}

std::optional<std::uint32_t> file_type_of(hal::DType t) {
  switch (t) {
    case hal::DType::kF32: return 0;
    case hal::DType::kF16: return 1;
    case hal::DType::kQ8_0: return 7;
    case hal::DType::kQ4_K: return 14;
    case hal::DType::kQ6_K: return 18;
    case hal::DType::kBF16: return 32;
    default: return std::nullopt;
  }
}

}  // namespace

Result<model::TokenizerMetadata> tokenizer_metadata_from_data(const tokenizer::TokenizerData& d) {
  if (tokenizer::pre_tokenizer_pattern(d.pre).empty()) {
    return unimplemented_error("tokenizer: its pre-tokenizer has no GGUF name (GGUF names these: {})",
                               tokenizer::known_pre_tokenizers());
  }
  model::TokenizerMetadata t;
  t.tokens = d.tokens;
  t.merges = d.merges;
  t.token_types = d.token_types;
  t.pre = d.pre;
  t.eos_id = d.eos_id.value_or(-1);
  t.bos_id = d.bos_id.value_or(-1);
  t.pad_id = d.pad_id.value_or(-1);
  t.add_bos = d.add_bos;
  t.chat_template = d.chat_template;
  return t;
}

hal::DType gguf_weight_type(hal::DType type, std::int64_t cols) {
  const int block = hal::dtype_info(type).block_elems;
  if (cols % block == 0) return type;
  if (is_k_quant(type) && cols % 32 == 0) return type == hal::DType::kQ6_K ? hal::DType::kQ8_0 : hal::DType::kQ5_0;
  return hal::DType::kF16;
}

Status convert_to_gguf(const OpenedModel& m, hal::DType type, const std::string& out_path) {
  if (!hal::can_quantize(type)) {
    return invalid_argument_error("sextant cannot write weights as {} (it can write f32, f16, bf16, q8_0, q4_0, q4_1, "
                                  "q5_0, q5_1, q4_k, q5_k, q6_k)",
                                  hal::dtype_name(type));
  }
  const model::ModelConfig& c = m.config;
  model::GgufWriter w;
  model::set_model_config_metadata(w, c);
  if (auto ft = file_type_of(type)) w.set_uint32("general.file_type", *ft);
  SX_ASSIGN_OR_RETURN(model::TokenizerMetadata tok, tokenizer_metadata_from_data(m.tokenizer->data()));
  model::set_tokenizer_metadata(w, tok, c.vocab);
  for (const model::ExpectedTensor& e : model::expected_tensors(c)) {
    const model::TensorInfo* t = m.weights->find_tensor(e.name);
    if (t == nullptr) return not_found_error("{}: tensor {} is missing", m.weights->path(), m.weights->tensor_label(e.name));
    if (!t->dtype || !hal::can_dequantize(*t->dtype)) {
      return invalid_argument_error("{}: tensor {} has type {}, which cannot be converted", m.weights->path(),
                                    m.weights->tensor_label(e.name), t->type_name);
    }
    const std::int64_t cols = t->dims[0];
    const std::int64_t rows = t->n_elements / cols;
    const hal::DType to = t->dims.size() == 1 ? hal::DType::kF32 : gguf_weight_type(type, cols);
    const hal::DType from = *t->dtype;
    SX_RETURN_IF_ERROR(w.add_tensor_streamed(
        e.name, t->dims, model::ggml_type_of(to), [t, from, to, rows, cols](model::GgufByteSink& sink) -> Status {
          if (from == to) return sink.write(t->data);
          const std::size_t in_row = hal::row_bytes(from, cols);
          std::vector<std::uint8_t> out(hal::row_bytes(to, cols));
          for (std::int64_t r = 0; r < rows; ++r) {  // a row at a time: the tensor is never held converted
            hal::convert_rows(from, t->data.data() + static_cast<std::size_t>(r) * in_row, to, out.data(), 1, cols);
            SX_RETURN_IF_ERROR(sink.write(out));
          }
          return ok_status();
        }));
  }
  return w.write(out_path);
}

Status export_safetensors(const OpenedModel& m, hal::DType dtype, int shards, const std::string& dir,
                          model::Int4Checkpoint int4) {
  model::HfWriteOptions o;
  o.int4 = int4;
  o.dtype = dtype;
  o.shards = shards;
  // A Qwen3.5 checkpoint as published holds a vision tower and an MTP layer: stand-ins for both.
  o.skipped_stand_ins = m.config.is_hybrid();
  const tokenizer::TokenizerData& d = m.tokenizer->data();
  SX_ASSIGN_OR_RETURN(o.tokenizer_json, tokenizer::tokenizer_json_from_data(d));
  o.tokenizer_config_json = tokenizer::tokenizer_config_json_from_data(d);
  if (d.eos_id) o.eos_ids.push_back(*d.eos_id);
  for (std::int32_t id : m.extra_eos_ids) {
    if (std::find(o.eos_ids.begin(), o.eos_ids.end(), id) == o.eos_ids.end()) o.eos_ids.push_back(id);
  }
  return model::write_hf_model(*m.weights, m.config, o, dir);
}

}  // namespace sx::engine
