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

#include "runtime/base/sha256.h"

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
};

// A transfer's sink: small bodies to a string, file bodies to a FILE* with the hash.
struct Sink {
  CURL* handle = nullptr;
  std::FILE* file = nullptr;        // null: collect into Response::body
  Sha256* hash = nullptr;
  std::uint64_t* file_size = nullptr;
  bool restart_if_200 = false;      // a Range was asked: a 200 means the server sends it all
  bool decided = false;
  bool to_file = false;
  Response* response = nullptr;
  const std::function<void(std::int64_t)>* progress = nullptr;
  std::uint64_t received = 0;
  bool reset_hash = false;          // set when a 200 restarted the file
  const std::atomic<bool>* cancel = nullptr;
};

std::size_t on_header(char* data, std::size_t size, std::size_t n, void* user) {
  auto* sink = static_cast<Sink*>(user);
  std::string_view line(data, size * n);
  if (line.size() > 12) {
    if (ascii_lower(line.substr(0, 12)) == "retry-after:") {
      std::string v(line.substr(12));
      sink->response->retry_after = std::atof(v.c_str());
    }
  }
  if (line.starts_with("HTTP/")) sink->decided = false;  // a new response (after a redirect)
  return size * n;
}

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
        return 0;
      }
      *sink->file_size = 0;
      sink->reset_hash = true;
    }
    sink->decided = true;
  }
  if (!sink->to_file) {
    if (sink->response->body.size() < (64u << 20)) sink->response->body.append(data, bytes);
    return bytes;
  }
  if (std::fwrite(data, 1, bytes, sink->file) != bytes) return 0;
  sink->hash->update({reinterpret_cast<const std::uint8_t*>(data), bytes});
  *sink->file_size += bytes;
  sink->received += bytes;
  if (sink->progress != nullptr && *sink->progress) (*sink->progress)(static_cast<std::int64_t>(bytes));
  return bytes;
}

