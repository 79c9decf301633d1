// safetensors reader: header parsing and layout checks for one file, and the index / shard
// cross-checks of a model directory. JSON is parsed with exceptions disabled; every access checks
// the type first.
#include "runtime/model/safetensors.h"

#include <algorithm>
#include <bit>
#include <cstring>
#include <filesystem>
#include <limits>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "runtime/base/json_depth.h"
#include "runtime/model/json_util.h"

namespace sx::model {

static_assert(std::endian::native == std::endian::little, "the safetensors reader assumes a little-endian host");

namespace {

using nlohmann::json;
namespace fs = std::filesystem;

struct DTypeEntry {
  std::string_view name;
  std::size_t size;
  std::optional<hal::DType> hal;
};

const DTypeEntry kDTypes[] = {
    {"BOOL", 1, std::nullopt},    {"U8", 1, std::nullopt},      {"I8", 1, std::nullopt},
    {"F8_E5M2", 1, std::nullopt}, {"F8_E4M3", 1, std::nullopt}, {"F8_E8M0", 1, std::nullopt},
    {"I16", 2, std::nullopt},     {"U16", 2, std::nullopt},     {"F16", 2, hal::DType::kF16},
    {"BF16", 2, hal::DType::kBF16}, {"I32", 4, hal::DType::kI32}, {"U32", 4, std::nullopt},
    {"F32", 4, hal::DType::kF32}, {"I64", 8, std::nullopt},     {"U64", 8, std::nullopt},
    {"F64", 8, std::nullopt},     {"C64", 8, std::nullopt},
};

const DTypeEntry* find_dtype(std::string_view name) {
  for (const DTypeEntry& e : kDTypes) {
    if (e.name == name) return &e;
  }
  return nullptr;
}

std::string known_dtypes() {
  std::string s;
  for (const DTypeEntry& e : kDTypes) {
    if (!s.empty()) s += ", ";
    s += e.name;
  }
  return s;
}

// Short JSON text of a value for messages (long values are cut).
std::string excerpt(const json& v) {
  std::string s = v.dump();
  if (s.size() > 80) s = s.substr(0, 77) + "...";
  return s;
}

bool is_gguf(std::span<const std::uint8_t> b) { return b.size() >= 4 && std::memcmp(b.data(), "GGUF", 4) == 0; }

// An unsigned integer that fits in u64 (nlohmann stores non-negative literals as unsigned).
std::optional<std::uint64_t> as_u64(const json& v) {
  if (v.is_number_unsigned()) return v.get<std::uint64_t>();
  if (v.is_number_integer() && v.get<std::int64_t>() >= 0) return static_cast<std::uint64_t>(v.get<std::int64_t>());
  return std::nullopt;
}

Status wrong_field(std::string_view file, std::string_view tensor, std::string_view field, const json& v,
                   std::string_view expected) {
  return data_loss_error("{}: tensor '{}': '{}' is {} ({}); expected {}", file, tensor, field, json_type_name(v),
                         excerpt(v), expected);
}

// Parses one tensor entry of the header; checks fields, dtype, shape and the size of its range.
Result<SafetensorsTensor> parse_entry(std::string_view file, const std::string& name, const json& e) {
  if (!e.is_object()) {
    return data_loss_error("{}: tensor '{}' is {} ({}); expected an object with dtype, shape and data_offsets", file,
                           name, json_type_name(e), excerpt(e));
  }
  SafetensorsTensor t;
  t.name = name;
  t.file = std::string(file);
  for (const char* key : {"dtype", "shape", "data_offsets"}) {
    if (e.find(key) == e.end()) return data_loss_error("{}: tensor '{}' has no '{}'", file, name, key);
  }
  const json& dt = e.at("dtype");
  if (!dt.is_string()) return wrong_field(file, name, "dtype", dt, "a string such as \"F32\"");
  t.dtype_name = dt.get<std::string>();
  const DTypeEntry* d = find_dtype(t.dtype_name);
  if (d == nullptr) {
    return unimplemented_error("{}: tensor '{}' has dtype '{}', which is not a safetensors dtype (known: {})", file,
                               name, t.dtype_name, known_dtypes());
  }
  t.elem_bytes = d->size;
  t.dtype = d->hal;

  const json& sh = e.at("shape");
  if (!sh.is_array()) return wrong_field(file, name, "shape", sh, "an array of non-negative integers");
  std::int64_t numel = 1;
  bool overflow = false;
  for (const json& dim : sh) {
    const auto u = as_u64(dim);
    if (!u || *u > static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max())) {
      return wrong_field(file, name, "shape", sh, "an array of non-negative integers");
    }
    const auto di = static_cast<std::int64_t>(*u);
    t.shape.push_back(di);
    if (di != 0 && numel > std::numeric_limits<std::int64_t>::max() / di) overflow = true;
    if (!overflow) numel *= di;
  }
  const bool has_zero = std::find(t.shape.begin(), t.shape.end(), 0) != t.shape.end();
  if (has_zero) {
    numel = 0;
    overflow = false;
  }
  if (overflow || static_cast<std::uint64_t>(numel) > std::numeric_limits<std::uint64_t>::max() / t.elem_bytes) {
    return data_loss_error("{}: tensor '{}' has shape {} whose element count or byte size overflows 64 bits", file,
                           name, excerpt(sh));
  }
  t.n_elements = numel;

