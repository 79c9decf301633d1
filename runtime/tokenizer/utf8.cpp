// UTF-8 helpers: Python-compatible invalid-byte replacement, NFC via utf8proc, Unicode properties.
#include "runtime/tokenizer/utf8.h"

#include <cstdlib>
#include <cstring>

#include <utf8proc.h>

#include "runtime/tokenizer/unicode_age.h"

namespace sx::tokenizer::utf8 {
namespace {

// For a lead byte: number of continuation bytes and the allowed range of the first one
// (Unicode Table 3-7, "well-formed UTF-8 byte sequences"). need == -1: not a lead byte.
struct LeadInfo {
  int need;
  std::uint8_t lo;
  std::uint8_t hi;
};

inline LeadInfo lead_info(std::uint8_t b) {
  if (b >= 0xC2 && b <= 0xDF) return {1, 0x80, 0xBF};
  if (b == 0xE0) return {2, 0xA0, 0xBF};
  if ((b >= 0xE1 && b <= 0xEC) || b == 0xEE || b == 0xEF) return {2, 0x80, 0xBF};
  if (b == 0xED) return {2, 0x80, 0x9F};
  if (b == 0xF0) return {3, 0x90, 0xBF};
  if (b >= 0xF1 && b <= 0xF3) return {3, 0x80, 0xBF};
  if (b == 0xF4) return {3, 0x80, 0x8F};
  return {-1, 0, 0};
}

enum class SeqKind { kValid, kInvalid, kTruncated };

// Classifies the sequence at s[i] (s[i] >= 0x80). `end` receives the end of the valid sequence,
// or of the maximal invalid subpart (at least i + 1).
inline SeqKind classify(std::string_view s, std::size_t i, std::size_t* end) {
  const auto* p = reinterpret_cast<const std::uint8_t*>(s.data());
  const LeadInfo info = lead_info(p[i]);
  if (info.need < 0) {
    *end = i + 1;
    return SeqKind::kInvalid;
  }
  std::size_t j = i + 1;
  for (int k = 0; k < info.need; ++k, ++j) {
    if (j >= s.size()) {
      *end = j;
      return SeqKind::kTruncated;
    }
    const std::uint8_t lo = k == 0 ? info.lo : 0x80;
    const std::uint8_t hi = k == 0 ? info.hi : 0xBF;
    if (p[j] < lo || p[j] > hi) {
      *end = j;
      return SeqKind::kInvalid;
    }
  }
  *end = j;
  return SeqKind::kValid;
}

}  // namespace

bool is_valid(std::string_view s) {
  const auto* p = reinterpret_cast<const std::uint8_t*>(s.data());
  std::size_t i = 0;
  const std::size_t n = s.size();
  while (i < n) {
    // Skip ASCII eight bytes at a time.
    while (i + 8 <= n) {
      std::uint64_t w;
      std::memcpy(&w, p + i, 8);
      if (w & 0x8080808080808080ull) break;
      i += 8;
    }
    if (i >= n) break;
    if (p[i] < 0x80) {
      ++i;
      continue;
    }
    std::size_t end;
    if (classify(s, i, &end) != SeqKind::kValid) return false;
    i = end;
  }
  return true;
}

std::size_t append_replacing_invalid(std::string& out, std::string_view s, bool final) {
  const auto* p = reinterpret_cast<const std::uint8_t*>(s.data());
  std::size_t i = 0;
  std::size_t run_start = 0;  // start of the pending run of valid bytes
  const std::size_t n = s.size();
  while (i < n) {
    if (p[i] < 0x80) {
      ++i;
      continue;
    }
    std::size_t end;
    const SeqKind kind = classify(s, i, &end);
    if (kind == SeqKind::kValid) {
      i = end;
      continue;
    }
    out.append(s.data() + run_start, i - run_start);
    if (kind == SeqKind::kTruncated && !final) return i;  // keep the incomplete tail for later
    out.append(kReplacement);
    i = end;  // the offending byte (if any) is examined again as a new sequence start
    run_start = i;
  }
  out.append(s.data() + run_start, n - run_start);
  return n;
}

std::string replace_invalid(std::string_view s) {
  std::string out;
  out.reserve(s.size() + 8);
  append_replacing_invalid(out, s, /*final=*/true);
  return out;
}

char32_t decode_at(std::string_view s, std::size_t i, std::size_t* len) {
  const auto* p = reinterpret_cast<const std::uint8_t*>(s.data());
  const std::uint8_t b = p[i];
  if (b < 0x80) {
    *len = 1;
    return b;
  }
  if (b < 0xE0) {
    *len = 2;
    return (char32_t(b & 0x1F) << 6) | (p[i + 1] & 0x3F);
  }
  if (b < 0xF0) {
    *len = 3;
    return (char32_t(b & 0x0F) << 12) | (char32_t(p[i + 1] & 0x3F) << 6) | (p[i + 2] & 0x3F);
  }
  *len = 4;
  return (char32_t(b & 0x07) << 18) | (char32_t(p[i + 1] & 0x3F) << 12) |
         (char32_t(p[i + 2] & 0x3F) << 6) | (p[i + 3] & 0x3F);
}

char32_t decode_before(std::string_view s, std::size_t end, std::size_t* len) {
  const auto* p = reinterpret_cast<const std::uint8_t*>(s.data());
  std::size_t start = end - 1;
  while (start > 0 && (p[start] & 0xC0) == 0x80) --start;
  return decode_at(s, start, len);
}

void append_code_point(std::string& out, char32_t cp) {
  if (cp < 0x80) {
    out.push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out.push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out.push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out.push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

bool may_need_nfc(std::string_view s) {
  // Code points below U+0300 are encoded with lead bytes below 0xCC; none of them has a canonical
  // decomposition that differs from its composition, and nothing composes without a code point
  // at or above U+0300 (combining marks, Hangul jamo, ...).
  for (unsigned char c : s) {
    if (c >= 0xCC) return true;
  }
  return false;
}

namespace {

std::string utf8proc_nfc(std::string_view s) {
  if (!may_need_nfc(s)) return std::string(s);
  utf8proc_uint8_t* dst = nullptr;
  const utf8proc_ssize_t n = utf8proc_map(reinterpret_cast<const utf8proc_uint8_t*>(s.data()),
                                          static_cast<utf8proc_ssize_t>(s.size()), &dst,
                                          static_cast<utf8proc_option_t>(UTF8PROC_STABLE | UTF8PROC_COMPOSE));
  if (n < 0) {
    // Only possible for invalid UTF-8 or out of memory; callers pass valid text.
    std::free(dst);
    return std::string(s);
  }
  std::string out(reinterpret_cast<const char*>(dst), static_cast<std::size_t>(n));
  std::free(dst);
  return out;
}

}  // namespace

std::string nfc(std::string_view s) {
  if (!may_need_nfc(s)) return std::string(s);
  // Code points assigned after Unicode 9.0 are inert for the reference (see unicode_age.h): a
  // starter that never composes is a normalisation barrier, so NFC(a x b) == NFC(a) x NFC(b).
  std::string out;
  std::size_t segment = 0;
  std::size_t i = 0;
  while (i < s.size()) {
    const auto b = static_cast<unsigned char>(s[i]);
    if (b < 0xCC) {  // below U+0300 (or a continuation byte of one)
      ++i;
      continue;
    }
    std::size_t len;
    const char32_t cp = decode_at(s, i, &len);
    if (!unicode_age::assigned_in_unicode_9(cp)) {
      out += utf8proc_nfc(s.substr(segment, i - segment));
      out.append(s.substr(i, len));
      segment = i + len;
    }
    i += len;
  }
  if (segment == 0) return utf8proc_nfc(s);
  out += utf8proc_nfc(s.substr(segment));
  return out;
}

bool is_white_space(char32_t cp) {
  switch (cp) {
    case 0x09: case 0x0A: case 0x0B: case 0x0C: case 0x0D: case 0x20: case 0x85: case 0xA0:
    case 0x1680: case 0x2028: case 0x2029: case 0x202F: case 0x205F: case 0x3000:
      return true;
    default:
      return cp >= 0x2000 && cp <= 0x200A;
  }
}

bool is_word_char(char32_t cp) {
  if (cp < 0x80) {
    return (cp >= '0' && cp <= '9') || (cp >= 'a' && cp <= 'z') || (cp >= 'A' && cp <= 'Z') ||
           cp == '_';
  }
  if (cp == 0x200C || cp == 0x200D) return true;  // Join_Control
  switch (utf8proc_category(static_cast<utf8proc_int32_t>(cp))) {
    case UTF8PROC_CATEGORY_LU: case UTF8PROC_CATEGORY_LL: case UTF8PROC_CATEGORY_LT:
    case UTF8PROC_CATEGORY_LM: case UTF8PROC_CATEGORY_LO: case UTF8PROC_CATEGORY_MN:
    case UTF8PROC_CATEGORY_MC: case UTF8PROC_CATEGORY_ME: case UTF8PROC_CATEGORY_ND:
    case UTF8PROC_CATEGORY_NL: case UTF8PROC_CATEGORY_PC:
      return true;
    default:
      return false;
  }
}

}  // namespace sx::tokenizer::utf8
