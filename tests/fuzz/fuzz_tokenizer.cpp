// Fuzz target: the tokenizer (runtime/tokenizer/tokenizer.h) with the real Qwen2.5 tokenizer.json
// (tests/data/qwen2.5-tokenizer, loaded once; $SX_FUZZ_TOKENIZER_JSON overrides the path) on
// arbitrary bytes as text, with and without special-token parsing (the latter only for text with
// a '<', where it can make a difference). Invariants (tokenizer.h, utf8.h):
// * every id is in 0..vocab_size-1; encoding is deterministic and encode_into appends exactly
//   what encode returns (compared on one input in eight: each encoding is a third of the time);
// * invalid UTF-8 is replaced first, as Python's errors='replace' does (restated below as the
//   maximal-subpart rule of Unicode Table 3-7 and compared with utf8::replace_invalid): so the
//   text the tokenizer sees is `clean`, which equals the input exactly when it is valid UTF-8;
// * decode(encode(text)) is valid UTF-8 with nfc(decode(...)) == nfc(clean), and equals `clean`
//   byte for byte when `clean` is already NFC (the normaliser is the only lossy step);
// * parse_special = false produces no special (control) id; parse_special = true produces one
//   special id per special token in `clean` (leftmost-longest among all added tokens), and
//   decode(..., skip_special) gives `clean` without them (up to NFC);
// * a StreamDecoder fed the ids one at a time (and any id sequence made from the input, negative
//   and out-of-range ids included) gives utf8-replaced decode(ids); unknown ids decode to nothing.
// Checked once at start-up: every added token's text encodes (with parse_special) to its own id
// alone.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "runtime/tokenizer/tokenizer.h"
#include "runtime/tokenizer/utf8.h"
#include "tests/fuzz/fuzz_check.h"

#ifndef SX_QWEN_TOKENIZER_DIR
#error "SX_QWEN_TOKENIZER_DIR must point at tests/data/qwen2.5-tokenizer"
#endif

