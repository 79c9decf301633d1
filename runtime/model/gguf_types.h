// GGUF building blocks shared by the reader and the writer: metadata value types, the metadata value
// itself (scalars, strings, possibly nested arrays) and the table of every ggml tensor type with its
// block layout.
//
// Format reference: ggml docs/gguf.md. All multi-byte numbers are little-endian.
//
// Lifetime: GgufValue / GgufArray own their data (strings are copied out of the file).
// Threading: plain values; the type tables are immutable.
// Errors: none here; the reader and the writer report them.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "runtime/hal/dtype.h"

namespace sx::model {

// Metadata value type ids, as stored in the file.
enum class GgufType : std::uint32_t {
  kUint8 = 0,
  kInt8 = 1,
  kUint16 = 2,
  kInt16 = 3,
  kUint32 = 4,
  kInt32 = 5,
  kFloat32 = 6,
  kBool = 7,
  kString = 8,
  kArray = 9,
  kUint64 = 10,
  kInt64 = 11,
  kFloat64 = 12,
};
inline constexpr std::uint32_t kGgufTypeCount = 13;

// "uint32", "string", "array", ...; "unknown" for ids outside the enum.
std::string_view gguf_type_name(GgufType t);
// Bytes of one scalar of a fixed-size type (0 for string and array).
std::size_t gguf_scalar_size(GgufType t);
bool gguf_type_is_unsigned(GgufType t);  // uint8/16/32/64
bool gguf_type_is_signed(GgufType t);    // int8/16/32/64
bool gguf_type_is_integer(GgufType t);   // either of the above
bool gguf_type_is_float(GgufType t);     // float32/64

struct GgufValue;

// An array value: element type plus items. Numeric and bool items are kept packed exactly as in
// the file (little-endian, gguf_scalar_size(elem_type) bytes each) so a 150k-entry token_type
// array costs what it costs on disk; strings and nested arrays are kept as objects.
struct GgufArray {
  GgufType elem_type = GgufType::kUint8;
  std::vector<std::uint8_t> raw;      // numeric / bool elements
  std::vector<std::string> strings;   // elem_type == kString
  std::vector<GgufValue> arrays;      // elem_type == kArray (each item is an array value)

  std::uint64_t size() const;
  // Element access; nullopt when the element type does not fit the request (or i is out of range).
  std::optional<std::uint64_t> uint_at(std::uint64_t i) const;  // unsigned ints, non-negative signed
  std::optional<std::int64_t> int_at(std::uint64_t i) const;    // any integer fitting int64
  std::optional<double> float_at(std::uint64_t i) const;        // floats and integers
  std::optional<bool> bool_at(std::uint64_t i) const;

  bool operator==(const GgufArray& o) const;
};

// One metadata value: a type tag plus its payload. Integers are widened to 64 bits (the tag keeps
// the width for writing back), float32 is widened to double exactly.
struct GgufValue {
  GgufType type = GgufType::kUint8;
  std::variant<std::uint64_t, std::int64_t, double, bool, std::string, GgufArray> payload{std::uint64_t{0}};

  static GgufValue uint8(std::uint8_t v) { return {GgufType::kUint8, std::uint64_t{v}}; }
  static GgufValue int8(std::int8_t v) { return {GgufType::kInt8, std::int64_t{v}}; }
  static GgufValue uint16(std::uint16_t v) { return {GgufType::kUint16, std::uint64_t{v}}; }
  static GgufValue int16(std::int16_t v) { return {GgufType::kInt16, std::int64_t{v}}; }
  static GgufValue uint32(std::uint32_t v) { return {GgufType::kUint32, std::uint64_t{v}}; }
  static GgufValue int32(std::int32_t v) { return {GgufType::kInt32, std::int64_t{v}}; }
  static GgufValue uint64(std::uint64_t v) { return {GgufType::kUint64, v}; }
  static GgufValue int64(std::int64_t v) { return {GgufType::kInt64, v}; }
  static GgufValue float32(float v) { return {GgufType::kFloat32, static_cast<double>(v)}; }
  static GgufValue float64(double v) { return {GgufType::kFloat64, v}; }
  static GgufValue boolean(bool v) { return {GgufType::kBool, v}; }
  static GgufValue string(std::string v) { return {GgufType::kString, std::move(v)}; }
  static GgufValue array(GgufArray a) { return {GgufType::kArray, std::move(a)}; }
  static GgufValue string_array(std::vector<std::string> items);
  static GgufValue int32_array(const std::vector<std::int32_t>& items);
  static GgufValue int64_array(const std::vector<std::int64_t>& items);
  static GgufValue uint32_array(const std::vector<std::uint32_t>& items);
  static GgufValue float32_array(const std::vector<float>& items);
  static GgufValue bool_array(const std::vector<bool>& items);
  static GgufValue array_of_arrays(std::vector<GgufValue> items);  // each item must be an array