int on_progress(void* user, curl_off_t, curl_off_t, curl_off_t, curl_off_t) {
  auto* sink = static_cast<Sink*>(user);
  return sink->cancel != nullptr && sink->cancel->load(std::memory_order_relaxed) ? 1 : 0;
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
  return o;
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

// One GET; the body into `sink` (a file from `offset`, or the response's string).
Response perform(const HubOptions& o, const std::string& url, Sink& sink, std::uint64_t offset) {
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
  r.curl = curl_easy_perform(h.get());
  curl_easy_getinfo(h.get(), CURLINFO_RESPONSE_CODE, &r.status);
  r.curl_error = error[0] != '\0' ? std::string(error) : std::string(curl_easy_strerror(r.curl));
  return r;
}

std::string error_text(const Response& r) {
  if (r.body.empty()) return "";
  std::string text = r.body.substr(0, 300);
  try {
    const json j = json::parse(r.body);
    if (j.is_object() && j.contains("error") && j["error"].is_string()) text = j["error"].get<std::string>();
    if (j.is_object() && j.contains("Message") && j["Message"].is_string()) text = j["Message"].get<std::string>();
  } catch (const json::exception&) {
  }
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

// A small GET with the retries of a download (429, 5xx, network).
Result<std::string> get_text(const HubOptions& o, const std::string& url, std::string_view repo, std::string_view what) {
  int failures = 0, throttled = 0;
  double backoff = o.backoff_seconds;
  for (;;) {
    Sink sink;
    const Response r = perform(o, url, sink, 0);
    if (cancelled(o)) return cancelled_error("{} {}: interrupted", what, repo);
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

// git's blob id: SHA-1 of "blob <size>\0" and the bytes.
Result<std::string> git_blob_id(const std::string& path, std::uint64_t size) {
  std::unique_ptr<EVP_MD_CTX, decltype(&EVP_MD_CTX_free)> ctx(EVP_MD_CTX_new(), EVP_MD_CTX_free);
  if (!ctx || EVP_DigestInit_ex(ctx.get(), EVP_sha1(), nullptr) != 1) return internal_error("SHA-1 unavailable");
  const std::string head = fmt::format("blob {}", size);
  EVP_DigestUpdate(ctx.get(), head.data(), head.size() + 1);  // with its NUL
  std::ifstream in(path, std::ios::binary);
  std::vector<char> buf(1 << 16);
  while (in) {
    in.read(buf.data(), static_cast<std::streamsize>(buf.size()));
    if (in.gcount() > 0) EVP_DigestUpdate(ctx.get(), buf.data(), static_cast<std::size_t>(in.gcount()));
  }
  unsigned char md[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  EVP_DigestFinal_ex(ctx.get(), md, &len);
  std::string hex;
  for (unsigned int i = 0; i < len; ++i) hex += fmt::format("{:02x}", md[i]);
  return hex;
}

}  // namespace

Result<RepoListing> parse_repo_listing(HubSource source, std::string_view text, std::string_view repo,
                                       std::string_view revision) {
  RepoListing out;
  // Sizes beyond this are no file a hub serves (and would overflow the sums of a pull).
  constexpr std::uint64_t kMaxFile = 1ull << 50;
  auto bad = [&](const std::string& why) {
    return data_loss_error("listing {}: an answer the {} API does not give ({})", repo, source_name(source), why);
  };
  auto checked_path = [](const std::string& p) {
    // A relative path inside the repository: no absolute path, no "..", no empty or "." segment.
    if (p.empty() || p.size() > 4096 || p.front() == '/' || p.find('\0') != std::string::npos) return false;
    std::size_t start = 0;
    while (start <= p.size()) {
      const std::size_t end = std::min(p.find('/', start), p.size());
      const std::string_view seg(p.data() + start, end - start);
      if (seg.empty() || seg == "." || seg == "..") return false;
      start = end + 1;
    }
    return true;
  };
  try {
    const json j = json::parse(text);
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
  if (out.commit.empty() || out.commit.size() > 128 || !checked_path(out.commit) || out.commit.find('/') != std::string::npos) {
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
  SX_ASSIGN_OR_RETURN(std::string text, get_text(o_, url, repo, "listing"));
  auto listing = parse_repo_listing(o_.source, text, repo, revision);
  if (!listing.ok()) return data_loss_error("{} (from {})", listing.status().message(), o_.endpoint);
  return listing;
}

Result<std::string> HubClient::fetch_text(std::string_view repo, std::string_view commit, std::string_view path) const {
  return get_text(o_, file_url(repo, commit, path), repo, fmt::format("fetching {} of", path));
}

Result<DownloadStats> HubClient::download(std::string_view repo, std::string_view commit, const RemoteFile& file,
                                          const std::string& partial, const std::string& final_path,
                                          const std::function<void(std::int64_t)>& progress) const {
  DownloadStats stats;
  const std::string url = file_url(repo, commit, file.path);
  const std::string where = fmt::format("{}: {}", repo, file.path);
  std::error_code ec;
  fs::create_directories(fs::path(partial).parent_path(), ec);
  int failures = 0, throttled = 0;
  double backoff = o_.backoff_seconds;
  for (;;) {
    if (cancelled(o_)) return cancelled_error("{}: interrupted; {} is kept to resume", where, partial);
    std::uint64_t have = fs::exists(partial, ec) ? fs::file_size(partial, ec) : 0;
    if (have > file.size) {  // longer than the file: nothing of it can be trusted
      fs::remove(partial, ec);
      have = 0;
    }
    auto hash = std::make_unique<Sha256>();
    if (have > 0) {  // the kept prefix goes into the hash first
      std::ifstream in(partial, std::ios::binary);
      std::vector<char> buf(1 << 20);
      std::uint64_t left = have;
      while (left > 0 && in) {
        in.read(buf.data(), static_cast<std::streamsize>(std::min<std::uint64_t>(buf.size(), left)));
        const auto got = static_cast<std::uint64_t>(in.gcount());
        if (got == 0) break;
        hash->update({reinterpret_cast<const std::uint8_t*>(buf.data()), got});
        left -= got;
      }
    }
    Response r;
    if (have < file.size || file.size == 0) {
      std::FILE* f = std::fopen(partial.c_str(), have > 0 ? "r+b" : "wb");
      if (f == nullptr) return internal_error("{}: cannot write {}: {}", where, partial, std::strerror(errno));
      std::fseek(f, static_cast<long>(have), SEEK_SET);
      Sink sink;
      sink.file = f;
      sink.hash = hash.get();
      sink.file_size = &have;
      sink.restart_if_200 = have > 0;
      sink.progress = &progress;
      if (have > 0) ++stats.resumes;
      ++stats.attempts;
      r = perform(o_, url, sink, have);
      if (sink.reset_hash) {
        // The server sent the whole file: hash what the file now holds.
        std::fflush(f);
        hash = std::make_unique<Sha256>();
        std::ifstream in(partial, std::ios::binary);
        std::vector<char> buf(1 << 20);
        while (in) {
          in.read(buf.data(), static_cast<std::streamsize>(buf.size()));
          if (in.gcount() > 0) hash->update({reinterpret_cast<const std::uint8_t*>(buf.data()), static_cast<std::size_t>(in.gcount())});
        }
      }
      const bool closed = std::fclose(f) == 0;
      stats.bytes_received += sink.received;
      if (!closed) return internal_error("{}: cannot write {}: {}", where, partial, std::strerror(errno));
      if (cancelled(o_)) return cancelled_error("{}: interrupted; {} is kept to resume", where, partial);
      have = fs::file_size(partial, ec);
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
        // An attempt that moved the file on starts the count again: only attempts in a row that
        // brought nothing are bounded, so a long file over a flaky link still completes.
        if (sink.received > 0) failures = 0, backoff = o_.backoff_seconds;
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
    // The published size is here: check it before it gets its name.
    std::string problem;
    const std::string sha = hash->finish_hex();
    if (have != file.size) {
      problem = fmt::format("{} bytes where the hub lists {}", have, file.size);
    } else if (!file.sha256.empty() && sha != file.sha256) {
      problem = fmt::format("SHA-256 {} where the hub publishes {}", sha, file.sha256);
    } else if (file.sha256.empty() && file.blob_id.size() == 40) {
      SX_ASSIGN_OR_RETURN(std::string id, git_blob_id(partial, have));
      if (id != file.blob_id) problem = fmt::format("git blob id {} where the hub lists {}", id, file.blob_id);
    }
    if (!problem.empty()) {
      fs::remove(partial, ec);
      ++stats.checksum_failures;
      if (++failures >= o_.max_attempts) {
        return data_loss_error("{}: the download is corrupt ({}) after {} attempts; nothing was kept", where, problem,
                               failures);
      }
      if (o_.note) o_.note(fmt::format("{}: corrupt download ({}); fetching it again", where, problem));
      continue;
    }
    fs::create_directories(fs::path(final_path).parent_path(), ec);
    fs::rename(partial, final_path, ec);
    if (ec) return internal_error("{}: cannot rename {} to {}: {}", where, partial, final_path, ec.message());
    stats.sha256 = sha;
    return stats;
  }
}

}  // namespace sx::hub
