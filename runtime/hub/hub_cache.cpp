// Model references and the Hugging Face cache layout (hub_cache.h).
#include "runtime/hub/hub_cache.h"

#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>

#include <fmt/format.h>

namespace sx::hub {

namespace {

namespace fs = std::filesystem;

constexpr std::size_t kMaxPart = 96;

bool valid_part(std::string_view s) {
  if (s.empty() || s.size() > kMaxPart || s.front() == '.' || s.front() == '-' || s == "..") return false;
  return std::all_of(s.begin(), s.end(), [](char c) {
    return std::isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '_' || c == '.';
  });
}

bool is_hex(std::string_view s, std::size_t n) {
  return s.size() == n && std::all_of(s.begin(), s.end(), [](char c) { return std::isxdigit(static_cast<unsigned char>(c)); });
}

std::string read_first_line(const fs::path& p) {
  std::ifstream in(p);
  std::string line;
  std::getline(in, line);
  while (!line.empty() && (line.back() == '\n' || line.back() == '\r' || line.back() == ' ')) line.pop_back();
  return line;
}

// Every regular file (or link to one) below `dir`, as relative paths.
std::vector<std::string> files_below(const fs::path& dir) {
  std::vector<std::string> out;
  std::error_code ec;
  for (auto it = fs::recursive_directory_iterator(dir, ec); !ec && it != fs::recursive_directory_iterator();
       it.increment(ec)) {
    std::error_code e2;
    if (it->is_directory(e2)) continue;
    out.push_back(it->path().lexically_relative(dir).generic_string());
  }
  std::sort(out.begin(), out.end());
  return out;
}

}  // namespace

std::string ascii_lower(std::string_view s) {
  std::string out(s);
  for (char& c : out) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return out;
}

std::string_view source_name(HubSource s) { return s == HubSource::kModelScope ? "ModelScope" : "Hugging Face"; }

Result<ModelRef> parse_model_ref(std::string_view text) {
  ModelRef r;
  std::string_view t = text;
  if (t.starts_with("hf:")) {
    t.remove_prefix(3);
  } else if (t.starts_with("ms:")) {
    r.source = HubSource::kModelScope;
    t.remove_prefix(3);
  }
  r.text = std::string(t);
  const std::size_t slash = t.find('/');
  const std::size_t colon = t.find(':');
  const std::string_view org = slash == std::string_view::npos ? std::string_view() : t.substr(0, slash);
  const std::string_view rest = slash == std::string_view::npos ? t : t.substr(slash + 1);
  const std::size_t rc = rest.find(':');
  const std::string_view name = rest.substr(0, rc);
  const std::string_view quant = rc == std::string_view::npos ? std::string_view() : rest.substr(rc + 1);
  const bool quant_ok = rc == std::string_view::npos || valid_part(quant);
  if (slash == std::string_view::npos || (colon != std::string_view::npos && colon < slash) || !valid_part(org) ||
      !valid_part(name) || !quant_ok) {
    return invalid_argument_error(
        "'{}' is not a model reference: expected ORG/NAME or ORG/NAME:QUANT (e.g. Qwen/Qwen3-8B, "
        "Qwen/Qwen3-8B-GGUF:Q4_K_M), optionally prefixed hf: or ms:, with letters, digits, '-', '_' and '.' "
        "in each part",
        text);
  }
  r.repo = fmt::format("{}/{}", org, name);
  r.quant = std::string(quant);
  return r;
}

bool is_model_ref(const std::string& text) {
  std::error_code ec;
  if (fs::exists(text, ec)) return false;
  return parse_model_ref(text).ok();
}

std::string hub_cache_dir() {
  if (const char* c = std::getenv("HF_HUB_CACHE"); c != nullptr && *c != '\0') return c;
  if (const char* h = std::getenv("HF_HOME"); h != nullptr && *h != '\0') return (fs::path(h) / "hub").string();
  if (const char* x = std::getenv("XDG_CACHE_HOME"); x != nullptr && *x != '\0') {
    return (fs::path(x) / "huggingface" / "hub").string();
  }
  const char* home = std::getenv("HOME");
  return (fs::path(home != nullptr ? home : "/tmp") / ".cache" / "huggingface" / "hub").string();
}

std::string repo_folder_name(std::string_view repo) {
  std::string out = "models--";
  for (char c : repo) {
    if (c == '/') {
      out += "--";
    } else {
      out += c;
    }
  }
  return out;
}

bool gguf_matches_quant(std::string_view path, std::string_view quant) {
  const std::string p = ascii_lower(path), q = ascii_lower(quant);
  if (!p.ends_with(".gguf") || q.empty()) return false;
  auto separator = [](char c) { return c == '.' || c == '-' || c == '_' || c == '/'; };
  for (std::size_t at = p.find(q); at != std::string::npos; at = p.find(q, at + 1)) {
    const bool starts = at == 0 || separator(p[at - 1]);
    const std::size_t end = at + q.size();
    // "Q4_K" must not match "Q4_K_M": the next character ends a token that is not the quant's own
    // continuation ("_M", "_S", "_L", "_0"...).
    const bool ends = end < p.size() && (p[end] == '.' || p[end] == '-' || p[end] == '/');
    if (starts && ends) return true;
  }
  return false;
}

std::optional<std::pair<int, int>> gguf_split_part(std::string_view path) {
  // "...-00001-of-00003.gguf"
  constexpr std::string_view kSuffix = ".gguf";
  if (!path.ends_with(kSuffix) || path.size() < kSuffix.size() + 15) return std::nullopt;
  const std::string_view tail = path.substr(path.size() - kSuffix.size() - 15, 15);  // -00001-of-00003
  if (tail[0] != '-' || tail.substr(6, 4) != "-of-") return std::nullopt;
  const std::string_view a = tail.substr(1, 5), b = tail.substr(10, 5);
  if (!std::all_of(a.begin(), a.end(), ::isdigit) || !std::all_of(b.begin(), b.end(), ::isdigit)) return std::nullopt;
  const int i = std::stoi(std::string(a)), n = std::stoi(std::string(b));
  if (i < 1 || n < 1 || i > n) return std::nullopt;
  return std::pair{i, n};
}

Status check_revision(std::string_view revision) {
  const std::string shown = fmt::format("'{}'", revision.substr(0, 100));
  if (revision.empty() || revision.size() > 256) {
    return invalid_argument_error("revision {} must have 1 to 256 characters (a branch, tag or commit)", shown);
  }
  for (const char c : revision) {
    if (static_cast<unsigned char>(c) < 0x20 || c == 0x7f || c == '\\') {
      return invalid_argument_error("revision {} holds a control character or a backslash", shown);
    }
  }
  for (std::size_t start = 0; start <= revision.size();) {
    const std::size_t end = std::min(revision.find('/', start), revision.size());
    const std::string_view seg = revision.substr(start, end - start);
    if (seg.empty() || seg == "." || seg == "..") {
      return invalid_argument_error(
          "revision {} is not a branch, tag or commit name: an empty, '.' or '..' part would take the file it "
          "names (refs/REVISION) out of the cache", shown);
    }
    start = end + 1;
  }
  return ok_status();
}

std::map<std::string, std::string> parse_sha256sums(std::string_view text) {
  std::map<std::string, std::string> out;
  while (!text.empty()) {
    const std::size_t nl = text.find('\n');
    std::string_view line = text.substr(0, nl);
    text.remove_prefix(nl == std::string_view::npos ? text.size() : nl + 1);
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    if (line.size() < 67 || !is_hex(line.substr(0, 64), 64) || line[64] != ' ' || (line[65] != ' ' && line[65] != '*')) {
      continue;
    }
    const std::string_view path = line.substr(66);
    if (std::any_of(path.begin(), path.end(), [](char c) { return static_cast<unsigned char>(c) < 0x20 || c == 0x7f; })) {
      continue;  // no file a listing names (parse_repo_listing refuses control characters)
    }
    out[std::string(path)] = ascii_lower(line.substr(0, 64));
  }
  return out;
}

std::optional<std::string> find_snapshot(const std::string& cache, std::string_view repo, std::string_view revision) {
  if (!check_revision(revision).ok()) return std::nullopt;
  const fs::path root = fs::path(cache) / repo_folder_name(repo);
  std::error_code ec;
  std::string commit(revision);
  if (!is_hex(revision, 40)) {
    const fs::path ref = root / "refs" / std::string(revision);
    if (!fs::is_regular_file(ref, ec)) return std::nullopt;
    commit = read_first_line(ref);
    if (!is_hex(commit, 40)) return std::nullopt;
  }
  const fs::path snap = root / "snapshots" / commit;
  if (!fs::is_directory(snap, ec)) return std::nullopt;
  return snap.string();
}

Result<std::string> model_path_in_snapshot(const std::string& snapshot, const ModelRef& ref) {
  const std::vector<std::string> files = files_below(snapshot);
  std::vector<std::string> ggufs;
  for (const std::string& f : files) {
    if (f.ends_with(".gguf")) ggufs.push_back(f);
  }
  if (!ref.quant.empty()) {
    std::vector<std::string> matching;
    for (const std::string& f : ggufs) {
      if (gguf_matches_quant(f, ref.quant)) matching.push_back(f);
    }
    if (matching.empty()) {
      return not_found_error("{}: no {} GGUF file in the cached snapshot {} (it holds: {}); fetch it with: sextant pull {}",
                             ref.text, ref.quant, snapshot, ggufs.empty() ? "no GGUF files" : fmt::format("{}", fmt::join(ggufs, ", ")),
                             ref.text);
    }
    for (const std::string& f : matching) {  // a split file is opened by its first part
      const auto part = gguf_split_part(f);
      if (!part || part->first == 1) return (fs::path(snapshot) / f).string();
    }
    return (fs::path(snapshot) / matching.front()).string();
  }
  const bool safetensors = std::any_of(files.begin(), files.end(), [](const std::string& f) {
    return f.ends_with(".safetensors") || f == "model.safetensors.index.json";
  });
  if (safetensors) return snapshot;
  if (ggufs.size() == 1) return (fs::path(snapshot) / ggufs.front()).string();
  if (ggufs.empty()) {
    return not_found_error("{}: the cached snapshot {} holds no model (no .safetensors or .gguf files)", ref.text,
                           snapshot);
  }
  return invalid_argument_error("{}: the repository holds {} GGUF files ({}); name one quantisation, e.g. {}:Q4_K_M",
                                ref.text, ggufs.size(), fmt::join(ggufs, ", "), ref.text);
}

std::vector<CachedModel> list_cached_models(const std::string& cache) {
  std::vector<CachedModel> out;
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(cache, ec)) {
    const std::string folder = entry.path().filename().string();
    if (!folder.starts_with("models--") || !entry.is_directory(ec)) continue;
    CachedModel m;
    const std::string tail = folder.substr(8);
    const std::size_t sep = tail.find("--");
    m.repo = sep == std::string::npos ? tail : tail.substr(0, sep) + "/" + tail.substr(sep + 2);
    // The newest snapshot, and the refs that name it.
    fs::file_time_type newest{};
    for (const auto& s : fs::directory_iterator(entry.path() / "snapshots", ec)) {
      std::error_code e2;
      const auto t = fs::last_write_time(s.path(), e2);
      if (m.commit.empty() || t > newest) newest = t, m.commit = s.path().filename().string();
    }
    for (const auto& r : fs::recursive_directory_iterator(entry.path() / "refs", ec)) {
      std::error_code e2;
      if (r.is_regular_file(e2) && read_first_line(r.path()) == m.commit) {
        m.refs.push_back(r.path().lexically_relative(entry.path() / "refs").generic_string());
      }
    }
    std::sort(m.refs.begin(), m.refs.end());
    for (const auto& b : fs::directory_iterator(entry.path() / "blobs", ec)) {
      std::error_code e2;
      const std::string name = b.path().filename().string();
      if (name.ends_with(".partial") || name.ends_with(".incomplete")) {
        ++m.partial_files;
      } else if (b.is_regular_file(e2)) {
        m.bytes += fs::file_size(b.path(), e2);
      }
    }
    bool broken = false, unverified = false;
    if (!m.commit.empty()) {
      const fs::path snap = entry.path() / "snapshots" / m.commit;
      std::set<std::string> listed;  // names a SHA256SUMS file gives a checksum
      if (std::ifstream sums(snap / "SHA256SUMS", std::ios::binary); sums) {
        const std::string text(std::istreambuf_iterator<char>(sums), {});
        for (const auto& [path, digest] : parse_sha256sums(text)) listed.insert(path);
      }
      for (const std::string& f : files_below(snap)) {
        if (f == "SHA256SUMS") continue;
        ++m.files;
        std::error_code e2;
        if (!fs::exists(snap / f, e2)) {
          broken = true;
          continue;
        }
        const fs::path target = fs::is_symlink(snap / f, e2) ? fs::read_symlink(snap / f, e2) : fs::path();
        if (!is_hex(target.filename().string(), 64) && !listed.contains(f)) unverified = true;
      }
    }
    m.state = broken ? "broken" : m.commit.empty() ? "empty" : unverified ? "unverified" : "verified";
    out.push_back(std::move(m));
  }
  std::sort(out.begin(), out.end(), [](const CachedModel& a, const CachedModel& b) { return a.repo < b.repo; });
  return out;
}

Status remove_cached_model(const std::string& cache, std::string_view repo) {
  const fs::path root = fs::path(cache) / repo_folder_name(repo);
  std::error_code ec;
  if (!fs::is_directory(root, ec)) return not_found_error("{} is not in the cache ({})", repo, cache);
  fs::remove_all(root, ec);
  if (ec) return internal_error("{}: cannot remove: {}", root.string(), ec.message());
  return ok_status();
}

}  // namespace sx::hub
