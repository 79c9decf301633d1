// GGUF reader: validates a whole GGUF v2/v3 file up front and exposes its metadata and tensors
// (ggml docs/gguf.md; llama.cpp naming conventions).
//
// Layout: magic "GGUF", u32 version, u64 tensor_count, u64 kv_count, kv_count metadata pairs
// (string key, u32 value type, value), tensor_count tensor infos (string name, u32 n_dims,
// n_dims x u64 ne (ne[0] innermost), u32 ggml type, u64 offset), padding to general.alignment
// (default 32), then the data section; tensor offsets are relative to it and multiples of the
// alignment. Strings are u64 length + UTF-8 bytes (no NUL). Little-endian only.
//
// Validation happens entirely in open()/parse(): after they succeed every TensorInfo::data span
// lies inside the file, tensors do not overlap and every metadata value is well-formed. Every
// count and length is bounded by the bytes that remain before anything is reserved, so a hostile
// file cannot make the reader allocate more than a small multiple of its own size.
//
// Error codes (messages always name the file and the key / tensor at fault):
//   INVALID_ARGUMENT  not a GGUF file (bad magic; safetensors is recognised and named), a
//                     well-known key with the wrong type or value (general.alignment not a u32
//                     power of two, ...), a tensor name longer than 64 bytes
//   UNIMPLEMENTED     GGUF version other than 2 or 3 (v1, big-endian files), unknown ggml type id,
//                     arrays nested deeper than kMaxArrayDepth
//   DATA_LOSS         everything structural: truncation anywhere, absurd counts/lengths, unknown
//                     value type, bool not 0/1, duplicate key or tensor name, n_dims 0 or > 4,
//                     a dim of 0, size overflow, ne[0] not a multiple of the block size,
//                     misaligned offset, data outside the file, overlapping tensors
//   get_*():          NOT_FOUND (missing key), INVALID_ARGUMENT (wrong type; names expected and
//                     actual), OUT_OF_RANGE (value does not fit the requested type)
//
// Lifetime: open() owns the mapping; parse() borrows `bytes`, which must outlive the GgufFile
// (TensorInfo::data points into them). Threading: immutable after construction; safe to read from
// any number of threads.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "runtime/base/mapped_file.h"
#include "runtime/base/status.h"
#include "runtime/hal/dtype.h"
#include "runtime/model/gguf_types.h"
#include "runtime/model/tensor_source.h"

namespace sx::model {

inline constexpr std::uint32_t kGgufMagic = 0x46554747;  // "GGUF" read as little-endian u32
inline constexpr std::uint64_t kGgufDefaultAlignment = 32;
inline constexpr std::uint32_t kGgufMaxDims = 4;
inline constexpr std::size_t kGgufMaxTensorName = 64;  // bytes (spec)
inline constexpr int kMaxArrayDepth = 16;               // nesting levels of array values
inline constexpr std::string_view kKeyAlignment = "general.alignment";
inline constexpr std::string_view kKeyArchitecture = "general.architecture";

class GgufFile final : public TensorSource {
 public:
  static Result<std::unique_ptr<GgufFile>> open(const std::string& path);
  static Result<std::unique_ptr<GgufFile>> parse(std::span<const std::uint8_t> bytes, std::string display_name);

  GgufFile(const GgufFile&) = delete;
  GgufFile& operator=(const GgufFile&) = delete;

  std::uint32_t version() const { return version_; }
  const std::string& path() const override { return path_; }
  std::uint64_t alignment() const { return alignment_; }
  std::uint64_t data_offset() const { return data_offset_; }
  std::uint64_t file_size() const { return bytes_.size(); }
  std::span<const std::uint8_t> bytes() const { return bytes_; }

  const std::vector<std::pair<std::string, GgufValue>>& metadata() const { return metadata_; }
  const GgufValue* find(std::string_view key) const;

  Result<std::uint64_t> get_uint(std::string_view key) const;  // any integer type, range-checked
  Result<std::int64_t> get_int(std::string_view key) const;    // any integer type, range-checked
  Result<double> get_float(std::string_view key) const;        // float32/64 and integers
  Result<bool> get_bool(std::string_view key) const;
  Result<std::string> get_string(std::string_view key) const;
  Result<std::vector<std::string>> get_string_array(std::string_view key) const;
  Result<std::vector<std::int64_t>> get_int_array(std::string_view key) const;   // any integer elements
  Result<std::vector<double>> get_float_array(std::string_view key) const;
  Result<std::vector<bool>> get_bool_array(std::string_view key) const;       // float/integer elements
  // Number of items of an array-valued key.
  Result<std::uint64_t> get_array_size(std::string_view key) const;

  const std::vector<TensorInfo>& tensors() const override { return tensors_; }
  const TensorInfo* find_tensor(std::string_view name) const override;
  std::string_view format() const override { return "gguf"; }
  std::vector<std::string> weight_files() const override { return {path_}; }

 private:
  friend class GgufParser;
  GgufFile() = default;

  Result<const GgufValue*> lookup(std::string_view key) const;
  Status wrong_type(std::string_view key, const GgufValue& v, std::string_view expected) const;

  std::unique_ptr<MappedFile> mapping_;  // set by open()
  std::span<const std::uint8_t> bytes_;
  std::string path_;
  std::uint32_t version_ = 0;
  std::uint64_t alignment_ = kGgufDefaultAlignment;
  std::uint64_t data_offset_ = 0;
  std::vector<std::pair<std::string, GgufValue>> metadata_;
  std::map<std::string, std::size_t, std::less<>> metadata_index_;
  std::vector<TensorInfo> tensors_;
  std::map<std::string, std::size_t, std::less<>> tensor_index_;
};

// OK when the loader can use the tensor's format (F32, F16, BF16 and the GGML block formats Q4_0,
// Q4_1, Q5_0, Q5_1, Q8_0, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K); otherwise UNIMPLEMENTED naming the file, the
// tensor and the type ("iq4_nl ... is not supported yet; supported: f32, ...").
Status require_supported(const TensorInfo& t);

}  // namespace sx::model
