// safetensors reader: validates a whole .safetensors file (or a sharded Hugging Face model
// directory) up front and exposes its metadata and tensors (https://huggingface.co/docs/safetensors).
//
// Layout: u64 little-endian header length N, N bytes of UTF-8 JSON, then the data section:
//   {"__metadata__": {str: str},                                   (optional)
//    "<tensor>": {"dtype": "F32", "shape": [d0, d1, ...], "data_offsets": [begin, end]}, ...}
// shape is row-major (shape[0] outermost, as torch writes it; the reverse of GGUF's ne order);
// offsets are relative to the first byte after the header, end exclusive.
//
// Validation happens entirely in open()/parse(): after they succeed every SafetensorsTensor::data
// span lies inside the file, holds exactly numel * dtype size bytes, and no two tensors overlap.
// Holes between tensors and trailing bytes after the last one are tolerated (not checked).
// A key named twice in one JSON object (header or index) is an error, not "the last one wins".
//
// A model directory (open_safetensors_dir) holds either model.safetensors or
// model.safetensors.index.json ({"metadata": {...}, "weight_map": {tensor: shard file}}); with an
// index every shard it names is opened and checked against it. The index wins when both exist.
//
// Error codes (messages always name the file, and the tensor / shard at fault):
//   INVALID_ARGUMENT  the wrong kind of input: a GGUF file ("... is a GGUF file, not safetensors"),
//                     a directory where a file is expected and vice versa; an index that is not
//                     JSON (or nested more than 128 levels deep), names a key twice, not an object,
//                     lacks weight_map or has values of the wrong type, or a shard name that is not
//                     a plain file name
//   NOT_FOUND         the path does not exist; a directory with neither model.safetensors nor an
//                     index; a shard the index names is missing (names the shard and a tensor)
//   UNIMPLEMENTED     a dtype string that is not a safetensors dtype (lists the known ones)
//   DATA_LOSS         everything structural in a file: shorter than 8 bytes, absurd header length
//                     (more than the bytes that follow, or over kSafetensorsMaxHeader), header not
//                     valid JSON / nested more than 128 levels / not an object / naming a tensor
//                     twice, a tensor entry
//                     with missing or wrongly typed fields, a negative dim, numel or byte-size overflow, begin > end,
//                     end - begin != numel * dtype size, data beyond the file ("... is truncated:
//                     its header needs X bytes of data, the file has Y"), overlapping tensors;
//                     across shards: a tensor in two shards, the index mapping a tensor to a
//                     shard that does not contain it.
//   Not errors: a shard tensor the index does not mention -> SafetensorsModel::warnings().
//
// Lifetime: open() owns the mapping (moving a SafetensorsFile keeps its spans valid); parse()
// borrows `bytes`, which must outlive the file. Threading: immutable after construction; safe to
// read from any number of threads.
#pragma once

#include <cstddef>
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

namespace sx::model {

inline constexpr std::uint64_t kSafetensorsMaxHeader = 100ull * 1000 * 1000;  // 100 MB, as the Rust reader
inline constexpr std::string_view kSafetensorsSingleFile = "model.safetensors";
inline constexpr std::string_view kSafetensorsIndexFile = "model.safetensors.index.json";

// Bytes per element of a safetensors dtype string ("F32" -> 4); nullopt for an unknown string.
std::optional<std::size_t> safetensors_dtype_size(std::string_view dtype);
// The HAL dtype a safetensors dtype maps to (F32, F16, BF16, I32); nullopt for the others.
std::optional<hal::DType> safetensors_to_hal_dtype(std::string_view dtype);
// The safetensors dtype string of a HAL dtype ("F32", "F16", "BF16", "I32"); nullopt otherwise.
std::optional<std::string_view> hal_to_safetensors_dtype(hal::DType dtype);

struct SafetensorsTensor {
  std::string name;
  std::string dtype_name;            // as in the file: "F32", "BF16", "I64", ...
  std::optional<hal::DType> dtype;   // F32, F16, BF16, I32; nullopt for the other dtypes
  std::size_t elem_bytes = 0;
  std::vector<std::int64_t> shape;   // row-major; empty for a scalar
  std::int64_t n_elements = 0;
  std::uint64_t begin = 0;           // data_offsets, relative to the data section
  std::uint64_t end = 0;
  std::span<const std::uint8_t> data;  // end - begin bytes inside the file
  std::string file;                    // display name of the file it came from (for messages)

