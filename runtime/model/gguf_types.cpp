// GGUF value types, the metadata value helpers and the ggml type table.
#include "runtime/model/gguf_types.h"

#include <cmath>
#include <cstring>
#include <limits>

#include <fmt/format.h>

namespace sx::model {

namespace {

template <typename T>
T load_le(const std::uint8_t* p) {
  T v;
  std::memcpy(&v, p, sizeof(T));  // the host is little-endian (checked in gguf_parse.cpp)
  return v;
}

template <typename T>
void append_le(std::vector<std::uint8_t>& out, T v) {
  const auto* p = reinterpret_cast<const std::uint8_t*>(&v);
  out.insert(out.end(), p, p + sizeof(T));
}

template <typename T>
GgufValue packed_array(GgufType t, const std::vector<T>& items) {
  GgufArray a;
  a.elem_type = t;
  a.raw.reserve(items.size() * sizeof(T));
  for (const T& x : items) append_le(a.raw, x);
  return GgufValue::array(std::move(a));
}

// Loads element i of a packed numeric array as the widest type of its kind.
struct Scalar {
  enum Kind { kUnsigned, kSigned, kFloat, kBool } kind;
  std::uint64_t u = 0;
  std::int64_t i = 0;
  double f = 0;
  bool b = false;
};

std::optional<Scalar> load_scalar(GgufType t, const std::uint8_t* p) {
  Scalar s{Scalar::kUnsigned};
  switch (t) {
    case GgufType::kUint8: s.u = load_le<std::uint8_t>(p); return s;
    case GgufType::kUint16: s.u = load_le<std::uint16_t>(p); return s;
    case GgufType::kUint32: s.u = load_le<std::uint32_t>(p); return s;
    case GgufType::kUint64: s.u = load_le<std::uint64_t>(p); return s;
    case GgufType::kInt8: s.kind = Scalar::kSigned; s.i = load_le<std::int8_t>(p); return s;
    case GgufType::kInt16: s.kind = Scalar::kSigned; s.i = load_le<std::int16_t>(p); return s;
    case GgufType::kInt32: s.kind = Scalar::kSigned; s.i = load_le<std::int32_t>(p); return s;
    case GgufType::kInt64: s.kind = Scalar::kSigned; s.i = load_le<std::int64_t>(p); return s;
    case GgufType::kFloat32: s.kind = Scalar::kFloat; s.f = load_le<float>(p); return s;
    case GgufType::kFloat64: s.kind = Scalar::kFloat; s.f = load_le<double>(p); return s;
    case GgufType::kBool: s.kind = Scalar::kBool; s.b = p[0] != 0; return s;
    default: return std::nullopt;
  }
}

std::string escape(std::string_view s, std::size_t max_chars) {
  std::string out = "\"";
  std::size_t n = 0;
  for (char c : s) {
    if (n++ == max_chars) {
      out += fmt::format("...\" ({} bytes)", s.size());
      return out;
    }
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      default:
        if (static_cast<unsigned char>(c) < 0x20) {
          out += fmt::format("\\x{:02x}", static_cast<unsigned char>(c));
        } else {
          out += c;
        }
    }
  }
  out += '"';
  return out;
}

std::string scalar_to_string(const Scalar& s, GgufType t) {
  switch (s.kind) {
    case Scalar::kUnsigned: return fmt::format("{}", s.u);
    case Scalar::kSigned: return fmt::format("{}", s.i);
    case Scalar::kBool: return s.b ? "true" : "false";
    case Scalar::kFloat:
      return t == GgufType::kFloat32 ? fmt::format("{}", static_cast<float>(s.f)) : fmt::format("{}", s.f);
  }
  return "?";
}

}  // namespace

std::string_view gguf_type_name(GgufType t) {
  switch (t) {
    case GgufType::kUint8: return "uint8";
    case GgufType::kInt8: return "int8";
    case GgufType::kUint16: return "uint16";
    case GgufType::kInt16: return "int16";
    case GgufType::kUint32: return "uint32";
    case GgufType::kInt32: return "int32";
    case GgufType::kFloat32: return "float32";
    case GgufType::kBool: return "bool";
    case GgufType::kString: return "string";
    case GgufType::kArray: return "array";
    case GgufType::kUint64: return "uint64";
    case GgufType::kInt64: return "int64";
    case GgufType::kFloat64: return "float64";
  }
  return "unknown";
}

std::size_t gguf_scalar_size(GgufType t) {
  switch (t) {
    case GgufType::kUint8: case GgufType::kInt8: case GgufType::kBool: return 1;
    case GgufType::kUint16: case GgufType::kInt16: return 2;
    case GgufType::kUint32: case GgufType::kInt32: case GgufType::kFloat32: return 4;
    case GgufType::kUint64: case GgufType::kInt64: case GgufType::kFloat64: return 8;
    case GgufType::kString: case GgufType::kArray: return 0;
  }
  return 0;
}

