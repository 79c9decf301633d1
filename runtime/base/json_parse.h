// nlohmann::json parsing that reports a syntax error without throwing. nlohmann's parse() either
// throws parse_error (whose message says where and why) or, with allow_exceptions = false, returns
// a discarded value and no reason. Readers of untrusted JSON want the reason, and an exception per
// malformed input is costly where inputs are hostile (thousands per second under a fuzzer or a
// flood of bad requests; under AddressSanitizer each one also sweeps its fake stacks). This builds
// the same document through nlohmann's SAX interface and keeps the message the exception would
// have carried, thrown by nobody. parse_json_within also bounds the tree (json_depth.h) before a
// byte is parsed: every JSON the server takes from a client or a model, wherever it sits (a body, a
// string field holding JSON, a tool call the model wrote), goes through it with the same limits,
// since a DOM nested 100,000 levels deep is parsed iteratively but dumped, destroyed and rendered
// recursively. Header-only; pure; thread-safe.
#pragma once

#include <cstddef>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "runtime/base/json_depth.h"

namespace sx {

template <class Json>
struct BasicJsonParse {
  Json value;          // the document when error is empty
  std::string error;   // nlohmann's message, e.g. "[json.exception.parse_error.101] parse error at ..."
  bool over_limits = false;  // parse_json_within refused the tree's size (error says which bound)
  bool ok() const { return error.empty(); }
};
using JsonParse = BasicJsonParse<nlohmann::json>;
using OrderedJsonParse = BasicJsonParse<nlohmann::ordered_json>;

// The largest tree a reader of untrusted JSON accepts: no request, schema or tool call nests more
// than a few levels (the HTTP body's defaults, daemon/openai/request.h ParseLimits).
struct JsonLimits {
  std::size_t max_depth = 32;
  std::size_t max_values = std::size_t{1} << 20;
};

namespace json_parse_detail {

// nlohmann's DOM builder without exceptions, keeping the first error's message. sax_parse calls
// the handler through its static type, so this parse_error is the one used.
template <class Json>
class DomBuilder : public nlohmann::detail::json_sax_dom_parser<Json> {
  using Base = nlohmann::detail::json_sax_dom_parser<Json>;

 public:
  DomBuilder(Json& root, bool reject_duplicate_keys)
      : Base(root, /*allow_exceptions=*/false), reject_duplicates_(reject_duplicate_keys) {}
  template <class Exception>
  bool parse_error(std::size_t position, const std::string& last_token, const Exception& ex) {
    if (error.empty()) error = ex.what();
    return Base::parse_error(position, last_token, ex);
  }
  // The keys of each open object, to refuse a repeated one (nlohmann keeps the last silently).
  bool start_object(std::size_t len) {
    if (reject_duplicates_) keys_.emplace_back();
    return Base::start_object(len);
  }
  bool end_object() {
    if (reject_duplicates_ && !keys_.empty()) keys_.pop_back();
    return Base::end_object();
  }
  bool key(typename Json::string_t& k) {
    if (reject_duplicates_ && !keys_.empty() && !keys_.back().insert(k).second) {
      if (error.empty()) error = "duplicate key \"" + k.substr(0, 100) + "\" in an object";
      return false;
    }
    return Base::key(k);
  }
  std::string error;

 private:
  bool reject_duplicates_;
  std::vector<std::set<std::string>> keys_;
};

}  // namespace json_parse_detail

// Strict RFC 8259 JSON (one value, nothing after it but whitespace), as nlohmann::json::parse.
// With `reject_duplicate_keys`, an object that names a key twice is an error ("duplicate key
// \"cmd\" in an object") instead of the last one winning: for protocols where an ambiguous
// request must not be guessed at (the admin socket).
template <class Json = nlohmann::json>
BasicJsonParse<Json> parse_json(std::string_view text, bool reject_duplicate_keys = false) {
  BasicJsonParse<Json> out;
  json_parse_detail::DomBuilder<Json> builder(out.value, reject_duplicate_keys);
  const bool ok = Json::sax_parse(text.begin(), text.end(), &builder);
  if (!ok || builder.is_errored() || !builder.error.empty()) {
    out.error = builder.error.empty() ? std::string("invalid JSON") : std::move(builder.error);
    out.value = Json();
  }
  return out;
}

// parse_json for text from a client or a model: refused, before it is parsed, when it nests
// deeper than limits.max_depth or holds more than limits.max_values values ("nests JSON 100000
// levels deep; at most 32 are accepted").
template <class Json = nlohmann::json>
BasicJsonParse<Json> parse_json_within(std::string_view text, const JsonLimits& limits) {
  const JsonShape shape = json_shape(text);
  if (shape.depth > limits.max_depth) {
    return {Json(), fmt::format("nests JSON {} levels deep; at most {} are accepted", shape.depth, limits.max_depth),
            true};
  }
  if (shape.values > limits.max_values) {
    return {Json(), fmt::format("holds {} JSON values; at most {} are accepted", shape.values, limits.max_values),
            true};
  }
  return parse_json<Json>(text);
}

}  // namespace sx
