// Added-token splitting (leftmost-longest with HF's single_word / lstrip / rstrip rules).
#include "runtime/tokenizer/added_tokens.h"

#include <algorithm>
#include <cstring>

#include "runtime/tokenizer/utf8.h"

namespace sx::tokenizer {
namespace {

bool ends_with_word(std::string_view s) {
  if (s.empty()) return false;
  std::size_t len;
  return utf8::is_word_char(utf8::decode_before(s, s.size(), &len));
}

bool starts_with_word(std::string_view s) {
  if (s.empty()) return false;
  std::size_t len;
  return utf8::is_word_char(utf8::decode_at(s, 0, &len));
}

// Start of the run of white space that ends `s` (s.size() if none).
std::size_t trailing_space_start(std::string_view s) {
  std::size_t end = s.size();
  while (end > 0) {
    std::size_t len;
    const char32_t cp = utf8::decode_before(s, end, &len);
    if (!utf8::is_white_space(cp)) break;
    end -= len;
  }
  return end;
}

// Length of the run of white space that starts `s`.
std::size_t leading_space_length(std::string_view s) {
  std::size_t i = 0;
  while (i < s.size()) {
    std::size_t len;
    const char32_t cp = utf8::decode_at(s, i, &len);
    if (!utf8::is_white_space(cp)) break;
    i += len;
  }
  return i;
}

}  // namespace

AddedTokenMatcher::AddedTokenMatcher(std::vector<AddedTokenPattern> patterns) {
  for (auto& p : patterns) {
    if (!p.content.empty()) patterns_.push_back(std::move(p));  // HF ignores empty tokens
  }
  for (std::uint32_t i = 0; i < patterns_.size(); ++i) {
    const auto b = static_cast<unsigned char>(patterns_[i].content[0]);
    by_first_byte_[b].push_back(i);
    is_first_byte_[b] = true;
  }
  for (auto& list : by_first_byte_) {
    // Longest first; among equal lengths the earlier pattern wins (stable).
    std::stable_sort(list.begin(), list.end(), [&](std::uint32_t a, std::uint32_t b) {
      return patterns_[a].content.size() > patterns_[b].content.size();
    });
  }
}

void AddedTokenMatcher::split(std::string_view text, bool parse_special, std::vector<Piece>& out) const {
  const std::size_t n = text.size();
  std::size_t start_offset = 0;  // end of the last emitted piece
  std::size_t i = 0;             // where the search for the next match resumes
  while (i < n) {
    if (!is_first_byte_[static_cast<unsigned char>(text[i])]) {
      ++i;
      continue;
    }
    const AddedTokenPattern* hit = nullptr;
    for (std::uint32_t idx : by_first_byte_[static_cast<unsigned char>(text[i])]) {
      const std::string& c = patterns_[idx].content;
      if (c.size() <= n - i && std::memcmp(text.data() + i, c.data(), c.size()) == 0) {
        hit = &patterns_[idx];
        break;
      }
    }
    if (hit == nullptr) {
      ++i;
      continue;
    }
    std::size_t start = i;
    std::size_t stop = i + hit->content.size();
    i = stop;  // like an Aho-Corasick iterator, a rejected match is still consumed
    if (hit->special && !parse_special) continue;
    if (hit->single_word) {
      const bool start_space = start == 0 || !ends_with_word(text.substr(0, start));
      const bool stop_space = stop == n || !starts_with_word(text.substr(stop));
      if (!start_space || !stop_space) continue;
    }
    if (hit->lstrip) start = std::max(trailing_space_start(text.substr(0, start)), start_offset);
    if (hit->rstrip) stop += leading_space_length(text.substr(stop));
    if (start_offset < start) out.push_back(Piece{text.substr(start_offset, start - start_offset), -1});
    out.push_back(Piece{text.substr(start, stop - start), hit->id});
    start_offset = stop;
    i = std::max(i, stop);
  }
  if (start_offset < n) out.push_back(Piece{text.substr(start_offset), -1});
}

}  // namespace sx::tokenizer
