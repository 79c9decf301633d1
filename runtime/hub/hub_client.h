// The model hubs' HTTP APIs through libcurl (TLS, proxies from HTTPS_PROXY / https_proxy / NO_PROXY,
// HTTP/2 where the server offers it, redirects to the hub's CDN): a repository's files at a
// revision, and one file's download that survives interruptions.
//
// Hugging Face ($HF_ENDPOINT, default https://huggingface.co):
//   GET /api/models/REPO/revision/REV?blobs=true -> "sha" (the commit) and "siblings" with each
//       file's size, git blob id and, for LFS files, the SHA-256 the Hub publishes;
//   GET /REPO/resolve/COMMIT/PATH (Range: bytes=N-) -> the bytes.
// ModelScope ($MODELSCOPE_DOMAIN, default https://modelscope.cn; a bare host means https):
//   GET /api/v1/models/REPO/repo/files?Revision=REV&Recursive=true -> Data.Files (Path, Size, Sha256,
//       Revision);
//   GET /api/v1/models/REPO/repo?Revision=REV&FilePath=PATH -> the bytes.
// A token (HF_TOKEN, HUGGING_FACE_HUB_TOKEN, $HF_HOME/token as `huggingface-cli login` writes it,
// or MODELSCOPE_API_TOKEN) is sent as "Authorization: Bearer"; libcurl drops it on a redirect to
// another host.
//
// Every request: "Accept-Encoding: identity" and no decoding by libcurl (the bytes counted,
// bounded and written are the bytes on the wire); redirects followed to http(s) only: "https" from
// an https endpoint, "http,https" from an http one (a redirect to ftp://, file://, gopher://...
// or from https down to http is refused once, FAILED_PRECONDITION naming where it pointed, never
// retried as a network error).
//
// Small requests (a listing, fetch_text) are bounded in size and time: a body past
// max_listing_bytes / max_text_bytes stops the transfer at once (DATA_LOSS naming the repository,
// the URL and the limit), and the whole request must finish within request_timeout_seconds
// ($SEXTANT_HUB_TIMEOUT; DEADLINE_EXCEEDED naming the repository, the URL and the limit); neither
// is retried. An error body (4xx/5xx) is read up to 64 KiB.
//
// download(): under BlobLock (blob_lock.h) on target.lock, so one process or thread at a time
// fetches a file. A file that already has FINAL's name (another pull finished it while this one
// waited, or it looked complete but no SHA256SUMS vouched for it) is hashed on disk and kept when
// it matches, else deleted and fetched. The bytes go to PARTIAL, appended from its current size
// with a Range request (a server that ignores Range restarts it from 0); one response may bring at
// most the listed size less what PARTIAL holds: a body that passes it (a hub that sends more than
// it lists, with no Content-Length or an encoding) stops the transfer at that byte, PARTIAL is
// deleted and the download fails (DATA_LOSS naming the file, its listed size and what the hub
// sent), not retried. A connection reset, timeout, stall (no byte for stall_seconds; no overall
// deadline for a download), 5xx or short body is retried after a backoff, resuming (max_attempts
// bounds the attempts in a row that take the file no further than it has been; one that takes it
// further starts the count again);
// 429 waits for its Retry-After. A write error (a full disk: ENOSPC) is final, naming PARTIAL and
// the system's reason (RESOURCE_EXHAUSTED for ENOSPC / EDQUOT / EFBIG, else INTERNAL), PARTIAL
// kept. Once PARTIAL has the listed size, the bytes ON DISK are hashed (the single source: nothing
// is hashed in flight) and must give the published SHA-256 (LFS files; git blob id for the others),
// else PARTIAL is deleted and the file fetched again, up to max_attempts times; only then, still
// under the lock, is PARTIAL renamed to FINAL. Nothing whose bytes on disk do not hash to the
// published checksum ever has FINAL's name.
//
// Errors name the repository and file: PERMISSION_DENIED (401/403: gated or private; says to
// set HF_TOKEN), NOT_FOUND (404), DATA_LOSS (checksum or size mismatch after max_attempts; a body
// past its bound), UNAVAILABLE (network after max_attempts), CANCELLED (the cancel flag, e.g.
// Ctrl-C: PARTIAL kept for the next run), RESOURCE_EXHAUSTED (429 more than max_429 times; a full
// disk), FAILED_PRECONDITION (a redirect to a protocol not followed), DEADLINE_EXCEEDED (a small
// request past its deadline). Messages about what a hub sent that breaks its API say "the hub
// sent" (the daemon's catalogue of known failures answers them with advice that can help).
// Threading: a HubClient may be used from several threads at once (each call has its own handle).
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "runtime/base/status.h"
#include "runtime/hub/hub_cache.h"

