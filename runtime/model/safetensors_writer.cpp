// SafetensorsWriter: builds the JSON header with nlohmann::ordered_json (insertion order kept).
#include "runtime/model/safetensors_writer.h"

#include <cerrno>
#include <cstdio>
#include <cstring>

#include <nlohmann/json.hpp>

#include "runtime/model/safetensors.h"

namespace sx::model {

Status SafetensorsWriter::add_tensor(std::string name, std::string dtype, std::vector<std::int64_t> shape,
                                     std::span<const std::uint8_t> data) {
  if (name == "__metadata__") return make_status(StatusCode::kAlreadyExists, "tensor name '__metadata__' is reserved");
  for (const Entry& e : tensors_) {
    if (e.name == name) return make_status(StatusCode::kAlreadyExists, "tensor '{}' added twice", name);
  }
  const auto size = safetensors_dtype_size(dtype);
  if (!size) return invalid_argument_error("tensor '{}': unknown safetensors dtype '{}'", name, dtype);
  std::uint64_t numel = 1;
  for (std::int64_t d : shape) {
    if (d < 0) return invalid_argument_error("tensor '{}': negative dim {}", name, d);
    numel *= static_cast<std::uint64_t>(d);
  }
  if (numel * *size != data.size()) {
    return invalid_argument_error("tensor '{}': {} elements of {} need {} bytes, got {}", name, numel, dtype,
                                  numel * *size, data.size());
  }
  tensors_.push_back(Entry{std::move(name), std::move(dtype), std::move(shape), {data.begin(), data.end()}});
  return ok_status();
}

Status SafetensorsWriter::add_tensor(std::string name, hal::DType dtype, std::vector<std::int64_t> shape,
                                     std::span<const std::uint8_t> data) {
  const auto st = hal_to_safetensors_dtype(dtype);
  if (!st) {
    return invalid_argument_error("tensor '{}': {} has no safetensors dtype", name, hal::dtype_name(dtype));
  }
  return add_tensor(std::move(name), std::string(*st), std::move(shape), data);
}

std::vector<std::uint8_t> SafetensorsWriter::to_bytes() const {
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  if (!metadata_.empty()) {
    nlohmann::ordered_json m = nlohmann::ordered_json::object();
    for (const auto& [k, v] : metadata_) m[k] = v;
    header["__metadata__"] = std::move(m);
  }
  std::uint64_t offset = 0;
  for (const Entry& e : tensors_) {
    header[e.name] = {{"dtype", e.dtype}, {"shape", e.shape}, {"data_offsets", {offset, offset + e.data.size()}}};
    offset += e.data.size();
  }
  std::string text = header.dump();
  text.resize((text.size() + 7) / 8 * 8, ' ');
  std::vector<std::uint8_t> out;
  out.reserve(8 + text.size() + offset);
  const std::uint64_t n = text.size();
  for (int i = 0; i < 8; ++i) out.push_back(static_cast<std::uint8_t>(n >> (8 * i)));  // little-endian
  out.insert(out.end(), text.begin(), text.end());
  for (const Entry& e : tensors_) out.insert(out.end(), e.data.begin(), e.data.end());
  return out;
}

Status SafetensorsWriter::write(const std::string& path) const {
  const std::vector<std::uint8_t> bytes = to_bytes();
  std::FILE* f = std::fopen(path.c_str(), "wb");
  if (f == nullptr) return invalid_argument_error("{}: cannot create: {}", path, std::strerror(errno));
  const std::size_t wrote = std::fwrite(bytes.data(), 1, bytes.size(), f);
  const bool ok = wrote == bytes.size() && std::fflush(f) == 0;
  const int e = errno;
  if (std::fclose(f) != 0 || !ok) {
    return make_status(StatusCode::kInternal, "{}: write failed after {} of {} bytes: {}", path, wrote, bytes.size(),
                       std::strerror(e));
  }
  return ok_status();
}

}  // namespace sx::model
