// UTF-8 helpers for the tokenizer: validation, Python-compatible U+FFFD replacement of invalid
// input, NFC normalisation (utf8proc) and the few Unicode properties the added-token matcher needs.
//
// Threading: pure functions, safe from any thread. Errors: none; invalid input is replaced, never
// rejected.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace sx::tokenizer::utf8 {

inline constexpr std::string_view kReplacement = "\xEF\xBF\xBD";  // U+FFFD

// True when `s` is well-formed UTF-8 (no surrogates, no overlongs, nothing above U+10FFFF).
bool is_valid(std::string_view s);

// Appends `s` to `out`, replacing each maximal invalid subpart with U+FFFD exactly as Python's
// `bytes.decode('utf-8', errors='replace')` does (b"\xe2\x82" -> one U+FFFD, b"\xf0\x80\x80" ->
// three). When `final` is false, a well-formed but truncated sequence at the very end is left
// unconsumed (for streaming). Returns the number of bytes of `s` consumed.
std::size_t append_replacing_invalid(std::string& out, std::string_view s, bool final = true);

// Python-style replacement of the whole string (see above).
std::string replace_invalid(std::string_view s);

// Decodes the code point at s[i] of a *valid* UTF-8 string; `len` receives its byte length.
char32_t decode_at(std::string_view s, std::size_t i, std::size_t* len);
// Decodes the code point that ends at s[end] (exclusive) of a valid UTF-8 string.
char32_t decode_before(std::string_view s, std::size_t end, std::size_t* len);

void append_code_point(std::string& out, char32_t cp);

// NFC of valid UTF-8 as Hugging Face `tokenizers` computes it: utf8proc (UTF8PROC_STABLE |
// UTF8PROC_COMPOSE), except that code points assigned after Unicode 9.0 are left inert, because
// the reference normalises with Unicode 9.0 tables (see unicode_age.h). Text whose code points
// are all below U+0300 is already NFC and is returned without calling utf8proc.
bool may_need_nfc(std::string_view s);
std::string nfc(std::string_view s);

// Unicode White_Space (Rust char::is_whitespace, Oniguruma and Rust-regex \s).
bool is_white_space(char32_t cp);
// Rust-regex \w: alphabetic, marks, decimal digits, connector punctuation, joiners.
bool is_word_char(char32_t cp);

}  // namespace sx::tokenizer::utf8
