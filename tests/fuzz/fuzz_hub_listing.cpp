// Fuzz target: a model hub's repository listing (parse_repo_listing, Hugging Face and ModelScope
// shapes) and the choice of files from it (select_files, with the same text as the safetensors
// index). Invariants after a successful parse (hub_client.h): every path relative and inside the
// repository (no empty, "." or ".." segment), hex checksums of their lengths, a commit that is one
// folder name; every selected file is one the listing holds.
#include <cstddef>
#include <cstdint>
#include <set>
#include <string>
#include <string_view>

#include "runtime/hub/hub_client.h"
#include "runtime/hub/pull.h"
#include "tests/fuzz/fuzz_check.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  for (const auto source : {sx::hub::HubSource::kHuggingFace, sx::hub::HubSource::kModelScope}) {
    auto listing = sx::hub::parse_repo_listing(source, text, "org/fuzz", "main");
    if (!listing.ok()) continue;
    FUZZ_CHECK(!listing->commit.empty() && listing->commit.find('/') == std::string::npos &&
               listing->commit != "." && listing->commit != "..");
    std::set<std::string> paths;
    for (const sx::hub::RemoteFile& f : listing->files) {
      FUZZ_CHECK(!f.path.empty() && f.path.front() != '/');
      FUZZ_CHECK(f.path.find("//") == std::string::npos && f.path.find("/../") == std::string::npos &&
                 !f.path.starts_with("../") && f.path != "..");
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
  return 0;
}
