// The smoke test before a load (runtime/engine/smoke_test.h) on CPU devices: the bundled model
// gives its text through every layout it allows (TP 1, 6, 7 and 8: the CPU backend's most, TP 3 x PP 2, PP 2), a rank made to
// compute wrong results (the CPU's corrupt_device fault injection) fails it naming the layout, the
// devices, the step and both tokens, whichever rank it is, and a layout beyond the bundled model
// is reported as not testable.
#include "runtime/engine/smoke_test.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <string>

#include "backends/registry.h"
#include "runtime/engine/device_group.h"

namespace sx::engine {
namespace {

std::string bundled() { return std::string(std::getenv("SX_MODELS_DIR")) + "/memorise-f16.gguf"; }

Result<SmokeResult> smoke(int tp, int pp, int corrupt = -1) {
  hal::Backend& cpu = **backends::default_registry().find("cpu");
  hal::DeviceOptions o;
  o.set("threads", 1);
  if (corrupt >= 0) o.set("corrupt_device", static_cast<std::int64_t>(corrupt));
  SX_ASSIGN_OR_RETURN(DeviceGroup g, create_device_group(cpu, tp * pp, o));
  return run_smoke_test(bundled(), cpu, g.devices, tp, pp);
}

TEST(SmokeTest, TheBundledModelGivesItsTextThroughEveryLayoutItAllows) {
  struct Layout {
    int tp, pp;
  };
  for (const Layout l : {Layout{1, 1}, Layout{6, 1}, Layout{7, 1}, Layout{8, 1}, Layout{3, 2}, Layout{1, 2}}) {
    auto r = smoke(l.tp, l.pp);
    ASSERT_TRUE(r.ok()) << "tp " << l.tp << " pp " << l.pp << ": " << r.status().to_string();
    EXPECT_EQ(r->steps, 24);
    EXPECT_TRUE(r->skipped.empty());
    std::printf("smoke test tp %d x pp %d: %d tokens as memorised in %.3f s\n", l.tp, l.pp, r->steps, r->seconds);
  }
}

TEST(SmokeTest, ARankComputingWrongResultsFailsIt) {
  for (int bad = 0; bad < 6; ++bad) {
    auto r = smoke(6, 1, bad);
    ASSERT_FALSE(r.ok()) << "cpu:" << bad << " corrupt, yet the smoke test passed";
    EXPECT_EQ(r.status().code(), StatusCode::kFailedPrecondition);
    const std::string m = r.status().message();
    EXPECT_NE(m.find("smoke test: the bundled model through tp 6 x pp 1 on cpu:0"), std::string::npos) << m;
    EXPECT_NE(m.find("at step "), std::string::npos) << m;
    EXPECT_NE(m.find("where its text has "), std::string::npos) << m;
  }
  auto pipeline = smoke(3, 2, 4);  // a rank of the second stage
  ASSERT_FALSE(pipeline.ok());
  EXPECT_NE(pipeline.status().message().find("tp 3 x pp 2"), std::string::npos) << pipeline.status().to_string();
}

TEST(SmokeTest, LayoutsBeyondTheBundledModelAreNotTestable) {
  hal::Backend& cpu = **backends::default_registry().find("cpu");
  hal::DeviceOptions o;
  o.set("threads", 1);
  auto g = create_device_group(cpu, 3, o);
  ASSERT_TRUE(g.ok());
  auto r = run_smoke_test(bundled(), cpu, g->devices, 1, 3);
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_EQ(r->steps, 0);
  EXPECT_EQ(r->skipped, "the bundled model has 14 heads and 2 layers; tp 1 x pp 3 needs more");
  auto missing = run_smoke_test("/nonexistent/memorise-f16.gguf", cpu, g->devices, 1, 1);
  EXPECT_FALSE(missing.ok());
}

}  // namespace
}  // namespace sx::engine
