// Tests of runtime/base: Status/Result, fp16/bf16 conversions, the thread pool, mapped files.
#include <gtest/gtest.h>

#include <atomic>
#include <cmath>
#include <cstdio>
#include <numeric>
#include <vector>

#include "runtime/base/half.h"
#include "runtime/base/mapped_file.h"
#include "runtime/base/membw.h"
#include "runtime/base/status.h"
#include "runtime/base/thread_pool.h"

namespace sx {
namespace {

Result<int> parse_positive(int x) {
  if (x <= 0) return invalid_argument_error("value {} is not positive", x);
  return x * 2;
}

Status chain(int x, int& out) {
  SX_ASSIGN_OR_RETURN(out, parse_positive(x));
  SX_RETURN_IF_ERROR(x > 100 ? out_of_range_error("too big: {}", x) : ok_status());
  return ok_status();
}

TEST(Status, PropagatesCodesAndMessages) {
  int out = 0;
  EXPECT_TRUE(chain(3, out).ok());
  EXPECT_EQ(out, 6);
  Status s = chain(-1, out);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(s.message(), "value -1 is not positive");
  EXPECT_EQ(s.to_string(), "INVALID_ARGUMENT: value -1 is not positive");
  EXPECT_EQ(chain(101, out).code(), StatusCode::kOutOfRange);
  EXPECT_EQ(s.with_context("file.gguf").message(), "file.gguf: value -1 is not positive");
}

TEST(Half, F16RoundTripsEveryValue) {
  for (std::uint32_t h = 0; h < 0x10000; ++h) {
    const float f = f16_to_f32(static_cast<std::uint16_t>(h));
    if (std::isnan(f)) {
      EXPECT_TRUE(std::isnan(f16_to_f32(f32_to_f16(f))));
      continue;
    }
    EXPECT_EQ(f32_to_f16(f), h) << "half bits " << h;
  }
}

TEST(Half, F16RoundsToNearestEven) {
  EXPECT_EQ(f32_to_f16(1.0f), 0x3c00);
  EXPECT_EQ(f32_to_f16(65504.0f), 0x7bff);
  EXPECT_EQ(f32_to_f16(65520.0f), 0x7c00);  // rounds to infinity
  EXPECT_EQ(f32_to_f16(1.0f + 1.0f / 2048.0f), 0x3c00);  // exact tie -> even
  EXPECT_EQ(f32_to_f16(1.0f + 3.0f / 2048.0f), 0x3c02);  // tie -> even (up)
  EXPECT_EQ(f32_to_f16(5.9604645e-08f), 0x0001);  // smallest subnormal
  EXPECT_EQ(f32_to_f16(2.9802322e-08f), 0x0000);  // half of it: tie -> even (zero)
  EXPECT_EQ(f32_to_f16(-0.0f), 0x8000);
  EXPECT_FLOAT_EQ(f16_to_f32(0x3555), 0.333251953125f);
}

TEST(Half, Bf16) {
  EXPECT_EQ(f32_to_bf16(1.0f), 0x3f80);
  EXPECT_EQ(bf16_to_f32(0x3f80), 1.0f);
  EXPECT_EQ(f32_to_bf16(1.00390625f), 0x3f80);  // tie -> even
  EXPECT_EQ(f32_to_bf16(1.01171875f), 0x3f82);  // tie -> even (up)
  EXPECT_TRUE(std::isnan(bf16_to_f32(f32_to_bf16(NAN))));
}

TEST(ThreadPool, ParallelForCoversEveryTaskOnce) {
  for (int threads : {1, 2, 3}) {
    ThreadPool pool(threads);
    for (int round = 0; round < 200; ++round) {
      const int n = round % 37;
      std::vector<std::atomic<int>> hits(static_cast<std::size_t>(n));
      pool.parallel_for(n, [&](std::int64_t i) { hits[static_cast<std::size_t>(i)].fetch_add(1); });
      for (int i = 0; i < n; ++i) ASSERT_EQ(hits[static_cast<std::size_t>(i)].load(), 1);
    }
  }
}

TEST(ThreadPool, RunOnAllRunsEachThreadOnce) {
  ThreadPool pool(3);
  std::vector<std::atomic<int>> hits(3);
  pool.run_on_all([&](int t, int n) {
    EXPECT_EQ(n, 3);
    hits[static_cast<std::size_t>(t)].fetch_add(1);
  });
  for (auto& h : hits) EXPECT_EQ(h.load(), 1);
}

TEST(ReadBandwidth, MedianRoundIsAtMostTheFastestAndBothAreMeasured) {
  sx::ThreadPool pool(2);
  const sx::ReadBandwidth bw = sx::measure_read_bandwidth_rounds(pool, std::size_t{64} << 20, 1);
  EXPECT_GT(bw.median, 1e8);  // any machine reads more than 100 MB/s
  EXPECT_LE(bw.median, bw.best);
  EXPECT_GT(sx::measure_read_bandwidth(pool, std::size_t{64} << 20, 1), 1e8);
}

TEST(MappedFile, ReadsAndReportsMissingFiles) {
  const std::string path = testing::TempDir() + "/mapped_file_test.bin";
  FILE* f = std::fopen(path.c_str(), "wb");
  ASSERT_NE(f, nullptr);
  std::fputs("hello", f);
  std::fclose(f);
  auto m = MappedFile::open(path);
  ASSERT_TRUE(m.ok()) << m.status().to_string();
  EXPECT_EQ((*m)->size(), 5u);
  EXPECT_EQ((*m)->bytes()[1], 'e');
  auto missing = MappedFile::open(path + ".nope");
  EXPECT_EQ(missing.status().code(), StatusCode::kNotFound);
  EXPECT_NE(missing.status().message().find("mapped_file_test.bin.nope"), std::string::npos);
  EXPECT_EQ(MappedFile::open(testing::TempDir()).status().code(), StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace sx
