// pull_model(): select, download (a few files at a time), lay out, checksum (pull.h).
#include "runtime/hub/pull.h"

#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <set>
#include <thread>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "runtime/base/json_depth.h"
#include "runtime/base/json_parse.h"
#include "runtime/base/regular_file.h"
#include "runtime/base/sha256.h"

namespace sx::hub {

namespace {

namespace fs = std::filesystem;

constexpr std::string_view kIndex = "model.safetensors.index.json";
// Beside the weights of a safetensors repository.
constexpr std::string_view kCompanions[] = {
    "config.json",          "generation_config.json", "tokenizer.json",       "tokenizer_config.json",
    "special_tokens_map.json", "vocab.json",          "merges.txt",           "added_tokens.json",
    "chat_template.jinja",  "chat_template.json",     "preprocessor_config.json"};

// Through a temporary of this process's own, so that two pulls writing the same SHA256SUMS or ref
// never interleave their bytes in one file.
std::string write_atomically(const fs::path& path, const std::string& text) {
  const fs::path tmp = fmt::format("{}.tmp.{}", path.string(), ::getpid());
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    out << text;
    if (!out.flush()) return fmt::format("cannot write {}", tmp.string());
  }
  std::error_code ec;
  fs::rename(tmp, path, ec);
  return ec ? fmt::format("cannot rename {}: {}", tmp.string(), ec.message()) : std::string();
}

}  // namespace

bool glob_match(std::string_view p, std::string_view s) {
  if (p.empty()) return s.empty();
  if (p.starts_with("**")) {
    for (std::size_t i = 0; i <= s.size(); ++i) {
      if (glob_match(p.substr(2), s.substr(i))) return true;
    }
    return false;
  }
  if (p[0] == '*') {
    for (std::size_t i = 0; i <= s.size(); ++i) {
      if (glob_match(p.substr(1), s.substr(i))) return true;
      if (i < s.size() && s[i] == '/') break;
    }
    return false;
  }
  if (s.empty()) return false;
  if (p[0] == '?' ? s[0] != '/' : p[0] == s[0]) return glob_match(p.substr(1), s.substr(1));
  return false;
}

