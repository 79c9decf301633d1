// Tokenizer: validation of TokenizerData, the encode pipeline, decode and the stream decoder.
// (from_hf_json lives in hf_json_loader.cpp.)
#include "runtime/tokenizer/tokenizer.h"

#include "runtime/tokenizer/added_tokens.h"
#include "runtime/tokenizer/bpe.h"
#include "runtime/tokenizer/byte_level.h"
#include "runtime/tokenizer/pretokenizer.h"
#include "runtime/tokenizer/token_index.h"
#include "runtime/tokenizer/utf8.h"

namespace sx::tokenizer {

struct Tokenizer::Impl {
  TokenizerData data;
  std::vector<std::string> token_bytes;     // raw bytes per id
  std::vector<std::uint8_t> types;          // TokenType per id
  TokenIndex lookup;                        // over data.tokens
  std::unique_ptr<BpeModel> bpe;
  std::unique_ptr<RegexSplitter> splitter;
  AddedTokenMatcher raw_matcher;         // added tokens with normalized = false
  AddedTokenMatcher normalized_matcher;  // added tokens with normalized = true (matched after NFC)

  void encode_text(std::string_view text, std::vector<std::string_view>& words,
                   std::vector<std::int32_t>& out) const {
    words.clear();
    splitter->split(text, words);
    for (std::string_view w : words) bpe->encode_word(w, out);
  }
};

namespace {

// Raw bytes of one token: "<0xHH>" byte tokens are that byte; otherwise the byte-level decoding,
// or the text itself when it has characters outside the byte-level alphabet (HF ByteLevel decoder).
std::string bytes_of_token(const std::string& text, std::int32_t type) {
  if (type == kTokenUnused) return {};
  if (type == kTokenByte && text.size() == 6 && text.starts_with("<0x") && text.back() == '>') {
    unsigned v = 0;
    bool ok = true;
    for (int k = 3; k < 5; ++k) {
      const char c = text[static_cast<std::size_t>(k)];
      v <<= 4;
      if (c >= '0' && c <= '9') v |= unsigned(c - '0');
      else if (c >= 'A' && c <= 'F') v |= unsigned(c - 'A' + 10);
      else if (c >= 'a' && c <= 'f') v |= unsigned(c - 'a' + 10);
      else ok = false;
    }
    if (ok) return std::string(1, static_cast<char>(v));
  }
  if (auto raw = byte_level::decode(text)) return std::move(*raw);
  return text;
}

}  // namespace

Tokenizer::Tokenizer() = default;
Tokenizer::~Tokenizer() = default;

Result<std::unique_ptr<Tokenizer>> Tokenizer::from_data(TokenizerData data) {
  auto impl = std::make_unique<Impl>();
  impl->data = std::move(data);
  const TokenizerData& d = impl->data;  // everything below refers into impl->data
  const std::size_t n = d.tokens.size();
  if (n == 0) return invalid_argument_error("tokenizer: the vocabulary is empty");
  if (n > static_cast<std::size_t>(INT32_MAX)) return invalid_argument_error("tokenizer: vocabulary too large ({})", n);
  if (!d.token_types.empty() && d.token_types.size() != n) {
    return invalid_argument_error("tokenizer: {} token types for {} tokens", d.token_types.size(), n);
  }
  impl->types.resize(n, static_cast<std::uint8_t>(kTokenNormal));
  for (std::size_t i = 0; i < d.token_types.size(); ++i) {
    const std::int32_t t = d.token_types[i];
    if (t < kTokenNormal || t > kTokenByte) {
      return invalid_argument_error("tokenizer: token {} ('{}') has type {}, not a GGUF token type (1..6)", i,
                                    d.tokens[i], t);
    }
    impl->types[i] = static_cast<std::uint8_t>(t);
  }
  auto check_id = [&](const std::optional<std::int32_t>& id, std::string_view what) -> Status {
    if (id && (*id < 0 || static_cast<std::size_t>(*id) >= n)) {
      return invalid_argument_error("tokenizer: {} id {} is outside the vocabulary (size {})", what, *id, n);
    }
    return ok_status();
  };
  SX_RETURN_IF_ERROR(check_id(d.eos_id, "eos"));
  SX_RETURN_IF_ERROR(check_id(d.bos_id, "bos"));
  SX_RETURN_IF_ERROR(check_id(d.pad_id, "pad"));

  // Pre-tokenizer.
  std::string_view pattern = d.pre_regex;
  if (pattern.empty()) {
    pattern = pre_tokenizer_pattern(d.pre);
    if (pattern.empty()) {
      return unimplemented_error("tokenizer: pre-tokenizer '{}' is not supported (supported: {})", d.pre,
                                 known_pre_tokenizers());
    }
  }
  auto splitter = RegexSplitter::create(pattern);
  if (!splitter.ok()) return splitter.status().with_context("tokenizer: pre-tokenizer");
  impl->splitter = std::move(splitter).value();

  // Lookup table and uniqueness (unused padding entries may repeat; the first one wins).
  impl->lookup = TokenIndex(d.tokens);
  for (std::size_t i = 0; i < n; ++i) {
    const auto id = static_cast<std::int32_t>(i);
    const std::int32_t prev = impl->lookup.insert(id);
    if (prev < 0) continue;
    const bool prev_unused = impl->types[static_cast<std::size_t>(prev)] == kTokenUnused;
    const bool this_unused = impl->types[i] == kTokenUnused;
    if (!prev_unused && !this_unused) {
      return invalid_argument_error("tokenizer: tokens {} and {} are both '{}'", prev, i, d.tokens[i]);
    }
    if (prev_unused && !this_unused) impl->lookup.replace(id);
  }
  impl->token_bytes.resize(n);
  for (std::size_t i = 0; i < n; ++i) impl->token_bytes[i] = bytes_of_token(d.tokens[i], impl->types[i]);

  // Added tokens.
  std::vector<const AddedTokenOptions*> options(n, nullptr);
  for (const AddedTokenOptions& o : d.added_token_options) {
    if (o.id < 0 || static_cast<std::size_t>(o.id) >= n) {
      return invalid_argument_error("tokenizer: added-token options for id {}, outside the vocabulary", o.id);
    }
    const std::uint8_t t = impl->types[static_cast<std::size_t>(o.id)];
    if (t != kTokenControl && t != kTokenUserDefined) {
      return invalid_argument_error("tokenizer: added-token options for token {} ('{}'), which is not an added token",
                                    o.id, d.tokens[static_cast<std::size_t>(o.id)]);
    }
    options[static_cast<std::size_t>(o.id)] = &o;
  }
  std::vector<AddedTokenPattern> raw_patterns, normalized_patterns;
  for (std::size_t i = 0; i < n; ++i) {
    const std::uint8_t t = impl->types[i];
    if (t != kTokenControl && t != kTokenUserDefined) continue;
    AddedTokenPattern p;
    p.id = static_cast<std::int32_t>(i);
    p.content = d.tokens[i];
    p.special = t == kTokenControl;
    bool normalized = false;
    if (const AddedTokenOptions* o = options[i]) {
      p.single_word = o->single_word;
      p.lstrip = o->lstrip;
      p.rstrip = o->rstrip;
      normalized = o->normalized;
    }
    if (normalized) {
      if (d.normalize_nfc) {
        if (!utf8::is_valid(p.content)) {
          return invalid_argument_error("tokenizer: added token {} is not valid UTF-8", i);
        }
        p.content = utf8::nfc(p.content);
      }
      normalized_patterns.push_back(std::move(p));
    } else {
      raw_patterns.push_back(std::move(p));
    }
  }
  impl->raw_matcher = AddedTokenMatcher(std::move(raw_patterns));
  impl->normalized_matcher = AddedTokenMatcher(std::move(normalized_patterns));

  // BPE model.
  std::vector<std::uint8_t> in_model(n);
  for (std::size_t i = 0; i < n; ++i) {
    const std::uint8_t t = impl->types[i];
    in_model[i] = t == kTokenNormal || t == kTokenUnknown || t == kTokenByte;
  }
  BpeModel::Options bpe_options;
  bpe_options.ignore_merges = d.ignore_merges;
  auto bpe = BpeModel::create(d.tokens, impl->token_bytes, in_model, impl->lookup, d.merges, bpe_options);
  if (!bpe.ok()) return bpe.status().with_context("tokenizer");
  impl->bpe = std::move(bpe).value();

  std::unique_ptr<Tokenizer> tok(new Tokenizer());
  tok->impl_ = std::move(impl);
  return tok;
}

void Tokenizer::encode_into(std::string_view text, bool parse_special, std::vector<std::int32_t>& out) const {
  const Impl& m = *impl_;
  std::string sanitized;
  if (!utf8::is_valid(text)) {
    sanitized = utf8::replace_invalid(text);
    text = sanitized;
  }
  if (out.empty()) out.reserve(text.size() / 4 + 8);  // (not when appending: avoid regrowth per call)
  std::vector<AddedTokenMatcher::Piece> pieces;
  if (m.raw_matcher.empty()) {
    if (!text.empty()) pieces.push_back({text, -1});
  } else {
    m.raw_matcher.split(text, parse_special, pieces);
  }
  std::vector<std::string_view> words;
  std::vector<AddedTokenMatcher::Piece> inner;
  std::string normalized;
  for (const AddedTokenMatcher::Piece& piece : pieces) {
    if (piece.id >= 0) {
      out.push_back(piece.id);
      continue;
    }
    std::string_view t = piece.text;
    if (m.data.normalize_nfc && utf8::may_need_nfc(t)) {
      normalized = utf8::nfc(t);
      t = normalized;
    }
    if (m.normalized_matcher.empty()) {
      m.encode_text(t, words, out);
      continue;
    }
    inner.clear();
    m.normalized_matcher.split(t, parse_special, inner);
    for (const AddedTokenMatcher::Piece& p : inner) {
      if (p.id >= 0) {
        out.push_back(p.id);
      } else {
        m.encode_text(p.text, words, out);
      }
    }
  }
}

std::vector<std::int32_t> Tokenizer::encode(std::string_view text, bool parse_special) const {
  std::vector<std::int32_t> ids;
  encode_into(text, parse_special, ids);
  return ids;
}

std::string Tokenizer::decode(std::span<const std::int32_t> ids, bool skip_special) const {
  std::string out;
  for (std::int32_t id : ids) {
    if (id < 0 || id >= vocab_size()) continue;
    if (skip_special && is_special(id)) continue;
    out += impl_->token_bytes[static_cast<std::size_t>(id)];
  }
  return out;
}

std::int32_t Tokenizer::vocab_size() const { return static_cast<std::int32_t>(impl_->data.tokens.size()); }

std::optional<std::int32_t> Tokenizer::token_id(std::string_view token_text) const {
  const std::int32_t id = impl_->lookup.find(token_text);
  if (id < 0) return std::nullopt;
  return id;
}

std::string_view Tokenizer::token_string(std::int32_t id) const {
  if (id < 0 || id >= vocab_size()) return {};
  return impl_->data.tokens[static_cast<std::size_t>(id)];
}

std::string_view Tokenizer::token_bytes_view(std::int32_t id) const {
  if (id < 0 || id >= vocab_size()) return {};
  return impl_->token_bytes[static_cast<std::size_t>(id)];
}

std::string Tokenizer::token_bytes(std::int32_t id) const { return std::string(token_bytes_view(id)); }

bool Tokenizer::is_special(std::int32_t id) const {
  return id >= 0 && id < vocab_size() && impl_->types[static_cast<std::size_t>(id)] == kTokenControl;
}

bool Tokenizer::is_added(std::int32_t id) const {
  if (id < 0 || id >= vocab_size()) return false;
  const std::uint8_t t = impl_->types[static_cast<std::size_t>(id)];
  return t == kTokenControl || t == kTokenUserDefined;
}

const TokenizerData& Tokenizer::data() const { return impl_->data; }
std::optional<std::int32_t> Tokenizer::eos_id() const { return impl_->data.eos_id; }
std::optional<std::int32_t> Tokenizer::bos_id() const { return impl_->data.bos_id; }
std::optional<std::int32_t> Tokenizer::pad_id() const { return impl_->data.pad_id; }
bool Tokenizer::add_bos() const { return impl_->data.add_bos; }

StreamDecoder::StreamDecoder(const Tokenizer& tok, bool skip_special) : tok_(&tok), skip_special_(skip_special) {}

std::string StreamDecoder::push(std::int32_t id) {
  if (skip_special_ && tok_->is_special(id)) return {};
  pending_ += tok_->token_bytes_view(id);
  std::string out;
  const std::size_t used = utf8::append_replacing_invalid(out, pending_, /*final=*/false);
  pending_.erase(0, used);
  return out;
}

std::string StreamDecoder::flush() {
  std::string out;
  utf8::append_replacing_invalid(out, pending_, /*final=*/true);
  pending_.clear();
  return out;
}

}  // namespace sx::tokenizer
