// FNV-1a, 64 bits: a fast, non-cryptographic hash of bytes fed in pieces (identities and salts,
// e.g. the prefix cache's; never for anything an adversary could choose to collide).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>
#include <type_traits>

namespace sx {

inline constexpr std::uint64_t kFnvOffset = 0xcbf29ce484222325ull;
inline constexpr std::uint64_t kFnvPrime = 0x100000001b3ull;

struct Fnv1a {
  std::uint64_t value = kFnvOffset;
  Fnv1a& add(const void* data, std::size_t n) {
    const auto* p = static_cast<const unsigned char*>(data);
    for (std::size_t i = 0; i < n; ++i) value = (value ^ p[i]) * kFnvPrime;
    return *this;
  }
  Fnv1a& add(std::string_view s) { return add(s.data(), s.size()); }
  template <typename T>
    requires std::is_trivially_copyable_v<T> && (!std::is_pointer_v<T>)
  Fnv1a& add_value(const T& v) {
    return add(&v, sizeof(T));
  }
};

}  // namespace sx
