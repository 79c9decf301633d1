// nlohmann::json parsing that reports a syntax error without throwing. nlohmann's parse() either
// throws parse_error (whose message says where and why) or, with allow_exceptions = false, returns
// a discarded value and no reason. Readers of untrusted JSON want the reason, and an exception per
// malformed input is costly where inputs are hostile (thousands per second under a fuzzer or a
// flood of bad requests; under AddressSanitizer each one also sweeps its fake stacks). This builds
// the same document through nlohmann's SAX interface and keeps the message the exception would
// have carried, thrown by nobody. Header-only; pure; thread-safe.
#pragma once

#include <cstddef>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

namespace sx {

struct JsonParse {
  nlohmann::json value;  // the document when error is empty
  std::string error;     // nlohmann's message, e.g. "[json.exception.parse_error.101] parse error at ..."
  bool ok() const { return error.empty(); }
};

namespace json_parse_detail {

// nlohmann's DOM builder without exceptions, keeping the first error's message. sax_parse calls
// the handler through its static type, so this parse_error is the one used.
class DomBuilder : public nlohmann::detail::json_sax_dom_parser<nlohmann::json> {
 public:
  DomBuilder(nlohmann::json& root, bool reject_duplicate_keys)
      : json_sax_dom_parser(root, /*allow_exceptions=*/false), reject_duplicates_(reject_duplicate_keys) {}
  template <class Exception>
  bool parse_error(std::size_t position, const std::string& last_token, const Exception& ex) {
    if (error.empty()) error = ex.what();
    return json_sax_dom_parser::parse_error(position, last_token, ex);
  }
  // The keys of each open object, to refuse a repeated one (nlohmann keeps the last silently).
  bool start_object(std::size_t len) {
    if (reject_duplicates_) keys_.emplace_back();
    return json_sax_dom_parser::start_object(len);
  }
  bool end_object() {
    if (reject_duplicates_ && !keys_.empty()) keys_.pop_back();
    return json_sax_dom_parser::end_object();
  }
  bool key(std::string& k) {
    if (reject_duplicates_ && !keys_.empty() && !keys_.back().insert(k).second) {
      if (error.empty()) error = "duplicate key \"" + k.substr(0, 100) + "\" in an object";
      return false;
    }
    return json_sax_dom_parser::key(k);
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
inline JsonParse parse_json(std::string_view text, bool reject_duplicate_keys = false) {
  JsonParse out;
  json_parse_detail::DomBuilder builder(out.value, reject_duplicate_keys);
  const bool ok = nlohmann::json::sax_parse(text.begin(), text.end(), &builder);
  if (!ok || builder.is_errored() || !builder.error.empty()) {
    out.error = builder.error.empty() ? std::string("invalid JSON") : std::move(builder.error);
    out.value = nlohmann::json();
  }
  return out;
}

}  // namespace sx
