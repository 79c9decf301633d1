// RequestParser: HTTP/1.1 request framing on llhttp with the server's limits and RFC 9112's rules.
#include "daemon/http/request_parser.h"

#include <fmt/format.h>

#include <optional>
#include <utility>
#include <string_view>
#include <vector>

namespace sx::daemon::http {

namespace {

RequestParser* from(llhttp_t* parser) { return static_cast<RequestParser*>(parser->data); }

std::string_view trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t')) s.remove_suffix(1);
  return s;
}

// The comma-separated codings of every Transfer-Encoding field, in order.
std::vector<std::string_view> transfer_codings(const Headers& headers) {
  std::vector<std::string_view> out;
  for (std::string_view value : headers.get_all("Transfer-Encoding")) {
    while (true) {
      const size_t comma = value.find(',');
      out.push_back(trim(value.substr(0, comma)));
      if (comma == std::string_view::npos) break;
      value.remove_prefix(comma + 1);
    }
  }
  return out;
}

}  // namespace

RequestParser::RequestParser(Limits limits, Listener* listener) : limits_(limits), listener_(listener) {
  llhttp_init(&parser_, HTTP_REQUEST, settings());
  parser_.data = this;
}

RequestParser::Result RequestParser::feed(const char* data, size_t len, size_t* consumed) {
  *consumed = 0;
  if (failed_) return Result::kError;
  feed_begin_ = data;
  const llhttp_errno_t err = llhttp_execute(&parser_, data, len);
  Result result = Result::kNeedMore;
  if (err == HPE_OK) {
    *consumed = len;
  } else if (err == HPE_PAUSED && message_complete_) {
    *consumed = static_cast<size_t>(llhttp_get_error_pos(&parser_) - data);
    llhttp_resume(&parser_);
    message_complete_ = false;
    result = Result::kComplete;
  } else {
    failed_ = true;
    error_status_ = reject_status_ != 0 ? reject_status_ : 400;
    if (!reject_reason_.empty()) {
      error_reason_ = reject_reason_;
    } else {
      const char* reason = llhttp_get_error_reason(&parser_);
      error_reason_ = fmt_reason(llhttp_errno_name(err), reason);
    }
    result = Result::kError;
  }
  // The stream's last two bytes before the next feed (obs-fold detection across feeds).
  const size_t used = result == Result::kError ? len : *consumed;
  for (size_t i = used > 2 ? used - 2 : 0; i < used; ++i) {
    tail_[0] = tail_[1];
    tail_[1] = data[i];
  }
  feed_begin_ = nullptr;
  return result;
}

std::string RequestParser::fmt_reason(const char* name, const char* reason) {
  std::string out = name;
  if (reason != nullptr && *reason != '\0') {
    out += " (";
    out += reason;
    out += ")";
  }
  return out;
}

Request RequestParser::take() {
  Request r = std::move(request_);
  request_ = Request{};
  return r;
}

char RequestParser::byte_before(const char* at, size_t back) const {
  const size_t in_feed = static_cast<size_t>(at - feed_begin_);
  if (back <= in_feed) return at[-static_cast<std::ptrdiff_t>(back)];
  const size_t from_tail = back - in_feed;  // 1: tail_[1], 2: tail_[0]
  return from_tail <= 2 ? tail_[2 - from_tail] : '\0';
}

const llhttp_settings_t* RequestParser::settings() {
  static const llhttp_settings_t settings = [] {
    llhttp_settings_t s;
    llhttp_settings_init(&s);
    s.on_message_begin = &RequestParser::on_message_begin;
    s.on_method = &RequestParser::on_method;
    s.on_url = &RequestParser::on_url;
    s.on_version = &RequestParser::on_version;
    s.on_version_complete = &RequestParser::on_version_complete;
    s.on_header_field = &RequestParser::on_header_field;
    s.on_header_value = &RequestParser::on_header_value;
    s.on_header_value_complete = &RequestParser::on_header_value_complete;
    s.on_headers_complete = &RequestParser::on_headers_complete;
    s.on_body = &RequestParser::on_body;
    s.on_message_complete = &RequestParser::on_message_complete;
    return s;
  }();
  return &settings;
}

int RequestParser::reject(int status, std::string reason) {
  reject_status_ = status;
  reject_reason_ = std::move(reason);
  return -1;
}

int RequestParser::count_header_bytes(size_t n) {
  header_bytes_ += n;
  if (header_bytes_ > limits_.max_header_bytes) {
    return reject(431, fmt::format("the request line and headers are larger than {} bytes", limits_.max_header_bytes));
  }
  return 0;
}

int RequestParser::on_message_begin(llhttp_t* parser) {
  RequestParser* p = from(parser);
  p->request_ = Request{};
  p->field_.clear();
  p->value_.clear();
  p->value_started_ = false;
  p->head_complete_ = false;
  p->header_bytes_ = 0;
  p->reject_status_ = 0;
  p->reject_reason_.clear();
  p->message_complete_ = false;
  p->in_request_ = true;
  p->listener_->on_request_begin();
  return 0;
}

int RequestParser::on_method(llhttp_t* parser, const char*, size_t length) {
  return from(parser)->count_header_bytes(length);
}

int RequestParser::on_url(llhttp_t* parser, const char* at, size_t length) {
  RequestParser* p = from(parser);
  p->request_.target.append(at, length);
  return p->count_header_bytes(length);
}

int RequestParser::on_version(llhttp_t* parser, const char*, size_t length) {
  return from(parser)->count_header_bytes(length);  // a span: a read may split it
}

int RequestParser::on_version_complete(llhttp_t* parser) {
  return from(parser)->count_header_bytes(4);  // the spaces and CRLF of the request line
}

