// Fuzz target: the admin socket's wire format (daemon/admin/protocol.h) on an arbitrary line, read
// both as a request (what the daemon parses from a peer) and as a response (what `sextant ctl`
// parses from the daemon). Invariants (protocol.h):
// * decode_request: success is an object whose "cmd" is a non-empty string; failure is
//   INVALID_ARGUMENT with a message; a trailing "\r\n" changes nothing; the request printed with
//   dump_line is one line that decodes to the same request;
// * decode_response: the response re-encoded with encode_response is exactly one line and decodes
//   to the same result, or to the same error code and message (the message as dump_line's UTF-8
//   replacement leaves it), and encoding that again gives the same line; a line that is not a
//   response (or one nested deeper than runtime/base/json_depth.h allows) is DATA_LOSS, "ok": true
//   gives its "result" (null when absent), an unknown code name is INTERNAL, OK never comes back
//   as an error; a trailing "\n" changes nothing;
// * dump_line of any string (the input as raw bytes included) is one line of valid JSON, never an
//   exception.
// JSON has no infinity: a number too large for a double parses as one and prints as null, so
// results are compared with non-finite numbers read as null.
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "daemon/admin/protocol.h"
#include "runtime/base/json_depth.h"
#include "runtime/base/status.h"
#include "tests/fuzz/fuzz_check.h"

