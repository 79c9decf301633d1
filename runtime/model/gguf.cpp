// GgufFile accessors: typed metadata lookups with precise errors, tensor lookup, format checks.
// (Parsing and validation live in gguf_parse.cpp.)
#include "runtime/model/gguf.h"

#include <fmt/format.h>

namespace sx::model {

const GgufValue* GgufFile::find(std::string_view key) const {
  auto it = metadata_index_.find(key);
  return it == metadata_index_.end() ? nullptr : &metadata_[it->second].second;
}

const TensorInfo* GgufFile::find_tensor(std::string_view name) const {
  auto it = tensor_index_.find(name);
  return it == tensor_index_.end() ? nullptr : &tensors_[it->second];
}

Result<const GgufValue*> GgufFile::lookup(std::string_view key) const {
  const GgufValue* v = find(key);
  if (v == nullptr) return not_found_error("{}: metadata key '{}' not found", path_, key);
  return v;
}

Status GgufFile::wrong_type(std::string_view key, const GgufValue& v, std::string_view expected) const {
  std::string actual(gguf_type_name(v.type));
  if (const GgufArray* a = v.if_array()) actual = fmt::format("array of {}", gguf_type_name(a->elem_type));
  return invalid_argument_error("{}: metadata key '{}' has type {}, expected {}", path_, key, actual, expected);
}

Result<std::uint64_t> GgufFile::get_uint(std::string_view key) const {
  SX_ASSIGN_OR_RETURN(const GgufValue* v, lookup(key));
  if (!gguf_type_is_integer(v->type)) return wrong_type(key, *v, "an integer");
  if (auto u = v->to_uint()) return *u;
  return out_of_range_error("{}: metadata key '{}' is {}, expected a non-negative integer", path_, key,
                            gguf_value_to_string(*v));
}

Result<std::int64_t> GgufFile::get_int(std::string_view key) const {
  SX_ASSIGN_OR_RETURN(const GgufValue* v, lookup(key));
  if (!gguf_type_is_integer(v->type)) return wrong_type(key, *v, "an integer");
  if (auto i = v->to_int()) return *i;
  return out_of_range_error("{}: metadata key '{}' is {}, which does not fit in int64", path_, key,
                            gguf_value_to_string(*v));
}

Result<double> GgufFile::get_float(std::string_view key) const {
  SX_ASSIGN_OR_RETURN(const GgufValue* v, lookup(key));
  if (!gguf_type_is_float(v->type) && !gguf_type_is_integer(v->type)) return wrong_type(key, *v, "a number");
  return *v->to_float();
}

Result<bool> GgufFile::get_bool(std::string_view key) const {
  SX_ASSIGN_OR_RETURN(const GgufValue* v, lookup(key));
  if (const bool* b = v->if_bool()) return *b;
  return wrong_type(key, *v, "bool");
}

Result<std::string> GgufFile::get_string(std::string_view key) const {
  SX_ASSIGN_OR_RETURN(const GgufValue* v, lookup(key));
  if (const std::string* s = v->if_string()) return *s;
  return wrong_type(key, *v, "string");
}

Result<std::vector<std::string>> GgufFile::get_string_array(std::string_view key) const {
  SX_ASSIGN_OR_RETURN(const GgufValue* v, lookup(key));
  const GgufArray* a = v->if_array();
  if (a == nullptr || a->elem_type != GgufType::kString) return wrong_type(key, *v, "array of string");
  return a->strings;
}

Result<std::vector<std::int64_t>> GgufFile::get_int_array(std::string_view key) const {
  SX_ASSIGN_OR_RETURN(const GgufValue* v, lookup(key));
  const GgufArray* a = v->if_array();
  if (a == nullptr || !gguf_type_is_integer(a->elem_type)) return wrong_type(key, *v, "array of integers");
  std::vector<std::int64_t> out;
  out.reserve(static_cast<std::size_t>(a->size()));
  for (std::uint64_t i = 0; i < a->size(); ++i) {
    auto x = a->int_at(i);
    if (!x) {
      return out_of_range_error("{}: metadata key '{}' item {} is {}, which does not fit in int64", path_, key, i,
                                *a->uint_at(i));
    }
    out.push_back(*x);
  }
  return out;
}

Result<std::vector<bool>> GgufFile::get_bool_array(std::string_view key) const {
  SX_ASSIGN_OR_RETURN(const GgufValue* v, lookup(key));
  const GgufArray* a = v->if_array();
  if (a == nullptr || a->elem_type != GgufType::kBool) return wrong_type(key, *v, "array of booleans");
  std::vector<bool> out;
  out.reserve(static_cast<std::size_t>(a->size()));
  for (std::uint64_t i = 0; i < a->size(); ++i) out.push_back(*a->bool_at(i));
  return out;
}

Result<std::vector<double>> GgufFile::get_float_array(std::string_view key) const {
  SX_ASSIGN_OR_RETURN(const GgufValue* v, lookup(key));
  const GgufArray* a = v->if_array();
  if (a == nullptr || !(gguf_type_is_integer(a->elem_type) || gguf_type_is_float(a->elem_type))) {
    return wrong_type(key, *v, "array of numbers");
  }
  std::vector<double> out;
  out.reserve(static_cast<std::size_t>(a->size()));
  for (std::uint64_t i = 0; i < a->size(); ++i) out.push_back(*a->float_at(i));
  return out;
}

Result<std::uint64_t> GgufFile::get_array_size(std::string_view key) const {
  SX_ASSIGN_OR_RETURN(const GgufValue* v, lookup(key));
  const GgufArray* a = v->if_array();
  if (a == nullptr) return wrong_type(key, *v, "an array");
  return a->size();
}

Status require_supported(const TensorInfo& t) {
  // The formats the CPU backend computes with: F32, F16, BF16 and every GGML block format the HAL
  // dequantises (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K).
  if (t.dtype && (*t.dtype == hal::DType::kF32 || *t.dtype == hal::DType::kF16 || *t.dtype == hal::DType::kBF16 ||
                  (hal::dtype_info(*t.dtype).quantized && hal::can_dequantize(*t.dtype)))) {
    return ok_status();
  }
  return unimplemented_error("{}: tensor '{}' has type {} (ggml type {}), which is not supported yet; supported: "
                             "f32, f16, bf16, q4_0, q4_1, q5_0, q5_1, q8_0, q2_k, q3_k, q4_k, q5_k, q6_k",
                             t.file, t.name, t.type_name, t.ggml_type);
}

}  // namespace sx::model
