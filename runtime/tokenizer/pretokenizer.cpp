// Regex pre-tokenizer: Oniguruma -> PCRE2 pattern translation and the "Isolated" split loop.
#define PCRE2_CODE_UNIT_WIDTH 8
#include "runtime/tokenizer/pretokenizer.h"

#include <pcre2.h>

#include <algorithm>

#include "runtime/base/log.h"

namespace sx::tokenizer {
namespace {

// Unicode White_Space, the set Oniguruma's \s matches (PCRE2's \s lacks U+0085).
constexpr std::string_view kSpaceItems =
    R"(\t-\r \x{85}\x{A0}\x{1680}\x{2000}-\x{200A}\x{2028}\x{2029}\x{202F}\x{205F}\x{3000})";
// Oniguruma's Unicode \w: Letter | Mark | Decimal_Number | Connector_Punctuation.
constexpr std::string_view kWordItems = R"(\p{L}\p{M}\p{Nd}\p{Pc})";
constexpr std::string_view kHexItems = "0-9a-fA-F";

std::string pcre2_error_text(int code) {
  PCRE2_UCHAR buf[256];
  const int n = pcre2_get_error_message(code, buf, sizeof buf);
  if (n < 0) return fmt::format("PCRE2 error {}", code);
  return std::string(reinterpret_cast<const char*>(buf), static_cast<std::size_t>(n));
}

}  // namespace

namespace {

struct NamedPattern {
  std::string_view name, pattern;
};
constexpr NamedPattern kNamedPatterns[] = {{"qwen2", kQwen2Pattern}, {"qwen35", kQwen35Pattern}};

}  // namespace

std::string_view pre_tokenizer_pattern(std::string_view name) {
  for (const NamedPattern& p : kNamedPatterns) {
    if (p.name == name) return p.pattern;
  }
  return {};
}

std::string_view pre_tokenizer_name(std::string_view pattern) {
  for (const NamedPattern& p : kNamedPatterns) {
    if (p.pattern == pattern) return p.name;
  }
  return {};
}

std::string_view known_pre_tokenizers() { return "qwen2, qwen35"; }

Result<std::string> oniguruma_to_pcre2(std::string_view p) {
  std::string out;
  out.reserve(p.size() + 64);
  bool in_class = false;
  std::size_t i = 0;
  while (i < p.size()) {
    const char c = p[i];
    if (c == '\\') {
      if (i + 1 >= p.size()) return invalid_argument_error("regex ends with a lone backslash");
      const char e = p[i + 1];
      std::string_view items;
      bool negated = false;
      switch (e) {
        case 's': items = kSpaceItems; break;
        case 'S': items = kSpaceItems; negated = true; break;
        case 'w': items = kWordItems; break;
        case 'W': items = kWordItems; negated = true; break;
        case 'h': items = kHexItems; break;
        case 'H': items = kHexItems; negated = true; break;
        default: break;
      }
      if (items.empty()) {
        out.append(p.substr(i, 2));
      } else if (!in_class) {
        out += negated ? "[^" : "[";
        out.append(items);
        out += ']';
      } else if (!negated) {
        out.append(items);
      } else {
        return unimplemented_error("regex: negated class escape \\{} inside [...] has no PCRE2 equivalent", e);
      }
      i += 2;
      continue;
    }
    if (!in_class) {
      if (c == '[') {
        in_class = true;
        out += c;
        ++i;
        if (i < p.size() && p[i] == '^') out += p[i++];
        if (i < p.size() && p[i] == ']') out += p[i++];  // a leading ']' is literal
        continue;
      }
      out += c;
      ++i;
      continue;
    }
    // Inside a character class.
    if (c == ']') {
      in_class = false;
    } else if (c == '[') {
      if (i + 1 < p.size() && p[i + 1] == ':') {  // POSIX class [:alpha:]
        const std::size_t close = p.find(":]", i + 2);
        if (close == std::string_view::npos) return invalid_argument_error("regex: unterminated POSIX class");
        out.append(p.substr(i, close + 2 - i));
        i = close + 2;
        continue;
      }
      return unimplemented_error("regex: nested character classes are not supported");
    } else if (c == '&' && i + 1 < p.size() && p[i + 1] == '&') {
      return unimplemented_error("regex: class intersection '&&' is not supported");
    }
    out += c;
    ++i;
  }
  if (in_class) return invalid_argument_error("regex: unterminated character class");
  return out;
}

struct RegexSplitter::Code {
  pcre2_code* code = nullptr;
  ~Code() { pcre2_code_free(code); }
};

RegexSplitter::~RegexSplitter() = default;

Result<std::unique_ptr<RegexSplitter>> RegexSplitter::create(std::string_view oniguruma_pattern) {
  SX_ASSIGN_OR_RETURN(std::string translated, oniguruma_to_pcre2(oniguruma_pattern));
  int err = 0;
  PCRE2_SIZE err_off = 0;
  pcre2_code* code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(translated.data()), translated.size(),
                                   PCRE2_UTF | PCRE2_UCP, &err, &err_off, nullptr);
  if (code == nullptr) {
    return invalid_argument_error("pre-tokenizer regex does not compile at offset {}: {} (pattern: {})",
                                  err_off, pcre2_error_text(err), translated);
  }
  std::unique_ptr<RegexSplitter> s(new RegexSplitter());
  s->code_ = std::make_unique<Code>();
  s->code_->code = code;
  s->pcre2_pattern_ = std::move(translated);
  std::uint32_t jit_available = 0;
  pcre2_config(PCRE2_CONFIG_JIT, &jit_available);
  if (jit_available != 0) s->jit_ = pcre2_jit_compile(code, PCRE2_JIT_COMPLETE) == 0;
  return s;
}

void RegexSplitter::split(std::string_view text, std::vector<std::string_view>& out) const {
  if (text.empty()) return;
  pcre2_match_data* md = pcre2_match_data_create_from_pattern(code_->code, nullptr);
  if (md == nullptr) {  // out of memory: degrade to one piece rather than abort
    out.push_back(text);
    return;
  }
  const auto* subject = reinterpret_cast<PCRE2_SPTR>(text.data());
  const std::size_t n = text.size();
  std::size_t pos = 0;   // where the next search starts
  std::size_t last = 0;  // end of the last emitted piece
  while (pos < n) {
    int rc = pcre2_match(code_->code, subject, n, pos, PCRE2_NO_UTF_CHECK, md, nullptr);
    if (rc == PCRE2_ERROR_JIT_STACKLIMIT) {
      // Very long runs can exhaust the JIT stack; the interpreter keeps its frames on the heap.
      rc = pcre2_match(code_->code, subject, n, pos, PCRE2_NO_UTF_CHECK | PCRE2_NO_JIT, md, nullptr);
    }
    if (rc == PCRE2_ERROR_NOMATCH) break;
    if (rc < 0) {
      log_warn("tokenizer: regex match failed ({}); keeping the rest of the text as one piece",
               pcre2_error_text(rc));
      break;
    }
    const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(md);
    const std::size_t start = ov[0];
    const std::size_t end = ov[1];
    if (start > last) out.push_back(text.substr(last, start - last));
    if (end > start) {
      out.push_back(text.substr(start, end - start));
      last = end;
      pos = end;
    } else {
      // Empty match: step over one character; the gap logic picks it up later.
      last = std::max(last, start);
      pos = start + 1;
      while (pos < n && (static_cast<unsigned char>(text[pos]) & 0xC0) == 0x80) ++pos;
    }
  }
  if (last < n) out.push_back(text.substr(last));
  pcre2_match_data_free(md);
}

}  // namespace sx::tokenizer