  const json& off = e.at("data_offsets");
  if (!off.is_array() || off.size() != 2 || !as_u64(off[0]) || !as_u64(off[1])) {
    return wrong_field(file, name, "data_offsets", off, "[begin, end], two non-negative integers");
  }
  t.begin = *as_u64(off[0]);
  t.end = *as_u64(off[1]);
  if (t.begin > t.end) {
    return data_loss_error("{}: tensor '{}' has data_offsets [{}, {}]: begin is after end", file, name, t.begin,
                           t.end);
  }
  const std::uint64_t want = static_cast<std::uint64_t>(numel) * t.elem_bytes;
  if (t.end - t.begin != want) {
    return data_loss_error(
        "{}: tensor '{}' has data_offsets [{}, {}] ({} bytes) but {} {} needs {} elements x {} bytes = {} bytes", file,
        name, t.begin, t.end, t.end - t.begin, t.dtype_name, t.shape_string(), numel, t.elem_bytes, want);
  }
  return t;
}

}  // namespace

std::optional<std::size_t> safetensors_dtype_size(std::string_view dtype) {
  const DTypeEntry* e = find_dtype(dtype);
  return e == nullptr ? std::nullopt : std::optional<std::size_t>(e->size);
}

std::optional<hal::DType> safetensors_to_hal_dtype(std::string_view dtype) {
  const DTypeEntry* e = find_dtype(dtype);
  return e == nullptr ? std::nullopt : e->hal;
}

std::optional<std::string_view> hal_to_safetensors_dtype(hal::DType dtype) {
  for (const DTypeEntry& e : kDTypes) {
    if (e.hal == dtype) return e.name;
  }
  return std::nullopt;
}

std::string SafetensorsTensor::shape_string() const {
  std::string s = "[";
  for (std::size_t i = 0; i < shape.size(); ++i) {
    if (i > 0) s += ", ";
    s += fmt::format("{}", shape[i]);
  }
  return s + "]";
}

// ---- SafetensorsFile ----

Status SafetensorsFile::check_kind(const std::string& path) {
  std::error_code ec;
  const fs::file_status st = fs::status(path, ec);
  if (ec || !fs::exists(st)) {
    if (ec && ec != std::errc::no_such_file_or_directory) {
      return invalid_argument_error("{}: cannot stat: {}", path, ec.message());
    }
    return not_found_error("{}: no such file", path);
  }
  if (fs::is_directory(st)) {
    return invalid_argument_error(
        "{} is a directory, not a safetensors file (open a model directory with open_safetensors_dir)", path);
  }
  return ok_status();
}

Result<SafetensorsFile> SafetensorsFile::open(const std::string& path) {
  SX_RETURN_IF_ERROR(check_kind(path));
  SX_ASSIGN_OR_RETURN(std::unique_ptr<MappedFile> mapping, MappedFile::open(path));
  const std::span<const std::uint8_t> bytes = mapping->bytes();
  SX_ASSIGN_OR_RETURN(SafetensorsFile f, parse(bytes, path));
  f.mapping_ = std::move(mapping);
  return f;
}

