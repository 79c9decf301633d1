// The GGUF parser: walks the header, metadata and tensor infos with a bounds-checked cursor and
// validates the tensor layout. Every failure is a Status naming the file and the key or tensor.
#include <algorithm>
#include <bit>
#include <cstring>
#include <limits>
#include <numeric>

#include "runtime/model/gguf.h"

namespace sx::model {

static_assert(std::endian::native == std::endian::little, "the GGUF reader assumes a little-endian host");

namespace {

// Smallest encoded size of one item of an array of `t` (for bounding counts by remaining bytes).
std::size_t min_encoded_size(GgufType t) {
  if (t == GgufType::kString) return 8;   // u64 length
  if (t == GgufType::kArray) return 12;   // u32 type + u64 count
  return gguf_scalar_size(t);
}

std::string hex_prefix(std::span<const std::uint8_t> b, std::size_t n) {
  std::string hex;
  std::string text;
  for (std::size_t i = 0; i < std::min(n, b.size()); ++i) {
    if (i > 0) hex += ' ';
    hex += fmt::format("{:02x}", b[i]);
    text += (b[i] >= 0x20 && b[i] < 0x7f) ? static_cast<char>(b[i]) : '.';
  }
  return fmt::format("{} (\"{}\")", hex, text);
}

bool looks_like_safetensors(std::span<const std::uint8_t> b) {
  if (b.size() < 10) return false;
  std::uint64_t n;
  std::memcpy(&n, b.data(), 8);
  return b[8] == '{' && n >= 2 && n <= b.size() - 8;
}

// A key whose type (and sometimes value) the spec fixes.
struct WellKnownKey {
  std::string_view key;
  GgufType type;
  std::optional<GgufType> elem_type;  // for arrays
  bool any_integer = false;           // accept any integer type instead of `type`
};

const WellKnownKey kWellKnownKeys[] = {
    {"general.alignment", GgufType::kUint32, std::nullopt},
    {"general.architecture", GgufType::kString, std::nullopt},
    {"general.name", GgufType::kString, std::nullopt},
    {"general.quantization_version", GgufType::kUint32, std::nullopt, true},
    {"general.file_type", GgufType::kUint32, std::nullopt, true},
    {"tokenizer.ggml.model", GgufType::kString, std::nullopt},
    {"tokenizer.ggml.pre", GgufType::kString, std::nullopt},
    {"tokenizer.ggml.tokens", GgufType::kArray, GgufType::kString},
    {"tokenizer.ggml.merges", GgufType::kArray, GgufType::kString},
    {"tokenizer.ggml.token_type", GgufType::kArray, GgufType::kInt32},
    {"tokenizer.ggml.scores", GgufType::kArray, GgufType::kFloat32},
    {"tokenizer.ggml.bos_token_id", GgufType::kUint32, std::nullopt, true},
    {"tokenizer.ggml.eos_token_id", GgufType::kUint32, std::nullopt, true},
    {"tokenizer.ggml.padding_token_id", GgufType::kUint32, std::nullopt, true},
    {"tokenizer.ggml.unknown_token_id", GgufType::kUint32, std::nullopt, true},
    {"tokenizer.chat_template", GgufType::kString, std::nullopt},
};

std::string type_description(GgufType t, std::optional<GgufType> elem) {
  if (t == GgufType::kArray && elem) return fmt::format("array of {}", gguf_type_name(*elem));
  return std::string(gguf_type_name(t));
}

std::string actual_type_description(const GgufValue& v) {
  if (const GgufArray* a = v.if_array()) return fmt::format("array of {}", gguf_type_name(a->elem_type));
  return std::string(gguf_type_name(v.type));
}

}  // namespace

class GgufParser {
 public:
  GgufParser(std::span<const std::uint8_t> bytes, GgufFile& out) : b_(bytes), out_(out), file_(out.path_) {}

  Status run() {
    SX_RETURN_IF_ERROR(parse_header());
    SX_RETURN_IF_ERROR(parse_metadata());
    SX_RETURN_IF_ERROR(check_well_known_keys());
    SX_RETURN_IF_ERROR(parse_tensor_infos());
    return check_layout();
  }

 private:
  std::uint64_t remaining() const { return b_.size() - pos_; }

  Status truncated(std::size_t n, std::string_view what) const {
    return data_loss_error("{}: truncated file: {} of {} at offset {} needs {} bytes but only {} remain "
                           "(file is {} bytes)",
                           file_, what, ctx_, pos_, n, remaining(), b_.size());
  }