namespace {

namespace tk = sx::tokenizer;

struct Added {
  std::string content;
  std::int32_t id;
  bool special;
};

struct State {
  std::unique_ptr<tk::Tokenizer> tok;
  std::vector<Added> added;  // longest first
};

State* load() {
  const char* env = std::getenv("SX_FUZZ_TOKENIZER_JSON");
  const std::string path = env != nullptr && env[0] != '\0' ? env : SX_QWEN_TOKENIZER_DIR "/tokenizer.json";
  auto tok = tk::Tokenizer::from_hf_json(path);
  if (!tok.ok()) {
    std::fprintf(stderr, "fuzz_tokenizer: cannot load %s: %s\n", path.c_str(), tok.status().to_string().c_str());
    std::exit(1);
  }
  auto* s = new State{std::move(tok).value(), {}};
  for (std::int32_t id = 0; id < s->tok->vocab_size(); ++id) {
    if (!s->tok->is_added(id)) continue;
    s->added.push_back({std::string(s->tok->token_string(id)), id, s->tok->is_special(id)});
    FUZZ_CHECK(s->added.back().content.starts_with('<'));  // (the '<' shortcut below relies on it)
    const std::vector<std::int32_t> alone = s->tok->encode(s->added.back().content, true);
    FUZZ_CHECK(alone.size() == 1 && alone[0] == id);
  }
  FUZZ_CHECK(!s->added.empty());
  std::stable_sort(s->added.begin(), s->added.end(),
                   [](const Added& a, const Added& b) { return a.content.size() > b.content.size(); });
  return s;
}

State& state() {
  static State* s = load();  // never freed: lives for the process
  return *s;
}

// Python's bytes.decode('utf-8', errors='replace'): a well-formed sequence (Unicode Table 3-7) is
// kept, each maximal ill-formed subpart becomes one U+FFFD.
std::string python_replace(std::string_view s) {
  std::string out;
  const auto* p = reinterpret_cast<const unsigned char*>(s.data());
  std::size_t i = 0;
  while (i < s.size()) {
    const unsigned b = p[i];
    if (b < 0x80) {
      out += static_cast<char>(b);
      ++i;
      continue;
    }
    int need = 0;
    unsigned lo = 0x80, hi = 0xBF;
    if (b >= 0xC2 && b <= 0xDF) need = 1;
    else if (b == 0xE0) need = 2, lo = 0xA0;
    else if ((b >= 0xE1 && b <= 0xEC) || b == 0xEE || b == 0xEF) need = 2;
    else if (b == 0xED) need = 2, hi = 0x9F;
    else if (b == 0xF0) need = 3, lo = 0x90;
    else if (b >= 0xF1 && b <= 0xF3) need = 3;
    else if (b == 0xF4) need = 3, hi = 0x8F;
    std::size_t j = i + 1;
    int got = 0;
    while (got < need && j < s.size() && p[j] >= (got == 0 ? lo : 0x80) && p[j] <= (got == 0 ? hi : 0xBF)) {
      ++j;
      ++got;
    }
    if (need > 0 && got == need) {
      out.append(s.substr(i, j - i));
    } else {
      out += tk::utf8::kReplacement;
    }
    i = j;
  }
  return out;
}

// `clean` with the special tokens that parse_special finds taken out, and how many there were.
std::string without_specials(const State& st, std::string_view clean, std::size_t* count) {
  std::string out;
  *count = 0;
  std::size_t i = 0;
  while (i < clean.size()) {
    // Every added token starts with '<' (checked at start-up): elsewhere none can match.
    const auto m = clean[i] != '<' ? st.added.end()
                                   : std::find_if(st.added.begin(), st.added.end(), [&](const Added& a) {
                                       return clean.substr(i).starts_with(a.content);
                                     });
    if (m == st.added.end()) {
      out += clean[i++];
      continue;
    }
    if (m->special) {
      ++*count;
    } else {
      out += m->content;
    }
    i += m->content.size();
  }
  return out;
}

std::string stream_decode(const tk::Tokenizer& tok, const std::vector<std::int32_t>& ids) {
  tk::StreamDecoder sd(tok);
  std::string out;
  for (std::int32_t id : ids) out += sd.push(id);
  out += sd.flush();
  FUZZ_CHECK(sd.pending_bytes() == 0);
  return out;
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  (void)state();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const State& st = state();
  const tk::Tokenizer& tok = *st.tok;
  const std::string_view text(reinterpret_cast<const char*>(data), size);

  const std::string clean = python_replace(text);
  FUZZ_CHECK(tk::utf8::replace_invalid(text) == clean);
  FUZZ_CHECK(tk::utf8::is_valid(text) == (clean == text));
  FUZZ_CHECK(tk::utf8::is_valid(clean));
  const std::string clean_nfc = tk::utf8::nfc(clean);

  // parse_special only changes what happens at a '<' (every added token starts with one, checked
  // at start-up): text without one is encoded once, which doubles the executions per second.
  const bool may_hold_added = clean.find('<') != std::string::npos;
  for (bool parse_special : {true, false}) {
    if (!parse_special && !may_hold_added) break;
    // encode_into appends to what the vector holds; encode (a wrapper of it) is compared on one
    // input in eight, since each encoding is a third of the time of an execution.
    std::vector<std::int32_t> appended{-7};
    tok.encode_into(text, parse_special, appended);
    FUZZ_CHECK(!appended.empty() && appended[0] == -7);
    const std::vector<std::int32_t> ids(appended.begin() + 1, appended.end());
    if (size % 8 == 0) FUZZ_CHECK(tok.encode(text, parse_special) == ids);
    std::size_t specials = 0;
    for (std::int32_t id : ids) {
      FUZZ_CHECK(id >= 0 && id < tok.vocab_size());
      if (tok.is_special(id)) ++specials;
    }
    const std::string decoded = tok.decode(ids);
    FUZZ_CHECK(tk::utf8::is_valid(decoded));
    FUZZ_CHECK(tk::utf8::nfc(decoded) == clean_nfc);
    if (clean_nfc == clean) FUZZ_CHECK(decoded == clean);
    FUZZ_CHECK(stream_decode(tok, ids) == decoded);
    if (!parse_special) {
      FUZZ_CHECK(specials == 0);
    } else {
      std::size_t expected_specials = 0;
      const std::string rest = without_specials(st, clean, &expected_specials);
      FUZZ_CHECK(specials == expected_specials);
      FUZZ_CHECK(tk::utf8::nfc(tok.decode(ids, /*skip_special=*/true)) == tk::utf8::nfc(rest));
    }
  }

  // Any id sequence: three bytes per id, spread over -32 .. vocab_size + 31.
  std::vector<std::int32_t> any_ids, known_ids;
  const std::int64_t span = std::int64_t{tok.vocab_size()} + 64;
  for (std::size_t i = 0; i + 3 <= size && any_ids.size() < 2048; i += 3) {
    const std::int64_t raw = data[i] | (data[i + 1] << 8) | (data[i + 2] << 16);
    const auto id = static_cast<std::int32_t>(raw % span - 32);
    any_ids.push_back(id);
    if (id >= 0 && id < tok.vocab_size()) known_ids.push_back(id);
  }
  const std::string raw_bytes = tok.decode(any_ids);
  FUZZ_CHECK(raw_bytes == tok.decode(known_ids));
  FUZZ_CHECK(stream_decode(tok, any_ids) == python_replace(raw_bytes));
  return 0;
}
