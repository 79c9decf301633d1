// HubClient: repository listings and resumable, verified downloads over libcurl (hub_client.h).
#include "runtime/hub/hub_client.h"

#include <curl/curl.h>
#include <openssl/evp.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <mutex>
#include <thread>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "runtime/base/json_depth.h"
#include "runtime/base/json_parse.h"
#include "runtime/base/regular_file.h"
#include "runtime/base/sha256.h"
#include "runtime/hub/blob_lock.h"

namespace sx::hub {

namespace {

namespace fs = std::filesystem;
using nlohmann::json;

void global_init() {
  static std::once_flag once;
  std::call_once(once, [] { curl_global_init(CURL_GLOBAL_DEFAULT); });
}

std::string env(const char* name) {
  const char* v = std::getenv(name);
  return v != nullptr ? std::string(v) : std::string();
}

std::string human(std::uint64_t b) {
  if (b >= (1ull << 30)) return fmt::format("{:.2f} GiB", static_cast<double>(b) / (1ull << 30));
  if (b >= (1ull << 20)) return fmt::format("{:.1f} MiB", static_cast<double>(b) / (1ull << 20));
  return fmt::format("{} bytes", b);
}

struct CurlDeleter {
  void operator()(CURL* c) const { curl_easy_cleanup(c); }
};
struct SlistDeleter {
  void operator()(curl_slist* l) const { curl_slist_free_all(l); }
};

// One request's outcome.
struct Response {
  CURLcode curl = CURLE_OK;
  long status = 0;
  std::string body;          // an error body or a small text body (bounded)
  double retry_after = -1;   // seconds, from Retry-After
  std::string curl_error;
  std::string location;      // the last redirect's Location
  std::string encoding;      // Content-Encoding of the last response
  bool over_size = false;    // a text body passed its bound (the transfer was stopped)
  bool over_time = false;    // the request passed its deadline (the transfer was stopped)
  bool over_file = false;    // a file body passed the listed size (the transfer was stopped)
  curl_off_t announced = -1; // Content-Length of the body that passed the listed size; -1: none
  std::uint64_t reached = 0; // the file's size, had the byte that passed the listed size been written
  int write_errno = 0;       // writing the file failed (the transfer was stopped)
};

// A transfer's sink: small bodies to a string, file bodies to a FILE*.
struct Sink {
  CURL* handle = nullptr;
  std::FILE* file = nullptr;        // null: collect into Response::body
  std::uint64_t* file_size = nullptr;
  std::uint64_t listed = 0;         // the file's listed size: no response writes past it
  bool restart_if_200 = false;      // a Range was asked: a 200 means the server sends it all
  bool decided = false;
  bool to_file = false;
  Response* response = nullptr;
  const std::function<void(std::int64_t)>* progress = nullptr;
  std::uint64_t received = 0;
  std::uint64_t max_body = 64 << 10;  // a string body's bound
  bool has_deadline = false;
  std::chrono::steady_clock::time_point deadline{};
  const std::atomic<bool>* cancel = nullptr;
};

std::size_t on_header(char* data, std::size_t size, std::size_t n, void* user) {
  auto* sink = static_cast<Sink*>(user);
  std::string_view line(data, size * n);
  while (!line.empty() && (line.back() == '\n' || line.back() == '\r')) line.remove_suffix(1);
  const std::size_t colon = line.find(':');
  if (line.starts_with("HTTP/")) {  // a new response (after a redirect)
    sink->decided = false;
    sink->response->encoding.clear();
  } else if (colon != std::string_view::npos) {
    const std::string name = ascii_lower(line.substr(0, colon));
    std::string_view value = line.substr(colon + 1);
    while (!value.empty() && (value.front() == ' ' || value.front() == '\t')) value.remove_prefix(1);
    if (name == "retry-after") sink->response->retry_after = std::atof(std::string(value).c_str());
    if (name == "location") sink->response->location = std::string(value.substr(0, 2048));
    if (name == "content-encoding") sink->response->encoding = std::string(value.substr(0, 100));
  }
  return size * n;
}

// Returning anything but `bytes` stops the transfer (CURLE_WRITE_ERROR); the reason is in the
// response's flags.
std::size_t on_body(char* data, std::size_t size, std::size_t n, void* user) {
  auto* sink = static_cast<Sink*>(user);
  const std::size_t bytes = size * n;
  if (!sink->decided) {
    long status = 0;
    curl_easy_getinfo(sink->handle, CURLINFO_RESPONSE_CODE, &status);
    sink->to_file = sink->file != nullptr && (status == 200 || status == 206);
    if (sink->to_file && status == 200 && sink->restart_if_200) {
      // The server ignored the Range: start the file again.
      if (std::fflush(sink->file) != 0 || ftruncate(fileno(sink->file), 0) != 0 || std::fseek(sink->file, 0, SEEK_SET) != 0) {
        sink->response->write_errno = errno != 0 ? errno : EIO;
        return 0;
      }
      *sink->file_size = 0;
    }
    if (sink->to_file) {  // a body announced longer than the file can be: refused before a byte is written
      curl_off_t length = -1;
      curl_easy_getinfo(sink->handle, CURLINFO_CONTENT_LENGTH_DOWNLOAD_T, &length);
      if (length >= 0 && static_cast<std::uint64_t>(length) > sink->listed - *sink->file_size) {
        sink->response->over_file = true;
        sink->response->announced = length;
        sink->response->reached = *sink->file_size + static_cast<std::uint64_t>(length);
        return 0;
      }
    }
    sink->decided = true;
  }
  if (!sink->to_file) {
    if (sink->response->body.size() + bytes > sink->max_body) {
      sink->response->over_size = true;
      return 0;
    }
    sink->response->body.append(data, bytes);
    return bytes;
  }
  if (bytes > sink->listed - *sink->file_size) {  // past the listed size: not one byte of it is written
    sink->response->over_file = true;
    sink->response->reached = *sink->file_size + bytes;
    curl_easy_getinfo(sink->handle, CURLINFO_CONTENT_LENGTH_DOWNLOAD_T, &sink->response->announced);
    return 0;
  }
  if (std::fwrite(data, 1, bytes, sink->file) != bytes) {
    sink->response->write_errno = errno != 0 ? errno : EIO;
    return 0;
  }
  *sink->file_size += bytes;
  sink->received += bytes;
  if (sink->progress != nullptr && *sink->progress) (*sink->progress)(static_cast<std::int64_t>(bytes));
  return bytes;
}

int on_progress(void* user, curl_off_t, curl_off_t, curl_off_t, curl_off_t) {
  auto* sink = static_cast<Sink*>(user);
  if (sink->cancel != nullptr && sink->cancel->load(std::memory_order_relaxed)) return 1;
  if (sink->has_deadline && std::chrono::steady_clock::now() >= sink->deadline) {
    sink->response->over_time = true;
    return 1;
  }
  return 0;
}

}  // namespace

std::string url_escape(std::string_view s, bool keep_slash) {
  std::string out;
  for (unsigned char c : s) {
    if (std::isalnum(c) || c == '-' || c == '_' || c == '.' || c == '~' || (keep_slash && c == '/')) {
      out += static_cast<char>(c);
    } else {
      out += fmt::format("%{:02X}", c);
    }
  }
  return out;
}

HubOptions hub_options_from_env(HubSource source) {
  HubOptions o;
  o.source = source;
  if (source == HubSource::kModelScope) {
    std::string d = env("MODELSCOPE_DOMAIN");
    if (d.empty()) d = "modelscope.cn";
    o.endpoint = d.find("://") == std::string::npos ? "https://" + d : d;
    o.token = env("MODELSCOPE_API_TOKEN");
  } else {
    o.endpoint = env("HF_ENDPOINT");
    if (o.endpoint.empty()) o.endpoint = "https://huggingface.co";
    o.token = env("HF_TOKEN");
    if (o.token.empty()) o.token = env("HUGGING_FACE_HUB_TOKEN");
    if (o.token.empty()) {
      std::string home = env("HF_HOME");
      if (home.empty()) home = (fs::path(env("HOME")) / ".cache" / "huggingface").string();
      std::ifstream in(fs::path(home) / "token");
      std::getline(in, o.token);
      while (!o.token.empty() && std::isspace(static_cast<unsigned char>(o.token.back()))) o.token.pop_back();
    }
  }
  while (!o.endpoint.empty() && o.endpoint.back() == '/') o.endpoint.pop_back();
  if (const std::string t = env("SEXTANT_HUB_TIMEOUT"); !t.empty()) {
    char* end = nullptr;
    const long seconds = std::strtol(t.c_str(), &end, 10);
    if (end != nullptr && *end == '\0' && seconds >= 1 && seconds <= 86400) o.request_timeout_seconds = static_cast<int>(seconds);
  }
  return o;
}

std::string allowed_protocols(std::string_view endpoint) {
  return ascii_lower(endpoint.substr(0, 8)) == "https://" ? "https" : "http,https";
}

HubClient::HubClient(HubOptions options) : o_(std::move(options)) { global_init(); }

std::string HubClient::file_url(std::string_view repo, std::string_view commit, std::string_view path) const {
  if (o_.source == HubSource::kModelScope) {
    return fmt::format("{}/api/v1/models/{}/repo?Revision={}&FilePath={}", o_.endpoint, repo, url_escape(commit, false),
                       url_escape(path, false));
  }
  return fmt::format("{}/{}/resolve/{}/{}", o_.endpoint, repo, url_escape(commit, false), url_escape(path, true));
}

namespace {

// One GET; the body into `sink` (a file from `offset`, or the response's string). `timeout_seconds`
// > 0: the whole request's deadline (small requests); 0: none (downloads: the stall bound only).
Response perform(const HubOptions& o, const std::string& url, Sink& sink, std::uint64_t offset,
                 int timeout_seconds = 0) {
  Response r;
  std::unique_ptr<CURL, CurlDeleter> h(curl_easy_init());
  if (!h) {
    r.curl = CURLE_FAILED_INIT;
    r.curl_error = "curl_easy_init failed";
    return r;
  }
  sink.handle = h.get();
  sink.response = &r;
  sink.cancel = o.cancel;
  curl_slist* headers = nullptr;
  headers = curl_slist_append(headers, "Accept-Encoding: identity");
  if (!o.token.empty()) headers = curl_slist_append(headers, ("Authorization: Bearer " + o.token).c_str());
  std::unique_ptr<curl_slist, SlistDeleter> header_list(headers);
  char error[CURL_ERROR_SIZE] = {0};
  const std::string range = fmt::format("{}-", offset);
  curl_easy_setopt(h.get(), CURLOPT_URL, url.c_str());
  curl_easy_setopt(h.get(), CURLOPT_HTTPHEADER, headers);
  curl_easy_setopt(h.get(), CURLOPT_USERAGENT, "sextant/1 (pull)");
  curl_easy_setopt(h.get(), CURLOPT_FOLLOWLOCATION, 1L);
  curl_easy_setopt(h.get(), CURLOPT_MAXREDIRS, 10L);
  // http(s) only, and never from https down to http; the bytes as they are on the wire.
  const std::string protocols = allowed_protocols(o.endpoint);
  curl_easy_setopt(h.get(), CURLOPT_PROTOCOLS_STR, protocols.c_str());
  curl_easy_setopt(h.get(), CURLOPT_REDIR_PROTOCOLS_STR, protocols.c_str());
  curl_easy_setopt(h.get(), CURLOPT_HTTP_CONTENT_DECODING, 0L);
  curl_easy_setopt(h.get(), CURLOPT_NOSIGNAL, 1L);
  curl_easy_setopt(h.get(), CURLOPT_CONNECTTIMEOUT, 30L);
  curl_easy_setopt(h.get(), CURLOPT_LOW_SPEED_LIMIT, 1L);
  curl_easy_setopt(h.get(), CURLOPT_LOW_SPEED_TIME, static_cast<long>(o.stall_seconds));
  curl_easy_setopt(h.get(), CURLOPT_ERRORBUFFER, error);
  curl_easy_setopt(h.get(), CURLOPT_HEADERFUNCTION, on_header);
  curl_easy_setopt(h.get(), CURLOPT_HEADERDATA, &sink);
  curl_easy_setopt(h.get(), CURLOPT_WRITEFUNCTION, on_body);
  curl_easy_setopt(h.get(), CURLOPT_WRITEDATA, &sink);
  curl_easy_setopt(h.get(), CURLOPT_NOPROGRESS, 0L);
  curl_easy_setopt(h.get(), CURLOPT_XFERINFOFUNCTION, on_progress);
  curl_easy_setopt(h.get(), CURLOPT_XFERINFODATA, &sink);
  if (offset > 0) curl_easy_setopt(h.get(), CURLOPT_RANGE, range.c_str());
  if (timeout_seconds > 0) {
    sink.has_deadline = true;
    sink.deadline = std::chrono::steady_clock::now() + std::chrono::seconds(timeout_seconds);
    // on_progress stops it at the deadline; libcurl's own timer is the backstop (DNS, connect).
    curl_easy_setopt(h.get(), CURLOPT_TIMEOUT_MS, static_cast<long>(timeout_seconds) * 1000 + 500);
  }
  const auto start = std::chrono::steady_clock::now();
  r.curl = curl_easy_perform(h.get());
  curl_easy_getinfo(h.get(), CURLINFO_RESPONSE_CODE, &r.status);
  r.curl_error = error[0] != '\0' ? std::string(error) : std::string(curl_easy_strerror(r.curl));
  if (timeout_seconds > 0 && r.curl == CURLE_OPERATION_TIMEDOUT &&
      std::chrono::steady_clock::now() - start >= std::chrono::seconds(timeout_seconds)) {
    r.over_time = true;
  }
  // An error body past its bound was cut, not lost: the status still says what happened.
  if (r.over_size && (r.status < 200 || r.status >= 300)) r.curl = CURLE_OK;
  return r;
}

// A URL as it may be shown: no query (a CDN's signature) and at most 200 characters.
std::string shown_url(std::string_view url) {
  return std::string(url.substr(0, std::min<std::size_t>(url.find('?'), 200)));
}

// The final error of a transfer stopped by its bounds or refused by the protocol rules, or OK
// when what happened is worth retrying (or was an HTTP status).
Status final_transfer_error(const HubOptions& o, const Response& r, std::string_view repo, std::string_view what,
                            std::string_view url, std::uint64_t max_body, std::string_view body_name) {
  if (r.over_size && r.status >= 200 && r.status < 300) {
    const std::string limit = max_body % (1 << 20) == 0   ? fmt::format("{} MiB", max_body >> 20)
                              : max_body % (1 << 10) == 0 ? fmt::format("{} KiB", max_body >> 10)
                                                          : fmt::format("{} bytes", max_body);
    return data_loss_error(
        "{} {} on {}: the hub sent more than {} for {}, the most {} may hold; stopped reading it. The hub is "
        "not answering as its API does",
        what, repo, o.endpoint, limit, shown_url(url), body_name);
  }
  if (r.over_time) {
    return deadline_exceeded_error(
        "{} {} on {}: {} gave no complete answer within {} s (SEXTANT_HUB_TIMEOUT; {} of it had come); the hub "
        "is too slow or never ends its answer",
        what, repo, o.endpoint, shown_url(url), o.request_timeout_seconds, human(r.body.size()));
  }
  if (r.curl == CURLE_UNSUPPORTED_PROTOCOL || r.curl == CURLE_URL_MALFORMAT) {
    if (r.location.empty()) {
      return failed_precondition_error("{} {}: {} is not a URL pull fetches ({} only): {}", what, repo, shown_url(url),
                                       allowed_protocols(o.endpoint), r.curl_error);
    }
    return failed_precondition_error(
        "{} {} on {}: the hub redirected to {}, which pull does not follow (it follows {} only from {}): {}; use "
        "another endpoint (HF_ENDPOINT / MODELSCOPE_DOMAIN) or report it to the hub's operator",
        what, repo, o.endpoint, shown_url(r.location), allowed_protocols(o.endpoint), o.endpoint, r.curl_error);
  }
  return ok_status();
}

std::string error_text(const Response& r) {
  if (r.body.empty()) return "";
  std::string text = r.body.substr(0, 300);
  if (json_shape(r.body).depth <= 16) {
    const auto parsed = parse_json(r.body);
    const json& j = parsed.value;
    if (parsed.ok() && j.is_object() && j.contains("error") && j["error"].is_string()) text = j["error"].get<std::string>();
    if (parsed.ok() && j.is_object() && j.contains("Message") && j["Message"].is_string()) {
      text = j["Message"].get<std::string>();
    }
  }
  text = text.substr(0, 300);
  for (char& c : text) {
    if (c == '\n' || c == '\r') c = ' ';
  }
  return ": " + text;
}

// The final error for a 4xx, or OK when the status is worth retrying.
Status client_error(const HubOptions& o, const Response& r, std::string_view repo, std::string_view what) {
  if (r.status == 401 || r.status == 403) {
    return permission_denied_error(
        "{} {} on {}: the hub answered {}{}; {} is gated or private: accept its terms on the hub's page, then set "
        "{} (or pass --token){}",
        what, repo, o.endpoint, r.status, error_text(r), repo,
        o.source == HubSource::kModelScope ? "MODELSCOPE_API_TOKEN" : "HF_TOKEN",
        o.token.empty() ? " (no token was sent)" : " (the token sent was refused)");
  }
  if (r.status == 404) {
    return not_found_error("{} {} on {}: not found (404){}", what, repo, o.endpoint, error_text(r));
  }
  if (r.status >= 400 && r.status < 500 && r.status != 408 && r.status != 429) {
    return failed_precondition_error("{} {} on {}: the hub answered {}{}", what, repo, o.endpoint, r.status,
                                     error_text(r));
  }
  return ok_status();
}

bool cancelled(const HubOptions& o) { return o.cancel != nullptr && o.cancel->load(std::memory_order_relaxed); }

// Sleeps in small steps, returning false when cancelled.
bool sleep_for(const HubOptions& o, double seconds) {
  const auto until = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
  while (std::chrono::steady_clock::now() < until) {
    if (cancelled(o)) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  return !cancelled(o);
}

// A small GET with the retries of a download (429, 5xx, network), bounded by `max_body` bytes
// (`body_name` says of what, for the error) and by o.request_timeout_seconds.
Result<std::string> get_text(const HubOptions& o, const std::string& url, std::string_view repo, std::string_view what,
                             std::uint64_t max_body, std::string_view body_name) {
  int failures = 0, throttled = 0;
  double backoff = o.backoff_seconds;
  for (;;) {
    Sink sink;
    sink.max_body = max_body;
    const Response r = perform(o, url, sink, 0, o.request_timeout_seconds);
    if (cancelled(o)) return cancelled_error("{} {}: interrupted", what, repo);
    SX_RETURN_IF_ERROR(final_transfer_error(o, r, repo, what, url, max_body, body_name));
    if (r.curl == CURLE_OK && r.status >= 200 && r.status < 300) return r.body;
    if (r.curl == CURLE_OK) SX_RETURN_IF_ERROR(client_error(o, r, repo, what));
    if (r.curl == CURLE_OK && r.status == 429) {
      if (++throttled > o.max_429) {
        return resource_exhausted_error("{} {}: the hub answered 429 (too many requests) {} times", what, repo, throttled);
      }
      const double wait = r.retry_after >= 0 ? std::min<double>(r.retry_after, o.max_retry_after_seconds) : backoff;
      if (o.note) o.note(fmt::format("{} {}: 429 too many requests; waiting {:.0f} s (Retry-After)", what, repo, wait));
      if (!sleep_for(o, wait)) return cancelled_error("{} {}: interrupted", what, repo);
      continue;
    }
    if (++failures >= o.max_attempts) {
      return unavailable_error("{} {} on {}: {} after {} attempts", what, repo, o.endpoint,
                               r.curl != CURLE_OK ? r.curl_error : fmt::format("HTTP {}{}", r.status, error_text(r)),
                               failures);
    }
    if (!sleep_for(o, backoff)) return cancelled_error("{} {}: interrupted", what, repo);
    backoff = std::min(backoff * 2, 30.0);
  }
}

// A failed write of PARTIAL: final (a full disk does not empty itself between retries), naming
// the file and the system's reason; what was written is kept for the next run.
Status write_error(int err, std::string_view where, const std::string& partial, std::uint64_t have,
                   std::uint64_t size) {
  const std::string text = fmt::format("{}: cannot write {}: {} ({} of {} written, kept for the next run)", where,
                                       partial, std::strerror(err), human(have), human(size));
  if (err == ENOSPC || err == EDQUOT || err == EFBIG) return resource_exhausted_error("{}", text);
  return internal_error("{}", text);
}

// What a file on disk hashes to, read once: its size, SHA-256 and git blob id (SHA-1 of
// "blob <size>\0" and the bytes).
struct Digests {
  std::uint64_t size = 0;
  std::string sha256;
  std::string blob_id;
};

Result<Digests> digest_file(const std::string& path) {
  SX_ASSIGN_OR_RETURN(RegularFile file, open_regular_file(path));
  std::unique_ptr<EVP_MD_CTX, decltype(&EVP_MD_CTX_free)> sha1(EVP_MD_CTX_new(), EVP_MD_CTX_free);
  if (!sha1 || EVP_DigestInit_ex(sha1.get(), EVP_sha1(), nullptr) != 1) return internal_error("SHA-1 unavailable");
  const std::string head = fmt::format("blob {}", file.size);
  EVP_DigestUpdate(sha1.get(), head.data(), head.size() + 1);  // with its NUL
  Sha256 sha256;
  Digests d;
  std::vector<std::uint8_t> buf(1 << 20);
  for (;;) {
    const ssize_t n = ::read(file.fd.get(), buf.data(), buf.size());
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return data_loss_error("{}: cannot read: {}", path, std::strerror(errno));
    if (n == 0) break;
    sha256.update({buf.data(), static_cast<std::size_t>(n)});
    EVP_DigestUpdate(sha1.get(), buf.data(), static_cast<std::size_t>(n));
    d.size += static_cast<std::uint64_t>(n);
  }
  unsigned char md[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  EVP_DigestFinal_ex(sha1.get(), md, &len);
  // A file that changed size while read: its blob id's header lied; the size check refuses it.
  for (unsigned int i = 0; i < len; ++i) d.blob_id += fmt::format("{:02x}", md[i]);
  d.sha256 = sha256.finish_hex();
  return d;
}

// Why the bytes of `d` are not the published file, or empty when they are.
std::string mismatch(const RemoteFile& file, const Digests& d) {
  if (d.size != file.size) return fmt::format("{} bytes where the hub lists {}", d.size, file.size);
  if (!file.sha256.empty() && d.sha256 != file.sha256) {
    return fmt::format("SHA-256 {} where the hub publishes {}", d.sha256, file.sha256);
  }
  if (file.sha256.empty() && !file.blob_id.empty() && d.blob_id != file.blob_id) {
    return fmt::format("git blob id {} where the hub lists {}", d.blob_id, file.blob_id);
  }
  if (file.sha256.empty() && file.blob_id.empty()) return "no checksum to compare with";
  return {};
}

}  // namespace

Result<RepoListing> parse_repo_listing(HubSource source, std::string_view text, std::string_view repo,
                                       std::string_view revision) {
  RepoListing out;
  // Sizes beyond this are no file a hub serves (and would overflow the sums of a pull).
  constexpr std::uint64_t kMaxFile = 1ull << 50;
  auto bad = [&](const std::string& why) {
    return data_loss_error("listing {}: the hub sent an answer the {} API does not give ({})", repo,
                           source_name(source), why);
  };
  auto checked_path = [](const std::string& p) {
    // A relative path inside the repository: no absolute path, no "..", no empty or "." segment, no
    // control character (a newline would forge a line of SHA256SUMS).
    if (p.empty() || p.size() > 4096 || p.front() == '/') return false;
    if (std::any_of(p.begin(), p.end(), [](char c) { return static_cast<unsigned char>(c) < 0x20 || c == 0x7f; })) {
      return false;
    }
    std::size_t start = 0;
    while (start <= p.size()) {
      const std::size_t end = std::min(p.find('/', start), p.size());
      const std::string_view seg(p.data() + start, end - start);
      if (seg.empty() || seg == "." || seg == "..") return false;
      start = end + 1;
    }
    return true;
  };
  // A listing nests 4 levels; its values are a few per file.
  if (const JsonShape shape = json_shape(text); shape.depth > 16 || shape.values > (std::size_t{1} << 24)) {
    return bad(fmt::format("JSON nested {} levels deep with {} values; a listing has at most 16 and {}", shape.depth,
                           shape.values, std::size_t{1} << 24));
  }
  auto parsed = parse_json(text);
  if (!parsed.ok()) return bad(parsed.error);
  try {
    const json& j = parsed.value;
    if (source == HubSource::kModelScope) {
      out.commit = std::string(revision);
      for (const json& f : j.at("Data").at("Files")) {
        if (f.value("Type", "blob") != "blob") continue;
        RemoteFile r;
        r.path = f.at("Path").get<std::string>();
        r.size = f.at("Size").get<std::uint64_t>();
        r.sha256 = ascii_lower(f.value("Sha256", ""));
        if (f.contains("Revision") && f["Revision"].is_string()) out.commit = f["Revision"].get<std::string>();
        out.files.push_back(std::move(r));
      }
    } else {
      out.commit = j.at("sha").get<std::string>();
      for (const json& sib : j.at("siblings")) {
        RemoteFile r;
        r.path = sib.at("rfilename").get<std::string>();
        if (!sib.contains("size")) return bad(fmt::format("no size for '{}'", r.path));
        r.size = sib.at("size").get<std::uint64_t>();
        r.blob_id = ascii_lower(sib.value("blobId", ""));
        if (sib.contains("lfs") && sib["lfs"].is_object()) r.sha256 = ascii_lower(sib["lfs"].value("sha256", ""));
        out.files.push_back(std::move(r));
      }
      if (out.commit.size() != 40 ||
          !std::all_of(out.commit.begin(), out.commit.end(), [](char c) { return std::isxdigit(static_cast<unsigned char>(c)); })) {
        return bad(fmt::format("the revision resolved to '{}', not a commit hash", out.commit.substr(0, 80)));
      }
    }
  } catch (const json::exception& e) {
    return bad(e.what());
  }
  // Everything later builds file names from these: only safe ones pass.
  auto hex = [](const std::string& s, std::size_t n) {
    return s.size() == n && std::all_of(s.begin(), s.end(), [](char c) { return std::isxdigit(static_cast<unsigned char>(c)); });
  };
  if (out.commit.empty() || out.commit.size() > 128 || !checked_path(out.commit) || out.commit.find('/') != std::string::npos ||
      !check_revision(out.commit).ok()) {
    return bad(fmt::format("a revision '{}' that cannot name a folder", out.commit.substr(0, 80)));
  }
  for (const RemoteFile& f : out.files) {
    if (!checked_path(f.path)) return bad(fmt::format("a file path '{}' outside the repository", f.path.substr(0, 200)));
    if (f.size > kMaxFile) return bad(fmt::format("'{}' of {} bytes", f.path, f.size));
    if (!f.sha256.empty() && !hex(f.sha256, 64)) return bad(fmt::format("'{}' with SHA-256 '{}'", f.path, f.sha256.substr(0, 80)));
    if (!f.blob_id.empty() && !hex(f.blob_id, 40)) return bad(fmt::format("'{}' with blob id '{}'", f.path, f.blob_id.substr(0, 80)));
  }
  return out;
}

Result<RepoListing> HubClient::list(std::string_view repo, std::string_view revision) const {
  const std::string url =
      o_.source == HubSource::kModelScope
          ? fmt::format("{}/api/v1/models/{}/repo/files?Revision={}&Recursive=true", o_.endpoint, repo,
                        url_escape(revision, false))
          : fmt::format("{}/api/models/{}/revision/{}?blobs=true", o_.endpoint, repo, url_escape(revision, false));
  SX_ASSIGN_OR_RETURN(std::string text, get_text(o_, url, repo, "listing", o_.max_listing_bytes, "a listing"));
  auto listing = parse_repo_listing(o_.source, text, repo, revision);
  if (!listing.ok()) return data_loss_error("{} (from {})", listing.status().message(), o_.endpoint);
  return listing;
}

Result<std::string> HubClient::fetch_text(std::string_view repo, std::string_view commit, std::string_view path) const {
  return get_text(o_, file_url(repo, commit, path), repo, fmt::format("fetching {} of", path), o_.max_text_bytes,
                  "a text file");
}

Result<DownloadStats> HubClient::download(std::string_view repo, std::string_view commit, const RemoteFile& file,
                                          const DownloadTarget& target,
                                          const std::function<void(std::int64_t)>& progress) const {
  DownloadStats stats;
  const std::string& partial = target.partial;
  const std::string& final_path = target.final_path;
  const std::string url = file_url(repo, commit, file.path);
  const std::string where = fmt::format("{}: {}", repo, file.path);
  std::error_code ec;
  fs::create_directories(fs::path(partial).parent_path(), ec);
  // One fetcher per file: a second pull (or thread) waits here, then finds the file done.
  BlobLock lock;
  if (!target.lock.empty()) {
    auto held = BlobLock::acquire(target.lock, target.remove_lock, o_.cancel, [&] {
      if (o_.note) o_.note(fmt::format("{}: another download holds {}; waiting for it", where, target.lock));
    });
    if (!held.ok()) {
      if (held.status().code() == StatusCode::kCancelled) {
        return cancelled_error("{}: interrupted while waiting for another download of it", where);
      }
      return held.status().with_context(where);
    }
    lock = std::move(*held);
  }
  // A file with the final name is kept only when its bytes on disk are the published ones.
  if (fs::is_regular_file(final_path, ec)) {
    auto d = digest_file(final_path);
    const std::string problem = d.ok() ? mismatch(file, *d) : d.status().message();
    if (problem.empty()) {
      stats.reused = true;
      stats.sha256 = d->sha256;
      return stats;
    }
    if (o_.note) o_.note(fmt::format("{}: {} is not the published file ({}); fetching it again", where, final_path, problem));
    fs::remove(final_path, ec);
  }
  int failures = 0, throttled = 0;
  std::uint64_t furthest = 0;  // the most of the file PARTIAL has held after an attempt
  double backoff = o_.backoff_seconds;
  for (;;) {
    if (cancelled(o_)) return cancelled_error("{}: interrupted; {} is kept to resume", where, partial);
    std::uint64_t have = fs::exists(partial, ec) ? fs::file_size(partial, ec) : 0;
    if (ec || have > file.size) {  // longer than the file: nothing of it can be trusted
      fs::remove(partial, ec);
      have = 0;
    }
    if (have < file.size || file.size == 0) {
      std::FILE* f = std::fopen(partial.c_str(), have > 0 ? "r+b" : "wb");
      if (f == nullptr) return write_error(errno, where, partial, have, file.size);
      if (std::fseek(f, static_cast<long>(have), SEEK_SET) != 0) {
        const int err = errno;
        std::fclose(f);
        return write_error(err, where, partial, have, file.size);
      }
      Sink sink;
      sink.file = f;
      sink.file_size = &have;
      sink.listed = file.size;
      sink.restart_if_200 = have > 0;
      sink.progress = &progress;
      if (have > 0) ++stats.resumes;
      ++stats.attempts;
      const Response r = perform(o_, url, sink, have);
      const bool closed = std::fclose(f) == 0;
      const int close_errno = errno;
      stats.bytes_received += sink.received;
      if (r.over_file) {
        fs::remove(partial, ec);
        return data_loss_error(
            "{}: the hub sent more than the {} bytes it lists for the file (at least {} bytes{}{}); stopped there, "
            "nothing was kept",
            where, file.size, r.reached,
            r.announced >= 0 ? fmt::format(", a body of {} announced", r.announced) : std::string(", no Content-Length"),
            r.encoding.empty() ? std::string()
                               : fmt::format(", Content-Encoding {} though identity was asked", r.encoding.substr(0, 40)));
      }
      if (r.write_errno != 0) return write_error(r.write_errno, where, partial, have, file.size);
      if (!closed) return write_error(close_errno, where, partial, have, file.size);
      if (cancelled(o_)) return cancelled_error("{}: interrupted; {} is kept to resume", where, partial);
      have = fs::file_size(partial, ec);
      if (ec) have = 0;
      SX_RETURN_IF_ERROR(final_transfer_error(o_, r, repo, fmt::format("downloading {} of", file.path), url, sink.max_body,
                                              "an answer that is not the file"));
      if (r.curl == CURLE_OK) SX_RETURN_IF_ERROR(client_error(o_, r, repo, fmt::format("downloading {} of", file.path)));
      if (r.curl == CURLE_OK && r.status == 429) {
        if (++throttled > o_.max_429) {
          return resource_exhausted_error("{}: the hub answered 429 (too many requests) {} times", where, throttled);
        }
        const double wait = r.retry_after >= 0 ? std::min<double>(r.retry_after, o_.max_retry_after_seconds) : backoff;
        if (o_.note) o_.note(fmt::format("{}: 429 too many requests; waiting {:.0f} s (Retry-After)", where, wait));
        if (!sleep_for(o_, wait)) return cancelled_error("{}: interrupted; {} is kept to resume", where, partial);
        continue;
      }
      const bool served = r.curl == CURLE_OK && (r.status == 200 || r.status == 206 || r.status == 416);
      if (!served || have < file.size) {
        // An attempt that took the file further than any before starts the count again: only
        // attempts in a row that brought it no further are bounded, so a long file over a flaky
        // link still completes, and a hub that ignores Range and drops each answer at the same
        // byte (every attempt brings bytes, from 0) does not retry for ever.
        if (have > furthest) failures = 0, backoff = o_.backoff_seconds;
        furthest = std::max(furthest, have);
        if (++failures >= o_.max_attempts) {
          return unavailable_error("{}: {} after {} attempts ({} of {} kept in {} for the next run)", where,
                                   r.curl != CURLE_OK ? r.curl_error : fmt::format("HTTP {}{}", r.status, error_text(r)),
                                   failures, human(have), human(file.size), partial);
        }
        if (o_.note) {
          o_.note(fmt::format("{}: {} at {} of {}; resuming in {:.0f} s", where,
                              r.curl != CURLE_OK ? r.curl_error : fmt::format("HTTP {}", r.status), human(have),
                              human(file.size), backoff));
        }
        if (!sleep_for(o_, backoff)) return cancelled_error("{}: interrupted; {} is kept to resume", where, partial);
        backoff = std::min(backoff * 2, 30.0);
        continue;
      }
    }
    // The listed size is here: the bytes on disk, and nothing else, decide whether it gets its name.
    auto d = digest_file(partial);
    const std::string problem = d.ok() ? mismatch(file, *d) : d.status().message();
    if (!problem.empty()) {
      fs::remove(partial, ec);
      ++stats.checksum_failures;
      if (++failures >= o_.max_attempts) {
        return data_loss_error("{}: the hub sent a corrupt file ({}) {} times in a row; nothing was kept", where,
                               problem, failures);
      }
      if (o_.note) o_.note(fmt::format("{}: corrupt download ({}); fetching it again", where, problem));
      continue;
    }
    fs::create_directories(fs::path(final_path).parent_path(), ec);
    fs::rename(partial, final_path, ec);
    if (ec) return internal_error("{}: cannot rename {} to {}: {}", where, partial, final_path, ec.message());
    stats.sha256 = d->sha256;
    return stats;
  }
}

}  // namespace sx::hub
