// The CPU backend's Device, Buffer and Stream (the oracle every other backend is tested against).
//
// A CpuDevice owns a thread pool (its "compute units") and a memory budget. Buffers are 64-byte
// aligned host allocations that only this backend dereferences. The stream executes each op when
// it is enqueued (in order, on the caller's thread plus the pool) and latches the first error.
//
// Threading: alloc() and memory() may be called from any thread; one Stream per thread; ops of
// different streams of the same device are serialised on the device's pool.
#pragma once

#include <atomic>
#include <cstddef>
#include <memory>
#include <mutex>

#include "backends/cpu/kernels/matmul.h"
#include "runtime/base/thread_pool.h"
#include "runtime/hal/device.h"
#include "runtime/hal/registry.h"

namespace sx::cpu {

class CpuDevice;

class CpuBuffer final : public hal::Buffer {
 public:
  CpuBuffer(CpuDevice& device, std::byte* data, std::size_t size);
  ~CpuBuffer() override;
  std::size_t size() const override { return size_; }
  hal::Device& device() const override;
  std::byte* data() const { return data_; }

 private:
  CpuDevice& device_;
  std::byte* data_;
  std::size_t size_;
};

class CpuDevice final : public hal::Device {
 public:
  CpuDevice(int index, const hal::DeviceOptions& options);
  const hal::DeviceInfo& info() const override { return info_; }
  hal::MemoryInfo memory() const override;
  Status supports(const hal::Op& op) const override;
  Result<std::unique_ptr<hal::Buffer>> alloc(std::size_t bytes) override;
  Result<std::unique_ptr<hal::Stream>> create_stream() override;

  ThreadPool& pool() { return pool_; }
  std::mutex& exec_mutex() { return exec_mu_; }
  void release(std::size_t bytes) { used_.fetch_sub(bytes); }

 private:
  hal::DeviceInfo info_;
  ThreadPool pool_;
  std::mutex exec_mu_;
  std::atomic<std::uint64_t> used_{0};
};

class CpuStream final : public hal::Stream {
 public:
  explicit CpuStream(CpuDevice& device) : device_(device) {}
  Status upload(hal::Buffer& dst, std::size_t dst_offset, std::span<const std::byte> src) override;
  Status download(std::span<std::byte> dst, const hal::Buffer& src, std::size_t src_offset) override;
  Status copy(hal::Buffer& dst, std::size_t dst_offset, const hal::Buffer& src, std::size_t src_offset,
              std::size_t bytes) override;
  Status run(const hal::Op& op) override;
  Status sync() override { return latched_; }

 private:
  Status latch(Status s);
  CpuDevice& device_;
  Scratch scratch_;
  Status latched_;
};

std::unique_ptr<hal::Backend> make_cpu_backend();

}  // namespace sx::cpu
