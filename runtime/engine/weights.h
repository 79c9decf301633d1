// A rank's weights on its device, and the loader that puts them there: whole tensors, row or
// column slices of them (tensor parallelism), stacked experts, and the small vectors the ops read
// as F32. Every architecture's blocks (runtime/engine/blocks/) load their tensors through it.
//
// Threading: one thread (the rank's loader). Errors: a tensor missing, of a format the loader
// does not read, or sliced off its blocks comes back as Status naming the file and the tensor.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string_view>
#include <utility>
#include <vector>

#include "runtime/base/status.h"
#include "runtime/hal/device.h"
#include "runtime/model/gguf.h"

namespace sx::engine {

// A weight on the device, in its format (empty when an optional tensor is absent).
struct DeviceTensor {
  std::unique_ptr<hal::Buffer> buffer;
  hal::DType type = hal::DType::kF32;
  hal::BufView view() const { return {buffer.get(), 0}; }
  explicit operator bool() const { return buffer != nullptr; }
};

// [first, first + count) ranges of rows or columns.
using Ranges = std::vector<std::pair<std::int64_t, std::int64_t>>;

// Uploads rows [row0, row0 + rows) x columns [col0, col0 + cols) of a 2-D tensor (ne[0] = columns)
// or elements [row0, row0 + rows) of a 1-D one. Whole rows are one contiguous upload; a column
// slice is gathered on the host first (and synced before the gather buffer goes away). A matrix
// asked for `as` another format (the plan's re-quantised o / down: ShardPlan::types) is
// dequantised block by block over the slice's columns and quantised to it on the host.
class Uploader {
 public:
  Uploader(const model::TensorSource& file, hal::Device& device, hal::Stream& stream)
      : file_(file), device_(device), stream_(stream) {}

  // Bytes uploaded so far.
  std::uint64_t bytes() const { return bytes_; }
  const model::TensorSource& file() const { return file_; }

  // A 2-D tensor of the file in a format the loader reads.
  Result<const model::TensorInfo*> matrix(std::string_view name) const;
  // The rows of a matrix given as ranges, one after another, as one weight (every format: rows
  // are whole).
  Result<DeviceTensor> rows_of(std::string_view name, const Ranges& ranges);
  // The columns of a matrix given as ranges, side by side in each row, as one weight: each range
  // whole blocks of the format.
  Result<DeviceTensor> cols_of(std::string_view name, const Ranges& ranges);
  // A small tensor the ops read as plain F32 (a conv's taps, decay rates, norms): converted from
  // F16 / BF16 on the host; `rows`, when given, the ranges of its rows (elements of a vector) to
  // take, one after another; `as_row` uploads a vector as a one-row matrix (for matmul).
  Result<DeviceTensor> f32(std::string_view name, bool as_row = false, const Ranges& rows = {});
  // A tensor or a slice of it (see the class comment); an absent tensor that is not `required` is
  // an empty DeviceTensor.
  Result<DeviceTensor> tensor(std::string_view name, bool required, std::int64_t row0 = 0, std::int64_t rows = -1,
                              std::int64_t col0 = 0, std::int64_t cols = -1,
                              std::optional<hal::DType> as = std::nullopt);

 private:
  Result<DeviceTensor> requantized(const model::TensorInfo& info, std::string_view name, hal::DType as,
                                   std::int64_t row0, std::int64_t rows, std::int64_t col0, std::int64_t cols,
                                   std::int64_t width);

  const model::TensorSource& file_;
  hal::Device& device_;
  hal::Stream& stream_;
  std::uint64_t bytes_ = 0;
};

}  // namespace sx::engine
