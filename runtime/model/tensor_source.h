// TensorSource: the weights of a model as the loader sees them, whatever the file format. A GGUF
// file is one; a Hugging Face safetensors directory (HfModel) is another, its tensors renamed to
// the GGUF convention (tensor_names.h) and their dims given in GGUF ne order, so the planner, the
// checks and the loader have one code path.
//
// Messages about a tensor should use tensor_label() and shape_label(), which speak the format's
// own language: "'blk.0.attn_q.weight'" and ne-order dims for GGUF, "'model.layers.0.self_attn.
// q_proj.weight' in model-00001-of-00004.safetensors" and row-major shapes for safetensors.
//
// Lifetime: TensorInfo::data points into memory the source owns (a mapping or converted
// buffers). Threading: immutable after construction; safe to read from any number of threads.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "runtime/hal/dtype.h"

namespace sx::model {

struct TensorInfo {
  std::string name;
  std::vector<std::int64_t> dims;  // ne order: dims[0] is the innermost (contiguous) dimension
  std::uint32_t ggml_type = 0;
  std::string type_name;              // "f32", "q4_k", ... (safetensors: its dtype string, "BF16")
  std::optional<hal::DType> dtype;    // the HAL format, when it has one (require_supported says
                                      // which can be loaded)
  std::uint64_t offset = 0;           // relative to the data section
  std::uint64_t n_bytes = 0;
  std::int64_t n_elements = 0;
  std::span<const std::uint8_t> data;  // n_bytes
  std::string file;                    // display name of the file it came from (for messages)

  // "[896, 151936]"
  std::string dims_string() const;
};

// "[896, 151936]"
std::string dims_to_string(std::span<const std::int64_t> dims);

class TensorSource {
 public:
  virtual ~TensorSource() = default;

  // The file or directory (for messages).
  virtual const std::string& path() const = 0;
  // "gguf" or "safetensors".
  virtual std::string_view format() const = 0;
  virtual const std::vector<TensorInfo>& tensors() const = 0;
  // By GGUF name; nullptr when absent.
  virtual const TensorInfo* find_tensor(std::string_view name) const = 0;
  // The files that hold the weights (the GGUF file; the shards).
  virtual std::vector<std::string> weight_files() const = 0;

  // How a user of this format names the tensor, quoted, with where it lives when that helps.
  virtual std::string tensor_label(std::string_view name) const;
  // Why `name` is absent, beyond "is missing" (e.g. which shards were searched); may be empty.
  virtual std::string missing_detail(std::string_view name) const;
  // Dims (ne order) as this format prints shapes.
  virtual std::string shape_label(std::span<const std::int64_t> dims) const;
};

}  // namespace sx::model
