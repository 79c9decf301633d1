// check_model(): the tensors a config needs, against what a TensorSource holds.
#include "runtime/model/model_check.h"

#include <cmath>
#include <algorithm>
#include <filesystem>
#include <map>
#include <sstream>

#include <fmt/format.h>

#include "runtime/base/regular_file.h"
#include "runtime/base/sha256.h"

namespace sx::model {

Status ModelCheck::status() const {
  if (errors.empty()) return ok_status();
  std::string message = errors.front().message;
  if (errors.size() > 1 || truncated) {
    message += fmt::format(" (and {}{} more problem{})", truncated ? "at least " : "", errors.size() - 1,
                           errors.size() == 2 && !truncated ? "" : "s");
  }
  return Status(errors.front().code, std::move(message));
}

std::string model_summary(const ModelConfig& c) {
  const std::string ffn = c.is_moe() ? fmt::format("{} experts of {} ({} per token{})", c.n_experts, c.expert_ffn,
                                                   c.n_experts_used, c.norm_topk_prob ? ", renormalised" : "")
                                     : fmt::format("ffn {}", c.ffn);
  std::string hybrid;
  if (c.is_hybrid()) {
    const auto recurrent = std::count(c.recurrent_layers.begin(), c.recurrent_layers.end(), true);
    hybrid = fmt::format(" ({} Gated DeltaNet with {} K / {} V heads x {})", recurrent, c.ssm_k_heads, c.ssm_v_heads,
                         c.ssm_head_dim);
  }
  const std::string shared = c.shared_expert_ffn > 0 ? fmt::format(" + a shared expert of {}", c.shared_expert_ffn) : "";
  return fmt::format("{}: {} layers{}, hidden {}, {} heads x {} (kv {}), {}{}, vocab {}{}{}", c.architecture,
                     c.n_layers, hybrid, c.hidden, c.n_heads, c.head_dim, c.n_kv_heads, ffn, shared, c.vocab,
                     c.qkv_bias ? ", qkv bias" : "", c.tied_embeddings ? ", tied embeddings" : "");
}

ModelCheck check_model(const TensorSource& src, const ModelConfig& c) {
  ModelCheck report;
  auto add = [&](StatusCode code, std::string message) {
    if (report.errors.size() >= kMaxCheckErrors) {
      report.truncated = true;
      return false;
    }
    report.errors.push_back({code, std::move(message)});
    return true;
  };
  const ArchSpec* spec = find_arch_spec(c.architecture);
  if (spec == nullptr) {
    add(StatusCode::kUnimplemented, fmt::format("{}: architecture '{}' is not supported (supported: {})", src.path(),
                                                c.architecture, supported_architectures()));
    return report;
  }
  const std::string summary = model_summary(c);
  // Walk the expected tensors lazily, stopping once the report is full.
  const Status walked = for_each_expected_tensor(c, [&](ExpectedTensor e) -> Status {
    const TensorInfo* t = src.find_tensor(e.name);
    bool room = true;
    if (t == nullptr) {
      const std::string detail = src.missing_detail(e.name);
      room = add(StatusCode::kNotFound, fmt::format("{}: tensor {} is missing{} ({})", src.path(), src.tensor_label(e.name),
                                                    detail.empty() ? "" : "; " + detail, summary));
    } else if (t->dims != e.dims) {
      room = add(StatusCode::kInvalidArgument,
                 fmt::format("{}: tensor {} has {} {} but the config expects {} ({})", src.path(),
                             src.tensor_label(e.name), src.format() == "gguf" ? "dims" : "shape",
                             src.shape_label(t->dims), src.shape_label(e.dims), summary));
    } else if (!t->dtype.has_value() || *t->dtype == hal::DType::kI32) {
      room = add(StatusCode::kInvalidArgument,
                 fmt::format("{}: tensor {} has type {}, which no weight can have (expected a float or quantized format)",
                             src.path(), src.tensor_label(e.name), t->type_name));
    }
    return room ? ok_status() : cancelled_error("full");
  });
  if (!walked.ok()) return report;
  // Every per-layer tensor must be one of the expected ones.
  auto is_expected_layer_tensor = [&](const LayerTensorName& n) {
    // Multi-token-prediction layers after the trunk are not loaded (nor checked).
    if (n.layer >= c.n_layers) return n.layer < c.n_layers + c.n_nextn_layers;
    for (LayerTensor t : layer_tensors_of(*spec, c, n.layer)) {
      if (layer_tensor_suffix(t) == n.suffix) return true;
    }
    if (c.qkv_bias) {
      for (LayerTensor t : spec->qkv_bias_tensors) {
        if (layer_tensor_suffix(t) == n.suffix) return true;
      }
    }
    return false;
  };
  for (const TensorInfo& t : src.tensors()) {
    const auto layer = parse_layer_tensor_name(t.name);
    if (!layer || is_expected_layer_tensor(*layer)) continue;
    bool room;
    if (layer->layer >= c.n_layers) {
      room = add(StatusCode::kInvalidArgument,
                 fmt::format("{}: tensor {} belongs to layer {} but the model has {} layers ({})", src.path(),
                             src.tensor_label(t.name), layer->layer, c.n_layers, summary));
    } else {
      room = add(StatusCode::kInvalidArgument,
                 fmt::format("{}: unexpected tensor {} ({} has no '{}' tensor{})", src.path(), src.tensor_label(t.name),
                             c.architecture, layer->suffix,
                             !c.qkv_bias && layer->suffix.ends_with(".bias")
                                 ? " without a qkv bias, and blk.0.attn_q.bias is absent"
                                 : ""));
    }
    if (!room) break;
  }
  return report;
}

namespace {

namespace fs = std::filesystem;

bool is_hex64(std::string_view s) {
  if (s.size() != 64) return false;
  for (char ch : s) {
    if (!((ch >= '0' && ch <= '9') || (ch >= 'a' && ch <= 'f'))) return false;
  }
  return true;
}

// The most a SHA256SUMS file may have (one line per file of a model: far below this).
constexpr std::uint64_t kMaxSumsBytes = 16u << 20;

// name -> digest from dir/SHA256SUMS ("digest  name" or "digest *name"). A file that cannot be
// read (not a regular file, too large, unreadable) is a warning and gives no digests.
std::map<std::string, std::string> read_sums(const fs::path& file, std::vector<std::string>& warnings) {
  std::map<std::string, std::string> sums;
  Result<std::string> text = read_regular_file(file.string(), kMaxSumsBytes);
  if (!text.ok()) {
    warnings.push_back(fmt::format("{}; no checksums were read from it", text.status().message()));
    return sums;
  }
  std::istringstream in(*text);
  std::string line;
  int n = 0;
  while (std::getline(in, line)) {
    ++n;
    if (line.empty() || line[0] == '#') continue;
    const std::size_t sp = line.find(' ');
    std::string digest = line.substr(0, sp);
    for (char& ch : digest) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
    if (sp == std::string::npos || !is_hex64(digest) || sp + 2 > line.size()) {
      warnings.push_back(fmt::format("{}:{}: not a '<sha256>  <file>' line", file.string(), n));
      continue;
    }
    std::string name = line.substr(sp + 1);
    if (!name.empty() && (name[0] == ' ' || name[0] == '*')) name.erase(0, 1);
    sums[fs::path(name).filename().string()] = digest;
  }
  return sums;
}

}  // namespace

void verify_checksums(const TensorSource& src, ModelCheck& report, const ChecksumProgress& progress) {
  for (const std::string& file : src.weight_files()) {
    const fs::path p(file);
    std::error_code ec;
    std::string expected, from;
    const fs::path sums_path = p.parent_path() / "SHA256SUMS";
    if (fs::exists(sums_path, ec)) {
      auto sums = read_sums(sums_path, report.warnings);
      if (auto it = sums.find(p.filename().string()); it != sums.end()) {
        expected = it->second;
        from = sums_path.string();
      }
    }
    if (expected.empty() && fs::is_symlink(p, ec)) {
      const fs::path target = fs::read_symlink(p, ec);
      if (!ec && is_hex64(target.filename().string()) && target.parent_path().filename() == "blobs") {
        expected = target.filename().string();
        from = "its Hugging Face cache blob name";
      }
    }
    if (expected.empty()) {
      report.warnings.push_back(
          fmt::format("{}: no checksum to verify it against (no SHA256SUMS entry, not a Hugging Face cache blob)", file));
      continue;
    }
    auto got = sha256_file(file, [&](std::uint64_t done, std::uint64_t total) {
      if (progress) progress(file, done, total);
    });
    if (!got.ok()) {
      report.errors.push_back({got.status().code(), got.status().message()});
    } else if (*got != expected) {
      report.errors.push_back({StatusCode::kDataLoss, fmt::format("{}: SHA-256 is {} but {} says {}; the file is "
                                                                  "corrupt or incomplete: download it again",
                                                                  file, *got, from, expected)});
    }
  }
}

void scan_values(const TensorSource& src, ModelCheck& report) {
  std::vector<float> row;
  for (const TensorInfo& t : src.tensors()) {
    if (!t.dtype || !hal::can_dequantize(*t.dtype) || t.dims.empty()) continue;
    const std::int64_t cols = t.dims[0];
    const std::int64_t rows = t.n_elements / cols;
    const std::size_t rb = hal::row_bytes(*t.dtype, cols);
    row.resize(static_cast<std::size_t>(cols));
    std::int64_t bad = 0, first = -1;
    for (std::int64_t r = 0; r < rows; ++r) {
      hal::dequantize_row(*t.dtype, t.data.data() + static_cast<std::size_t>(r) * rb, row.data(), cols);
      for (std::int64_t i = 0; i < cols; ++i) {
        if (!std::isfinite(row[static_cast<std::size_t>(i)])) {
          if (first < 0) first = r * cols + i;
          ++bad;
        }
      }
    }
    if (bad > 0) {
      report.errors.push_back({StatusCode::kDataLoss, fmt::format("{}: tensor {} holds {} NaN or Inf values (the first "
                                                                  "at element {})",
                                                                  src.path(), src.tensor_label(t.name), bad, first)});
    }
  }
}

}  // namespace sx::model