  template <typename T>
  Result<T> read(std::string_view what) {
    if (remaining() < sizeof(T)) return truncated(sizeof(T), what);
    T v;
    std::memcpy(&v, b_.data() + pos_, sizeof(T));
    pos_ += sizeof(T);
    return v;
  }

  Result<std::string> read_string(std::string_view what) {
    SX_ASSIGN_OR_RETURN(std::uint64_t len, read<std::uint64_t>(fmt::format("length of {}", what)));
    if (len > remaining()) {
      return data_loss_error("{}: {} of {} at offset {} claims {} bytes but only {} remain (file is {} bytes)",
                             file_, what, ctx_, pos_ - 8, len, remaining(), b_.size());
    }
    std::string s(reinterpret_cast<const char*>(b_.data() + pos_), static_cast<std::size_t>(len));
    pos_ += static_cast<std::size_t>(len);
    return s;
  }

  Result<GgufType> read_type(std::string_view what) {
    SX_ASSIGN_OR_RETURN(std::uint32_t t, read<std::uint32_t>(what));
    if (t >= kGgufTypeCount) {
      return data_loss_error("{}: {} has unknown {} {} at offset {} (valid: 0..{})", file_, ctx_, what, t, pos_ - 4,
                             kGgufTypeCount - 1);
    }
    return static_cast<GgufType>(t);
  }

  Status parse_header() {
    ctx_ = "the header";
    if (b_.size() < 4) {
      static constexpr std::uint8_t kMagic[4] = {'G', 'G', 'U', 'F'};
      if (std::equal(b_.begin(), b_.end(), kMagic)) {
        return data_loss_error("{}: truncated file: {} bytes, too short for a GGUF header", file_, b_.size());
      }
      return invalid_argument_error("{}: not a GGUF file: only {} bytes ({})", file_, b_.size(), hex_prefix(b_, 4));
    }
    if (std::memcmp(b_.data(), "FUGG", 4) == 0) {
      return unimplemented_error("{}: big-endian GGUF files are not supported (re-convert as little-endian)", file_);
    }
    if (std::memcmp(b_.data(), "GGUF", 4) != 0) {
      if (looks_like_safetensors(b_)) {
        return invalid_argument_error(
            "{}: not a GGUF file: starts with {} instead of \"GGUF\"; this looks like a safetensors file "
            "(an 8-byte header length followed by '{{'), load it as safetensors",
            file_, hex_prefix(b_, 9));
      }
      return invalid_argument_error("{}: not a GGUF file: starts with {} instead of 47 47 55 46 (\"GGUF\")", file_,
                                    hex_prefix(b_, 4));
    }
    pos_ = 4;
    SX_ASSIGN_OR_RETURN(std::uint32_t version, read<std::uint32_t>("version"));
    if (version == 1) {
      return unimplemented_error(
          "{}: unsupported version 1 (GGUF v1 is obsolete; re-convert the model with a current llama.cpp); "
          "supported versions: 2, 3",
          file_);
    }
    if (version == 0x02000000u || version == 0x03000000u) {
      return unimplemented_error("{}: this looks like a big-endian GGUF file (version field {:#010x}); only "
                                 "little-endian files are supported",
                                 file_, version);
    }
    if (version != 2 && version != 3) {
      return unimplemented_error("{}: unsupported version {}; supported versions: 2, 3", file_, version);
    }
    out_.version_ = version;
    SX_ASSIGN_OR_RETURN(tensor_count_, read<std::uint64_t>("tensor_count"));
    SX_ASSIGN_OR_RETURN(kv_count_, read<std::uint64_t>("metadata_kv_count"));
    // Minimum encodings: a kv pair is key length (8) + type (4) + a 1-byte value; a tensor info is
    // name length (8) + n_dims (4) + one dim (8) + type (4) + offset (8).
    constexpr std::uint64_t kMinKv = 13;
    constexpr std::uint64_t kMinTensorInfo = 32;
    if (kv_count_ > remaining() / kMinKv) {
      return data_loss_error("{}: metadata_kv_count {} is larger than the file can hold ({} bytes remain after "
                             "the header; each pair takes at least {} bytes): corrupt or truncated file",
                             file_, kv_count_, remaining(), kMinKv);
    }
    if (tensor_count_ > remaining() / kMinTensorInfo) {
      return data_loss_error("{}: tensor_count {} is larger than the file can hold ({} bytes remain after the "
                             "header; each tensor info takes at least {} bytes): corrupt or truncated file",
                             file_, tensor_count_, remaining(), kMinTensorInfo);
    }
    if (kv_count_ * kMinKv + tensor_count_ * kMinTensorInfo > remaining()) {
      return data_loss_error("{}: metadata_kv_count {} and tensor_count {} are larger than the file can hold ({} "
                             "bytes remain after the header): corrupt or truncated file",
                             file_, kv_count_, tensor_count_, remaining());
    }
    return ok_status();
  }

