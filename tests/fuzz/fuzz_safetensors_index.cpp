// Fuzz target: the sharded-model index reader (parse_safetensors_index, the text of
// model.safetensors.index.json). Invariant after a successful parse: every shard name is a plain
// file name (not empty, ".", "..", no '/' or '\'), so a hostile index cannot point outside the
// model directory.
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "runtime/model/safetensors.h"
#include "tests/fuzz/fuzz_check.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  auto idx = sx::model::parse_safetensors_index(text, "fuzz.index.json");
  if (!idx.ok()) return 0;
  for (const auto& [tensor, shard] : idx->weight_map) {
    FUZZ_CHECK(!shard.empty() && shard != "." && shard != "..");
    FUZZ_CHECK(shard.find('/') == std::string::npos && shard.find('\\') == std::string::npos);
  }
  return 0;
}
