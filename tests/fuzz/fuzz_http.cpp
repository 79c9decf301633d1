// Fuzz target: the HTTP request path up to the handler, on arbitrary bytes: RequestParser
// (llhttp's callbacks, the server's limits, RFC 9112's rules) fed in reads of sizes taken from the
// input, then the Router's match against the daemon's routes.
//
// Invariants: where reads split the bytes changes nothing (the same requests, or the same error
// status, as one read of everything; but a limit may be met before a malformed byte past it); a parser never uses more bytes than it was given; every
// request handed out keeps the limits (head and body sizes, JSON bounds of a JSON body), has
// exactly one Host when it is HTTP/1.1, no Transfer-Encoding but "chunked", and no CR or LF in a
// header; an error status is one of those the header lists; a route found has a handler, a 405
// lists the methods allowed.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "daemon/http/headers.h"
#include "daemon/http/request_parser.h"
#include "daemon/http/router.h"
#include "runtime/base/json_depth.h"
#include "tests/fuzz/fuzz_check.h"

namespace {

using sx::daemon::http::Request;
using sx::daemon::http::RequestParser;

constexpr RequestParser::Limits kLimits{/*max_header_bytes=*/1024, /*max_body_bytes=*/4096, /*max_json_depth=*/8,
                                        /*max_json_values=*/64};

class Phases final : public RequestParser::Listener {
 public:
  void on_request_begin() override {
    FUZZ_CHECK(!in_head_);
    in_head_ = true;
  }
  void on_request_head(const Request&, bool) override {
    FUZZ_CHECK(in_head_);
    in_head_ = false;
  }
  void reset() { in_head_ = false; }

 private:
  bool in_head_ = false;
};

struct Outcome {
  std::vector<Request> requests;
  int error_status = 0;
};

// Parses `wire` in reads whose sizes come from `sizes` (cycled; 0 or none: one read).
Outcome parse(std::string_view wire, std::string_view sizes) {
  Phases phases;
  RequestParser parser(kLimits, &phases);
  Outcome out;
  std::string pending;
  size_t fed = 0, next_size = 0;
  while (true) {
    if (fed < wire.size()) {
      size_t n = wire.size() - fed;
      if (!sizes.empty()) {
        const size_t s = static_cast<unsigned char>(sizes[next_size++ % sizes.size()]);
        if (s > 0) n = std::min(n, s);
      }
      pending.append(wire.substr(fed, n));
      fed += n;
    }
    size_t used = 0;
    const RequestParser::Result r = parser.feed(pending.data(), pending.size(), &used);
    FUZZ_CHECK(used <= pending.size());
    pending.erase(0, used);
    if (r == RequestParser::Result::kError) {
      out.error_status = parser.error_status();
      FUZZ_CHECK(!parser.error_reason().empty());
      return out;
    }
    if (r == RequestParser::Result::kComplete) {
      out.requests.push_back(parser.take());
      continue;
    }
    FUZZ_CHECK(pending.empty());  // kNeedMore uses everything
    if (fed == wire.size()) return out;
  }
}

void check_request(const Request& r, const sx::daemon::http::Router& router) {
  FUZZ_CHECK(r.target.size() <= kLimits.max_header_bytes);
  FUZZ_CHECK(r.body.size() <= kLimits.max_body_bytes);
  FUZZ_CHECK(r.path == r.target.substr(0, r.path.size()));
  const bool http11 = r.http_major == 1 && r.http_minor >= 1;
  const size_t hosts = r.headers.get_all("Host").size();
  FUZZ_CHECK(hosts <= 1);
  if (http11) FUZZ_CHECK(hosts == 1);
  for (std::string_view te : r.headers.get_all("Transfer-Encoding")) {
    FUZZ_CHECK(http11 && sx::daemon::http::iequals(te, "chunked"));
  }
  for (const auto& [name, value] : r.headers) {
    FUZZ_CHECK(name.find_first_of("\r\n") == std::string::npos);
    FUZZ_CHECK(value.find_first_of("\r\n") == std::string::npos);
  }
  const auto type = r.headers.get("Content-Type");
  if (!type || type->find("json") != std::string_view::npos) {
    const sx::JsonShape shape = sx::json_shape(r.body);
    FUZZ_CHECK(shape.depth <= kLimits.max_json_depth);
    FUZZ_CHECK(shape.values <= kLimits.max_json_values);
  }
  const sx::daemon::http::Handler* handler = nullptr;
  std::string allow;
  switch (router.match(r.method, r.path, &handler, &allow)) {
    case sx::daemon::http::Router::Match::kFound: FUZZ_CHECK(handler != nullptr && *handler); break;
    case sx::daemon::http::Router::Match::kMethodNotAllowed: FUZZ_CHECK(!allow.empty()); break;
    case sx::daemon::http::Router::Match::kNotFound: break;
  }
}

const sx::daemon::http::Router& daemon_routes() {
  static const sx::daemon::http::Router router = [] {
    sx::daemon::http::Router r;
    auto ignore = [](Request, sx::daemon::http::ResponderPtr) {};
    for (const char* path : {"/v1/chat/completions", "/v1/completions"}) (void)r.post(path, ignore);
    for (const char* path : {"/v1/models", "/health", "/metrics"}) (void)r.get(path, ignore);
    return r;
  }();
  return router;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  // The first byte says how many of the next bytes are read sizes; the rest is the wire.
  std::string_view input(reinterpret_cast<const char*>(data), size);
  const size_t n_sizes = input.empty() ? 0 : std::min<size_t>(static_cast<unsigned char>(input[0]) % 16, size - 1);
  const std::string_view sizes = input.substr(input.empty() ? 0 : 1, n_sizes);
  const std::string_view wire = input.substr(input.empty() ? 0 : 1 + n_sizes);

  const Outcome whole = parse(wire, {});
  const Outcome split = parse(wire, sizes);
  // llhttp reports a span when it ends or when a read does, so a malformed byte past a limit is
  // seen first in one read (400) and the limit first in smaller reads (431 / 413): both refuse.
  const bool limit_first = whole.error_status == 400 && (split.error_status == 431 || split.error_status == 413);
  FUZZ_CHECK(whole.error_status == split.error_status || limit_first);
  FUZZ_CHECK(whole.requests.size() == split.requests.size() || limit_first);
  for (size_t i = 0; i < std::min(whole.requests.size(), split.requests.size()); ++i) {
    const Request& a = whole.requests[i];
    const Request& b = split.requests[i];
    FUZZ_CHECK(a.method == b.method && a.target == b.target && a.body == b.body);
    FUZZ_CHECK(a.http_major == b.http_major && a.http_minor == b.http_minor && a.keep_alive == b.keep_alive);
    FUZZ_CHECK(a.headers.size() == b.headers.size());
    for (auto x = a.headers.begin(), y = b.headers.begin(); x != a.headers.end(); ++x, ++y) FUZZ_CHECK(*x == *y);
    check_request(a, daemon_routes());
  }
  switch (whole.error_status) {
    case 0: case 400: case 413: case 431: case 501: break;
    default: FUZZ_CHECK(false);
  }
  return 0;
}
