// RequestParser: HTTP/1.1 request framing on llhttp, with the server's limits and the message
// rules of RFC 9112 that llhttp leaves to its user (internal to daemon/http; also driven directly
// by the fuzz target tests/fuzz/fuzz_http.cpp).
//
// feed() parses bytes of one connection, one request at a time: when a request is complete it
// stops (kComplete) and reports how many bytes it used; take() hands out the request and the
// parser is ready for the next one. A request that breaks a rule stops with kError and the status
// to answer (the connection then closes):
//   400  malformed (llhttp), a JSON body beyond Limits' JSON bounds, an HTTP/1.1 request without exactly one Host (RFC 9112 §3.2), a header
//        value folded over several lines (obs-fold, §5.2), a Transfer-Encoding whose last coding
//        is not chunked or that appears in an HTTP/1.0 request (§6.1, §6.3)
//   413  a body larger than max_body_bytes (announced by Content-Length, or while reading chunks)
//   431  the request line and headers larger than max_header_bytes
//   501  a Transfer-Encoding coding other than chunked (gzip, ...): not implemented
// The Listener hears the phases (the connection's deadlines follow them); it may not call back
// into the parser.
//
// Threading: one connection's parser, used from one thread. Nothing here does I/O.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include <llhttp.h>

#include "daemon/http/request.h"
#include "runtime/base/json_depth.h"

namespace sx::daemon::http {

class RequestParser {
 public:
  struct Limits {
    size_t max_header_bytes = 16 * 1024;
    size_t max_body_bytes = 16 * 1024 * 1024;
    // Bounds on a JSON body (Content-Type application/json or any +json type, or none), checked
    // as its bytes arrive, so that a body nested thousands of levels deep or holding millions of
    // values is refused after its first bytes instead of being stored and parsed; 0: no bound.
    size_t max_json_depth = 0;
    size_t max_json_values = 0;
  };

  class Listener {
   public:
    // The first byte of a request arrived.
    virtual void on_request_begin() = 0;
    // The request line and headers are complete and acceptable; `expects_body`: a body follows
    // (Content-Length > 0 or chunked). `request` has no body yet.
    virtual void on_request_head(const Request& request, bool expects_body) = 0;

   protected:
    ~Listener() = default;
  };

  enum class Result { kNeedMore, kComplete, kError };

  RequestParser(Limits limits, Listener* listener);
  RequestParser(const RequestParser&) = delete;
  RequestParser& operator=(const RequestParser&) = delete;

  // Parses from `data`; `*consumed` is set to the bytes used (all of them for kNeedMore, up to the
  // end of the request for kComplete). After kError nothing more may be fed.
  Result feed(const char* data, size_t len, size_t* consumed);
  // The complete request (after kComplete); the parser continues with the next one.
  Request take();
  // The status to answer after kError (400, 413, 431 or 501).
  int error_status() const { return error_status_; }
  // The rule broken, or llhttp's reason, after kError (for the response body and logs).
  const std::string& error_reason() const { return error_reason_; }
  // A request has begun and is not complete yet.
  bool in_request() const { return in_request_; }

 private:
  static const llhttp_settings_t* settings();
  static int on_message_begin(llhttp_t* parser);
  static int on_method(llhttp_t* parser, const char* at, size_t length);
  static int on_url(llhttp_t* parser, const char* at, size_t length);
  static int on_version(llhttp_t* parser, const char* at, size_t length);
  static int on_version_complete(llhttp_t* parser);
  static int on_header_field(llhttp_t* parser, const char* at, size_t length);
  static int on_header_value(llhttp_t* parser, const char* at, size_t length);
  static int on_header_value_complete(llhttp_t* parser);
  static int on_headers_complete(llhttp_t* parser);
  static int on_body(llhttp_t* parser, const char* at, size_t length);
  static int on_message_complete(llhttp_t* parser);

  static std::string fmt_reason(const char* name, const char* reason);
  // The byte `back` positions before `at` in the stream (the current feed, then the last two
  // bytes of the previous one; '\0' beyond that).
  char byte_before(const char* at, size_t back) const;
  int count_header_bytes(size_t n);
  int reject(int status, std::string reason);
  // The RFC 9112 rules on a complete head; 0 or the status to answer.
  int check_head();
  int check_json(std::string_view bytes);  // the body's JSON bounds, on its next bytes

  Limits limits_;
  Listener* listener_;
  llhttp_t parser_{};
  Request request_;
  std::string field_;
  std::string value_;
  bool value_started_ = false;  // a span of the current header value was seen
  bool head_complete_ = false;  // header fields from now on are a chunked body's trailer fields
  const char* feed_begin_ = nullptr;
  char tail_[2] = {'\0', '\0'};
  size_t header_bytes_ = 0;
  bool json_body_ = false;  // the body is checked against the JSON bounds
  JsonShapeScanner json_;
  int reject_status_ = 0;  // set by a callback before it fails the parse
  std::string reject_reason_;
  bool message_complete_ = false;
  bool in_request_ = false;
  bool failed_ = false;
  int error_status_ = 0;
  std::string error_reason_;
};

}  // namespace sx::daemon::http