Result<SafetensorsFile> SafetensorsFile::parse(std::span<const std::uint8_t> bytes, std::string display_name) {
  const std::string& file = display_name;
  if (is_gguf(bytes)) {
    return invalid_argument_error("{} is a GGUF file, not safetensors (load it as GGUF)", file);
  }
  if (bytes.size() < 8) {
    return data_loss_error("{} is truncated: {} bytes, shorter than the 8-byte header length of a safetensors file",
                           file, bytes.size());
  }
  std::uint64_t n = 0;
  std::memcpy(&n, bytes.data(), 8);
  const std::uint64_t after = bytes.size() - 8;
  if (n > kSafetensorsMaxHeader) {
    return data_loss_error("{}: header length {} is absurd (limit {} bytes); not a safetensors file or corrupt",
                           file, n, kSafetensorsMaxHeader);
  }
  if (n > after) {
    return data_loss_error("{}: header length {} exceeds the {} bytes after the length field; truncated or corrupt",
                           file, n, after);
  }
  if (n < 2) return data_loss_error("{}: header length {} is too short for a JSON object", file, n);

  const auto* text = reinterpret_cast<const char*>(bytes.data() + 8);
  if (json_nesting_depth(std::string_view(text, n)) > kMaxJsonDepth) {
    return data_loss_error("{}: the header nests JSON arrays/objects more than {} levels deep; corrupt or hostile",
                           file, kMaxJsonDepth);
  }
  std::string duplicate;
  const json root = parse_json_unique_keys(std::string_view(text, n), &duplicate);
  if (root.is_discarded()) {
    return data_loss_error("{}: the {}-byte header is not valid JSON", file, n);
  }
  if (!duplicate.empty()) {
    return data_loss_error("{}: the header names '{}' twice (a duplicate tensor entry; which one is meant is unknown)",
                           file, duplicate);
  }
  if (!root.is_object()) {
    return data_loss_error("{}: the header is {}, expected a JSON object", file, json_type_name(root));
  }

  SafetensorsFile f;
  f.path_ = display_name;
  f.bytes_ = bytes;
  f.header_size_ = n;
  const std::uint64_t data_size = after - n;
  const std::uint8_t* data = bytes.data() + 8 + n;

  for (auto it = root.begin(); it != root.end(); ++it) {
    if (it.key() == "__metadata__") {
      const json& m = it.value();
      if (!m.is_object()) {
        return data_loss_error("{}: '__metadata__' is {}, expected an object of strings", file, json_type_name(m));
      }
      for (auto mi = m.begin(); mi != m.end(); ++mi) {
        if (!mi.value().is_string()) {
          return data_loss_error("{}: '__metadata__.{}' is {} ({}), expected a string", file, mi.key(),
                                 json_type_name(mi.value()), excerpt(mi.value()));
        }
        f.metadata_.emplace(mi.key(), mi.value().get<std::string>());
      }
      continue;
    }
    SX_ASSIGN_OR_RETURN(SafetensorsTensor t, parse_entry(file, it.key(), it.value()));
    f.tensors_.push_back(std::move(t));
  }

  // Data range: the furthest end must lie inside the file.
  const SafetensorsTensor* last = nullptr;
  for (const SafetensorsTensor& t : f.tensors_) {
    if (last == nullptr || t.end > last->end) last = &t;
  }
  if (last != nullptr && last->end > data_size) {
    return data_loss_error(
        "{} is truncated: its header needs {} bytes of data, the file has {} (tensor '{}' ends at data byte {})", file,
        last->end, data_size, last->name, last->end);
  }

  // Overlaps: sort by begin; each tensor must start at or after the previous one's end.
  std::sort(f.tensors_.begin(), f.tensors_.end(), [](const SafetensorsTensor& a, const SafetensorsTensor& b) {
    return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
  });
  // Empty tensors occupy no bytes and never overlap; `reach` is the non-empty tensor ending last.
  const SafetensorsTensor* reach = nullptr;
  for (const SafetensorsTensor& b : f.tensors_) {
    if (b.begin == b.end) continue;
    if (reach != nullptr && b.begin < reach->end) {
      return data_loss_error("{}: tensors '{}' [{}, {}) and '{}' [{}, {}) overlap", file, reach->name, reach->begin,
                             reach->end, b.name, b.begin, b.end);
    }
    if (reach == nullptr || b.end > reach->end) reach = &b;
  }
  for (std::size_t i = 0; i < f.tensors_.size(); ++i) {
    SafetensorsTensor& t = f.tensors_[i];
    t.data = std::span<const std::uint8_t>(data + t.begin, t.end - t.begin);
    f.index_.emplace(t.name, i);
  }
  return f;
}