namespace sx::hub {

struct RemoteFile {
  std::string path;        // in the repository, '/'-separated
  std::uint64_t size = 0;
  std::string sha256;      // published (LFS files; every ModelScope file); empty when unknown
  std::string blob_id;     // git blob id (Hugging Face); empty when unknown
  bool lfs() const { return !sha256.empty() && !blob_id.empty(); }
};

struct RepoListing {
  std::string commit;      // the revision resolved to a commit
  std::vector<RemoteFile> files;
};

struct HubOptions {
  HubSource source = HubSource::kHuggingFace;
  std::string endpoint;    // scheme://host[:port] without a trailing slash
  std::string token;       // empty: anonymous
  int max_attempts = 5;    // per file, for network errors and for checksum mismatches alike
  int max_429 = 30;
  int max_retry_after_seconds = 300;
  int stall_seconds = 60;
  double backoff_seconds = 1.0;  // doubled per retry, at most 30 s
  // The bounds of a small request (see above).
  int request_timeout_seconds = 120;                  // $SEXTANT_HUB_TIMEOUT
  std::uint64_t max_listing_bytes = 64ull << 20;
  std::uint64_t max_text_bytes = 16ull << 20;         // fetch_text: an index, a config
  const std::atomic<bool>* cancel = nullptr;
  // Said as retries happen ("model-00002-of-00003.safetensors: connection reset after 1.2 GiB;
  // resuming"); may be called from several threads.
  std::function<void(const std::string&)> note;
};

// Endpoint and token from the environment (HF_ENDPOINT, HF_TOKEN, ...; see above), and
// SEXTANT_HUB_TIMEOUT (seconds, 1 to 86400) for request_timeout_seconds.
HubOptions hub_options_from_env(HubSource source);

// The protocols a request may use and follow redirects to: "https" for an https endpoint, else
// "http,https" (libcurl's CURLOPT_PROTOCOLS_STR / CURLOPT_REDIR_PROTOCOLS_STR syntax).
std::string allowed_protocols(std::string_view endpoint);

// Where download() puts a file (see above).
struct DownloadTarget {
  std::string partial;            // the bytes as they arrive
  std::string final_path;         // the verified file
  std::string lock;               // its BlobLock; empty: none
  bool remove_lock = false;       // delete the lock file when done (a plain folder)
};

struct DownloadStats {
  std::uint64_t bytes_received = 0;  // body bytes over all attempts
  int attempts = 0;                  // requests made
  int resumes = 0;                   // requests that continued a partial file
  int checksum_failures = 0;
  bool reused = false;               // FINAL was there already and its bytes on disk matched
  std::string sha256;                // of the verified file, hashed on disk
};

class HubClient {
 public:
  explicit HubClient(HubOptions options);

  Result<RepoListing> list(std::string_view repo, std::string_view revision) const;
  // A small text file (an index, a config) of the repository at `commit`, with the same retries.
  Result<std::string> fetch_text(std::string_view repo, std::string_view commit, std::string_view path) const;
  // See the file comment. `progress(n)` is called with each n body bytes appended.
  Result<DownloadStats> download(std::string_view repo, std::string_view commit, const RemoteFile& file,
                                 const DownloadTarget& target,
                                 const std::function<void(std::int64_t)>& progress = {}) const;
  std::string file_url(std::string_view repo, std::string_view commit, std::string_view path) const;
  const HubOptions& options() const { return o_; }

 private:
  HubOptions o_;
};

// A listing's JSON (see above) as RepoListing. DATA_LOSS, naming the repository ("listing REPO: the
// hub sent an answer the ... API does not give (why)"), for JSON the API does not give (nesting
// deeper than 16 levels or more than 2^24 values among it), and for what could escape the cache
// when used as a file name: a path that is absolute, has an empty, "." or ".." segment or a
// control character, a commit that is not one folder name, a SHA-256 or blob id that is not hex of
// its length, a size over 2^50.
Result<RepoListing> parse_repo_listing(HubSource source, std::string_view text, std::string_view repo,
                                       std::string_view revision);

// "%2F" and friends for a path segment or a query value (RFC 3986 unreserved kept).
std::string url_escape(std::string_view s, bool keep_slash);

}  // namespace sx::hub
