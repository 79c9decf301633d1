// Fuzz target: the admin socket's wire format (daemon/admin/protocol.h) on an arbitrary line, read
// both as a request (what the daemon parses from a peer) and as a response (what `sextant ctl`
// parses from the daemon). Invariants (protocol.h):
// * decode_request: success is an object whose "cmd" is a non-empty string; failure is
//   INVALID_ARGUMENT with a message; a trailing "\n" or "\r\n" changes nothing; the request
//   printed with dump_line is one line that decodes to the same request;
// * decode_response: the response re-encoded with encode_response is exactly one line and decodes
//   to the same result, or to the same error code and message (the message as dump_line's UTF-8
//   replacement leaves it), and encoding that again gives the same line; a line that is not a
//   response is DATA_LOSS, an unknown code name is INTERNAL, OK never comes back as an error;
// * dump_line of any string (the input as raw bytes included) is one line of valid JSON, never an
//   exception.
// JSON has no infinity: a number too large for a double parses as one and prints as null, so
// results are compared with non-finite numbers read as null.
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "daemon/admin/protocol.h"
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

// Whether nlohmann's strict dump accepts `s` (it throws for invalid UTF-8).
bool dumps_strictly(const std::string& s) {
  try {
    (void)json(s).dump();
    return true;
  } catch (const json::exception&) {
    return false;
  }
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
  const sx::Result<json> r_crlf = admin::decode_request(std::string(line) + "\r\n");
  FUZZ_CHECK(r.ok() == r_crlf.ok());
  if (!r.ok()) {
    FUZZ_CHECK(r.status().code() == sx::StatusCode::kInvalidArgument);
    FUZZ_CHECK(!r.status().message().empty());
    FUZZ_CHECK(r_crlf.status().message() == r.status().message());
    return;
  }
  FUZZ_CHECK(*r == *r_crlf);
  FUZZ_CHECK(r->is_object());
  const auto cmd = r->find("cmd");
  FUZZ_CHECK(cmd != r->end() && cmd->is_string() && !cmd->get_ref<const std::string&>().empty());
  const std::string printed = admin::dump_line(*r);
  FUZZ_CHECK(one_line(printed));
  const sx::Result<json> again = admin::decode_request(printed);
  FUZZ_CHECK(again.ok());
  FUZZ_CHECK(*again == finite_only(*r));
}

void check_response(std::string_view line) {
  const sx::Result<json> d1 = admin::decode_response(line);
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
    if (dumps_strictly(d1.status().message())) {
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
  if (back.get_ref<const std::string&>() != bytes) FUZZ_CHECK(!dumps_strictly(std::string(bytes)));
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