Result<std::vector<RemoteFile>> select_files(const RepoListing& listing, const ModelRef& ref,
                                             const std::vector<std::string>& includes,
                                             const std::function<Result<std::string>()>& index_json) {
  std::map<std::string, const RemoteFile*> by_path;
  for (const RemoteFile& f : listing.files) by_path[f.path] = &f;
  auto holds = [&] {
    std::string names;
    int n = 0;
    for (const auto& [p, f] : by_path) {
      if (++n > 40) {
        names += fmt::format(", ... ({} files)", by_path.size());
        break;
      }
      names += (names.empty() ? "" : ", ") + p;
    }
    return names.empty() ? std::string("no files") : names;
  };
  std::vector<RemoteFile> out;
  if (!includes.empty()) {
    for (const RemoteFile& f : listing.files) {
      if (std::any_of(includes.begin(), includes.end(), [&](const std::string& g) { return glob_match(g, f.path); })) {
        out.push_back(f);
      }
    }
    if (out.empty()) {
      return invalid_argument_error("{}: no file matches --include {} (the repository holds {})", ref.text,
                                    fmt::join(includes, " "), holds());
    }
    return out;
  }
  std::vector<const RemoteFile*> ggufs;
  for (const RemoteFile& f : listing.files) {
    if (ascii_lower(f.path).ends_with(".gguf")) ggufs.push_back(&f);
  }
  if (!ref.quant.empty()) {
    std::map<std::string, std::vector<const RemoteFile*>> by_split;  // file stem without -0000i-of-0000N
    for (const RemoteFile* f : ggufs) {
      if (!gguf_matches_quant(f->path, ref.quant)) continue;
      const auto part = gguf_split_part(f->path);
      by_split[part ? f->path.substr(0, f->path.size() - 20) : f->path].push_back(f);
    }
    if (by_split.empty()) {
      std::set<std::string> names;
      for (const RemoteFile* f : ggufs) names.insert(fs::path(f->path).filename().string());
      return invalid_argument_error("{}: the repository has no {} GGUF file (its GGUF files: {})", ref.text, ref.quant,
                                    names.empty() ? std::string("none") : fmt::format("{}", fmt::join(names, ", ")));
    }
    if (by_split.size() > 1) {
      std::vector<std::string> names;
      for (const auto& [stem, files] : by_split) names.push_back(files.front()->path);
      return invalid_argument_error("{}: {} files match {} ({}); pick one with --include", ref.text, by_split.size(),
                                    ref.quant, fmt::join(names, ", "));
    }
    const auto& files = by_split.begin()->second;
    if (const auto part = gguf_split_part(files.front()->path)) {
      const std::string stem = by_split.begin()->first;
      for (int i = 1; i <= part->second; ++i) {
        const std::string name = fmt::format("{}-{:05d}-of-{:05d}.gguf", stem, i, part->second);
        auto it = by_path.find(name);
        if (it == by_path.end()) {
          return not_found_error("{}: the split GGUF {} has {} parts but the repository lacks part {} ({})", ref.text,
                                 stem, part->second, i, name);
        }
        out.push_back(*it->second);
      }
    } else {
      out.push_back(*files.front());
    }
    return out;
  }
  auto add_companions = [&] {
    for (std::string_view c : kCompanions) {
      if (auto it = by_path.find(std::string(c)); it != by_path.end()) out.push_back(*it->second);
    }
  };
  if (by_path.contains(std::string(kIndex))) {
    SX_ASSIGN_OR_RETURN(std::string text, index_json());
    std::set<std::string> shards;
    if (json_shape(text).depth > kMaxJsonDepth) {
      return data_loss_error("{}: {} is not a safetensors index (nested over {} levels deep)", ref.text, kIndex,
                             kMaxJsonDepth);
    }
    const auto parsed = parse_json(text);
    if (!parsed.ok()) return data_loss_error("{}: {} is not a safetensors index ({})", ref.text, kIndex, parsed.error);
    try {
      for (const auto& [tensor, shard] : parsed.value.at("weight_map").items()) shards.insert(shard.get<std::string>());
    } catch (const nlohmann::json::exception& e) {
      return data_loss_error("{}: {} is not a safetensors index ({})", ref.text, kIndex, e.what());
    }
    out.push_back(*by_path.at(std::string(kIndex)));
    for (const std::string& s : shards) {
      auto it = by_path.find(s);
      if (it == by_path.end()) {
        return not_found_error("{}: {} names the shard {}, which the repository does not hold (it has {})", ref.text,
                               kIndex, s, holds());
      }
      out.push_back(*it->second);
    }
    add_companions();
    return out;
  }
  if (auto it = by_path.find("model.safetensors"); it != by_path.end()) {
    out.push_back(*it->second);
    add_companions();
    return out;
  }
  if (ggufs.size() == 1) {
    out.push_back(*ggufs.front());
    return out;
  }
  if (ggufs.size() > 1) {
    std::set<std::string> quants;
    for (const RemoteFile* f : ggufs) quants.insert(fs::path(f->path).filename().string());
    return invalid_argument_error("{}: the repository holds {} GGUF files ({}); name one quantisation: {}:Q4_K_M",
                                  ref.text, ggufs.size(), fmt::join(quants, ", "), ref.text);
  }
  return invalid_argument_error("{}: the repository holds no model Sextant loads (no {}, model.safetensors or .gguf "
                                "file; it holds {})", ref.text, kIndex, holds());
}