bool gguf_type_is_unsigned(GgufType t) {
  return t == GgufType::kUint8 || t == GgufType::kUint16 || t == GgufType::kUint32 || t == GgufType::kUint64;
}
bool gguf_type_is_signed(GgufType t) {
  return t == GgufType::kInt8 || t == GgufType::kInt16 || t == GgufType::kInt32 || t == GgufType::kInt64;
}
bool gguf_type_is_integer(GgufType t) { return gguf_type_is_unsigned(t) || gguf_type_is_signed(t); }
bool gguf_type_is_float(GgufType t) { return t == GgufType::kFloat32 || t == GgufType::kFloat64; }

// ---- GgufArray ----

std::uint64_t GgufArray::size() const {
  if (elem_type == GgufType::kString) return strings.size();
  if (elem_type == GgufType::kArray) return arrays.size();
  const std::size_t s = gguf_scalar_size(elem_type);
  return s == 0 ? 0 : raw.size() / s;
}

std::optional<std::uint64_t> GgufArray::uint_at(std::uint64_t i) const {
  const std::size_t s = gguf_scalar_size(elem_type);
  if (s == 0 || !gguf_type_is_integer(elem_type) || i >= size()) return std::nullopt;
  const auto v = load_scalar(elem_type, raw.data() + i * s);
  if (v->kind == Scalar::kUnsigned) return v->u;
  if (v->i < 0) return std::nullopt;
  return static_cast<std::uint64_t>(v->i);
}

std::optional<std::int64_t> GgufArray::int_at(std::uint64_t i) const {
  const std::size_t s = gguf_scalar_size(elem_type);
  if (s == 0 || !gguf_type_is_integer(elem_type) || i >= size()) return std::nullopt;
  const auto v = load_scalar(elem_type, raw.data() + i * s);
  if (v->kind == Scalar::kSigned) return v->i;
  if (v->u > static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max())) return std::nullopt;
  return static_cast<std::int64_t>(v->u);
}

std::optional<double> GgufArray::float_at(std::uint64_t i) const {
  const std::size_t s = gguf_scalar_size(elem_type);
  if (s == 0 || elem_type == GgufType::kBool || i >= size()) return std::nullopt;
  const auto v = load_scalar(elem_type, raw.data() + i * s);
  switch (v->kind) {
    case Scalar::kUnsigned: return static_cast<double>(v->u);
    case Scalar::kSigned: return static_cast<double>(v->i);
    default: return v->f;
  }
}

std::optional<bool> GgufArray::bool_at(std::uint64_t i) const {
  if (elem_type != GgufType::kBool || i >= size()) return std::nullopt;
  return raw[i] != 0;
}

bool GgufArray::operator==(const GgufArray& o) const {
  return elem_type == o.elem_type && raw == o.raw && strings == o.strings && arrays == o.arrays;
}

// ---- GgufValue ----

GgufValue GgufValue::string_array(std::vector<std::string> items) {
  GgufArray a;
  a.elem_type = GgufType::kString;
  a.strings = std::move(items);
  return array(std::move(a));
}
GgufValue GgufValue::int32_array(const std::vector<std::int32_t>& items) {
  return packed_array(GgufType::kInt32, items);
}
GgufValue GgufValue::int64_array(const std::vector<std::int64_t>& items) {
  return packed_array(GgufType::kInt64, items);
}
GgufValue GgufValue::uint32_array(const std::vector<std::uint32_t>& items) {
  return packed_array(GgufType::kUint32, items);
}
GgufValue GgufValue::float32_array(const std::vector<float>& items) {
  return packed_array(GgufType::kFloat32, items);
}
GgufValue GgufValue::bool_array(const std::vector<bool>& items) {
  std::vector<std::uint8_t> bytes(items.begin(), items.end());
  return packed_array(GgufType::kBool, bytes);
}
GgufValue GgufValue::array_of_arrays(std::vector<GgufValue> items) {
  GgufArray a;
  a.elem_type = GgufType::kArray;
  a.arrays = std::move(items);
  return array(std::move(a));
}

std::optional<std::uint64_t> GgufValue::to_uint() const {
  if (const auto* u = std::get_if<std::uint64_t>(&payload)) return *u;
  if (const auto* i = std::get_if<std::int64_t>(&payload)) {
    if (*i >= 0) return static_cast<std::uint64_t>(*i);
  }
  return std::nullopt;
}

std::optional<std::int64_t> GgufValue::to_int() const {
  if (const auto* i = std::get_if<std::int64_t>(&payload)) return *i;
  if (const auto* u = std::get_if<std::uint64_t>(&payload)) {
    if (*u <= static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max())) return static_cast<std::int64_t>(*u);
  }
  return std::nullopt;
}

std::optional<double> GgufValue::to_float() const {
  if (const auto* f = std::get_if<double>(&payload)) return *f;
  if (const auto* i = std::get_if<std::int64_t>(&payload)) return static_cast<double>(*i);
  if (const auto* u = std::get_if<std::uint64_t>(&payload)) return static_cast<double>(*u);
  return std::nullopt;
}

