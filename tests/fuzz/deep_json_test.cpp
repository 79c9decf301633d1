// Regression test for a finding of the fuzz targets' JSON inputs: a document nested ~100k levels
// deep (a few hundred KB) overflowed the stack in nlohmann's recursive dump() while the safetensors
// header / index parsers and parse_hf_config built their error messages. They now refuse nesting
// deeper than 128 levels up front. Too large for a seed file, so the inputs are built here.
// Prints "N passed, N failed" (scripts/test_summary.py).
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "runtime/model/hf_config.h"
#include "runtime/model/safetensors.h"

namespace {

int passed = 0;
int failed = 0;

void expect(bool ok, const std::string& what) {
  if (ok) {
    ++passed;
  } else {
    ++failed;
    std::printf("FAILED: %s\n", what.c_str());
  }
}

std::string nested(std::size_t depth) { return std::string(depth, '[') + std::string(depth, ']'); }

bool says_too_deep(const sx::Status& s) { return !s.ok() && s.to_string().find("levels deep") != std::string::npos; }

std::vector<std::uint8_t> safetensors_with_header(const std::string& header) {
  std::vector<std::uint8_t> b(8 + header.size());
  const std::uint64_t n = header.size();
  std::memcpy(b.data(), &n, 8);
  std::memcpy(b.data() + 8, header.data(), header.size());
  return b;
}

}  // namespace

int main() {
  using namespace sx::model;
  // total: the document's nesting including the enclosing objects; 128 is the most accepted.
  for (std::size_t total : {std::size_t{128}, std::size_t{129}, std::size_t{200000}}) {
    const bool deep = total > 128;
    const std::string tag = " (nested " + std::to_string(total) + " levels)";

    const std::string index = R"({"metadata":{"a":)" + nested(total - 2) + R"(},"weight_map":{"w":"s.safetensors"}})";
    auto idx = parse_safetensors_index(index, "index.json");
    expect(deep ? says_too_deep(idx.status()) : idx.ok(), "parse_safetensors_index" + tag + ": " + idx.status().to_string());

    // Not deep: refused for the wrong type instead.
    const std::string config = R"({"model_type":"qwen2","num_hidden_layers":)" + nested(total - 1) + "}";
    auto cfg = parse_hf_config(config, "config.json");
    expect(deep ? says_too_deep(cfg.status()) : !cfg.ok() && !says_too_deep(cfg.status()),
           "parse_hf_config" + tag + ": " + cfg.status().to_string().substr(0, 200));

    const auto st = safetensors_with_header(R"({"t":{"dtype":"F32","shape":)" + nested(total - 2) +
                                            R"(,"data_offsets":[0,0]}})");
    auto f = SafetensorsFile::parse(st, "deep.safetensors");
    expect(deep ? says_too_deep(f.status()) : !f.ok() && !says_too_deep(f.status()),
           "SafetensorsFile::parse" + tag + ": " + f.status().to_string().substr(0, 200));
  }
  // Brackets inside strings do not count.
  const std::string in_string = R"({"metadata":{"a":")" + std::string(1000, '[') + R"("},"weight_map":{}})";
  expect(parse_safetensors_index(in_string, "index.json").ok(), "brackets inside a string");
  std::printf("%d passed, %d failed\n", passed, failed);
  return failed == 0 ? 0 : 1;
}
