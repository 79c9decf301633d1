// Registry::find / pick: a backend is chosen by name, or with "auto" as the first registered one
// that reports a device, with the reason; list_devices names an unavailable backend;
// hal::describe_op and device_kind_name.
#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include "runtime/hal/registry.h"

namespace sx::hal {
namespace {

// A backend whose devices() answers what it is told.
class FakeBackend final : public Backend {
 public:
  FakeBackend(std::string name, Result<std::vector<DeviceInfo>> devices)
      : name_(std::move(name)), devices_(std::move(devices)) {}
  std::string_view name() const override { return name_; }
  Result<std::vector<DeviceInfo>> devices() const override { return devices_; }
  Result<std::unique_ptr<Device>> create_device(int, const DeviceOptions&) override {
    return unimplemented_error("fake");
  }

 private:
  std::string name_;
  Result<std::vector<DeviceInfo>> devices_;
};

Registry three_backends() {
  Registry r;
  r.add(std::make_unique<FakeBackend>("gpu1", unavailable_error("no driver")));
  r.add(std::make_unique<FakeBackend>("gpu2", std::vector<DeviceInfo>{}));
  r.add(std::make_unique<FakeBackend>("host", std::vector<DeviceInfo>(2)));
  return r;
}

TEST(Registry, AutoPicksTheFirstBackendWithADeviceAndSaysWhy) {
  Registry r = three_backends();
  std::string why;
  auto b = r.pick("auto", &why);
  ASSERT_TRUE(b.ok()) << b.status().to_string();
  EXPECT_EQ((*b)->name(), "host");
  EXPECT_EQ(why, "auto: gpu1: UNAVAILABLE: no driver; gpu2: no devices; using host (2 devices)");
}

TEST(Registry, ANamedBackendIsTakenAsItIs) {
  Registry r = three_backends();
  std::string why;
  auto b = r.pick("gpu2", &why);  // no devices: creating the group will say so, naming the count
  ASSERT_TRUE(b.ok());
  EXPECT_EQ((*b)->name(), "gpu2");
  EXPECT_EQ(why, "gpu2 (as configured)");
  auto missing = r.pick("tpu");
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.status().code(), StatusCode::kNotFound);
  EXPECT_EQ(missing.status().message(),
            "backend 'tpu' is not available in this build (compiled in: gpu1, gpu2, host)");
}

TEST(Registry, AutoWithoutAnyDeviceIsNotFoundNamingEveryBackend) {
  Registry r;
  r.add(std::make_unique<FakeBackend>("gpu1", unavailable_error("no driver")));
  auto b = r.pick("auto");
  ASSERT_FALSE(b.ok());
  EXPECT_EQ(b.status().message(), "backend auto: no backend has a device (gpu1: UNAVAILABLE: no driver)");
  EXPECT_EQ(Registry().pick("auto").status().message(), "backend auto: no backend has a device (none compiled in)");
}

TEST(Registry, ListDevicesNamesAnUnavailableBackend) {
  const FakeBackend gpu("gpu1", unavailable_error("no driver"));
  auto infos = list_devices(gpu);
  ASSERT_FALSE(infos.ok());
  EXPECT_EQ(infos.status().code(), StatusCode::kUnavailable);
  EXPECT_EQ(infos.status().message(), "backend gpu1 unavailable: no driver");
  const FakeBackend host("host", std::vector<DeviceInfo>(2));
  ASSERT_TRUE(list_devices(host).ok());
  EXPECT_EQ(list_devices(host)->size(), 2u);
}

TEST(Ops, DescriptionsNameWhatSupportDependsOn) {
  MatmulArgs m;
  m.w_type = DType::kQ4_K;
  m.n = 4864;
  m.k = 896;
  EXPECT_EQ(describe_op(m), "matmul with q4_k weights [4864 x 896]");
  EmbeddingArgs e;
  e.table_type = DType::kQ8_0;
  e.vocab = 151936;
  e.dim = 896;
  EXPECT_EQ(describe_op(e), "embedding with a q8_0 table [151936 x 896]");
  AttentionArgs a;
  a.head_dim = 128;
  a.heads_per_kv = 7;
  a.cache_type = DType::kF16;
  EXPECT_EQ(describe_op(a), "attention with head size 128, 7 query heads per KV head, KV cache in f16");
  EXPECT_EQ(op_name(Op{a}), "attention");
  EXPECT_EQ(device_kind_name(DeviceKind::kDiscreteGpu), "discrete gpu");
}

}  // namespace
}  // namespace sx::hal
