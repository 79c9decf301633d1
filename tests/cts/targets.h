// The backends the conformance suites (tests/cts, tests/ops) run on, by registry name with the
// device options of each mode. A new backend adds a line here and nothing to the tests.
#pragma once

#include <ostream>
#include <string>
#include <utility>
#include <vector>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "backends/registry.h"
#include "runtime/hal/registry.h"

namespace sx::hal::testing {

struct Target {
  const char* label;    // the test-name suffix: the backend, and its mode
  const char* backend;  // registry name
  std::vector<std::pair<const char*, const char*>> options;

  DeviceOptions device_options() const {
    DeviceOptions o;
    for (const auto& [k, v] : options) o.set(k, std::string(v));
    return o;
  }
};

inline void PrintTo(const Target& t, std::ostream* os) { *os << t.label; }

// Every backend by name; the CPU also in strict mode (device memory out of the host's reach, work
// run only at sync()), which is what catches a caller that relies on the host sharing memory.
inline const std::vector<Target>& targets() {
  static const std::vector<Target> kTargets = {
      {"cpu", "cpu", {{"threads", "2"}}},
      {"cpu_strict", "cpu", {{"threads", "1"}, {"strict", "true"}}},
      {"vulkan", "vulkan", {}},
      {"vulkan_subgroup", "vulkan", {{"matmul", "subgroup"}}},  // the variant GPUs take (lavapipe: not by default)
      {"cuda", "cuda", {}},
  };
  return kTargets;
}

// The target's backend when it can run a case needing `devices` devices here; else null with the
// reason (not compiled in, UNAVAILABLE, too few devices) in `why`.
inline Backend* usable_backend(const Target& t, int devices, std::string& why) {
  auto b = backends::default_registry().find(t.backend);
  if (!b.ok()) {
    why = b.status().to_string();
    return nullptr;
  }
  auto infos = (*b)->devices();
  if (!infos.ok()) {
    why = infos.status().to_string();
    return nullptr;
  }
  if (static_cast<int>(infos->size()) < devices) {
    why = fmt::format("backend '{}' has {} device(s), the case needs {}", t.backend, infos->size(), devices);
    return nullptr;
  }
  return *b;
}

inline std::string target_name(const ::testing::TestParamInfo<Target>& info) { return info.param.label; }

}  // namespace sx::hal::testing
