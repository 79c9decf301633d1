// Device kind names; hal::Device's default weight upload: the file's bytes as they are.
#include "runtime/hal/device.h"

namespace sx::hal {

std::string_view device_kind_name(DeviceKind kind) {
  switch (kind) {
    case DeviceKind::kCpu: return "cpu";
    case DeviceKind::kIntegratedGpu: return "integrated gpu";
    case DeviceKind::kDiscreteGpu: return "discrete gpu";
    case DeviceKind::kVirtualGpu: return "virtual gpu";
    case DeviceKind::kOther: break;
  }
  return "other";
}

std::string_view buffer_usage_name(BufferUsage usage) {
  switch (usage) {
    case BufferUsage::kDevice: return "device";
    case BufferUsage::kUpload: return "upload";
    case BufferUsage::kReadback: break;
  }
  return "readback";
}

Status check_weight_bytes(const WeightDesc& w, std::span<const std::byte> bytes) {
  const std::size_t need = tensor_bytes(w.format, w.rows, w.cols);
  if (bytes.size() != need) {
    return invalid_argument_error("upload_weight: {} x {} {} takes {} bytes, {} given", w.rows, w.cols,
                                  dtype_name(w.format), need, bytes.size());
  }
  return ok_status();
}

Result<std::unique_ptr<Buffer>> Device::upload_weight(Stream& stream, const WeightDesc& w,
                                                      std::span<const std::byte> bytes) {
  SX_RETURN_IF_ERROR(check_weight_bytes(w, bytes));
  SX_ASSIGN_OR_RETURN(std::unique_ptr<Buffer> b, alloc(weight_bytes(w)));
  SX_RETURN_IF_ERROR(stream.upload(*b, 0, bytes));
  return b;
}

}  // namespace sx::hal
