// GPT-2 byte-level alphabet: every byte 0..255 maps to one printable code point (bytes_to_unicode),
// so that byte-level BPE tokens are stored as text ("Ġthe" for " the").
//
// Threading: the tables are built at static-initialisation time and immutable; safe everywhere.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace sx::tokenizer::byte_level {

// The code point that stands for `b` (identity for printable Latin-1, 256+n for the rest).
char32_t byte_to_code_point(std::uint8_t b);
// The byte that `cp` stands for, if `cp` is in the byte-level alphabet.
std::optional<std::uint8_t> code_point_to_byte(char32_t cp);

// Raw bytes -> byte-level text ("\x20the" -> "Ġthe").
std::string encode(std::string_view bytes);
// Byte-level text -> raw bytes; nullopt if a character is outside the alphabet or `text` is not
// valid UTF-8.
std::optional<std::string> decode(std::string_view text);

}  // namespace sx::tokenizer::byte_level
