// Serialisation of HTTP/1.1 response heads: status line, the caller's headers and the framing
// headers the server owns (Content-Length / Transfer-Encoding, Connection, Date).
//
// Framing is decided here, never by handlers: a caller's Content-Length, Transfer-Encoding and
// Connection fields are dropped and rewritten from HeadFraming; fields whose name or value holds
// CR, LF or NUL (response splitting) are dropped too.
//
// Threading: pure functions; http_date() is thread-safe.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "daemon/http/headers.h"

namespace sx::daemon::http {

// The reason phrase for `status` ("OK", "Not Found"...); "Unknown" for codes not listed.
std::string_view status_reason(int status);

// True for statuses that never carry a body (1xx, 204, 304).
bool status_has_no_body(int status);

// RFC 9110 IMF-fixdate for the current time, e.g. "Sun, 06 Nov 1994 08:49:37 GMT".
std::string http_date();

struct HeadFraming {
  std::optional<uint64_t> content_length;  // Content-Length: N when set
  bool chunked = false;                    // Transfer-Encoding: chunked
  bool keep_alive = true;                  // else "Connection: close"
  bool http10_client = false;              // keep-alive to a 1.0 client needs "Connection: keep-alive"
  std::string date;                        // Date value; omitted when empty
};

std::string build_response_head(int status, const Headers& headers, const HeadFraming& framing);

}  // namespace sx::daemon::http
