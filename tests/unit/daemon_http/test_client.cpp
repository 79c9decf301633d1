// Blocking loopback clients and a small HTTP/1.1 response reader for the daemon/http tests.
#include "test_client.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cctype>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>

namespace sx::daemon::http::testing {

namespace {

bool iequal(std::string_view a, std::string_view b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i) {
    if (std::tolower(static_cast<unsigned char>(a[i])) != std::tolower(static_cast<unsigned char>(b[i]))) {
      return false;
    }
  }
  return true;
}

}  // namespace

std::string HttpResponse::header(std::string_view name) const {
  for (const auto& [k, v] : headers) {
    if (iequal(k, name)) return v;
  }
  return "";
}

bool HttpResponse::has_header(std::string_view name) const {
  for (const auto& [k, v] : headers) {
    if (iequal(k, name)) return true;
  }
  return false;
}

TestClient::TestClient(uint16_t port, int timeout_ms) {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return;
  timeval tv{timeout_ms / 1000, (timeout_ms % 1000) * 1000};
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  ::setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
  int one = 1;
  ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(port);
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    ::close(fd);
    return;
  }
  fd_ = fd;
}

TestClient::~TestClient() { close(); }

void TestClient::close() {
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
}

bool TestClient::send(std::string_view data) {
  while (!data.empty()) {
    ssize_t n = ::send(fd_, data.data(), data.size(), MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    data.remove_prefix(static_cast<size_t>(n));
  }
  return true;
}

bool TestClient::fill() {
  if (fd_ < 0 || eof_) return false;
  char tmp[16384];
  for (;;) {
    ssize_t n = ::recv(fd_, tmp, sizeof(tmp), 0);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      eof_ = true;
      return false;
    }
    buf_.append(tmp, static_cast<size_t>(n));
    return true;
  }
}

std::optional<std::string> TestClient::read_line() {
  for (;;) {
    size_t pos = buf_.find("\r\n");
    if (pos != std::string::npos) {
      std::string line = buf_.substr(0, pos);
      buf_.erase(0, pos + 2);
      return line;
    }
    if (!fill()) return std::nullopt;
  }
}

std::optional<std::string> TestClient::read_exact(size_t n) {
  while (buf_.size() < n) {
    if (!fill()) return std::nullopt;
  }
  std::string out = buf_.substr(0, n);
  buf_.erase(0, n);
  return out;
}

std::optional<HttpResponse> TestClient::read_head() {
  HttpResponse r;
  std::optional<std::string> line = read_line();
  // Skip interim 100 Continue responses.
  while (line && line->rfind("HTTP/1.1 100", 0) == 0) {
    while (line && !line->empty()) line = read_line();
    if (!line) return std::nullopt;
    line = read_line();
  }
  if (!line || line->size() < 12 || line->rfind("HTTP/1.", 0) != 0) return std::nullopt;
  r.status = std::atoi(line->c_str() + 9);
  r.reason = line->size() > 13 ? line->substr(13) : "";
  for (;;) {
    line = read_line();
    if (!line) return std::nullopt;
    if (line->empty()) break;
    size_t colon = line->find(':');
    if (colon == std::string::npos) return std::nullopt;
    std::string value = line->substr(colon + 1);
    while (!value.empty() && value.front() == ' ') value.erase(0, 1);
    r.headers.emplace_back(line->substr(0, colon), value);
  }
  r.chunked = iequal(r.header("Transfer-Encoding"), "chunked");
  return r;
}

std::optional<std::string> TestClient::read_chunk() {
  std::optional<std::string> size_line = read_line();
  if (!size_line) return std::nullopt;
  size_t size = std::strtoul(size_line->c_str(), nullptr, 16);
  std::optional<std::string> data = read_exact(size);
  std::optional<std::string> crlf = read_exact(2);
  if (!data || !crlf || *crlf != "\r\n") return std::nullopt;
  return data;
}

std::optional<HttpResponse> TestClient::read_response(bool head_request) {
  std::optional<HttpResponse> r = read_head();
  if (!r) return std::nullopt;
  if (head_request || r->status == 204 || r->status == 304) return r;
  if (r->chunked) {
    for (;;) {
      std::optional<std::string> chunk = read_chunk();
      if (!chunk) return std::nullopt;
      if (chunk->empty()) break;
      r->body += *chunk;
      r->chunks.push_back(std::move(*chunk));
    }
    return r;
  }
  if (r->has_header("Content-Length")) {
    std::optional<std::string> body = read_exact(std::strtoull(r->header("Content-Length").c_str(), nullptr, 10));
    if (!body) return std::nullopt;
    r->body = std::move(*body);
    return r;
  }
  while (fill()) {
  }
  r->body = std::move(buf_);  // until EOF
  buf_.clear();
  return r;
}

bool TestClient::wait_closed(int timeout_ms) {
  if (eof_) return true;
  auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
  for (;;) {
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now()).count();
    if (left <= 0) return false;
    pollfd p{fd_, POLLIN, 0};
    int rc = ::poll(&p, 1, static_cast<int>(left));
    if (rc < 0 && errno == EINTR) continue;
    if (rc <= 0) return false;
    if (!fill()) return true;  // EOF or reset
  }
}

std::string make_request(std::string_view method, std::string_view path, std::string_view body,
                         std::string_view extra_headers) {
  std::string r;
  r.append(method).append(" ").append(path).append(" HTTP/1.1\r\nHost: t\r\n");
  r.append(extra_headers);
  if (!body.empty()) r.append("Content-Length: ").append(std::to_string(body.size())).append("\r\n");
  r.append("\r\n").append(body);
  return r;
}

}  // namespace sx::daemon::http::testing
