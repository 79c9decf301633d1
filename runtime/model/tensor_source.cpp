// TensorSource defaults (the GGUF way of naming tensors and shapes) and dims formatting.
#include "runtime/model/tensor_source.h"

#include <fmt/format.h>

namespace sx::model {

std::string TensorInfo::dims_string() const { return dims_to_string(dims); }

std::string dims_to_string(std::span<const std::int64_t> dims) {
  std::string s = "[";
  for (std::size_t i = 0; i < dims.size(); ++i) {
    if (i > 0) s += ", ";
    s += fmt::format("{}", dims[i]);
  }
  return s + "]";
}

std::string TensorSource::tensor_label(std::string_view name) const { return fmt::format("'{}'", name); }

std::string TensorSource::missing_detail(std::string_view) const { return {}; }

std::string TensorSource::shape_label(std::span<const std::int64_t> dims) const { return dims_to_string(dims); }

}  // namespace sx::model
