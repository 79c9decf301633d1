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
// download(): the bytes go to PARTIAL, appended from its current size with a Range request (a
// server that ignores Range restarts it from 0), hashed as they arrive (the kept prefix is hashed
// first); a connection reset, timeout, stall (no byte for stall_seconds), 5xx or short body is
// retried after a backoff, resuming (max_attempts bounds the attempts in a row that bring no byte;
// one that brought bytes starts the count again); 429 waits for its Retry-After; once PARTIAL has
// the published size its SHA-256 (LFS files; git blob id for the others) must match, else PARTIAL
// is deleted and the file fetched again, up to max_attempts times; only then is PARTIAL renamed to
// FINAL. Nothing unverified ever has FINAL's name.
//
// Errors name the repository and file: PERMISSION_DENIED (401/403: gated or private; says to
// set HF_TOKEN), NOT_FOUND (404), DATA_LOSS (checksum or size mismatch after max_attempts),
// UNAVAILABLE (network after max_attempts), CANCELLED (the cancel flag, e.g. Ctrl-C: PARTIAL kept
// for the next run), RESOURCE_EXHAUSTED (429 more than max_429 times).
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
  const std::atomic<bool>* cancel = nullptr;
  // Said as retries happen ("model-00002-of-00003.safetensors: connection reset after 1.2 GiB;
  // resuming"); may be called from several threads.
  std::function<void(const std::string&)> note;
};

// Endpoint and token from the environment (HF_ENDPOINT, HF_TOKEN, ...; see above).
HubOptions hub_options_from_env(HubSource source);

struct DownloadStats {
  std::uint64_t bytes_received = 0;  // body bytes over all attempts
  int attempts = 0;                  // requests made
  int resumes = 0;                   // requests that continued a partial file
  int checksum_failures = 0;
  std::string sha256;                // of the verified file
};

class HubClient {
 public:
  explicit HubClient(HubOptions options);

  Result<RepoListing> list(std::string_view repo, std::string_view revision) const;
  // A small text file (an index, a config) of the repository at `commit`, with the same retries.
  Result<std::string> fetch_text(std::string_view repo, std::string_view commit, std::string_view path) const;
  // See the file comment. `progress(n)` is called with each n body bytes appended.
  Result<DownloadStats> download(std::string_view repo, std::string_view commit, const RemoteFile& file,
                                 const std::string& partial, const std::string& final_path,
                                 const std::function<void(std::int64_t)>& progress = {}) const;
  std::string file_url(std::string_view repo, std::string_view commit, std::string_view path) const;
  const HubOptions& options() const { return o_; }

 private:
  HubOptions o_;
};

// A listing's JSON (see above) as RepoListing. DATA_LOSS, naming the repository, for JSON the API
// does not give, and for what could escape the cache when used as a file name: a path that is
// absolute or has an empty, "." or ".." segment, a commit that is not one folder name, a SHA-256
// or blob id that is not hex of its length, a size over 2^50.
Result<RepoListing> parse_repo_listing(HubSource source, std::string_view text, std::string_view repo,
                                       std::string_view revision);

// "%2F" and friends for a path segment or a query value (RFC 3986 unreserved kept).
std::string url_escape(std::string_view s, bool keep_slash);

}  // namespace sx::hub
