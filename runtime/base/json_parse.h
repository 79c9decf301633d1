// nlohmann::json parsing that reports a syntax error without throwing. nlohmann's parse() either
// throws parse_error (whose message says where and why) or, with allow_exceptions = false, returns
// a discarded value and no reason. Readers of untrusted JSON want the reason, and an exception per
// malformed input is costly where inputs are hostile (thousands per second under a fuzzer or a
// flood of bad requests; under AddressSanitizer each one also sweeps its fake stacks). This builds
// the same document through nlohmann's SAX interface and keeps the message the exception would
// have carried, thrown by nobody. Header-only; pure; thread-safe.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

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
  explicit DomBuilder(nlohmann::json& root) : json_sax_dom_parser(root, /*allow_exceptions=*/false) {}
  template <class Exception>
  bool parse_error(std::size_t position, const std::string& last_token, const Exception& ex) {
    if (error.empty()) error = ex.what();
    return json_sax_dom_parser::parse_error(position, last_token, ex);
  }
  std::string error;
};

}  // namespace json_parse_detail

// Strict RFC 8259 JSON (one value, nothing after it but whitespace), as nlohmann::json::parse.
inline JsonParse parse_json(std::string_view text) {
  JsonParse out;
  json_parse_detail::DomBuilder builder(out.value);
  const bool ok = nlohmann::json::sax_parse(text.begin(), text.end(), &builder);
  if (!ok || builder.is_errored()) {
    out.error = builder.error.empty() ? std::string("invalid JSON") : std::move(builder.error);
    out.value = nlohmann::json();
  }
  return out;
}

}  // namespace sx