  Result<GgufValue> read_value(GgufType t, int depth) {
    switch (t) {
      case GgufType::kUint8: { SX_ASSIGN_OR_RETURN(auto v, read<std::uint8_t>("uint8 value")); return GgufValue::uint8(v); }
      case GgufType::kInt8: { SX_ASSIGN_OR_RETURN(auto v, read<std::int8_t>("int8 value")); return GgufValue::int8(v); }
      case GgufType::kUint16: { SX_ASSIGN_OR_RETURN(auto v, read<std::uint16_t>("uint16 value")); return GgufValue::uint16(v); }
      case GgufType::kInt16: { SX_ASSIGN_OR_RETURN(auto v, read<std::int16_t>("int16 value")); return GgufValue::int16(v); }
      case GgufType::kUint32: { SX_ASSIGN_OR_RETURN(auto v, read<std::uint32_t>("uint32 value")); return GgufValue::uint32(v); }
      case GgufType::kInt32: { SX_ASSIGN_OR_RETURN(auto v, read<std::int32_t>("int32 value")); return GgufValue::int32(v); }
      case GgufType::kUint64: { SX_ASSIGN_OR_RETURN(auto v, read<std::uint64_t>("uint64 value")); return GgufValue::uint64(v); }
      case GgufType::kInt64: { SX_ASSIGN_OR_RETURN(auto v, read<std::int64_t>("int64 value")); return GgufValue::int64(v); }
      case GgufType::kFloat32: { SX_ASSIGN_OR_RETURN(auto v, read<float>("float32 value")); return GgufValue::float32(v); }
      case GgufType::kFloat64: { SX_ASSIGN_OR_RETURN(auto v, read<double>("float64 value")); return GgufValue::float64(v); }
      case GgufType::kBool: {
        SX_ASSIGN_OR_RETURN(std::uint8_t v, read<std::uint8_t>("bool value"));
        if (v > 1) return data_loss_error("{}: {} has invalid bool value {} at offset {} (must be 0 or 1)", file_, ctx_, v, pos_ - 1);
        return GgufValue::boolean(v != 0);
      }
      case GgufType::kString: {
        SX_ASSIGN_OR_RETURN(std::string s, read_string("string value"));
        return GgufValue::string(std::move(s));
      }
      case GgufType::kArray: {
        SX_ASSIGN_OR_RETURN(GgufArray a, read_array(depth + 1));
        return GgufValue::array(std::move(a));
      }
    }
    return data_loss_error("{}: {} has unknown value type {}", file_, ctx_, static_cast<std::uint32_t>(t));
  }

  Result<GgufArray> read_array(int depth) {
    if (depth > kMaxArrayDepth) {
      return unimplemented_error("{}: {} has arrays nested more than {} levels deep", file_, ctx_, kMaxArrayDepth);
    }
    GgufArray a;
    SX_ASSIGN_OR_RETURN(a.elem_type, read_type("array element type"));
    SX_ASSIGN_OR_RETURN(std::uint64_t count, read<std::uint64_t>("array length"));
    const std::size_t min_size = min_encoded_size(a.elem_type);
    if (count > remaining() / min_size) {
      return data_loss_error("{}: {} has an array of {} {} items at offset {} that cannot fit in the {} bytes that "
                             "remain (file is {} bytes)",
                             file_, ctx_, count, gguf_type_name(a.elem_type), pos_ - 8, remaining(), b_.size());
    }
    const auto n = static_cast<std::size_t>(count);
    if (a.elem_type == GgufType::kString) {
      a.strings.reserve(n);
      for (std::size_t i = 0; i < n; ++i) {
        SX_ASSIGN_OR_RETURN(std::string s, read_string("array item"));
        a.strings.push_back(std::move(s));
      }
    } else if (a.elem_type == GgufType::kArray) {
      a.arrays.reserve(n);
      for (std::size_t i = 0; i < n; ++i) {
        SX_ASSIGN_OR_RETURN(GgufArray inner, read_array(depth + 1));
        a.arrays.push_back(GgufValue::array(std::move(inner)));
      }
    } else {
      const std::size_t bytes = n * min_size;  // bounded by remaining() above
      a.raw.assign(b_.data() + pos_, b_.data() + pos_ + bytes);
      if (a.elem_type == GgufType::kBool) {
        for (std::size_t i = 0; i < n; ++i) {
          if (a.raw[i] > 1) {
            return data_loss_error("{}: {} has invalid bool value {} in array item {} at offset {} (must be 0 or 1)",
                                   file_, ctx_, a.raw[i], i, pos_ + i);
          }
        }
      }
      pos_ += bytes;
    }
    return a;
  }

