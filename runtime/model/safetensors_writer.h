// safetensors writer: tensors laid out back to back in the order they are added, header padded
// with spaces to a multiple of 8 bytes (as the reference Rust writer does), optional __metadata__.
// Serves tests now and `sextant make-model --format safetensors` later.
//
// Lifetime: add_tensor copies the bytes. Threading: not thread-safe; one writer per thread.
// Errors: add_tensor reports INVALID_ARGUMENT (unknown dtype string, negative dim, byte count not
// numel * dtype size) and ALREADY_EXISTS (duplicate name, or the reserved name "__metadata__"),
// naming the tensor; write() reports I/O errors naming the path.
#pragma once

#include <cstdint>
#include <map>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "runtime/base/status.h"
#include "runtime/hal/dtype.h"

namespace sx::model {

class SafetensorsWriter {
 public:
  void set_metadata(std::string key, std::string value) { metadata_[std::move(key)] = std::move(value); }

  // `dtype` is a safetensors dtype string ("F32", "BF16", "I64", ...); shape is row-major.
  Status add_tensor(std::string name, std::string dtype, std::vector<std::int64_t> shape,
                    std::span<const std::uint8_t> data);
  // HAL dtypes with a safetensors name (F32, F16, BF16, I32).
  Status add_tensor(std::string name, hal::DType dtype, std::vector<std::int64_t> shape,
                    std::span<const std::uint8_t> data);

  std::vector<std::uint8_t> to_bytes() const;
  Status write(const std::string& path) const;

 private:
  struct Entry {
    std::string name;
    std::string dtype;
    std::vector<std::int64_t> shape;
    std::vector<std::uint8_t> data;
  };
  std::map<std::string, std::string> metadata_;
  std::vector<Entry> tensors_;
};

}  // namespace sx::model
