// The CPU backend's Device, Buffer, Stream and Event (the oracle every other backend is tested
// against), and its N logical devices cpu:0 ... cpu:N-1 (one per rank of a TP/PP group).
//
// A CpuDevice owns a thread pool (its "compute units") and a memory budget. Buffers are 64-byte
// aligned host allocations that only this backend dereferences; every op and copy checks that its
// buffers belong to the stream's device (data crosses devices only through Channels or the host).
// Normally a stream executes each piece of work when it is enqueued (in order, on the caller's
// thread plus the pool). In strict mode (CpuOptions::strict) device memory is mapped with no
// access at all except while the device itself executes, and a stream only queues its work and
// runs it at sync(); download destinations are filled with 0xFF bytes (NaN) until then.
//
// Threading: alloc() and memory() may be called from any thread; one Stream per thread; work of
// different streams of the same device is serialised on the device's pool.
#pragma once

#include <atomic>
#include <cstddef>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <span>
#include <string_view>
#include <vector>

#include "backends/cpu/kernels/matmul.h"
#include "runtime/base/thread_pool.h"
#include "runtime/hal/device.h"
#include "runtime/hal/registry.h"

namespace sx::cpu {

class CpuDevice;

// The CPU backend's device options (hal::DeviceOptions names: "threads", "memory_budget",
// "strict", "fail_at_op", "corrupt_device"; any other name is refused).
struct CpuOptions {
  int threads = 0;                  // worker threads (0 = all hardware threads); for a group
                                    // (create_devices) the total, split evenly between the ranks
  std::uint64_t memory_budget = 0;  // bytes this device may allocate (0 = system memory)
  // Strict mode (tests): device memory is unreachable from host code outside the device's own
  // execution, and streams run their work only at sync(), so engine code that bypasses the HAL
  // (reads a buffer, reads a download before sync, reuses an upload source early) fails.
  bool strict = false;
  // Fault injection (tests): the n-th op run on this device (1-based) fails with INTERNAL.
  std::uint64_t fail_at_op = 0;
  // Fault injection (tests): the device cpu:N with this N computes wrong results without an error
  // (every matmul output y becomes 1 - 2y), as a broken GPU would; -1: none. Set for a whole group, it hits
  // one rank (the smoke test must catch it).
  int corrupt_device = -1;
};
Result<CpuOptions> parse_cpu_options(const hal::DeviceOptions& options);

class CpuBuffer final : public hal::Buffer {
 public:
  CpuBuffer(CpuDevice& device, std::byte* data, std::size_t size, std::size_t mapped_bytes, hal::BufferUsage usage);
  ~CpuBuffer() override;
  std::size_t size() const override { return size_; }
  hal::Device& device() const override;
  hal::BufferUsage usage() const override { return usage_; }
  std::span<std::byte> host() const override;
  CpuDevice& cpu_device() const { return device_; }
  // Backend-internal: the memory. In strict mode it is only accessible while the device executes.
  std::byte* data() const { return data_; }
  std::size_t mapped_bytes() const { return mapped_bytes_; }  // > 0: an mmap of this size (large or strict)
  // A weight buffer made by upload_weight: the layout its bytes are in (layouts.h), which ops
  // that name the weight by its file format read it as. Empty for every other buffer.
  std::optional<hal::DType> layout() const { return layout_; }
  // The rows upload_weight was given (where a float layout's plain tail begins).
  std::int64_t layout_rows() const { return layout_rows_; }
  void set_layout(hal::DType layout, std::int64_t rows) {
    layout_ = layout;
    layout_rows_ = rows;
  }

