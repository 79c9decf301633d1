// A guard for JSON read from files: nlohmann parses iteratively but dump() (used in messages)
// recurses, so a small hostile file nested ~100k levels deep would overflow the stack. Every
// reader refuses text nested deeper than kMaxJsonDepth before parsing it (found by tests/fuzz).
// Pure; thread-safe.
#pragma once

#include <algorithm>
#include <cstddef>
#include <string_view>

namespace sx {

inline constexpr std::size_t kMaxJsonDepth = 128;

// Deepest nesting of arrays and objects in JSON text; brackets inside strings do not count (exact
// for valid JSON, a bound for anything else).
inline std::size_t json_nesting_depth(std::string_view text) {
  std::size_t depth = 0, max_depth = 0;
  bool in_string = false;
  for (std::size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (in_string) {
      if (c == '\\') {
        ++i;
      } else if (c == '"') {
        in_string = false;
      }
    } else if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      max_depth = std::max(max_depth, ++depth);
    } else if ((c == ']' || c == '}') && depth > 0) {
      --depth;
    }
  }
  return max_depth;
}

}  // namespace sx
