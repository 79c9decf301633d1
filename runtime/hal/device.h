// Device, Buffer and Stream: the HAL objects the engine programs against (DESIGN.md §4).
//
// - Buffer: memory of one device, allocated for a usage (BufferUsage). A device-local buffer is
//   never dereferenced by host code: data moves only through Stream upload/update/download/copy/
//   fill. Upload-staging and readback buffers are host-visible (host()): the host writes the
//   first and reads the second, and streams move their bytes to and from device-local buffers
//   with copy(). Ops read and write device-local buffers only.
// - Stream: ordered asynchronous work. Calls enqueue and return; the first error latches and is
//   returned by sync() (and by every later call). Host spans passed to upload must stay valid and
//   unchanged, and download destinations must not be read, until sync() returns; update() copies
//   its (small) source before it returns.
// - Event: a point in a stream. record() marks it after the work enqueued so far; another stream
//   of the same device that wait()s on it runs its later work only after that point.
// - Device: identity, memory, capabilities; creates buffers, streams and events.
//
// Threading: a Device may be used from several threads; a Stream from one thread at a time.
// Lifetime: buffers and streams must be destroyed before their device.
// Errors: device and input errors are Status values, never aborts.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <string_view>

#include "runtime/base/status.h"
#include "runtime/hal/ops.h"