 private:
  CpuDevice& device_;
  std::byte* data_;
  std::size_t size_;
  std::size_t mapped_bytes_;
  std::optional<hal::DType> layout_;
  std::int64_t layout_rows_ = 0;
  hal::BufferUsage usage_;
};

class CpuDevice final : public hal::Device {
 public:
  CpuDevice(int index, const CpuOptions& options);
  const hal::DeviceInfo& info() const override { return info_; }
  hal::MemoryInfo memory() const override;
  Status supports(const hal::Op& op) const override;
  // Weights are kept in the interleaved layouts of cpu::weight_layout (Q8_0 as kQ8_0R16, F32 as
  // kF32R16, ...) where the vector kernels for them are built (AVX2), every other format as the
  // file holds it.
  std::size_t weight_bytes(const hal::WeightDesc& w) const override;
  Result<std::unique_ptr<hal::Buffer>> upload_weight(hal::Stream& stream, const hal::WeightDesc& w,
                                                     std::span<const std::byte> bytes) override;
  // Upload and readback buffers are host memory the host may use at any time (never mapped
  // away in strict mode); ops refuse them as operands, as a GPU's kernels would read them slowly
  // or not at all.
  Result<std::unique_ptr<hal::Buffer>> alloc(std::size_t bytes,
                                             hal::BufferUsage usage = hal::BufferUsage::kDevice) override;
  Result<std::unique_ptr<hal::Stream>> create_stream() override;
  Result<std::unique_ptr<hal::Event>> create_event() override;

  bool strict() const { return strict_; }
  bool corrupt() const { return corrupt_; }
  ThreadPool& pool() { return pool_; }
  std::mutex& exec_mutex() { return exec_mu_; }
  void release(CpuBuffer* buffer);
  // Strict mode: opens (or closes) every live buffer of this device for the device's execution.
  void set_buffers_accessible(bool accessible);
  // Counts an op about to run; the injected failure when it is the configured one.
  Status count_op(std::string_view op_name);

 private:
  hal::DeviceInfo info_;
  ThreadPool pool_;
  bool strict_ = false;
  std::uint64_t fail_at_op_ = 0;
  bool corrupt_ = false;
  std::atomic<std::uint64_t> ops_run_{0};
  std::mutex exec_mu_;
  std::atomic<std::uint64_t> used_{0};
  std::mutex buffers_mu_;
  std::set<CpuBuffer*> mapped_buffers_;  // strict mode: the buffers to open/close around execution
};

class CpuStream final : public hal::Stream {
 public:
  explicit CpuStream(CpuDevice& device) : device_(device) {}
  Status upload(hal::Buffer& dst, std::size_t dst_offset, std::span<const std::byte> src) override;
  Status download(std::span<std::byte> dst, const hal::Buffer& src, std::size_t src_offset) override;
  Status update(hal::Buffer& dst, std::size_t dst_offset, std::span<const std::byte> src) override;
  Status fill(hal::Buffer& dst, std::size_t dst_offset, std::size_t bytes, std::uint8_t value) override;
  Status copy(hal::Buffer& dst, std::size_t dst_offset, const hal::Buffer& src, std::size_t src_offset,
              std::size_t bytes) override;
  Status run(const hal::Op& op) override;
  // Runs `fn` in stream order on the calling thread now, or at sync() in strict mode, like every
  // piece of work of a CPU stream; the CPU Channel enqueues its collectives this way.
  Status host_call(std::function<Status()> fn) override { return enqueue(std::move(fn)); }
  Status record(hal::Event& event) override;
  Status wait(const hal::Event& event) override;
  Status sync() override;

  CpuDevice& device() const { return device_; }

 private:
  // Runs `work` in stream order on the device (now, or at sync() in strict mode); its error latches.
  Status enqueue(std::function<Status()> work);
  Status latch(Status s);
  CpuDevice& device_;
  Scratch scratch_;
  Status latched_;
  std::vector<std::function<Status()>> pending_;  // strict mode
};

// Backend-internal: the memory of `v` after checking that it is a buffer of `device` with
// `bytes` bytes from the offset, and device-local unless `any_usage` (transfers: upload, update,
// download, copy, fill); errors name the op and the operand.
Result<std::byte*> resolve_view(const CpuDevice& device, const hal::BufView& v, std::size_t bytes, std::string_view op,
                                std::string_view what, bool any_usage = false);

// Logical devices listed by devices(); create_device accepts the same range.
inline constexpr int kCpuLogicalDevices = 8;

std::unique_ptr<hal::Backend> make_cpu_backend();

}  // namespace sx::cpu