const SafetensorsTensor* SafetensorsFile::find(std::string_view name) const {
  auto it = index_.find(name);
  return it == index_.end() ? nullptr : &tensors_[it->second];
}

Result<const SafetensorsTensor*> SafetensorsFile::tensor(std::string_view name) const {
  if (const SafetensorsTensor* t = find(name)) return t;
  return not_found_error("{}: no tensor '{}'", path_, name);
}

// ---- SafetensorsModel ----

std::vector<const SafetensorsTensor*> SafetensorsModel::tensors() const {
  std::vector<const SafetensorsTensor*> out;
  out.reserve(where_.size());
  for (const auto& [name, loc] : where_) out.push_back(&shards_[loc.first].tensors()[loc.second]);
  return out;
}

const SafetensorsTensor* SafetensorsModel::find(std::string_view name) const {
  auto it = where_.find(name);
  return it == where_.end() ? nullptr : &shards_[it->second.first].tensors()[it->second.second];
}

Result<const SafetensorsTensor*> SafetensorsModel::tensor(std::string_view name) const {
  if (const SafetensorsTensor* t = find(name)) return t;
  return not_found_error("{}: no tensor '{}' in any shard", dir_, name);
}

namespace {

bool path_exists(const fs::path& p) {
  std::error_code ec;
  return fs::exists(fs::status(p, ec));
}

Result<SafetensorsIndex> read_index(const std::string& path) {
  SX_ASSIGN_OR_RETURN(std::unique_ptr<MappedFile> m, MappedFile::open(path));
  const auto* text = reinterpret_cast<const char*>(m->bytes().data());
  return parse_safetensors_index(std::string_view(text, m->size()), path);
}

}  // namespace

// The index's metadata and weight_map, shard names checked.
Result<SafetensorsIndex> parse_safetensors_index(std::string_view text, std::string_view display_name) {
  const std::string_view path = display_name;
  if (json_nesting_depth(text) > kMaxJsonDepth) {
    return invalid_argument_error("{}: nests JSON arrays/objects more than {} levels deep", path, kMaxJsonDepth);
  }
  std::string duplicate;
  const json root = parse_json_unique_keys(text, &duplicate);
  if (root.is_discarded()) return invalid_argument_error("{}: not valid JSON", path);
  if (!duplicate.empty()) {
    return invalid_argument_error("{}: names '{}' twice (in weight_map: two shards claimed for one tensor)", path,
                                  duplicate);
  }
  if (!root.is_object()) return invalid_argument_error("{}: holds {}, expected a JSON object", path, json_type_name(root));
  SafetensorsIndex idx;
  if (auto it = root.find("metadata"); it != root.end() && !it->is_null()) {
    if (!it->is_object()) {
      return invalid_argument_error("{}: 'metadata' is {}, expected an object", path, json_type_name(*it));
    }
    for (auto mi = it->begin(); mi != it->end(); ++mi) {
      idx.metadata.emplace(mi.key(), mi.value().is_string() ? mi.value().get<std::string>() : mi.value().dump());
    }
  }
  auto wm = root.find("weight_map");
  if (wm == root.end()) return invalid_argument_error("{}: no 'weight_map'", path);
  if (!wm->is_object()) {
    return invalid_argument_error("{}: 'weight_map' is {}, expected an object of tensor -> shard file", path,
                                  json_type_name(*wm));
  }
  for (auto wi = wm->begin(); wi != wm->end(); ++wi) {
    if (!wi.value().is_string()) {
      return invalid_argument_error("{}: 'weight_map.{}' is {} ({}), expected a shard file name", path, wi.key(),
                                    json_type_name(wi.value()), excerpt(wi.value()));
    }
    std::string shard = wi.value().get<std::string>();
    if (shard.empty() || shard == "." || shard == ".." || shard.find('/') != std::string::npos ||
        shard.find('\\') != std::string::npos) {
      return invalid_argument_error("{}: 'weight_map.{}' is \"{}\", not a plain file name in the model directory",
                                    path, wi.key(), shard);
    }
    idx.weight_map.emplace(wi.key(), std::move(shard));
  }
  return idx;
}