namespace sx::hal {

class Device;

enum class DeviceKind { kCpu, kIntegratedGpu, kDiscreteGpu, kVirtualGpu, kOther };
// "cpu", "integrated gpu", "discrete gpu", "virtual gpu", "other"
std::string_view device_kind_name(DeviceKind kind);

struct DeviceInfo {
  std::string backend;  // the registry name of its backend
  int index = 0;
  std::string name;     // human readable, starting "<backend>:<index>", e.g. "cpu:0 (2 threads)"
  DeviceKind kind = DeviceKind::kOther;
  std::uint64_t memory_bytes = 0;  // total memory usable by Sextant
  std::uint64_t free_bytes = 0;    // of which free when the device was enumerated or created
  // Every device of the backend draws on one memory (the CPU's logical devices on the host's RAM):
  // the ranks of a group split memory_bytes between them instead of each having its own.
  bool shared_memory = false;
};

struct MemoryInfo {
  std::uint64_t total_bytes = 0;
  std::uint64_t used_bytes = 0;  // by buffers of this device
};

// Where a buffer lives, chosen at allocation (Device::alloc).
enum class BufferUsage {
  kDevice,    // device-local: weights, KV cache, activations, op operands
  kUpload,    // host-visible staging the host writes and streams copy() from, reused step after step
  kReadback,  // host-visible memory streams copy() into and the host reads after sync()
};
// "device", "upload", "readback"
std::string_view buffer_usage_name(BufferUsage usage);

class Buffer {
 public:
  virtual ~Buffer() = default;
  virtual std::size_t size() const = 0;
  virtual Device& device() const = 0;
  virtual BufferUsage usage() const = 0;
  // The bytes of an upload or readback buffer as the host sees them (size() of them); empty for
  // a device-local buffer. The host may read and write them only while no enqueued work uses them
  // (after the sync() of the stream that last did, or in a host_call ordered after that work).
  // Both directions work on both; upload is the one made for host -> device, readback for
  // device -> host (host-cached memory where the device has it).
  virtual std::span<std::byte> host() const = 0;
};

class Event {
 public:
  virtual ~Event() = default;
};

class Stream {
 public:
  virtual ~Stream() = default;
  virtual Status upload(Buffer& dst, std::size_t dst_offset, std::span<const std::byte> src) = 0;
  virtual Status download(std::span<std::byte> dst, const Buffer& src, std::size_t src_offset) = 0;
  // Like upload, but `src` (at most kMaxUpdateBytes) is copied before the call returns, so it may
  // be changed or freed at once: for small host updates between ops.
  static constexpr std::size_t kMaxUpdateBytes = 65536;
  virtual Status update(Buffer& dst, std::size_t dst_offset, std::span<const std::byte> src) = 0;
  virtual Status copy(Buffer& dst, std::size_t dst_offset, const Buffer& src, std::size_t src_offset,
                      std::size_t bytes) = 0;
  // Sets `bytes` bytes of dst from dst_offset to `value` (e.g. zeroing a KV pool at start-up).
  virtual Status fill(Buffer& dst, std::size_t dst_offset, std::size_t bytes, std::uint8_t value) = 0;
  virtual Status run(const Op& op) = 0;
  // Runs `fn` on a host thread once all work enqueued before it has completed, and before any work
  // enqueued after it starts (CUDA would use cudaLaunchHostFunc; the Vulkan backend drains the
  // stream and calls fn on the calling thread). It may read and write host-visible buffers
  // (Buffer::host) and host memory, e.g. a channel that stages through host memory
  // (backends/common/staged_channel.h); it must not enqueue on, or sync, any stream. Its error
  // latches like an op's.
  virtual Status host_call(std::function<Status()> fn) = 0;
  // Marks `event` after the work enqueued so far on this stream.
  virtual Status record(Event& event) = 0;
  // Work enqueued after this call runs after the work `event` marks (FAILED_PRECONDITION when the
  // event was never recorded).
  virtual Status wait(const Event& event) = 0;
  // Waits for all enqueued work; returns the first latched error.
  virtual Status sync() = 0;
};

// A weight matrix as its file holds it: rows x cols of `format` (cols a multiple of its block).
struct WeightDesc {
  DType format = DType::kF32;
  std::int64_t rows = 0, cols = 0;
  // > 0: the weight stacks matrices of this many rows each (a mixture's experts), which an op takes
  // one at a time: a device layout that groups rows must not let a group straddle two of them.
  std::int64_t row_unit = 0;
};

// OK when `bytes` is exactly a `w` as its file holds it (tensor_bytes); INVALID_ARGUMENT naming
// both sizes otherwise. Every upload_weight checks this first.
Status check_weight_bytes(const WeightDesc& w, std::span<const std::byte> bytes);

class Device {
 public:
  virtual ~Device() = default;
  virtual const DeviceInfo& info() const = 0;
  virtual MemoryInfo memory() const = 0;
  // OK if this device can run the op with these formats and shapes; otherwise UNIMPLEMENTED whose
  // message is the reason, if there is more to say than "not supported" (it may be empty). The
  // engine asks it at load for every op a step can issue, with the op's formats and its largest
  // shapes and null buffers, and refuses the model naming rank, device, op, format and shape
  // (hal::describe_op); a stream's run() is never preceded by it on the hot path.
  virtual Status supports(const Op& op) const = 0;
  // Device memory a weight matrix takes once upload_weight has prepared it: the file's bytes
  // (tensor_bytes) unless the backend keeps the format in a layout of its own (e.g. the CPU
  // interleaves the rows of Q8_0 and Q5_0 weights for its SIMD kernels, padding the last group).
  // For memory planning (the planner still counts file bytes: padding is at most 15 rows a matrix).
  virtual std::size_t weight_bytes(const WeightDesc& w) const { return tensor_bytes(w.format, w.rows, w.cols); }
  // A new buffer holding the weight `w` whose file bytes (rows x row_bytes, row-major) are
  // `bytes`, in whatever layout this backend's kernels read; an op names the weight by its file
  // format (MatmulArgs::w_type, EmbeddingArgs::table_type) and the backend finds its layout
  // from the buffer. Enqueued on `stream`: `bytes` must stay valid until stream.sync().
  virtual Result<std::unique_ptr<Buffer>> upload_weight(Stream& stream, const WeightDesc& w,
                                                        std::span<const std::byte> bytes);
  // A new buffer of `bytes` bytes for `usage` (contents unspecified: fill() what must start at
  // zero). Allocate at start-up: the engine allocates nothing while it runs steps.
  virtual Result<std::unique_ptr<Buffer>> alloc(std::size_t bytes, BufferUsage usage = BufferUsage::kDevice) = 0;
  virtual Result<std::unique_ptr<Stream>> create_stream() = 0;
  virtual Result<std::unique_ptr<Event>> create_event() = 0;
};

// Typed helpers over Stream for host vectors.
template <typename T>
Status upload_span(Stream& s, Buffer& dst, std::size_t dst_offset, std::span<const T> src) {
  return s.upload(dst, dst_offset, std::as_bytes(src));
}
template <typename T>
Status download_span(Stream& s, std::span<T> dst, const Buffer& src, std::size_t src_offset) {
  return s.download(std::as_writable_bytes(dst), src, src_offset);
}

}  // namespace sx::hal