  Status parse_metadata() {
    out_.metadata_.reserve(static_cast<std::size_t>(kv_count_));
    for (std::uint64_t i = 0; i < kv_count_; ++i) {
      ctx_ = fmt::format("metadata pair #{}", i);
      SX_ASSIGN_OR_RETURN(std::string key, read_string("key"));
      ctx_ = fmt::format("metadata key '{}'", key);
      if (out_.metadata_index_.count(key) != 0) {
        return data_loss_error("{}: duplicate metadata key '{}' (pair #{})", file_, key, i);
      }
      SX_ASSIGN_OR_RETURN(GgufType type, read_type("value type"));
      SX_ASSIGN_OR_RETURN(GgufValue value, read_value(type, 0));
      out_.metadata_index_.emplace(key, out_.metadata_.size());
      out_.metadata_.emplace_back(std::move(key), std::move(value));
    }
    return ok_status();
  }

  Status check_well_known_keys() {
    for (const WellKnownKey& k : kWellKnownKeys) {
      const GgufValue* v = out_.find(k.key);
      if (v == nullptr) continue;
      bool fits = v->type == k.type;
      if (k.any_integer) fits = gguf_type_is_integer(v->type);
      if (fits && k.elem_type) fits = v->if_array()->elem_type == *k.elem_type;
      if (!fits) {
        return invalid_argument_error("{}: metadata key '{}' has type {} but the GGUF spec requires {}", file_, k.key,
                                      actual_type_description(*v), type_description(k.type, k.elem_type));
      }
    }
    if (const GgufValue* a = out_.find(kKeyAlignment)) {
      const std::uint64_t align = *a->to_uint();
      if (align == 0 || !std::has_single_bit(align)) {
        return invalid_argument_error("{}: metadata key 'general.alignment' is {}; it must be a power of two", file_,
                                      align);
      }
      out_.alignment_ = align;
    }
    return ok_status();
  }

