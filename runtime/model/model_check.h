// ModelCheck: everything wrong with a model's tensors, found before any device memory is used, as
// one report that the loader (first error), `sextant inspect` (all of it) and later `doctor` share.
//
// check_model() walks the tensors the architecture needs (expected_tensors(config)) and reports,
// in that order: a missing tensor (NOT_FOUND; names it as the format does and, for a sharded
// directory, what the index says), dims other than the config implies (INVALID_ARGUMENT; expected
// and actual), a format no weight can have (INVALID_ARGUMENT: an integer or unknown type), and
// per-layer tensors the architecture does not have or layers beyond n_layers (INVALID_ARGUMENT).
// A source's own findings (HfModel: unmapped tensor names, lm_head of a tied model) come as
// warnings. The walk stops after kMaxCheckErrors errors, so a corrupt layer count cannot make it
// build millions of names.
//
// Threading: pure over immutable inputs.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "runtime/base/status.h"
#include "runtime/model/model_config.h"
#include "runtime/model/tensor_source.h"

namespace sx::model {

inline constexpr std::size_t kMaxCheckErrors = 16;

struct CheckFinding {
  StatusCode code = StatusCode::kInvalidArgument;
  std::string message;  // starts with the source's path
};

struct ModelCheck {
  std::vector<CheckFinding> errors;
  std::vector<std::string> warnings;
  bool truncated = false;  // stopped at kMaxCheckErrors

  bool ok() const { return errors.empty(); }
  // OK, or the first error (its code and message, plus "(and N more problems)").
  Status status() const;
};

// "qwen2: 24 layers, hidden 896, 14 heads x 64 (kv 2), ffn 4864, vocab 151936, qkv bias, tied embeddings"
std::string model_summary(const ModelConfig& c);

ModelCheck check_model(const TensorSource& source, const ModelConfig& c);

// SHA-256 of every weight file against a SHA256SUMS file ("<64 hex>  <name>" lines, as sha256sum
// writes them) in the directory of the files, or, for a file that is a symlink into a Hugging Face
// cache (.../blobs/<sha256>), against its blob name. A mismatch is DATA_LOSS naming the file and
// both digests; a file with no checksum to compare is a warning. `progress(file, done, total)` is
// called as each file is read.
using ChecksumProgress = std::function<void(const std::string& file, std::uint64_t done, std::uint64_t total)>;
void verify_checksums(const TensorSource& source, ModelCheck& report, const ChecksumProgress& progress = {});

// Every value of every tensor whose format can be dequantized is finite; a tensor holding NaN or
// Inf is DATA_LOSS naming it, the count and the first index.
void scan_values(const TensorSource& source, ModelCheck& report);

}  // namespace sx::model