Result<SafetensorsModel> open_safetensors_dir(const std::string& dir) {
  std::error_code ec;
  const fs::file_status st = fs::status(dir, ec);
  if (!fs::exists(st)) return not_found_error("{}: no such directory", dir);
  if (!fs::is_directory(st)) {
    return invalid_argument_error("{} is a file, not a model directory (open one file with SafetensorsFile::open)",
                                  dir);
  }
  SafetensorsModel model;
  model.dir_ = dir;
  const fs::path root(dir);
  const fs::path index_path = root / kSafetensorsIndexFile;
  const fs::path single_path = root / kSafetensorsSingleFile;

  if (!path_exists(index_path)) {
    if (!path_exists(single_path)) {
      return not_found_error("{}: holds neither {} nor {}", dir, kSafetensorsSingleFile, kSafetensorsIndexFile);
    }
    SX_ASSIGN_OR_RETURN(SafetensorsFile f, SafetensorsFile::open(single_path.string()));
    for (std::size_t i = 0; i < f.tensors().size(); ++i) model.where_.emplace(f.tensors()[i].name, std::pair{0, i});
    model.shards_.push_back(std::move(f));
    return model;
  }

  model.index_path_ = index_path.string();
  SX_ASSIGN_OR_RETURN(SafetensorsIndex idx, read_index(model.index_path_));
  model.metadata_ = std::move(idx.metadata);

  // Shards in name order, each with the first tensor the index maps to it (for messages).
  std::map<std::string, std::string> shard_names;
  for (const auto& [tensor, shard] : idx.weight_map) shard_names.emplace(shard, tensor);
  if (shard_names.empty()) return invalid_argument_error("{}: 'weight_map' is empty", model.index_path_);

  for (const auto& [shard, first_tensor] : shard_names) {
    const fs::path p = root / shard;
    if (!path_exists(p)) {
      return not_found_error("{} names shard {} (for tensor '{}'), but {} does not exist", model.index_path_, shard,
                             first_tensor, p.string());
    }
  }
  std::map<std::string, std::size_t, std::less<>> shard_index;
  for (const auto& [shard, first_tensor] : shard_names) {
    SX_ASSIGN_OR_RETURN(SafetensorsFile f, SafetensorsFile::open((root / shard).string()));
    const std::size_t s = model.shards_.size();
    for (std::size_t i = 0; i < f.tensors().size(); ++i) {
      const std::string& name = f.tensors()[i].name;
      auto [it, inserted] = model.where_.emplace(name, std::pair{s, i});
      if (!inserted) {
        return data_loss_error("{}: tensor '{}' is in both shard {} and shard {}", dir, name,
                               model.shards_[it->second.first].path(), f.path());
      }
    }
    shard_index.emplace(shard, s);
    model.shards_.push_back(std::move(f));
  }

  // Every index entry must be found in the shard it names.
  for (const auto& [tensor, shard] : idx.weight_map) {
    const SafetensorsFile& f = model.shards_[shard_index.at(shard)];
    if (f.find(tensor) != nullptr) continue;
    auto found = model.where_.find(tensor);
    if (found == model.where_.end()) {
      return data_loss_error("{} maps tensor '{}' to shard {}, which does not contain it (no shard does)",
                             model.index_path_, tensor, shard);
    }
    return data_loss_error("{} maps tensor '{}' to shard {}, which does not contain it (it is in {})",
                           model.index_path_, tensor, shard, model.shards_[found->second.first].path());
  }
  for (const SafetensorsFile& f : model.shards_) {
    for (const SafetensorsTensor& t : f.tensors()) {
      if (idx.weight_map.find(t.name) == idx.weight_map.end()) {
        model.warnings_.push_back(fmt::format("{} holds tensor '{}', which {} does not mention; it is loaded anyway",
                                              f.path(), t.name, model.index_path_));
      }
    }
  }
  return model;
}

}  // namespace sx::model