Result<PullResult> pull_model(const PullOptions& o) {
  const HubClient client(o.hub);
  const std::string revision = !o.revision.empty() ? o.revision
                               : o.ref.source == HubSource::kModelScope ? "master"
                                                                        : "main";
  SX_RETURN_IF_ERROR(check_revision(revision));
  SX_ASSIGN_OR_RETURN(RepoListing listing, client.list(o.ref.repo, revision));
  const std::string cache = o.cache.empty() ? hub_cache_dir() : o.cache;
  const fs::path repo_root = fs::path(cache) / repo_folder_name(o.ref.repo);
  const bool local = !o.local_dir.empty();
  const fs::path dir = local ? fs::path(o.local_dir) : repo_root / "snapshots" / listing.commit;
  std::error_code ec;

  // The blob (cache) or file (local dir) a remote file ends in, its partial and its lock.
  auto etag = [](const RemoteFile& f) { return !f.sha256.empty() ? f.sha256 : f.blob_id; };
  auto final_of = [&](const RemoteFile& f) {
    return local ? (dir / f.path).string() : (repo_root / "blobs" / etag(f)).string();
  };
  auto target_of = [&](const RemoteFile& f) {
    DownloadTarget t;
    t.final_path = final_of(f);
    t.partial = t.final_path + ".partial";
    // huggingface_hub's lock for the blob (so its downloads and ours exclude each other too);
    // beside the partial in a plain folder, deleted when done.
    t.lock = local ? t.partial + ".lock"
                   : (fs::path(cache) / ".locks" / repo_folder_name(o.ref.repo) / (etag(f) + ".lock")).string();
    t.remove_lock = local;
    return t;
  };
  // What an earlier pull of this snapshot (or into this folder) hashed on disk.
  std::map<std::string, std::string> sums;  // path -> sha256, for SHA256SUMS
  if (auto text = read_regular_file((dir / "SHA256SUMS").string(), 64ull << 20); text.ok()) {
    sums = parse_sha256sums(*text);
  }
  // A file is taken as it is, unread, only when it has its listed size and SHA256SUMS vouches for
  // the SHA-256 the hub publishes for it. Anything else that looks complete (a blob another tool
  // or an interrupted pull left, a small git file) goes to download(), which hashes it on disk
  // before trusting it: one read of what is unvouched, none of what is.
  auto have = [&](const RemoteFile& f) {
    const std::string path = final_of(f);
    if (!fs::is_regular_file(path, ec) || fs::file_size(path, ec) != f.size) return false;
    const auto it = sums.find(f.path);
    return !f.sha256.empty() && it != sums.end() && it->second == f.sha256;
  };

  std::vector<RemoteFile> files;
  {
    const std::function<Result<std::string>()> index = [&]() -> Result<std::string> {
      for (const RemoteFile& f : listing.files) {
        if (f.path == kIndex && have(f)) return read_regular_file(final_of(f), o.hub.max_text_bytes);
      }
      return client.fetch_text(o.ref.repo, listing.commit, kIndex);
    };
    SX_ASSIGN_OR_RETURN(files, select_files(listing, o.ref, o.includes, index));
  }
  for (const RemoteFile& f : files) {
    if (f.sha256.empty() && f.blob_id.empty()) {
      return data_loss_error("{}: the hub publishes no checksum for {}, so its download could not be verified",
                             o.ref.text, f.path);
    }
  }
  PullResult result;
  result.commit = listing.commit;
  result.dir = dir.string();
  result.files = static_cast<int>(files.size());
  std::vector<const RemoteFile*> todo;
  std::uint64_t total = 0;
  for (const RemoteFile& f : files) {
    result.bytes += f.size;
    if (!have(f)) {
      todo.push_back(&f);
      total += f.size;
    } else if (!f.sha256.empty()) {
      sums[f.path] = f.sha256;
    }
  }
  // Downloads, `parallel` at a time.
  std::mutex mu;
  Status failure = ok_status();
  std::atomic<bool> stop{false};
  std::atomic<std::uint64_t> done{0};
  std::atomic<int> files_done{0};
  std::size_t next = 0;
  HubOptions hub = o.hub;
  std::atomic<bool> any_cancel{false};
  hub.cancel = &any_cancel;  // o.hub.cancel or a failed sibling stops every download
  const HubClient worker_client(hub);
  auto report = [&] {
    if (o.progress) o.progress(done.load(), total, files_done.load(), static_cast<int>(todo.size()));
  };
  auto work = [&] {
    for (;;) {
      const RemoteFile* f = nullptr;
      {
        std::lock_guard lock(mu);
        if (next >= todo.size() || stop) return;
        f = todo[next++];
      }
      auto stats = worker_client.download(o.ref.repo, listing.commit, *f, target_of(*f), [&](std::int64_t n) {
        done += static_cast<std::uint64_t>(n);
        if (o.hub.cancel != nullptr && o.hub.cancel->load()) any_cancel = true;
        report();
      });
      std::lock_guard lock(mu);
      if (!stats.ok()) {
        if (failure.ok()) failure = stats.status();
        stop = true;
        any_cancel = true;
        return;
      }
      ++files_done;
      if (stats->reused) done += f->size;  // there already, and verified on disk
      if (!stats->reused) ++result.files_fetched;
      result.bytes_fetched += stats->bytes_received;
      result.resumes += stats->resumes;
      result.checksum_failures += stats->checksum_failures;
      sums[f->path] = stats->sha256;
      report();
    }
  };
  std::vector<std::thread> threads;
  const int n = std::max(1, std::min<int>(o.parallel, static_cast<int>(todo.size())));
  for (int i = 0; i < n && !todo.empty(); ++i) threads.emplace_back(work);
  // The caller's cancel flag reaches the downloads between chunks too.
  while (!todo.empty()) {
    {
      std::lock_guard lock(mu);
      if (stop || static_cast<std::size_t>(files_done.load()) == todo.size()) break;
    }
    if (o.hub.cancel != nullptr && o.hub.cancel->load()) any_cancel = true;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  for (std::thread& t : threads) t.join();
  if (o.hub.cancel != nullptr && o.hub.cancel->load()) {
    return cancelled_error("pull {}: interrupted with {} of {} bytes fetched, kept in .partial files; the same command resumes",
                           o.ref.text, done.load(), total);
  }
  if (!failure.ok()) return failure;

  // The snapshot: a relative link per file to its blob, and the ref.
  if (!local) {
    for (const RemoteFile& f : files) {
      const fs::path link = dir / f.path;
      const int depth = static_cast<int>(std::count(f.path.begin(), f.path.end(), '/'));
      std::string target;
      for (int i = 0; i < depth + 2; ++i) target += "../";
      target += "blobs/" + etag(f);
      fs::create_directories(link.parent_path(), ec);
      if (fs::is_symlink(link, ec) && fs::read_symlink(link, ec) == target) continue;
      fs::remove(link, ec);
      fs::create_symlink(target, link, ec);
      if (ec) return internal_error("{}: cannot link it to {}: {}", link.string(), target, ec.message());
    }
    if (revision != listing.commit) {
      fs::create_directories((repo_root / "refs" / revision).parent_path(), ec);
      if (std::string e = write_atomically(repo_root / "refs" / revision, listing.commit); !e.empty()) {
        return internal_error("{}", e);
      }
    }
  }
  // SHA256SUMS of every file of the selection (sha256sum's format).
  std::string text;
  for (const RemoteFile& f : files) {
    auto it = sums.find(f.path);
    std::string digest = it != sums.end() ? it->second : std::string();
    if (digest.empty()) {
      SX_ASSIGN_OR_RETURN(digest, sha256_file((dir / f.path).string()));
    }
    text += fmt::format("{}  {}\n", digest, f.path);
  }
  fs::create_directories(dir, ec);
  if (std::string e = write_atomically(dir / "SHA256SUMS", text); !e.empty()) return internal_error("{}", e);
  // What serve loads (none for an --include selection without a model).
  if (auto path = model_path_in_snapshot(dir.string(), o.ref); path.ok()) result.path = *path;
  return result;
}

}  // namespace sx::hub
