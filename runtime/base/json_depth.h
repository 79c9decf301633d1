// Guards for JSON from files and requests: nlohmann parses iteratively but dump() (used in
// messages) recurses, so a small hostile file nested ~100k levels deep would overflow the stack,
// and a DOM of a few MiB of '[' costs hundreds of MiB. Every reader refuses text nested deeper
// than kMaxJsonDepth before parsing it (found by tests/fuzz); request readers also bound the
// number of values (json_shape).
// Pure; thread-safe.
#pragma once

#include <algorithm>
#include <cstddef>
#include <string_view>

namespace sx {

inline constexpr std::size_t kMaxJsonDepth = 128;

// The size of a JSON text's tree, found by a pass over its bytes before any parse: the deepest
// nesting of arrays and objects and the number of values (arrays, objects, and the members and
// elements they hold). Brackets and commas inside strings do not count: exact for valid JSON, a
// bound for anything else. A DOM parse costs memory in proportion to `values`, so a reader that
// bounds both never spends more than it allows, whatever the text.
struct JsonShape {
  std::size_t depth = 0;
  std::size_t values = 0;
};

// The same pass over text that arrives in pieces (an HTTP body as it is read): feed() each piece
// in order; shape() is the shape of everything fed so far, so a bound can be checked before the
// rest arrives.
class JsonShapeScanner {
 public:
  void feed(std::string_view text) {
    for (const char c : text) {
      if (escaped_) {
        escaped_ = false;
      } else if (in_string_) {
        if (c == '\\') {
          escaped_ = true;
        } else if (c == '"') {
          in_string_ = false;
        }
      } else if (c == '"') {
        in_string_ = true;
        any_ = true;
      } else if (c == '[' || c == '{') {
        ++containers_;
        max_depth_ = std::max(max_depth_, ++depth_);
      } else if ((c == ']' || c == '}') && depth_ > 0) {
        --depth_;
      } else if (c == ',') {
        ++commas_;
      } else if (c != ' ' && c != '\t' && c != '\n' && c != '\r') {
        any_ = true;
      }
    }
  }
  JsonShape shape() const {
    // Every comma separates one more value; each container holds at least one or is empty.
    return {max_depth_, containers_ + commas_ + ((any_ || containers_ > 0) ? 1 : 0)};
  }

 private:
  std::size_t depth_ = 0, max_depth_ = 0, commas_ = 0, containers_ = 0;
  bool in_string_ = false, escaped_ = false, any_ = false;
};

inline JsonShape json_shape(std::string_view text) {
  JsonShapeScanner scanner;
  scanner.feed(text);
  return scanner.shape();
}

inline std::size_t json_nesting_depth(std::string_view text) { return json_shape(text).depth; }

}  // namespace sx