namespace {

namespace admin = sx::daemon::admin;
using nlohmann::json;

// `v` with every non-finite number replaced by null (what dump() prints for them). Iterative: the
// input may nest thousands of levels deep.
json finite_only(json v) {
  std::vector<json*> todo{&v};
  while (!todo.empty()) {
    json* j = todo.back();
    todo.pop_back();
    if (j->is_number_float() && !std::isfinite(j->get<double>())) {
      *j = nullptr;
    } else if (j->is_structured()) {
      for (auto& child : *j) todo.push_back(&child);
    }
  }
  return v;
}

bool one_line(std::string_view s) { return s.find('\n') == std::string_view::npos; }

// Well-formed UTF-8 (Unicode Table 3-7): what nlohmann's strict dump() accepts without throwing
// (checked here without an exception, which costs a lot under ASan).
bool valid_utf8(std::string_view s) {
  const auto* p = reinterpret_cast<const unsigned char*>(s.data());
  for (std::size_t i = 0; i < s.size();) {
    const unsigned b = p[i];
    int need = 0;
    unsigned lo = 0x80, hi = 0xBF;
    if (b < 0x80) {
      ++i;
      continue;
    }
    if (b >= 0xC2 && b <= 0xDF) need = 1;
    else if (b == 0xE0) need = 2, lo = 0xA0;
    else if ((b >= 0xE1 && b <= 0xEC) || b == 0xEE || b == 0xEF) need = 2;
    else if (b == 0xED) need = 2, hi = 0x9F;
    else if (b == 0xF0) need = 3, lo = 0x90;
    else if (b >= 0xF1 && b <= 0xF3) need = 3;
    else if (b == 0xF4) need = 3, hi = 0x8F;
    else return false;
    for (int k = 0; k < need; ++k) {
      const std::size_t j = i + 1 + static_cast<std::size_t>(k);
      if (j >= s.size() || p[j] < (k == 0 ? lo : 0x80) || p[j] > (k == 0 ? hi : 0xBF)) return false;
    }
    i += 1 + static_cast<std::size_t>(need);
  }
  return true;
}

// The code names round-trip through status_code_from_name; OK is not an error code.
void check_code_names() {
  for (int c = static_cast<int>(sx::StatusCode::kCancelled); c <= static_cast<int>(sx::StatusCode::kDataLoss); ++c) {
    const auto code = static_cast<sx::StatusCode>(c);
    const auto back = admin::status_code_from_name(sx::status_code_name(code));
    FUZZ_CHECK(back.has_value() && *back == code);
  }
  FUZZ_CHECK(!admin::status_code_from_name("OK").has_value());
}

// An encoded response: a single line ending in its only '\n'.
void check_encoded(const std::string& line) {
  FUZZ_CHECK(!line.empty() && line.back() == '\n');
  FUZZ_CHECK(one_line(std::string_view(line).substr(0, line.size() - 1)));
}

void check_request(std::string_view line) {
  const sx::Result<json> r = admin::decode_request(line);
  if (!r.ok()) {
    FUZZ_CHECK(r.status().code() == sx::StatusCode::kInvalidArgument);
    FUZZ_CHECK(!r.status().message().empty());
    return;
  }
  // (Only for a request that decodes: a malformed one throws inside decode_request, which is slow
  // under ASan, and the line ending cannot make it any less malformed.)
  const sx::Result<json> r_crlf = admin::decode_request(std::string(line) + "\r\n");
  FUZZ_CHECK(r_crlf.ok() && *r == *r_crlf);
  FUZZ_CHECK(r->is_object());
  const auto cmd = r->find("cmd");
  FUZZ_CHECK(cmd != r->end() && cmd->is_string() && !cmd->get_ref<const std::string&>().empty());
  const std::string printed = admin::dump_line(*r);
  FUZZ_CHECK(one_line(printed));
  const sx::Result<json> again = admin::decode_request(printed);
  FUZZ_CHECK(again.ok());
  FUZZ_CHECK(*again == finite_only(*r));
}

// What decode_response must make of `line`, from its header: not a response object (or nested
// deeper than the JSON bound) is DATA_LOSS; "ok": true is the result; "ok": false is the error
// named by a canonical code, else INTERNAL.
void check_meaning(std::string_view line, const sx::Result<json>& d) {
  while (!line.empty() && (line.back() == '\n' || line.back() == '\r')) line.remove_suffix(1);
  const json parsed = sx::json_nesting_depth(line) > sx::kMaxJsonDepth
                          ? json(json::value_t::discarded)
                          : json::parse(line, nullptr, /*allow_exceptions=*/false);
  const auto ok = parsed.is_object() ? parsed.find("ok") : parsed.end();
  if (!parsed.is_object() || ok == parsed.end() || !ok->is_boolean()) {
    FUZZ_CHECK(!d.ok() && d.status().code() == sx::StatusCode::kDataLoss);
    return;
  }
  if (ok->get<bool>()) {
    FUZZ_CHECK(d.ok());
    const auto result = parsed.find("result");
    FUZZ_CHECK(*d == (result == parsed.end() ? json(nullptr) : *result));
    return;
  }
  FUZZ_CHECK(!d.ok());
  const auto error = parsed.find("error");
  const json* code = nullptr;
  if (error != parsed.end() && error->is_object() && error->contains("code") && (*error)["code"].is_string()) {
    code = &(*error)["code"];
  }
  const auto named = code != nullptr ? admin::status_code_from_name(code->get<std::string>()) : std::nullopt;
  FUZZ_CHECK(d.status().code() == (named ? *named : sx::StatusCode::kInternal));
}

void check_response(std::string_view line) {
  const sx::Result<json> d1 = admin::decode_response(line);
  check_meaning(line, d1);
  const sx::Result<json> d1_nl = admin::decode_response(std::string(line) + "\n");
  FUZZ_CHECK(d1.ok() == d1_nl.ok());
  if (d1.ok()) {
    FUZZ_CHECK(*d1 == *d1_nl);
  } else {
    FUZZ_CHECK(d1.status().code() != sx::StatusCode::kOk);
    FUZZ_CHECK(d1.status().code() == d1_nl.status().code());
    FUZZ_CHECK(d1.status().message() == d1_nl.status().message());
  }
  const std::string e1 = admin::encode_response(d1);
  check_encoded(e1);
  const sx::Result<json> d2 = admin::decode_response(e1);
  FUZZ_CHECK(d2.ok() == d1.ok());
  if (d1.ok()) {
    FUZZ_CHECK(*d2 == finite_only(*d1));
  } else {
    FUZZ_CHECK(d2.status().code() == d1.status().code());
    // The message is the same unless it had invalid UTF-8 (then dump_line replaced it).
    if (valid_utf8(d1.status().message())) {
      FUZZ_CHECK(d2.status().message() == d1.status().message());
    }
  }
  const std::string e2 = admin::encode_response(d2);
  FUZZ_CHECK(e2 == e1);  // one round normalises; the second changes nothing
}

void check_dump_line(std::string_view bytes) {
  const std::string printed = admin::dump_line(json(std::string(bytes)));
  FUZZ_CHECK(one_line(printed));
  const json back = json::parse(printed, nullptr, /*allow_exceptions=*/false);
  FUZZ_CHECK(back.is_string());
  // Only a string with invalid UTF-8 may change (nlohmann's strict dump throws for exactly those).
  if (valid_utf8(bytes)) FUZZ_CHECK(back.get_ref<const std::string&>() == bytes);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  static const bool names_checked = (check_code_names(), true);
  (void)names_checked;
  const std::string_view line(reinterpret_cast<const char*>(data), size);
  check_request(line);
  check_response(line);
  check_dump_line(line);
  return 0;
}
