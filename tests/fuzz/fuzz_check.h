// Shared by the fuzz targets: FUZZ_CHECK aborts with a message when an invariant the parsers
// promise does not hold (active in every build type, unlike assert), so libFuzzer and the replay
// driver both report it as a crash.
#pragma once

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <span>

#define FUZZ_CHECK(cond)                                                                   \
  do {                                                                                     \
    if (!(cond)) {                                                                         \
      std::fprintf(stderr, "%s:%d: fuzz invariant failed: %s\n", __FILE__, __LINE__, #cond); \
      std::abort();                                                                        \
    }                                                                                      \
  } while (0)

namespace sx::fuzz {

// `inner` lies entirely inside `outer` (an empty span anywhere inside or at the end is fine).
inline bool span_inside(std::span<const unsigned char> inner, std::span<const unsigned char> outer) {
  if (inner.empty()) return true;
  const auto in = reinterpret_cast<std::uintptr_t>(inner.data());
  const auto out = reinterpret_cast<std::uintptr_t>(outer.data());
  return in >= out && in - out <= outer.size() && inner.size() <= outer.size() - (in - out);
}

}  // namespace sx::fuzz
