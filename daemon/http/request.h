// An HTTP request as the router and handlers see it: fully parsed, body included.
//
// Handlers receive a Request by value (they may move it into work queued for another thread).
// Nothing here refers back to the connection; answering goes through the Responder.
#pragma once

#include <string>

#include "daemon/http/headers.h"

namespace sx::daemon::http {

struct Request {
  std::string method;  // as sent, e.g. "GET", "POST"
  std::string target;  // raw request-target, e.g. "/v1/models?x=1"
  std::string path;    // target up to '?', not percent-decoded
  std::string query;   // target after '?', raw; empty when absent
  Headers headers;
  std::string body;    // de-chunked when Transfer-Encoding: chunked
  int http_major = 1;
  int http_minor = 1;
  bool keep_alive = true;  // the client allows another request on this connection
  std::string peer;        // "ip:port" of the client
};

}  // namespace sx::daemon::http
