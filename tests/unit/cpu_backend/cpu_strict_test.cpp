// Strict mode of the CPU backend: device memory is out of the host's reach, streams run only at
// sync(), downloads read before sync() hold NaN, and buffers cannot cross devices.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "backends/cpu/cpu_device.h"

namespace sx::cpu {
namespace {

std::unique_ptr<hal::Device> strict_device(hal::Backend& b, int index = 0) {
  hal::DeviceOptions o;
  o.set("threads", 1);
  o.set("strict", true);
  return *b.create_device(index, o);
}

TEST(CpuStrictDeathTest, AHostDereferenceOfADeviceBufferFails) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  auto backend = make_cpu_backend();
  auto dev = strict_device(*backend);
  auto buf = *dev->alloc(256);
  auto stream = *dev->create_stream();
  const std::vector<float> ones(64, 1.0f);
  ASSERT_TRUE(hal::upload_span<float>(*stream, *buf, 0, ones).ok());
  ASSERT_TRUE(stream->sync().ok());
  // What engine code would do if it reached behind the HAL: read device memory through a pointer.
  const volatile float* p = reinterpret_cast<const float*>(static_cast<CpuBuffer&>(*buf).data());
  EXPECT_DEATH({ [[maybe_unused]] float x = p[0]; }, "");
}

TEST(CpuStrict, TheSameReadWorksWithoutStrictMode) {
  auto backend = make_cpu_backend();
  hal::DeviceOptions o;
  o.set("threads", 1);
  auto dev = *backend->create_device(0, o);
  auto buf = *dev->alloc(256);
  auto stream = *dev->create_stream();
  const std::vector<float> ones(64, 1.0f);
  ASSERT_TRUE(hal::upload_span<float>(*stream, *buf, 0, ones).ok());
  ASSERT_TRUE(stream->sync().ok());
  EXPECT_EQ(reinterpret_cast<const float*>(static_cast<CpuBuffer&>(*buf).data())[0], 1.0f);
}

TEST(CpuStrict, WorkRunsAtSyncAndDownloadsAreNaNUntilThen) {
  auto backend = make_cpu_backend();
  auto dev = strict_device(*backend);
  auto stream = *dev->create_stream();
  auto a = *dev->alloc(16 * sizeof(float));
  auto b = *dev->alloc(16 * sizeof(float));
  std::vector<float> x(16), y(16);
  for (int i = 0; i < 16; ++i) {
    x[static_cast<std::size_t>(i)] = static_cast<float>(i);
    y[static_cast<std::size_t>(i)] = 100.0f;
  }
  ASSERT_TRUE(hal::upload_span<float>(*stream, *a, 0, x).ok());
  ASSERT_TRUE(hal::upload_span<float>(*stream, *b, 0, y).ok());
  ASSERT_TRUE(stream->run(hal::AddArgs{{a.get(), 0}, {b.get(), 0}, {a.get(), 0}, 16}).ok());
  std::vector<float> out(16, 0.0f);
  ASSERT_TRUE(hal::download_span<float>(*stream, std::span<float>(out), *a, 0).ok());
  for (float v : out) EXPECT_TRUE(std::isnan(v));  // not run yet
  // An upload source changed before sync() is what the device sees: the contract says keep it.
  y[0] = 1000.0f;
  ASSERT_TRUE(stream->sync().ok());
  EXPECT_EQ(out[0], 1000.0f);
  for (int i = 1; i < 16; ++i) EXPECT_EQ(out[static_cast<std::size_t>(i)], static_cast<float>(i) + 100.0f);
}

TEST(CpuStrict, BuffersCannotCrossDevices) {
  auto backend = make_cpu_backend();
  auto d0 = strict_device(*backend, 0);
  auto d1 = strict_device(*backend, 1);
  auto s0 = *d0->create_stream();
  auto mine = *d0->alloc(64);
  auto theirs = *d1->alloc(64);
  const Status st = s0->copy(*mine, 0, *theirs, 0, 64);
  ASSERT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("belongs to cpu:1"), std::string::npos) << st.to_string();
  // The error latches: the stream reports it at sync().
  EXPECT_EQ(s0->sync().code(), StatusCode::kInvalidArgument);
}

TEST(CpuStrict, EventsOrderStreamsAndAnUnrecordedEventIsAnError) {
  auto backend = make_cpu_backend();
  auto dev = strict_device(*backend);
  auto s1 = *dev->create_stream();
  auto s2 = *dev->create_stream();
  auto e = *dev->create_event();
  EXPECT_EQ(s2->wait(*e).code(), StatusCode::kFailedPrecondition);
  auto s3 = *dev->create_stream();
  ASSERT_TRUE(s1->record(*e).ok());
  ASSERT_TRUE(s3->wait(*e).ok());
  // s1's work has not run (strict mode runs it at s1's sync): s3 must not run ahead of it.
  EXPECT_EQ(s3->sync().code(), StatusCode::kFailedPrecondition);
  auto s4 = *dev->create_stream();
  ASSERT_TRUE(s1->sync().ok());
  ASSERT_TRUE(s4->wait(*e).ok());
  EXPECT_TRUE(s4->sync().ok());
}

TEST(CpuStrict, FaultInjectionFailsTheConfiguredOp) {
  auto backend = make_cpu_backend();
  hal::DeviceOptions o;
  o.set("threads", 1);
  o.set("fail_at_op", 2);
  auto dev = *backend->create_device(3, o);
  auto s = *dev->create_stream();
  auto a = *dev->alloc(64);
  const hal::AddArgs add{{a.get(), 0}, {a.get(), 0}, {a.get(), 0}, 16};
  EXPECT_TRUE(s->run(add).ok());
  const Status st = s->run(add);
  ASSERT_EQ(st.code(), StatusCode::kInternal);
  EXPECT_NE(st.message().find("cpu:3"), std::string::npos);
  EXPECT_NE(st.message().find("injected failure at op 2 (add)"), std::string::npos) << st.to_string();
}

}  // namespace
}  // namespace sx::cpu
