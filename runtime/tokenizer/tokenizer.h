// The tokenizer: Qwen2-family byte-level BPE with added/special tokens, built from what a model
// file says (TokenizerData, e.g. from GGUF) or from a Hugging Face tokenizer.json. Encodes text to
// ids exactly as Hugging Face `tokenizers` does for these models, and decodes ids back to bytes.
//
// Pipeline of encode(): invalid UTF-8 -> U+FFFD (Python errors='replace') -> split out added
// tokens on the raw text -> NFC -> regex pre-tokenizer ("Isolated") -> byte-level BPE per word.
//
// Lifetime: a Tokenizer owns everything it needs (its TokenizerData included); string_views it
// returns live as long as the Tokenizer. A StreamDecoder borrows its Tokenizer, which must outlive
// it.
// Threading: a Tokenizer is immutable after construction; every const method (encode and decode
// included) may be called from many threads at once. A StreamDecoder is single-threaded.
// Errors: construction returns a Status naming the file, field, token or merge at fault;
// encode/decode never fail (invalid input is replaced, unknown ids are skipped).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "runtime/base/status.h"

namespace sx::tokenizer {

// GGUF token types (tokenizer.ggml.token_type).
enum TokenType : std::int32_t {
  kTokenNormal = 1,
  kTokenUnknown = 2,
  kTokenControl = 3,      // special added token ("<|im_end|>"): skipped by decode(skip_special)
  kTokenUserDefined = 4,  // non-special added token: matched before BPE, always decoded
  kTokenUnused = 5,       // padding entries: never produced by encode, decode to nothing
  kTokenByte = 6,
};

// Hugging Face per-added-token flags (tokenizer.json "added_tokens"); GGUF has none (all false).
struct AddedTokenOptions {
  std::int32_t id = -1;
  bool single_word = false;
  bool lstrip = false;
  bool rstrip = false;
  bool normalized = false;  // matched on the NFC-normalised text instead of the raw text
};

// What a model file says about its tokenizer.
struct TokenizerData {
  std::vector<std::string> tokens;     // id -> token, GPT-2 byte-level form ("Ġthe"); added tokens
                                       // as their literal content ("<|im_start|>")
  std::vector<std::string> merges;     // "Ġ t" pairs, rank = index
  std::vector<std::int32_t> token_types;  // TokenType per id; empty = all normal. Types 3 and 4
                                          // are "added tokens" matched before BPE.
  std::string pre = "qwen2";           // pre-tokenizer name (GGUF tokenizer.ggml.pre)
  std::optional<std::int32_t> eos_id, bos_id, pad_id;
  bool add_bos = false;
  std::string chat_template;           // raw Jinja text if known (informational)

  // Set by from_hf_json; a GGUF loader leaves them at their defaults.
  std::string pre_regex;               // Oniguruma split pattern; empty = the pattern of `pre`
  bool normalize_nfc = true;           // Qwen tokenizer.json uses NFC; GGUF does not record it
  bool ignore_merges = false;          // HF BPE ignore_merges
  std::vector<AddedTokenOptions> added_token_options;  // by id; added tokens not listed: all false
};

class Tokenizer {
 public:
  // Validates (token types, unique token strings, merge pieces present, ids in range, supported
  // pre-tokenizer) and builds the lookup tables. Unknown `pre` -> UNIMPLEMENTED naming it.
  static Result<std::unique_ptr<Tokenizer>> from_data(TokenizerData data);
  // Reads a Hugging Face tokenizer.json and, if present in the same folder,
  // tokenizer_config.json (eos/bos/pad tokens, add_bos_token, chat_template). Errors name the
  // file and the field (NOT_FOUND for a missing file, INVALID_ARGUMENT for bad JSON or fields,
  // UNIMPLEMENTED for model/normalizer/pre-tokenizer kinds this runtime does not implement).
  static Result<std::unique_ptr<Tokenizer>> from_hf_json(const std::string& tokenizer_json_path);

  ~Tokenizer();
  Tokenizer(const Tokenizer&) = delete;
  Tokenizer& operator=(const Tokenizer&) = delete;

  // Text (any bytes; invalid UTF-8 is replaced) -> ids. parse_special = false treats special
  // (control) tokens as plain text; user-defined added tokens are still matched (as HF does).
  std::vector<std::int32_t> encode(std::string_view text, bool parse_special = true) const;
  // Appends to `out` instead of returning a new vector.
  void encode_into(std::string_view text, bool parse_special, std::vector<std::int32_t>& out) const;

  // Concatenated raw bytes of the tokens (not necessarily valid UTF-8 for a partial sequence);
  // special tokens emit their content unless skip_special; out-of-range ids are skipped.
  std::string decode(std::span<const std::int32_t> ids, bool skip_special = false) const;

  std::int32_t vocab_size() const;
  // Exact token string lookup ("<|im_end|>", "Ġthe").
  std::optional<std::int32_t> token_id(std::string_view token_text) const;
  // The token as stored (byte-level form); empty for an out-of-range id.
  std::string_view token_string(std::int32_t id) const;
  // Raw bytes of one token; empty for an out-of-range or unused id.
  std::string token_bytes(std::int32_t id) const;
  std::string_view token_bytes_view(std::int32_t id) const;
  // Control token (HF "special": true) - what decode(skip_special) drops.
  bool is_special(std::int32_t id) const;
  // Control or user-defined: matched before BPE.
  bool is_added(std::int32_t id) const;

  const TokenizerData& data() const;
  std::optional<std::int32_t> eos_id() const;
  std::optional<std::int32_t> bos_id() const;
  std::optional<std::int32_t> pad_id() const;
  bool add_bos() const;

 private:
  Tokenizer();
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// Incremental detokenizer for streaming: push ids one at a time, get back only complete UTF-8
// text. Concatenating every push() and the final flush() gives Python's
// `decode(ids).decode('utf-8', errors='replace')`: invalid bytes become U+FFFD, an incomplete
// sequence is held back until it completes (or until flush()).
class StreamDecoder {
 public:
  explicit StreamDecoder(const Tokenizer& tok, bool skip_special = false);
  // Returns the newly completed text (possibly empty).
  std::string push(std::int32_t id);
  // Whatever is left (an incomplete sequence becomes U+FFFD); the decoder is then empty.
  std::string flush();
  // Bytes held back waiting for the rest of a UTF-8 sequence.
  std::size_t pending_bytes() const { return pending_.size(); }

 private:
  const Tokenizer* tok_;
  bool skip_special_;
  std::string pending_;
};

}  // namespace sx::tokenizer
