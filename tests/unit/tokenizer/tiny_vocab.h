// Test helper: a hand-made byte-level vocabulary (ids 0..255 are the single bytes, in byte order),
// followed by merged tokens and added tokens, for small BPE cases with known answers.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "runtime/tokenizer/byte_level.h"
#include "runtime/tokenizer/tokenizer.h"

namespace sx::tokenizer::testing {

// `merges` are written with raw bytes ("a b"); a space inside a piece is written as "Ġ" by the
// caller if needed. Merged tokens get ids 256, 257, ... in merge order.
inline TokenizerData tiny_data(const std::vector<std::pair<std::string, std::string>>& merges,
                               const std::vector<std::pair<std::string, TokenType>>& added = {}) {
  TokenizerData d;
  for (int b = 0; b < 256; ++b) d.tokens.push_back(byte_level::encode(std::string(1, static_cast<char>(b))));
  d.token_types.assign(256, kTokenNormal);
  for (const auto& [l, r] : merges) {
    const std::string left = byte_level::encode(l);
    const std::string right = byte_level::encode(r);
    d.merges.push_back(left + " " + right);
    const std::string joined = left + right;
    bool present = false;
    for (const auto& t : d.tokens) present = present || t == joined;
    if (!present) {
      d.tokens.push_back(joined);
      d.token_types.push_back(kTokenNormal);
    }
  }
  for (const auto& [text, type] : added) {
    d.tokens.push_back(text);
    d.token_types.push_back(type);
  }
  return d;
}

}  // namespace sx::tokenizer::testing
