// Pre-tokenizer: splits normalised text into words with a regex, keeping both the matches and the
// gaps between them (Hugging Face `Split` with behaviour "Isolated"). Patterns are written in the
// Oniguruma dialect that tokenizer.json uses; they are translated to PCRE2 (UTF + UCP, JIT when
// available) so that \s, \w and \h mean what Oniguruma means by them.
//
// Lifetime: a RegexSplitter owns its compiled pattern; pieces returned by split() point into the
// caller's text. Threading: split() is const and safe from many threads at once (each call uses
// its own match data). Errors: create() reports INVALID_ARGUMENT for a pattern PCRE2 rejects and
// UNIMPLEMENTED for Oniguruma constructs without a PCRE2 equivalent.
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "runtime/base/status.h"

namespace sx::tokenizer {

// The Qwen2 pre-tokenizer pattern (GGUF tokenizer.ggml.pre = "qwen2"; identical to the Split regex
// of Qwen2/Qwen2.5/Qwen3 tokenizer.json files).
inline constexpr std::string_view kQwen2Pattern =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

// The Qwen3.5 / 3.6 pre-tokenizer pattern (GGUF tokenizer.ggml.pre = "qwen35", as llama.cpp names
// it): Qwen2's with combining marks (\p{M}) joined to letter runs and left out of the punctuation
// class, so a Devanagari or Thai word, or a decomposed accent, stays one word.
inline constexpr std::string_view kQwen35Pattern =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

// The pattern of a GGUF pre-tokenizer name ("qwen2", "qwen35"), empty for a name Sextant does not
// know; and the name of a pattern (a tokenizer.json Split regex), empty for one without a name.
std::string_view pre_tokenizer_pattern(std::string_view name);
std::string_view pre_tokenizer_name(std::string_view pattern);
// The names pre_tokenizer_pattern knows, for messages: "qwen2, qwen35".
std::string_view known_pre_tokenizers();

// The GPT-2 pattern (tokenizer.json ByteLevel pre-tokenizer with use_regex = true).
inline constexpr std::string_view kGpt2Pattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

// Rewrites an Oniguruma pattern into PCRE2 syntax with the same meaning for the escapes whose
// meaning differs (\s = Unicode White_Space incl. U+0085, \w = L|M|Nd|Pc, \h = hex digit).
Result<std::string> oniguruma_to_pcre2(std::string_view pattern);

class RegexSplitter {
 public:
  static Result<std::unique_ptr<RegexSplitter>> create(std::string_view oniguruma_pattern);
  ~RegexSplitter();
  RegexSplitter(const RegexSplitter&) = delete;
  RegexSplitter& operator=(const RegexSplitter&) = delete;

  // Appends the pieces of `text` (valid UTF-8) to `out`: every match and every non-empty gap, in
  // order, covering the whole text. If PCRE2 fails at run time (resource limits), the rest of the
  // text becomes one piece.
  void split(std::string_view text, std::vector<std::string_view>& out) const;

  const std::string& pattern() const { return pcre2_pattern_; }
  bool jit() const { return jit_; }

 private:
  RegexSplitter() = default;
  struct Code;
  std::unique_ptr<Code> code_;
  std::string pcre2_pattern_;
  bool jit_ = false;
};

}  // namespace sx::tokenizer
