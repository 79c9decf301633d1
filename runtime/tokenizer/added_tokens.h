// Added-token splitting: finds added/special tokens ("<|im_start|>") in text before normalisation
// and pre-tokenisation, leftmost-longest, honouring the Hugging Face single_word / lstrip / rstrip
// flags, exactly as `tokenizers`' AddedVocabulary::find_matches does.
//
// Lifetime: pieces point into the caller's text. Threading: immutable after construction; split()
// is const and safe from many threads. Errors: none (construction input is validated by Tokenizer).
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace sx::tokenizer {

struct AddedTokenPattern {
  std::int32_t id = -1;
  std::string content;  // the text to match (already normalised for normalised tokens)
  bool special = false; // control token: not matched when parse_special is false
  bool single_word = false;
  bool lstrip = false;
  bool rstrip = false;
};

class AddedTokenMatcher {
 public:
  AddedTokenMatcher() = default;
  explicit AddedTokenMatcher(std::vector<AddedTokenPattern> patterns);

  bool empty() const { return patterns_.empty(); }

  struct Piece {
    std::string_view text;
    std::int32_t id;  // -1: plain text to be tokenised
  };
  // Appends the pieces of `text` to `out`: added tokens (id >= 0, text = the matched span incl.
  // stripped whitespace) and the plain-text gaps between them (never empty).
  void split(std::string_view text, bool parse_special, std::vector<Piece>& out) const;

 private:
  std::vector<AddedTokenPattern> patterns_;
  // For each first byte, the patterns starting with it, longest first.
  std::array<std::vector<std::uint32_t>, 256> by_first_byte_;
  std::array<bool, 256> is_first_byte_{};
};

}  // namespace sx::tokenizer
