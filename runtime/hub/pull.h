// `sextant pull`: a model from the Hugging Face Hub or ModelScope into the shared cache (or a plain
// folder), every file resumable and verified before it gets its name (hub_client.h), a few at a
// time, and a SHA256SUMS file beside them so `doctor` and the start-up checks verify it later.
//
// Which files (select_files): --include globs when given; else for REPO:QUANT the GGUF file(s) of
// that quantisation (every part of a split -0000i-of-0000N file, or an error naming the missing
// part); else a safetensors repository's model.safetensors.index.json with every shard it names
// (an error names a shard the repository lacks), or its model.safetensors, with the config,
// generation config and tokenizer files; else a GGUF repository's only GGUF file (several: an
// error listing them and asking for :QUANT).
//
// What is trusted without a download (cheap and correct): a file is taken unread only when it has
// its listed size and the snapshot's (or folder's) SHA256SUMS, which a pull writes from the bytes
// it hashed on disk, gives the SHA-256 the hub publishes for it. Every other file that looks
// complete (a blob left by another tool, another pull or an older Sextant; a small git file) is
// hashed on disk under its lock by download() and kept when it matches, fetched again when not.
// (A SHA256SUMS written by a Sextant from before this rule, which hashed bytes in flight, is taken
// at its word too; `sextant inspect --verify-checksums` re-hashes a snapshot, and `sextant rm`
// then a pull fetches it again.)
// Concurrent pulls of one repository on one cache (or into one folder) are safe: each file is
// fetched under its BlobLock (huggingface_hub's .locks/ in the cache), so a second pull waits
// ("another download holds ...; waiting for it") and then finds the file done; SHA256SUMS and refs
// are written through temporaries of each process's own.
//
// Errors: those of hub_client.h and hub_cache.h, INVALID_ARGUMENT for a selection that matches
// nothing (naming what the repository holds) and for a revision check_revision refuses (before any
// request). Threading: pull_model runs its downloads on `parallel` threads of its own and returns
// when all are done or one failed (the others stop at their next chunk; their .partial files are
// kept).
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "runtime/base/status.h"
#include "runtime/hub/hub_cache.h"
#include "runtime/hub/hub_client.h"

namespace sx::hub {

// `index_json` is called (once) for model.safetensors.index.json's text when the listing has one.
Result<std::vector<RemoteFile>> select_files(const RepoListing& listing, const ModelRef& ref,
                                             const std::vector<std::string>& includes,
                                             const std::function<Result<std::string>()>& index_json);
// fnmatch-style: '*' (not across '/'), '**' (across), '?'.
bool glob_match(std::string_view pattern, std::string_view path);

struct PullOptions {
  ModelRef ref;
  std::string revision;               // empty: "main" (Hugging Face) or "master" (ModelScope)
  std::vector<std::string> includes;  // globs; empty: select_files' choice
  std::string local_dir;              // empty: the cache
  std::string cache;                  // empty: hub_cache_dir()
  int parallel = 3;
  HubOptions hub;                     // endpoint, token, retries, cancel flag, notes
  // Progress: bytes done and total over the files to fetch, files done and total; called often.
  std::function<void(std::uint64_t done, std::uint64_t total, int files_done, int files_total)> progress;
};

struct PullResult {
  std::string path;       // what `serve --model` loads (model_path_in_snapshot)
  std::string dir;        // the snapshot (or local) directory
  std::string commit;
  int files = 0, files_fetched = 0;
  std::uint64_t bytes = 0, bytes_fetched = 0;  // of the selection; body bytes received
  int resumes = 0, checksum_failures = 0;
};

Result<PullResult> pull_model(const PullOptions& options);

}  // namespace sx::hub
