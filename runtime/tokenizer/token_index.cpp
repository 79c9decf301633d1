// Open-addressing token text -> id table (linear probing, power-of-two size, hash tags).
#include "runtime/tokenizer/token_index.h"

namespace sx::tokenizer {

TokenIndex::TokenIndex(const std::vector<std::string>& tokens) : tokens_(&tokens) {
  std::size_t cap = 16;
  while (cap < tokens.size() * 2 + 2) cap <<= 1;  // load factor <= 0.5
  slots_.assign(cap, 0);
  mask_ = cap - 1;
}

std::uint64_t hash_string(std::string_view s) {
  std::uint64_t h = 0xcbf29ce484222325ull;
  for (unsigned char c : s) {
    h ^= c;
    h *= 0x100000001b3ull;
  }
  h ^= h >> 29;
  h *= 0xbf58476d1ce4e5b9ull;
  h ^= h >> 32;
  return h;
}

std::size_t TokenIndex::probe(std::string_view text, std::uint64_t h) const {
  const std::uint64_t tag = h >> 32;
  std::size_t i = static_cast<std::size_t>(h) & mask_;
  while (true) {
    const std::uint64_t s = slots_[i];
    if (s == 0) return i;
    if ((s >> 32) == tag) {
      const auto id = static_cast<std::size_t>((s & 0xffffffffu) - 1);
      if ((*tokens_)[id] == text) return i;
    }
    i = (i + 1) & mask_;
  }
}

std::int32_t TokenIndex::insert(std::int32_t id) {
  const std::string& text = (*tokens_)[static_cast<std::size_t>(id)];
  const std::uint64_t h = hash_string(text);
  const std::size_t i = probe(text, h);
  if (slots_[i] != 0) return static_cast<std::int32_t>((slots_[i] & 0xffffffffu) - 1);
  slots_[i] = ((h >> 32) << 32) | (static_cast<std::uint64_t>(id) + 1);
  return -1;
}

void TokenIndex::replace(std::int32_t id) {
  const std::string& text = (*tokens_)[static_cast<std::size_t>(id)];
  const std::uint64_t h = hash_string(text);
  const std::size_t i = probe(text, h);
  slots_[i] = ((h >> 32) << 32) | (static_cast<std::uint64_t>(id) + 1);
}

std::int32_t TokenIndex::find(std::string_view text) const {
  if (slots_.empty()) return -1;
  const std::size_t i = probe(text, hash_string(text));
  const std::uint64_t s = slots_[i];
  return s == 0 ? -1 : static_cast<std::int32_t>((s & 0xffffffffu) - 1);
}

}  // namespace sx::tokenizer