  std::uint64_t n_bytes() const { return end - begin; }
  // "[151936, 896]"
  std::string shape_string() const;
};

class SafetensorsFile {
 public:
  static Result<SafetensorsFile> open(const std::string& path);
  static Result<SafetensorsFile> parse(std::span<const std::uint8_t> bytes, std::string display_name);

  SafetensorsFile(SafetensorsFile&&) = default;
  SafetensorsFile& operator=(SafetensorsFile&&) = default;
  SafetensorsFile(const SafetensorsFile&) = delete;
  SafetensorsFile& operator=(const SafetensorsFile&) = delete;

  const std::string& path() const { return path_; }
  std::uint64_t header_size() const { return header_size_; }   // N
  std::uint64_t data_offset() const { return 8 + header_size_; }
  std::uint64_t file_size() const { return bytes_.size(); }

  // "__metadata__" (absent: empty).
  const std::map<std::string, std::string, std::less<>>& metadata() const { return metadata_; }

  // In data order (ascending begin).
  const std::vector<SafetensorsTensor>& tensors() const { return tensors_; }
  const SafetensorsTensor* find(std::string_view name) const;
  // NOT_FOUND naming the file and the tensor.
  Result<const SafetensorsTensor*> tensor(std::string_view name) const;

 private:
  SafetensorsFile() = default;
  static Status check_kind(const std::string& path);

  std::unique_ptr<MappedFile> mapping_;  // set by open()
  std::span<const std::uint8_t> bytes_;
  std::string path_;
  std::uint64_t header_size_ = 0;
  std::map<std::string, std::string, std::less<>> metadata_;
  std::vector<SafetensorsTensor> tensors_;
  std::map<std::string, std::size_t, std::less<>> index_;
};

// A Hugging Face model directory's weights: one file, or the shards of an index.
class SafetensorsModel {
 public:
  const std::string& dir() const { return dir_; }
  // Path of model.safetensors.index.json; empty for a single-file model.
  const std::string& index_path() const { return index_path_; }
  // The index's "metadata" (non-string values as their JSON text, e.g. total_size "1234");
  // empty for a single-file model.
  const std::map<std::string, std::string, std::less<>>& metadata() const { return metadata_; }
  // Shards sorted by file name.
  const std::vector<SafetensorsFile>& shards() const { return shards_; }
  // Every tensor of every shard, sorted by name.
  std::vector<const SafetensorsTensor*> tensors() const;
  std::size_t tensor_count() const { return where_.size(); }
  const SafetensorsTensor* find(std::string_view name) const;
  // NOT_FOUND naming the directory and the tensor.
  Result<const SafetensorsTensor*> tensor(std::string_view name) const;
  // Non-fatal findings, e.g. a shard tensor the index does not mention.
  const std::vector<std::string>& warnings() const { return warnings_; }

 private:
  friend Result<SafetensorsModel> open_safetensors_dir(const std::string& dir);
  std::string dir_;
  std::string index_path_;
  std::map<std::string, std::string, std::less<>> metadata_;
  std::vector<SafetensorsFile> shards_;
  std::map<std::string, std::pair<std::size_t, std::size_t>, std::less<>> where_;  // shard, tensor
  std::vector<std::string> warnings_;
};

// Opens `dir`/model.safetensors.index.json and every shard it names, or `dir`/model.safetensors.
Result<SafetensorsModel> open_safetensors_dir(const std::string& dir);

// The contents of a model.safetensors.index.json.
struct SafetensorsIndex {
  // "metadata" (non-string values as their JSON text); empty when absent or null.
  std::map<std::string, std::string, std::less<>> metadata;
  // "weight_map": tensor -> shard file name (never empty, ".", "..", nor containing '/' or '\\').
  std::map<std::string, std::string, std::less<>> weight_map;
};

// Parses the text of an index (what open_safetensors_dir reads); `display_name` names it in
// messages. INVALID_ARGUMENT as listed above for an index. An empty weight_map is not an error
// here (open_safetensors_dir rejects it). Pure; used by the fuzz tests.
Result<SafetensorsIndex> parse_safetensors_index(std::string_view text, std::string_view display_name);

}  // namespace sx::model
