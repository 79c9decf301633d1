// Uploader (weights.h).
#include "runtime/engine/weights.h"

#include <algorithm>
#include <cstring>
#include <string>

namespace sx::engine {

Result<const model::TensorInfo*> Uploader::matrix(std::string_view name) const {
  const model::TensorInfo* info = file_.find_tensor(name);
  if (info == nullptr) return not_found_error("{}: tensor '{}' is missing", file_.path(), name);
  SX_RETURN_IF_ERROR(model::require_supported(*info));
  if (info->dims.size() != 2) return internal_error("{}: '{}' is not a matrix", file_.path(), name);
  return info;
}

Result<DeviceTensor> Uploader::rows_of(std::string_view name, const Ranges& ranges) {
  SX_ASSIGN_OR_RETURN(const model::TensorInfo* info, matrix(name));
  DeviceTensor t;
  t.type = *info->dtype;
  const std::int64_t width = info->dims[0], height = info->dims[1];
  const std::size_t row = hal::row_bytes(t.type, width);
  std::vector<std::byte> gathered;
  std::int64_t total = 0;
  const std::byte* base = reinterpret_cast<const std::byte*>(info->data.data());
  for (const auto& [row0, rows] : ranges) {
    if (row0 < 0 || rows < 0 || row0 + rows > height) {
      return internal_error("{}: rows [{}, {}) are outside '{}' ({} rows)", file_.path(), row0, row0 + rows, name,
                            height);
    }
    gathered.insert(gathered.end(), base + row * static_cast<std::size_t>(row0),
                    base + row * static_cast<std::size_t>(row0 + rows));
    total += rows;
  }
  SX_ASSIGN_OR_RETURN(t.buffer, device_.upload_weight(stream_, hal::WeightDesc{t.type, total, width},
                                                      {gathered.data(), gathered.size()}));
  SX_RETURN_IF_ERROR(stream_.sync());  // the upload reads `gathered`
  bytes_ += t.buffer->size();
  return t;
}

Result<DeviceTensor> Uploader::cols_of(std::string_view name, const Ranges& ranges) {
  SX_ASSIGN_OR_RETURN(const model::TensorInfo* info, matrix(name));
  DeviceTensor t;
  t.type = *info->dtype;
  const std::int64_t width = info->dims[0], height = info->dims[1], block = hal::dtype_info(t.type).block_elems;
  std::int64_t total = 0;
  for (const auto& [col0, cols] : ranges) {
    if (col0 < 0 || cols < 0 || col0 + cols > width || col0 % block != 0 || cols % block != 0) {
      return invalid_argument_error("{}: columns [{}, {}) of '{}' ({} wide) do not fall on {} block boundaries",
                                    file_.path(), col0, col0 + cols, name, width, hal::dtype_name(t.type));
    }
    total += cols;
  }
  const std::size_t full_row = hal::row_bytes(t.type, width);
  const std::byte* base = reinterpret_cast<const std::byte*>(info->data.data());
  std::vector<std::byte> gathered;
  gathered.reserve(hal::tensor_bytes(t.type, height, total));
  for (std::int64_t r = 0; r < height; ++r) {
    const std::byte* row = base + full_row * static_cast<std::size_t>(r);
    for (const auto& [col0, cols] : ranges) {
      const std::byte* from = row + hal::row_bytes(t.type, col0);
      gathered.insert(gathered.end(), from, from + hal::row_bytes(t.type, cols));
    }
  }
  SX_ASSIGN_OR_RETURN(t.buffer, device_.upload_weight(stream_, hal::WeightDesc{t.type, height, total},
                                                      {gathered.data(), gathered.size()}));
  SX_RETURN_IF_ERROR(stream_.sync());  // the upload reads `gathered`
  bytes_ += t.buffer->size();
  return t;
}

Result<DeviceTensor> Uploader::f32(std::string_view name, bool as_row, const Ranges& rows) {
  const model::TensorInfo* info = file_.find_tensor(name);
  if (info == nullptr) return not_found_error("{}: tensor '{}' is missing", file_.path(), name);
  SX_RETURN_IF_ERROR(model::require_supported(*info));
  const hal::DType from = *info->dtype;
  if (from != hal::DType::kF32 && from != hal::DType::kF16 && from != hal::DType::kBF16) {
    return invalid_argument_error("{}: '{}' is {}; it must be f32, f16 or bf16", file_.path(), name,
                                  hal::dtype_name(from));
  }
  const std::int64_t all = info->n_elements, width = info->dims.size() >= 2 ? info->dims[0] : 1;
  std::vector<float> whole(static_cast<std::size_t>(all));
  const std::byte* base = reinterpret_cast<const std::byte*>(info->data.data());
  const std::int64_t row_len = info->dims[0];
  for (std::int64_t r = 0; r < all / row_len; ++r) {
    hal::dequantize_row(from, base + hal::row_bytes(from, row_len) * static_cast<std::size_t>(r),
                        whole.data() + r * row_len, row_len);
  }
  std::vector<float> values;
  if (rows.empty()) {
    values = std::move(whole);
  } else {
    for (const auto& [row0, n_rows] : rows) {
      if (row0 < 0 || n_rows < 0 || (row0 + n_rows) * width > all) {
        return internal_error("{}: rows [{}, {}) are outside '{}'", file_.path(), row0, row0 + n_rows, name);
      }
      values.insert(values.end(), whole.begin() + row0 * width, whole.begin() + (row0 + n_rows) * width);
    }
  }
  const auto n = static_cast<std::int64_t>(values.size());
  const std::span<const std::byte> bytes = std::as_bytes(std::span<const float>(values));
  DeviceTensor t;
  if (as_row) {
    SX_ASSIGN_OR_RETURN(t.buffer, device_.upload_weight(stream_, hal::WeightDesc{hal::DType::kF32, 1, n}, bytes));
  } else {
    SX_ASSIGN_OR_RETURN(t.buffer, device_.alloc(bytes.size()));
    SX_RETURN_IF_ERROR(stream_.upload(*t.buffer, 0, bytes));
  }
  SX_RETURN_IF_ERROR(stream_.sync());  // the upload reads `values`
  bytes_ += t.buffer->size();
  return t;
}

Result<DeviceTensor> Uploader::tensor(std::string_view name, bool required, std::int64_t row0, std::int64_t rows,
                                      std::int64_t col0, std::int64_t cols, std::optional<hal::DType> as) {
  const model::TensorInfo* info = file_.find_tensor(name);
  if (info == nullptr) {
    if (!required) return DeviceTensor{};
    return not_found_error("{}: tensor '{}' is missing", file_.path(), name);
  }
  SX_RETURN_IF_ERROR(model::require_supported(*info));
  DeviceTensor t;
  t.type = *info->dtype;
  // A 3-D tensor (stacked experts) is its experts' matrices one after another: rows of all.
  const std::int64_t width = info->dims.size() >= 2 ? info->dims[0] : 1;
  std::int64_t height = info->dims.size() >= 2 ? info->dims[1] : info->dims[0];
  for (std::size_t d = 2; d < info->dims.size(); ++d) height *= info->dims[d];
  if (rows < 0) rows = height;
  if (cols < 0) cols = width;
  if (row0 < 0 || row0 + rows > height || col0 < 0 || col0 + cols > width) {
    return internal_error("{}: slice rows [{}, {}) x cols [{}, {}) is outside '{}' ({} x {})", file_.path(), row0,
                          row0 + rows, col0, col0 + cols, name, height, width);
  }
  if (as && *as != t.type) return requantized(*info, name, *as, row0, rows, col0, cols, width);
  const int block = hal::dtype_info(t.type).block_elems;
  if (col0 % block != 0 || cols % block != 0) {
    return invalid_argument_error("{}: columns [{}, {}) of '{}' do not fall on {} block boundaries", file_.path(), col0,
                                  col0 + cols, name, hal::dtype_name(t.type));
  }
  const std::size_t full_row = hal::row_bytes(t.type, width);
  const std::size_t slice_row = hal::row_bytes(t.type, cols);
  const std::byte* base = reinterpret_cast<const std::byte*>(info->data.data());
  // The slice's rows, contiguous: in the file itself when whole rows are taken, else gathered.
  std::vector<std::byte> gathered;
  const std::byte* rows_data = base + full_row * static_cast<std::size_t>(row0);
  if (cols != width) {
    gathered.resize(slice_row * static_cast<std::size_t>(rows));
    const std::size_t col_off = hal::row_bytes(t.type, col0);
    for (std::int64_t r = 0; r < rows; ++r) {
      std::memcpy(gathered.data() + slice_row * static_cast<std::size_t>(r),
                  base + full_row * static_cast<std::size_t>(row0 + r) + col_off, slice_row);
    }
    rows_data = gathered.data();
  }
  const std::size_t bytes = hal::tensor_bytes(t.type, rows, cols);
  if (info->dims.size() >= 2) {
    // A matrix: the device keeps it in its own layout (hal::Device::upload_weight); stacked experts
    // are taken one at a time.
    const hal::WeightDesc desc{t.type, rows, cols, info->dims.size() >= 3 ? info->dims[1] : 0};
    SX_ASSIGN_OR_RETURN(t.buffer, device_.upload_weight(stream_, desc, {rows_data, bytes}));
  } else {
    SX_ASSIGN_OR_RETURN(t.buffer, device_.alloc(bytes));
    SX_RETURN_IF_ERROR(stream_.upload(*t.buffer, 0, {rows_data, bytes}));
  }
  // The upload reads host memory of this scope until then (the file's mapping needs no wait).
  if (rows_data != base + full_row * static_cast<std::size_t>(row0)) SX_RETURN_IF_ERROR(stream_.sync());
  bytes_ += t.buffer->size();
  return t;
}

Result<DeviceTensor> Uploader::requantized(const model::TensorInfo& info, std::string_view name, hal::DType as,
                                           std::int64_t row0, std::int64_t rows, std::int64_t col0, std::int64_t cols,
                                           std::int64_t width) {
  const hal::DType from = *info.dtype;
  const std::int64_t in_block = hal::dtype_info(from).block_elems, out_block = hal::dtype_info(as).block_elems;
  if (info.dims.size() < 2 || !hal::can_dequantize(from) || !hal::can_quantize(as) || col0 % out_block != 0 ||
      cols % out_block != 0) {
    return invalid_argument_error("{}: '{}' ({}) cannot be re-quantised to {} over columns [{}, {})", file_.path(),
                                  name, hal::dtype_name(from), hal::dtype_name(as), col0, col0 + cols);
  }
  // The file's blocks that cover the slice, dequantised a row at a time, the slice quantised.
  const std::int64_t b0 = col0 / in_block * in_block;
  const std::int64_t b1 = std::min(width, (col0 + cols + in_block - 1) / in_block * in_block);
  const std::size_t full_row = hal::row_bytes(from, width), out_row = hal::row_bytes(as, cols);
  const std::byte* base = reinterpret_cast<const std::byte*>(info.data.data());
  std::vector<float> wide(static_cast<std::size_t>(b1 - b0));
  std::vector<std::byte> out(out_row * static_cast<std::size_t>(rows));
  for (std::int64_t r = 0; r < rows; ++r) {
    const std::byte* src = base + full_row * static_cast<std::size_t>(row0 + r) + hal::row_bytes(from, b0);
    hal::dequantize_row(from, src, wide.data(), b1 - b0);
    hal::quantize_row(as, wide.data() + (col0 - b0), out.data() + out_row * static_cast<std::size_t>(r), cols);
  }
  DeviceTensor t;
  t.type = as;
  SX_ASSIGN_OR_RETURN(t.buffer,
                      device_.upload_weight(stream_, hal::WeightDesc{as, rows, cols}, {out.data(), out.size()}));
  SX_RETURN_IF_ERROR(stream_.sync());  // the upload reads `out`
  bytes_ += t.buffer->size();
  return t;
}

}  // namespace sx::engine