  Status parse_tensor_infos() {
    out_.tensors_.reserve(static_cast<std::size_t>(tensor_count_));
    for (std::uint64_t i = 0; i < tensor_count_; ++i) {
      ctx_ = fmt::format("tensor info #{}", i);
      TensorInfo t;
      SX_ASSIGN_OR_RETURN(t.name, read_string("tensor name"));
      ctx_ = fmt::format("tensor '{}'", t.name);
      if (t.name.size() > kGgufMaxTensorName) {
        return invalid_argument_error("{}: tensor name '{}' (tensor info #{}) is {} bytes; GGUF allows at most {}",
                                      file_, t.name, i, t.name.size(), kGgufMaxTensorName);
      }
      if (out_.tensor_index_.count(t.name) != 0) {
        return data_loss_error("{}: duplicate tensor name '{}' (tensor info #{})", file_, t.name, i);
      }
      SX_ASSIGN_OR_RETURN(std::uint32_t n_dims, read<std::uint32_t>("n_dims"));
      if (n_dims == 0 || n_dims > kGgufMaxDims) {
        return data_loss_error("{}: tensor '{}' has n_dims {}; it must be 1..{}", file_, t.name, n_dims, kGgufMaxDims);
      }
      std::uint64_t n_elements = 1;
      for (std::uint32_t d = 0; d < n_dims; ++d) {
        SX_ASSIGN_OR_RETURN(std::uint64_t ne, read<std::uint64_t>("dimension"));
        if (ne == 0) {
          return data_loss_error("{}: tensor '{}' has dimension {} equal to 0", file_, t.name, d);
        }
        if (ne > static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max()) ||
            __builtin_mul_overflow(n_elements, ne, &n_elements) ||
            n_elements > static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max())) {
          return data_loss_error("{}: tensor '{}' has dimensions whose element count overflows (dimension {} is {})",
                                 file_, t.name, d, ne);
        }
        t.dims.push_back(static_cast<std::int64_t>(ne));
      }
      t.n_elements = static_cast<std::int64_t>(n_elements);
      SX_ASSIGN_OR_RETURN(t.ggml_type, read<std::uint32_t>("ggml type"));
      const GgmlTypeInfo* info = ggml_type_info(t.ggml_type);
      if (info == nullptr) {
        return unimplemented_error("{}: tensor '{}' has unknown ggml type id {} (removed from ggml or newer than "
                                   "this reader)",
                                   file_, t.name, t.ggml_type);
      }
      t.type_name = std::string(info->name);
      t.dtype = info->dtype;
      if (t.dims[0] % info->block_elems != 0) {
        return data_loss_error("{}: tensor '{}' has ne[0] = {}, not a multiple of the {} block size {}", file_,
                               t.name, t.dims[0], info->name, info->block_elems);
      }
      const std::uint64_t blocks = n_elements / info->block_elems;
      if (__builtin_mul_overflow(blocks, std::uint64_t{info->block_bytes}, &t.n_bytes)) {
        return data_loss_error("{}: tensor '{}' byte size overflows ({} elements of {})", file_, t.name, n_elements,
                               info->name);
      }
      SX_ASSIGN_OR_RETURN(t.offset, read<std::uint64_t>("data offset"));
      if (t.offset % out_.alignment_ != 0) {
        return data_loss_error("{}: tensor '{}' has offset {}, not a multiple of the alignment {}", file_, t.name,
                               t.offset, out_.alignment_);
      }
      t.file = file_;
      out_.tensor_index_.emplace(t.name, out_.tensors_.size());
      out_.tensors_.push_back(std::move(t));
    }
    return ok_status();
  }

  Status check_layout() {
    // The data section starts at the first multiple of the alignment after the tensor infos.
    const std::uint64_t align = out_.alignment_;
    const std::uint64_t pos = pos_;
    const std::uint64_t data_offset = (pos + align - 1) / align * align;  // pos <= file size, no overflow
    out_.data_offset_ = data_offset;
    if (out_.tensors_.empty()) return ok_status();
    const std::uint64_t size = b_.size();
    if (data_offset > size) {
      const TensorInfo& t = out_.tensors_.front();
      return data_loss_error("{}: truncated file: the data section (first tensor '{}') starts at offset {} but the "
                             "file is only {} bytes",
                             file_, t.name, data_offset, size);
    }
    const std::uint64_t data_size = size - data_offset;
    for (TensorInfo& t : out_.tensors_) {
      if (t.offset > data_size || t.n_bytes > data_size - t.offset) {
        std::uint64_t end;
        if (__builtin_add_overflow(t.offset, t.n_bytes, &end)) {
          return data_loss_error("{}: tensor '{}' has offset {} + size {} that overflows", file_, t.name, t.offset,
                                 t.n_bytes);
        }
        return data_loss_error("{}: tensor '{}' data [{}, {}) lies outside the file: the data section has {} bytes "
                               "(from offset {}; file is {} bytes; truncated file?)",
                               file_, t.name, t.offset, end, data_size, data_offset, size);
      }
      t.data = b_.subspan(static_cast<std::size_t>(data_offset + t.offset), static_cast<std::size_t>(t.n_bytes));
    }
    std::vector<std::size_t> order(out_.tensors_.size());
    std::iota(order.begin(), order.end(), std::size_t{0});
    std::sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) {
      return out_.tensors_[a].offset < out_.tensors_[b].offset;
    });
    for (std::size_t k = 1; k < order.size(); ++k) {
      const TensorInfo& prev = out_.tensors_[order[k - 1]];
      const TensorInfo& cur = out_.tensors_[order[k]];
      if (prev.offset + prev.n_bytes > cur.offset) {
        return data_loss_error("{}: tensor '{}' data [{}, {}) overlaps tensor '{}' data [{}, {})", file_, cur.name,
                               cur.offset, cur.offset + cur.n_bytes, prev.name, prev.offset,
                               prev.offset + prev.n_bytes);
      }
    }
    return ok_status();
  }

  std::span<const std::uint8_t> b_;
  GgufFile& out_;
  const std::string& file_;
  std::size_t pos_ = 0;
  std::string ctx_;
  std::uint64_t tensor_count_ = 0;
  std::uint64_t kv_count_ = 0;
};

Result<std::unique_ptr<GgufFile>> GgufFile::parse(std::span<const std::uint8_t> bytes, std::string display_name) {
  std::unique_ptr<GgufFile> f(new GgufFile());
  f->path_ = std::move(display_name);
  f->bytes_ = bytes;
  GgufParser parser(bytes, *f);
  SX_RETURN_IF_ERROR(parser.run());
  return f;
}

Result<std::unique_ptr<GgufFile>> GgufFile::open(const std::string& path) {
  SX_ASSIGN_OR_RETURN(std::unique_ptr<MappedFile> mapping, MappedFile::open(path));
  const std::span<const std::uint8_t> bytes = mapping->bytes();
  SX_ASSIGN_OR_RETURN(std::unique_ptr<GgufFile> f, parse(bytes, path));
  f->mapping_ = std::move(mapping);
  return f;
}

}  // namespace sx::model
