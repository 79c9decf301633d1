// Blocking loopback clients and a small HTTP/1.1 response reader for the daemon/http tests.
//
// Every socket has 5 s send/receive timeouts, so a broken server fails a test instead of hanging
// it. Threading: one TestClient per thread.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace sx::daemon::http::testing {

struct HttpResponse {
  int status = 0;
  std::string reason;
  std::vector<std::pair<std::string, std::string>> headers;
  std::string body;                 // de-chunked
  std::vector<std::string> chunks;  // chunk payloads, when chunked
  bool chunked = false;

  // First value of a header (case-insensitive name), or "" when absent.
  std::string header(std::string_view name) const;
  bool has_header(std::string_view name) const;
};

class TestClient {
 public:
  // Connects to 127.0.0.1:port; check connected().
  explicit TestClient(uint16_t port, int timeout_ms = 5000);
  ~TestClient();
  TestClient(const TestClient&) = delete;
  TestClient& operator=(const TestClient&) = delete;

  bool connected() const { return fd_ >= 0; }
  int fd() const { return fd_; }

  // Sends all bytes (MSG_NOSIGNAL); false on error.
  bool send(std::string_view data);
  // Reads one response. `head_request`: the response has no body. Nullopt on EOF, timeout or a
  // malformed response.
  std::optional<HttpResponse> read_response(bool head_request = false);
  // Reads the response head and then exactly one chunk (for streams); nullopt on failure.
  std::optional<HttpResponse> read_head();
  std::optional<std::string> read_chunk();
  // True when the server closes the connection (EOF or reset) within `timeout_ms`; bytes that
  // arrive meanwhile are kept for later reads.
  bool wait_closed(int timeout_ms);
  // Bytes received but not consumed yet.
  const std::string& buffered() const { return buf_; }
  void close();

 private:
  bool fill();  // one recv into buf_; false on EOF/error/timeout
  std::optional<std::string> read_line();
  std::optional<std::string> read_exact(size_t n);

  int fd_ = -1;
  std::string buf_;
  bool eof_ = false;
};

// "METHOD path HTTP/1.1\r\nHost: t\r\n<extra>\r\n<body>" with Content-Length when body non-empty.
std::string make_request(std::string_view method, std::string_view path, std::string_view body = "",
                         std::string_view extra_headers = "");

}  // namespace sx::daemon::http::testing