std::string gguf_value_to_string(const GgufValue& v, std::size_t max_items) {
  constexpr std::size_t kMaxStringChars = 120;
  if (const auto* s = v.if_string()) return escape(*s, kMaxStringChars);
  if (const auto* b = v.if_bool()) return *b ? "true" : "false";
  if (const auto* a = v.if_array()) {
    const std::uint64_t n = a->size();
    std::string out = "[";
    const std::uint64_t shown = std::min<std::uint64_t>(n, max_items);
    for (std::uint64_t i = 0; i < shown; ++i) {
      if (i > 0) out += ", ";
      if (a->elem_type == GgufType::kString) {
        out += escape(a->strings[i], kMaxStringChars);
      } else if (a->elem_type == GgufType::kArray) {
        out += gguf_value_to_string(a->arrays[i], max_items);
      } else {
        const std::size_t s = gguf_scalar_size(a->elem_type);
        out += scalar_to_string(*load_scalar(a->elem_type, a->raw.data() + i * s), a->elem_type);
      }
    }
    if (shown < n) out += fmt::format("{}... ({} {} items)", shown > 0 ? ", " : "", n, gguf_type_name(a->elem_type));
    out += "]";
    return out;
  }
  if (const auto* f = std::get_if<double>(&v.payload)) {
    return v.type == GgufType::kFloat32 ? fmt::format("{}", static_cast<float>(*f)) : fmt::format("{}", *f);
  }
  if (const auto* u = std::get_if<std::uint64_t>(&v.payload)) return fmt::format("{}", *u);
  if (const auto* i = std::get_if<std::int64_t>(&v.payload)) return fmt::format("{}", *i);
  return "?";
}

// ---- ggml types ----

const std::vector<GgmlTypeInfo>& ggml_type_table() {
  // Block sizes and bytes per block from ggml-common.h (QK_K = 256).
  static const std::vector<GgmlTypeInfo> kTable = {
      {0, "f32", 1, 4, hal::DType::kF32},
      {1, "f16", 1, 2, hal::DType::kF16},
      {2, "q4_0", 32, 18, hal::DType::kQ4_0},
      {3, "q4_1", 32, 20, hal::DType::kQ4_1},
      {6, "q5_0", 32, 22, hal::DType::kQ5_0},
      {7, "q5_1", 32, 24, hal::DType::kQ5_1},
      {8, "q8_0", 32, 34, hal::DType::kQ8_0},
      {9, "q8_1", 32, 36, std::nullopt},
      {10, "q2_k", 256, 84, hal::DType::kQ2_K},
      {11, "q3_k", 256, 110, hal::DType::kQ3_K},
      {12, "q4_k", 256, 144, hal::DType::kQ4_K},
      {13, "q5_k", 256, 176, hal::DType::kQ5_K},
      {14, "q6_k", 256, 210, hal::DType::kQ6_K},
      {15, "q8_k", 256, 292, std::nullopt},
      {16, "iq2_xxs", 256, 66, std::nullopt},
      {17, "iq2_xs", 256, 74, std::nullopt},
      {18, "iq3_xxs", 256, 98, std::nullopt},
      {19, "iq1_s", 256, 50, std::nullopt},
      {20, "iq4_nl", 32, 18, std::nullopt},
      {21, "iq3_s", 256, 110, std::nullopt},
      {22, "iq2_s", 256, 82, std::nullopt},
      {23, "iq4_xs", 256, 136, std::nullopt},
      {24, "i8", 1, 1, std::nullopt},
      {25, "i16", 1, 2, std::nullopt},
      {26, "i32", 1, 4, std::nullopt},
      {27, "i64", 1, 8, std::nullopt},
      {28, "f64", 1, 8, std::nullopt},
      {29, "iq1_m", 256, 56, std::nullopt},
      {30, "bf16", 1, 2, hal::DType::kBF16},
      {34, "tq1_0", 256, 54, std::nullopt},
      {35, "tq2_0", 256, 66, std::nullopt},
      {39, "mxfp4", 32, 17, std::nullopt},
  };
  return kTable;
}

const GgmlTypeInfo* ggml_type_info(std::uint32_t id) {
  for (const GgmlTypeInfo& t : ggml_type_table()) {
    if (t.id == id) return &t;
  }
  return nullptr;
}

std::string ggml_type_name(std::uint32_t id) {
  const GgmlTypeInfo* t = ggml_type_info(id);
  return t != nullptr ? std::string(t->name) : fmt::format("unknown#{}", id);
}

std::uint32_t ggml_type_of(hal::DType t) {
  switch (t) {
    case hal::DType::kF32: return 0;
    case hal::DType::kF16: return 1;
    case hal::DType::kBF16: return 30;
    case hal::DType::kQ8_0: return 8;
    case hal::DType::kI32: return 26;
    case hal::DType::kQ4_0: return 2;
    case hal::DType::kQ5_0: return 6;
    case hal::DType::kQ4_K: return 12;
    case hal::DType::kQ6_K: return 14;
    case hal::DType::kQ4_1: return 3;
    case hal::DType::kQ5_1: return 7;
    case hal::DType::kQ2_K: return 10;
    case hal::DType::kQ3_K: return 11;
    case hal::DType::kQ5_K: return 13;
    case hal::DType::kAwqInt4: return kNoGgmlType;
  }
  return kNoGgmlType;
}

}  // namespace sx::model
