// GPT-2 bytes_to_unicode mapping and its inverse.
#include "runtime/tokenizer/byte_level.h"

#include <array>

#include "runtime/tokenizer/utf8.h"

namespace sx::tokenizer::byte_level {
namespace {

struct Tables {
  std::array<char32_t, 256> to_cp{};
  std::array<std::int16_t, 512> from_cp{};  // every mapped code point is below 512
  std::array<std::string, 256> utf8{};      // to_cp[b] encoded as UTF-8
};

Tables build_tables() {
  Tables t;
  t.from_cp.fill(-1);
  auto printable = [](int b) {
    return (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
  };
  int next = 0;
  for (int b = 0; b < 256; ++b) {
    const char32_t cp = printable(b) ? static_cast<char32_t>(b) : static_cast<char32_t>(256 + next++);
    t.to_cp[b] = cp;
    t.from_cp[cp] = static_cast<std::int16_t>(b);
    utf8::append_code_point(t.utf8[b], cp);
  }
  return t;
}

const Tables& tables() {
  static const Tables t = build_tables();
  return t;
}

}  // namespace

char32_t byte_to_code_point(std::uint8_t b) { return tables().to_cp[b]; }

std::optional<std::uint8_t> code_point_to_byte(char32_t cp) {
  if (cp >= 512) return std::nullopt;
  const std::int16_t b = tables().from_cp[cp];
  if (b < 0) return std::nullopt;
  return static_cast<std::uint8_t>(b);
}

std::string encode(std::string_view bytes) {
  const Tables& t = tables();
  std::string out;
  out.reserve(bytes.size() * 2);
  for (unsigned char b : bytes) out += t.utf8[b];
  return out;
}

std::optional<std::string> decode(std::string_view text) {
  if (!utf8::is_valid(text)) return std::nullopt;
  std::string out;
  out.reserve(text.size());
  std::size_t i = 0;
  while (i < text.size()) {
    std::size_t len;
    const char32_t cp = utf8::decode_at(text, i, &len);
    const auto b = code_point_to_byte(cp);
    if (!b) return std::nullopt;
    out.push_back(static_cast<char>(*b));
    i += len;
  }
  return out;
}

}  // namespace sx::tokenizer::byte_level
