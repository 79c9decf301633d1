// Operands larger than one binding may span are bound in windows (backends/vulkan/vk_device.h):
// with the max_binding option making windows small, add over a long vector at an odd offset and
// embedding from tables of many windows (every format, a vocab shard) give exactly what one
// window gives and what the CPU's dequantisation says. Skipped with the reason when no Vulkan
// device is selected (meson selects device 0: lavapipe in CI).
#include <gtest/gtest.h>

#include <cstdio>
#include <random>
#include <vector>

#include "backends/registry.h"
#include "runtime/hal/quant.h"
#include "runtime/hal/registry.h"

namespace sx::vk {
namespace {

class VulkanWindows : public ::testing::Test {
 protected:
  void SetUp() override {
    auto b = backends::default_registry().find("vulkan");
    ASSERT_TRUE(b.ok()) << b.status().to_string();
    auto infos = hal::list_devices(**b);
    if (!infos.ok()) {
      std::printf("skipped: %s\n", infos.status().to_string().c_str());
      GTEST_SKIP() << infos.status().to_string();
    }
    hal::DeviceOptions o;
    o.set("max_binding", 1040);  // 1 KiB windows (+ the largest offset alignment lavapipe asks)
    auto d = (*b)->create_device(0, o);
    ASSERT_TRUE(d.ok()) << d.status().to_string();
    device_ = std::move(*d);
    stream_ = std::move(device_->create_stream()).value();
  }
  template <typename T>
  std::unique_ptr<hal::Buffer> buf(const std::vector<T>& host, std::size_t extra = 0) {
    auto b = std::move(device_->alloc(host.size() * sizeof(T) + extra)).value();
    EXPECT_TRUE(stream_->upload(*b, extra, std::as_bytes(std::span<const T>(host))).ok());
    EXPECT_TRUE(stream_->sync().ok());
    return b;
  }
  template <typename T>
  std::vector<T> read(const hal::Buffer& b, std::size_t n) {
    std::vector<T> out(n);
    EXPECT_TRUE(stream_->download(std::as_writable_bytes(std::span<T>(out)), b, 0).ok());
    EXPECT_TRUE(stream_->sync().ok());
    return out;
  }
  std::unique_ptr<hal::Device> device_;
  std::unique_ptr<hal::Stream> stream_;
  std::mt19937 rng_{5};
};

TEST_F(VulkanWindows, AddOverManyWindowsAtAnOffset) {
  const std::size_t n = 1000, lead = 16;  // 4000 bytes from byte 16: four windows and a tail
  std::normal_distribution<float> dist;
  std::vector<float> a(n), b(n);
  for (std::size_t i = 0; i < n; ++i) a[i] = dist(rng_), b[i] = dist(rng_);
  auto ba = buf(a, lead), bb = buf(b), bo = buf(std::vector<float>(n));
  ASSERT_TRUE(stream_->run(hal::AddArgs{{ba.get(), lead}, {bb.get(), 0}, {bo.get(), 0}, static_cast<std::int64_t>(n)}).ok());
  const auto o = read<float>(*bo, n);
  for (std::size_t i = 0; i < n; ++i) ASSERT_EQ(o[i], a[i] + b[i]) << i;
}

TEST_F(VulkanWindows, EmbeddingTablesOfManyWindows) {
  const int vocab = 128, dim = 32;
  std::normal_distribution<float> dist;
  std::vector<float> table(vocab * dim);
  for (float& v : table) v = dist(rng_);
  const std::vector<std::int32_t> ids = {127, 0, 17, 40, 41, 2, 63};
  auto bi = buf(ids);
  for (hal::DType t : {hal::DType::kF32, hal::DType::kF16, hal::DType::kBF16, hal::DType::kQ8_0, hal::DType::kQ5_0}) {
    SCOPED_TRACE(hal::dtype_name(t));
    const std::size_t rb = hal::row_bytes(t, dim);
    std::vector<std::uint8_t> packed(rb * vocab);
    for (int r = 0; r < vocab; ++r) hal::quantize_row(t, &table[r * dim], &packed[rb * r], dim);
    ASSERT_GT(packed.size(), 1024u * 2);  // at least three windows
    auto bt = buf(packed);
    auto bo = buf(std::vector<float>(ids.size() * dim, -1.0f));
    ASSERT_TRUE(stream_->run(hal::EmbeddingArgs{{bt.get(), 0}, t, {bi.get(), 0}, {bo.get(), 0},
                                                static_cast<std::int64_t>(ids.size()), dim, vocab}).ok());
    auto out = read<float>(*bo, ids.size() * dim);
    std::vector<float> expect(dim);
    for (std::size_t i = 0; i < ids.size(); ++i) {
      hal::dequantize_row(t, &packed[rb * ids[i]], expect.data(), dim);
      for (int j = 0; j < dim; ++j) ASSERT_EQ(out[i * dim + j], expect[j]) << "id " << ids[i] << " column " << j;
    }
    // A shard of rows [16, 56): ids outside it are zero rows.
    auto bs = buf(std::vector<std::uint8_t>(packed.begin() + rb * 16, packed.begin() + rb * 56));
    hal::EmbeddingArgs e{{bs.get(), 0}, t, {bi.get(), 0}, {bo.get(), 0}, static_cast<std::int64_t>(ids.size()), dim, 40};
    e.shard = true;
    e.vocab_offset = 16;
    ASSERT_TRUE(stream_->run(e).ok());
    out = read<float>(*bo, ids.size() * dim);
    for (std::size_t i = 0; i < ids.size(); ++i) {
      const bool inside = ids[i] >= 16 && ids[i] < 56;
      if (inside) hal::dequantize_row(t, &packed[rb * ids[i]], expect.data(), dim);
      for (int j = 0; j < dim; ++j) ASSERT_EQ(out[i * dim + j], inside ? expect[j] : 0.0f) << "shard id " << ids[i];
    }
  }
}

}  // namespace
}  // namespace sx::vk
