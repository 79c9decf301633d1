// Model references ("Qwen/Qwen3-8B", "hf:Qwen/Qwen3-8B-GGUF:Q4_K_M", "ms:Qwen/Qwen3-8B") and the
// Hugging Face cache layout they resolve in, shared with huggingface_hub, vLLM and
// `huggingface-cli`:
//
//   CACHE/models--ORG--NAME/blobs/<etag>            the bytes (LFS files: their SHA-256; plain git
//                                                   files: their git blob id)
//   CACHE/models--ORG--NAME/snapshots/<commit>/PATH relative symlinks to ../../blobs/<etag>
//   CACHE/models--ORG--NAME/refs/<revision>         the commit a branch or tag named
//
// CACHE is $HF_HUB_CACHE, else $HF_HOME/hub, else $XDG_CACHE_HOME/huggingface/hub, else
// ~/.cache/huggingface/hub (huggingface_hub's order). Models pulled from ModelScope land in the
// same layout.
//
// Errors: INVALID_ARGUMENT for a malformed reference (naming it and the accepted forms); NOT_FOUND
// for a model or quantisation missing from the cache, naming the command that fetches it.
// Threading: pure functions apart from reading (and, for remove_cached_model, deleting) files.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "runtime/base/status.h"

namespace sx::hub {

enum class HubSource { kHuggingFace, kModelScope };
std::string_view source_name(HubSource s);  // "Hugging Face", "ModelScope"

struct ModelRef {
  HubSource source = HubSource::kHuggingFace;
  std::string repo;      // "Qwen/Qwen3-8B"
  std::string quant;     // "Q4_K_M" (a GGUF repository's file); empty: the repository's model
  std::string text;      // as written, less an hf: / ms: prefix ("Qwen/Qwen3-8B-GGUF:Q4_K_M")
};

// "ORG/NAME[:QUANT]" with an optional "hf:" or "ms:" prefix; ORG and NAME of letters, digits, '-',
// '_' and '.', at most 96 characters each, not starting with '.' or '-'.
Result<ModelRef> parse_model_ref(std::string_view text);
// Whether `text` names a model rather than a path: it parses as a reference and no file or
// directory of that name exists (a local "Qwen/Qwen3-8B" directory wins).
bool is_model_ref(const std::string& text);

std::string hub_cache_dir();
// ASCII lowercase (hub file names, quant names and hex digests compare case-insensitively).
std::string ascii_lower(std::string_view s);
// "models--Qwen--Qwen3-8B"
std::string repo_folder_name(std::string_view repo);

// A quantisation's GGUF file names: "Q4_K_M" matches "qwen3-8b-Q4_K_M.gguf", "x.q4_k_m.gguf",
// "Q4_K_M/x-00001-of-00002.gguf" (case-insensitive, as a whole dot-, dash-, underscore- or
// slash-separated token run).
bool gguf_matches_quant(std::string_view path, std::string_view quant);
// "-00001-of-00003.gguf" -> {1, 3}; nullopt for an unsplit file.
std::optional<std::pair<int, int>> gguf_split_part(std::string_view path);

// A revision (branch, tag or commit) that is safe to join into the cache as refs/<revision>:
// 1-256 characters, no control character or backslash, '/'-separated segments that are neither
// empty, "." nor ".." (so "refs/pr/1", as huggingface_hub stores it, passes; "../../x", "/x" and
// "a//b" do not). INVALID_ARGUMENT naming the revision and what is wrong with it.
Status check_revision(std::string_view revision);

// A SHA256SUMS file (sha256sum's format, "<64 hex>  PATH" or "<64 hex> *PATH" per line, LF or CRLF):
// path -> lowercase digest. Lines of any other shape, or whose path holds a control character, are
// skipped; a path listed twice keeps its last line.
std::map<std::string, std::string> parse_sha256sums(std::string_view text);

// The snapshot directory of `repo` at `revision` (a branch or tag through refs/, or a commit hash);
// nullopt when the cache has none (or the revision fails check_revision).
std::optional<std::string> find_snapshot(const std::string& cache, std::string_view repo, std::string_view revision);

// What `serve --model REF` loads from a snapshot: the directory for a safetensors repository, the
// quantisation's GGUF file (its first part when split) for REPO:QUANT, or the only GGUF file of a
// GGUF repository. NOT_FOUND names what is missing.
Result<std::string> model_path_in_snapshot(const std::string& snapshot, const ModelRef& ref);

// A model in the cache, for `sextant ls`.
struct CachedModel {
  std::string repo;                  // "Qwen/Qwen3-8B"
  std::string commit;                // the newest snapshot's
  std::vector<std::string> refs;     // revisions that name that commit ("main")
  std::uint64_t bytes = 0;           // blobs, counted once
  std::int64_t files = 0;            // files in that snapshot
  std::int64_t partial_files = 0;    // unfinished downloads (*.partial, *.incomplete) in blobs/
  // "verified" (every blob name a published SHA-256 matches, or a SHA256SUMS file lists it),
  // "unverified" (files with no checksum to compare: run `sextant doctor --verify`), "broken"
  // (a snapshot link points at no blob).
  std::string state;
};
std::vector<CachedModel> list_cached_models(const std::string& cache);
// Deletes CACHE/models--ORG--NAME. NOT_FOUND when absent.
Status remove_cached_model(const std::string& cache, std::string_view repo);

}  // namespace sx::hub
