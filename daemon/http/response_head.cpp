// Serialisation of HTTP/1.1 response heads.
#include "daemon/http/response_head.h"

#include <ctime>

#include <fmt/format.h>

namespace sx::daemon::http {

std::string_view status_reason(int status) {
  switch (status) {
    case 100: return "Continue";
    case 101: return "Switching Protocols";
    case 200: return "OK";
    case 201: return "Created";
    case 202: return "Accepted";
    case 204: return "No Content";
    case 206: return "Partial Content";
    case 301: return "Moved Permanently";
    case 302: return "Found";
    case 303: return "See Other";
    case 304: return "Not Modified";
    case 307: return "Temporary Redirect";
    case 308: return "Permanent Redirect";
    case 400: return "Bad Request";
    case 401: return "Unauthorized";
    case 403: return "Forbidden";
    case 404: return "Not Found";
    case 405: return "Method Not Allowed";
    case 406: return "Not Acceptable";
    case 408: return "Request Timeout";
    case 409: return "Conflict";
    case 410: return "Gone";
    case 411: return "Length Required";
    case 413: return "Content Too Large";
    case 414: return "URI Too Long";
    case 415: return "Unsupported Media Type";
    case 417: return "Expectation Failed";
    case 422: return "Unprocessable Content";
    case 429: return "Too Many Requests";
    case 431: return "Request Header Fields Too Large";
    case 499: return "Client Closed Request";
    case 500: return "Internal Server Error";
    case 501: return "Not Implemented";
    case 502: return "Bad Gateway";
    case 503: return "Service Unavailable";
    case 504: return "Gateway Timeout";
    case 505: return "HTTP Version Not Supported";
    default: return "Unknown";
  }
}

bool status_has_no_body(int status) {
  return (status >= 100 && status < 200) || status == 204 || status == 304;
}

std::string http_date() {
  std::time_t now = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&now, &tm);
  char buf[64];
  size_t n = std::strftime(buf, sizeof(buf), "%a, %d %b %Y %H:%M:%S GMT", &tm);
  return std::string(buf, n);
}

namespace {

bool safe_field(std::string_view s) {
  return s.find_first_of(std::string_view("\r\n\0", 3)) == std::string_view::npos;
}

bool framing_field(std::string_view name) {
  return iequals(name, "Content-Length") || iequals(name, "Transfer-Encoding") ||
         iequals(name, "Connection") || iequals(name, "Date");
}

}  // namespace

std::string build_response_head(int status, const Headers& headers, const HeadFraming& framing) {
  std::string out;
  out.reserve(256);
  fmt::format_to(std::back_inserter(out), "HTTP/1.1 {} {}\r\n", status, status_reason(status));
  for (const auto& [name, value] : headers) {
    if (name.empty() || !safe_field(name) || !safe_field(value) || framing_field(name)) continue;
    out.append(name).append(": ").append(value).append("\r\n");
  }
  if (!framing.date.empty()) out.append("Date: ").append(framing.date).append("\r\n");
  if (framing.chunked) {
    out.append("Transfer-Encoding: chunked\r\n");
  } else if (framing.content_length) {
    fmt::format_to(std::back_inserter(out), "Content-Length: {}\r\n", *framing.content_length);
  }
  if (!framing.keep_alive) {
    out.append("Connection: close\r\n");
  } else if (framing.http10_client) {
    out.append("Connection: keep-alive\r\n");
  }
  out.append("\r\n");
  return out;
}

}  // namespace sx::daemon::http
