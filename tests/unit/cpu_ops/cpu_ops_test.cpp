// What only the CPU backend has: its weight layouts, vector math, options and memory budget (every
// op against naive references, on every backend: tests/ops).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>
#include <span>
#include <vector>

#include "backends/cpu/cpu_device.h"
#include "backends/cpu/ops/cpu_ops.h"
#include "runtime/base/half.h"

namespace sx {
namespace {

class CpuOps : public testing::Test {
 protected:
  void SetUp() override {
    cpu::CpuOptions o;
    o.threads = 2;
    device_ = std::make_unique<cpu::CpuDevice>(0, o);
    stream_ = std::move(device_->create_stream()).value();
  }

  std::vector<float> random(std::size_t n, float scale = 1.0f) {
    std::normal_distribution<float> d(0.0f, scale);
    std::vector<float> v(n);
    for (auto& x : v) x = d(rng_);
    return v;
  }

  std::mt19937 rng_{42};
  std::unique_ptr<cpu::CpuDevice> device_;
  std::unique_ptr<hal::Stream> stream_;
};

// upload_weight keeps Q8_0, Q5_0 and F16 in the CPU's interleaved layouts where it has the AVX2
// kernels for them, sized by weight_bytes (the ops on them: tests/ops).
TEST_F(CpuOps, UploadedWeightsTakeTheCpuLayout) {
  const int rows = 10, dim = 64;
  auto table = random(rows * dim);
  for (hal::DType source : {hal::DType::kQ8_0, hal::DType::kQ5_0, hal::DType::kF16}) {
    const std::size_t rb = hal::row_bytes(source, dim);
    std::vector<std::uint8_t> plain(rb * rows);
    for (int r = 0; r < rows; ++r) hal::quantize_row(source, &table[r * dim], &plain[rb * r], dim);
    auto b = device_->upload_weight(*stream_, hal::WeightDesc{source, rows, dim}, std::as_bytes(std::span(plain)));
    ASSERT_TRUE(b.ok()) << b.status().to_string();
    ASSERT_TRUE(stream_->sync().ok());
    EXPECT_EQ((*b)->size(), device_->weight_bytes(hal::WeightDesc{source, rows, dim}));
    EXPECT_EQ(static_cast<cpu::CpuBuffer&>(**b).layout(), cpu::weight_layout(source, dim)) << hal::dtype_name(source);
  }
  // Stacked matrices of 5 rows each (experts) would straddle the layouts' groups: kept as the file.
  std::vector<float> stacked(static_cast<std::size_t>(rows * dim), 0.5f);
  auto b = device_->upload_weight(*stream_, hal::WeightDesc{hal::DType::kF32, rows, dim, 5},
                                  std::as_bytes(std::span(stacked)));
  ASSERT_TRUE(b.ok()) << b.status().to_string();
  ASSERT_TRUE(stream_->sync().ok());
  EXPECT_EQ(static_cast<cpu::CpuBuffer&>(**b).layout(), hal::DType::kF32);
  // A 16-row layout's matmul takes all its rows or whole panels from the first: where its plain
  // tail begins depends on the rows uploaded (layouts.h).
  if (!cpu::vector_interleaved()) return;
  const int n = 40, k = 64;
  const auto wv = random(static_cast<std::size_t>(n * k));
  auto w = device_->upload_weight(*stream_, hal::WeightDesc{hal::DType::kF32, n, k}, std::as_bytes(std::span(wv)));
  ASSERT_TRUE(w.ok()) << w.status().to_string();
  auto x = *device_->alloc(4 * k), y = *device_->alloc(4 * n);
  ASSERT_TRUE(stream_->fill(*x, 0, 4 * k, 0).ok());
  for (const int rows : {40, 32, 16, 20}) {
    auto st = stream_->run(hal::MatmulArgs{{w->get(), 0}, hal::DType::kF32, {x.get(), 0}, {}, {y.get(), 0}, 1, rows, k});
    if (st.ok()) st = stream_->sync();
    EXPECT_EQ(st.ok(), rows != 20) << rows << ": " << st.to_string();
    if (!st.ok()) {
      EXPECT_NE(st.message().find("whole panels from its first row"), std::string::npos) << st.message();
      stream_ = std::move(device_->create_stream()).value();  // the error latched in that stream
    }
  }
}

TEST(CpuVectorMath, ExpAndSiluMatchLibm) {
  std::vector<float> x;
  for (float v = -100.0f; v <= 0.0f; v += 0.01f) x.push_back(v);
  std::vector<float> e = x;
  const float sum = cpu::exp_shifted_sum(e.data(), static_cast<std::int64_t>(e.size()), -1.0f);
  double ref_sum = 0;
  for (std::size_t i = 0; i < x.size(); ++i) {
    const double ref = std::exp(static_cast<double>(x[i]) + 1.0);
    ref_sum += ref;
    ASSERT_NEAR(e[i], ref, ref * 3e-7 + 1e-37) << x[i];
  }
  EXPECT_NEAR(sum, ref_sum, ref_sum * 1e-6);
  std::vector<float> g, u, o;
  for (float v = -120.0f; v <= 120.0f; v += 0.05f) {
    g.push_back(v);
    u.push_back(0.5f - v / 240.0f);
  }
  o.resize(g.size());
  cpu::silu_mul_row(g.data(), u.data(), o.data(), static_cast<std::int64_t>(g.size()));
  for (std::size_t i = 0; i < g.size(); ++i) {
    const double ref = g[i] / (1.0 + std::exp(-static_cast<double>(g[i]))) * u[i];
    ASSERT_NEAR(o[i], ref, std::fabs(ref) * 1e-6 + 1e-30) << g[i];
  }
}

// The CPU's device options arrive by name: known ones parsed, a bad value or an unknown name
// refused naming it; a group's threads are split between its ranks.
TEST(CpuOptions, AreParsedByNameAndUnknownNamesAreRefused) {
  const std::unique_ptr<hal::Backend> backend = cpu::make_cpu_backend();
  hal::DeviceOptions o;
  o.set("threads", 4).set("memory_budget", std::uint64_t{1} << 30).set("strict", true).set("fail_at_op", 9).set(
      "corrupt_device", 1);
  auto parsed = cpu::parse_cpu_options(o);
  ASSERT_TRUE(parsed.ok()) << parsed.status().to_string();
  EXPECT_EQ(parsed->threads, 4);
  EXPECT_EQ(parsed->memory_budget, std::uint64_t{1} << 30);
  EXPECT_TRUE(parsed->strict);
  EXPECT_EQ(parsed->fail_at_op, 9u);
  EXPECT_EQ(parsed->corrupt_device, 1);
  auto group = backend->create_devices(2, o);
  ASSERT_TRUE(group.ok()) << group.status().to_string();
  EXPECT_EQ((*group)[1]->info().name, "cpu:1 (2 threads, strict)");
  EXPECT_EQ((*group)[1]->info().memory_bytes, std::uint64_t{1} << 30);
  EXPECT_TRUE((*group)[1]->info().shared_memory);

  hal::DeviceOptions unknown;
  unknown.set("threads", 1).set("device_memory_fraction", "0.5");
  auto refused = backend->create_device(0, unknown);
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(refused.status().message(), "backend 'cpu' has no device option 'device_memory_fraction' (it takes: "
                                        "threads, memory_budget, strict, fail_at_op, corrupt_device)");
  hal::DeviceOptions bad;
  bad.set("strict", "yes");
  EXPECT_EQ(cpu::parse_cpu_options(bad).status().message(),
            "backend 'cpu': device option 'strict' must be true or false, got 'yes'");
  bad = {};
  bad.set("threads", "-1");
  EXPECT_EQ(cpu::parse_cpu_options(bad).status().message(),
            "backend 'cpu': device option 'threads' must be an integer in [0, 4096], got '-1'");
}

TEST_F(CpuOps, MemoryBudgetIsEnforced) {
  cpu::CpuOptions o;
  o.threads = 1;
  o.memory_budget = 1 << 20;
  cpu::CpuDevice d(1, o);
  auto a = d.alloc(800 << 10);
  ASSERT_TRUE(a.ok());
  auto b = d.alloc(800 << 10);
  EXPECT_EQ(b.status().code(), StatusCode::kResourceExhausted);
  EXPECT_EQ(d.memory().used_bytes, 800u << 10);
  a.value().reset();
  EXPECT_EQ(d.memory().used_bytes, 0u);
  EXPECT_TRUE(d.alloc(900 << 10).ok());
}

}  // namespace
}  // namespace sx
