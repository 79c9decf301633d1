// Fuzz target: a model hub's repository listing (parse_repo_listing, Hugging Face and ModelScope
// shapes) and the choice of files from it (select_files, with the same text as the safetensors
// index); the same bytes as a SHA256SUMS file (parse_sha256sums) and as a --revision
// (check_revision). Invariants (hub_client.h, hub_cache.h): after a successful parse every path
// relative and inside the repository (no empty, "." or ".." segment, no control character), hex
// checksums of their lengths, a commit that is one folder name and a revision check_revision
// accepts; every selected file is one the listing holds; a refused listing is DATA_LOSS saying
// "the hub sent". SHA256SUMS: 64 lowercase hex digits per path, no control character in a path,
// and the map written back in sha256sum's format parses to itself. A revision accepted is 1-256
// characters with no control character, backslash, or empty, "." or ".." segment.
#include <cstddef>
#include <cstdint>
#include <set>
#include <string>
#include <string_view>

#include "runtime/hub/hub_cache.h"
#include "runtime/hub/hub_client.h"
#include "runtime/hub/pull.h"
#include "tests/fuzz/fuzz_check.h"

namespace {

bool has_control(std::string_view s) {
  for (const char c : s) {
    if (static_cast<unsigned char>(c) < 0x20 || c == 0x7f) return true;
  }
  return false;
}

bool has_bad_segment(std::string_view s) {
  for (std::size_t start = 0; start <= s.size();) {
    const std::size_t end = std::min(s.find('/', start), s.size());
    const std::string_view seg = s.substr(start, end - start);
    if (seg.empty() || seg == "." || seg == "..") return true;
    start = end + 1;
  }
  return false;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  for (const auto source : {sx::hub::HubSource::kHuggingFace, sx::hub::HubSource::kModelScope}) {
    auto listing = sx::hub::parse_repo_listing(source, text, "org/fuzz", "main");
    if (!listing.ok()) {
      FUZZ_CHECK(listing.status().code() == sx::StatusCode::kDataLoss);
      FUZZ_CHECK(listing.status().message().find("the hub sent") != std::string::npos);
      continue;
    }
    FUZZ_CHECK(!listing->commit.empty() && listing->commit.find('/') == std::string::npos &&
               listing->commit != "." && listing->commit != "..");
    FUZZ_CHECK(sx::hub::check_revision(listing->commit).ok());
    std::set<std::string> paths;
    for (const sx::hub::RemoteFile& f : listing->files) {
      FUZZ_CHECK(!f.path.empty() && f.path.front() != '/');
      FUZZ_CHECK(!has_bad_segment(f.path) && !has_control(f.path));
      FUZZ_CHECK(f.sha256.empty() || f.sha256.size() == 64);
      FUZZ_CHECK(f.blob_id.empty() || f.blob_id.size() == 40);
      paths.insert(f.path);
    }
    for (const char* ref : {"org/fuzz", "org/fuzz:Q4_K_M"}) {
      auto chosen = sx::hub::select_files(*listing, sx::hub::parse_model_ref(ref).value(), {},
                                          [&]() -> sx::Result<std::string> { return std::string(text); });
      if (!chosen.ok()) continue;
      for (const sx::hub::RemoteFile& f : *chosen) FUZZ_CHECK(paths.contains(f.path));
    }
  }
  // The same bytes as the SHA256SUMS a pull reads back to decide what it trusts.
  const auto sums = sx::hub::parse_sha256sums(text);
  std::string written;
  for (const auto& [path, digest] : sums) {
    FUZZ_CHECK(!path.empty() && !has_control(path));
    FUZZ_CHECK(digest.size() == 64);
    for (const char c : digest) FUZZ_CHECK((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'));
    written += digest + "  " + path + "\n";
  }
  FUZZ_CHECK(sx::hub::parse_sha256sums(written) == sums);
  // And as a --revision, which names a file under the cache's refs/.
  if (sx::hub::check_revision(text).ok()) {
    FUZZ_CHECK(!text.empty() && text.size() <= 256 && !has_control(text) && text.find('\\') == std::string_view::npos);
    FUZZ_CHECK(!has_bad_segment(text));
  }
  return 0;
}