  // Checked views (nullopt / nullptr when the type does not fit).
  std::optional<std::uint64_t> to_uint() const;  // any integer >= 0
  std::optional<std::int64_t> to_int() const;    // any integer fitting int64
  std::optional<double> to_float() const;        // floats and integers
  const bool* if_bool() const { return std::get_if<bool>(&payload); }
  const std::string* if_string() const { return std::get_if<std::string>(&payload); }
  const GgufArray* if_array() const { return std::get_if<GgufArray>(&payload); }

  bool operator==(const GgufValue& o) const { return type == o.type && payload == o.payload; }
};

// Human-readable rendering for inspect-like tools: scalars as values, strings quoted and escaped
// (long ones cut), arrays as "[a, b, ... (N items)]" showing at most max_items items per level.
std::string gguf_value_to_string(const GgufValue& v, std::size_t max_items = 8);

// ---- ggml tensor types ----

// One ggml tensor type: a row of n elements takes (n / block_elems) * block_bytes bytes.
struct GgmlTypeInfo {
  std::uint32_t id;
  std::string_view name;           // "f32", "q4_k", ... (ggml's type_name)
  std::uint32_t block_elems;
  std::uint32_t block_bytes;
  std::optional<hal::DType> dtype;  // set where the HAL knows the format (its size; kernels: require_supported)
};

// Known ggml type ids (ggml.h). Ids 4, 5 and 31-33, 36-38 were removed from ggml and are unknown.
enum class GgmlType : std::uint32_t {
  kF32 = 0, kF16 = 1, kQ4_0 = 2, kQ4_1 = 3, kQ5_0 = 6, kQ5_1 = 7, kQ8_0 = 8, kQ8_1 = 9,
  kQ2_K = 10, kQ3_K = 11, kQ4_K = 12, kQ5_K = 13, kQ6_K = 14, kQ8_K = 15,
  kIQ2_XXS = 16, kIQ2_XS = 17, kIQ3_XXS = 18, kIQ1_S = 19, kIQ4_NL = 20, kIQ3_S = 21,
  kIQ2_S = 22, kIQ4_XS = 23, kI8 = 24, kI16 = 25, kI32 = 26, kI64 = 27, kF64 = 28,
  kIQ1_M = 29, kBF16 = 30, kTQ1_0 = 34, kTQ2_0 = 35, kMXFP4 = 39,
};

// nullptr for an unknown id.
const GgmlTypeInfo* ggml_type_info(std::uint32_t id);
// "q4_k", or "unknown#N".
std::string ggml_type_name(std::uint32_t id);
// What ggml_type_of returns for a HAL format GGUF cannot hold (AWQ int4); ggml_type_info() knows no
// such id, so writing it fails with a clear error.
inline constexpr std::uint32_t kNoGgmlType = 0xFFFFFFFFu;
// The ggml type a HAL dtype is stored as (F32, F16, BF16, I32 and every GGML block format), or
// kNoGgmlType.
std::uint32_t ggml_type_of(hal::DType t);
// Every known type, ascending id.
const std::vector<GgmlTypeInfo>& ggml_type_table();

}  // namespace sx::model
