// A CPU device with two threads and its stream, with upload / download helpers, for the CPU op
// tests (moe_test.cpp, deltanet_test.cpp). Host copies passed to upload() and put() are read by the
// stream before they return (the CPU stream copies at once).
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <memory>
#include <span>
#include <vector>

#include "backends/cpu/cpu_device.h"

namespace sx::cpu::ops_test {

struct Dev {
  std::unique_ptr<hal::Backend> backend = make_cpu_backend();
  std::unique_ptr<hal::Device> device;
  std::unique_ptr<hal::Stream> stream;
  Dev() {
    hal::DeviceOptions o;
    o.set("threads", 2);
    device = *backend->create_device(0, o);
    stream = *device->create_stream();
  }
  template <class T>
  std::unique_ptr<hal::Buffer> upload(const std::vector<T>& v) {
    auto b = *device->alloc(std::max<std::size_t>(v.size() * sizeof(T), 4));
    EXPECT_TRUE(stream->upload(*b, 0, std::as_bytes(std::span(v))).ok());
    return b;
  }
  template <class T>
  void put(hal::Buffer& b, const std::vector<T>& v) {
    EXPECT_TRUE(stream->upload(b, 0, std::as_bytes(std::span(v))).ok());
  }
  template <class T>
  std::vector<T> download(hal::Buffer& b, std::size_t n) {
    std::vector<T> v(n);
    EXPECT_TRUE(stream->download(std::as_writable_bytes(std::span(v)), b, 0).ok());
    EXPECT_TRUE(stream->sync().ok());
    return v;
  }
};

}  // namespace sx::cpu::ops_test