int RequestParser::on_header_field(llhttp_t* parser, const char* at, size_t length) {
  RequestParser* p = from(parser);
  p->field_.append(at, length);
  return p->count_header_bytes(length);
}

int RequestParser::on_header_value(llhttp_t* parser, const char* at, size_t length) {
  RequestParser* p = from(parser);
  // llhttp continues a value over "CRLF SP" (obs-fold): a span of the same value that starts
  // right after a line break. A value split only by the end of a read has no CRLF before it.
  if (p->value_started_ && length > 0 && p->byte_before(at, 1) == '\n' && p->byte_before(at, 2) == '\r') {
    return p->reject(400, "a header value folded over several lines (obs-fold)");
  }
  p->value_started_ = true;
  p->value_.append(at, length);
  return p->count_header_bytes(length);
}

int RequestParser::on_header_value_complete(llhttp_t* parser) {
  RequestParser* p = from(parser);
  // RFC 9110 §5.5: a field value has no leading or trailing whitespace. llhttp skips the leading
  // OWS but hands trailing SP / HTAB over as part of the value ("chunked " would not be chunked).
  while (!p->value_.empty() && (p->value_.back() == ' ' || p->value_.back() == '\t')) p->value_.pop_back();
  // Trailer fields of a chunked body are counted against the header limit and dropped: merging
  // them would let a trailer add a second Host (or any field) after check_head() accepted the
  // head, and no handler here uses trailers (RFC 9110 §6.5.1 lets a recipient discard them).
  if (!p->head_complete_) p->request_.headers.add(std::move(p->field_), std::move(p->value_));
  p->field_.clear();
  p->value_.clear();
  p->value_started_ = false;
  return p->count_header_bytes(4);  // ": " and CRLF
}

int RequestParser::check_head() {
  const Request& r = request_;
  const bool http11 = r.http_major == 1 && r.http_minor >= 1;
  const size_t hosts = r.headers.get_all("Host").size();
  if (hosts > 1) return reject(400, "more than one Host header");
  if (http11 && hosts == 0) return reject(400, "an HTTP/1.1 request without Host");
  const std::vector<std::string_view> codings = transfer_codings(r.headers);
  if (!codings.empty()) {
    if (!http11) return reject(400, "Transfer-Encoding in an HTTP/1.0 request");
    // llhttp already refuses codings whose last one is not chunked.
    if (codings.size() != 1) return reject(501, "a transfer coding other than chunked");
    if (!iequals(codings[0], "chunked")) return reject(400, "a Transfer-Encoding that does not end in chunked");
  }
  return 0;
}

int RequestParser::on_headers_complete(llhttp_t* parser) {
  RequestParser* p = from(parser);
  Request& r = p->request_;
  r.method = llhttp_method_name(static_cast<llhttp_method_t>(llhttp_get_method(parser)));
  r.http_major = llhttp_get_http_major(parser);
  r.http_minor = llhttp_get_http_minor(parser);
  const size_t q = r.target.find('?');
  r.path = r.target.substr(0, q);
  r.query = q == std::string::npos ? std::string() : r.target.substr(q + 1);
  if (p->check_head() != 0) return -1;
  p->head_complete_ = true;
  const bool has_length = (parser->flags & F_CONTENT_LENGTH) != 0;
  // A body announced larger than allowed is refused before any of it is read.
  if (has_length && parser->content_length > p->limits_.max_body_bytes) {
    return p->reject(413, fmt::format("the body is larger than {} bytes", p->limits_.max_body_bytes));
  }
  const bool expects_body = (parser->flags & F_CHUNKED) != 0 || (has_length && parser->content_length > 0);
  const std::optional<std::string_view> type = r.headers.get("Content-Type");
  p->json_body_ = (p->limits_.max_json_depth > 0 || p->limits_.max_json_values > 0) &&
                  (!type || type->find("json") != std::string_view::npos);
  p->json_ = JsonShapeScanner{};
  p->listener_->on_request_head(r, expects_body);
  return 0;
}

int RequestParser::on_body(llhttp_t* parser, const char* at, size_t length) {
  RequestParser* p = from(parser);
  // Chunked bodies are only known to be too large while reading. The bytes within the limit are
  // scanned first, so that the error is that of the first byte at fault whatever the read sizes:
  // JSON past its bounds before byte max_body_bytes is a 400 even when that read goes past it.
  const size_t room = p->limits_.max_body_bytes - p->request_.body.size();
  const bool too_large = length > room;
  if (too_large) length = room;
  p->request_.body.append(at, length);
  if (const int rc = p->check_json(std::string_view(at, length)); rc != 0) return rc;
  if (too_large) return p->reject(413, fmt::format("the body is larger than {} bytes", p->limits_.max_body_bytes));
  return 0;
}

int RequestParser::check_json(std::string_view bytes) {
  if (!json_body_) return 0;
  json_.feed(bytes);
  const JsonShape shape = json_.shape();
  if (limits_.max_json_depth > 0 && shape.depth > limits_.max_json_depth) {
    return reject(400, fmt::format("the JSON body nests more than {} levels deep", limits_.max_json_depth));
  }
  if (limits_.max_json_values > 0 && shape.values > limits_.max_json_values) {
    return reject(400, fmt::format("the JSON body holds more than {} values", limits_.max_json_values));
  }
  return 0;
}

int RequestParser::on_message_complete(llhttp_t* parser) {
  RequestParser* p = from(parser);
  p->request_.keep_alive = llhttp_should_keep_alive(parser) != 0 && parser->upgrade == 0;
  p->message_complete_ = true;
  p->in_request_ = false;
  return HPE_PAUSED;  // the request is handed out before any later byte is parsed
}

}  // namespace sx::daemon::http
