// Byte-level BPE model: turns one pre-tokenised word (raw bytes) into token ids by applying merges
// lowest rank first (leftmost on ties), exactly as Hugging Face `tokenizers` BPE does with no
// dropout, no unk token and no continuing-subword prefix.
//
// Lifetime: a BpeModel copies what it needs from its inputs; it does not keep pointers to them.
// Threading: encode_word() is const and safe from many threads at once; it uses an internal
// word cache (sharded, mutex-protected, bounded). Errors: create() reports INVALID_ARGUMENT naming
// the merge that refers to a piece missing from the vocabulary.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "runtime/base/status.h"
#include "runtime/tokenizer/token_index.h"

namespace sx::tokenizer {

class BpeModel {
 public:
  struct Options {
    bool ignore_merges = false;       // HF: a word that is itself a token skips the merges
    std::size_t cache_words = 1 << 15;  // cache slots (rounded up to a power of two); 0 disables it
  };

  // `tokens[id]`: byte-level token text; `token_bytes[id]`: its raw bytes; `in_model[id]`: whether
  // the token belongs to the BPE model (added/control/unused tokens do not); `index`: the
  // byte-level text -> id map over all tokens. `merges[rank]`: "left right".
  static Result<std::unique_ptr<BpeModel>> create(
      std::span<const std::string> tokens, std::span<const std::string> token_bytes,
      std::span<const std::uint8_t> in_model,
      const TokenIndex& index,
      std::span<const std::string> merges, Options options);
  ~BpeModel();

  // Appends the ids of `word` (raw bytes, already pre-tokenised) to `out`. Bytes whose byte-level
  // character is not a token are dropped (HF behaviour without an unk token).
  void encode_word(std::string_view word, std::vector<std::int32_t>& out) const;

  std::size_t merge_count() const;

 private:
  BpeModel();
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace sx::tokenizer
