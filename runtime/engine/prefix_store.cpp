// PrefixStore: the prefix cache's files (prefix_store.h).
#include "runtime/engine/prefix_store.h"

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <system_error>

#include <fmt/format.h>

#include "runtime/base/fnv.h"
#include "runtime/base/log.h"

namespace sx::engine {

namespace fs = std::filesystem;

namespace {

constexpr char kMagic[8] = {'S', 'X', 'P', 'F', 'X', '0', '0', '1'};

struct Header {
  char magic[8];
  std::uint32_t kind;
  std::uint32_t n_tokens;
  std::uint64_t salt;
  std::uint64_t hash;
  std::uint64_t payload_bytes;
  std::uint64_t checksum;  // of the tokens, then the payload
};
static_assert(sizeof(Header) == 48);

// FNV-1a's steps over 8-byte words (the tail byte by byte, as Fnv1a): a check against torn and
// damaged files, eight times fewer multiplies than byte by byte over megabytes of KV.
std::uint64_t checksum(std::span<const std::byte> a, std::span<const std::byte> b) {
  std::uint64_t h = kFnvOffset;
  for (const auto part : {a, b}) {
    std::size_t i = 0;
    for (; i + 8 <= part.size(); i += 8) {
      std::uint64_t w;
      std::memcpy(&w, part.data() + i, 8);
      h = (h ^ w) * kFnvPrime;
    }
    for (; i < part.size(); ++i) h = (h ^ static_cast<std::uint64_t>(part[i])) * kFnvPrime;
  }
  return h;
}

bool ours(const fs::path& p) {
  const std::string ext = p.extension().string();
  return ext == ".blk" || ext == ".snp";
}

}  // namespace

PrefixStore::PrefixStore(PrefixStoreOptions options) : options_(std::move(options)) {}

Result<std::unique_ptr<PrefixStore>> PrefixStore::open(const PrefixStoreOptions& options) {
  std::error_code ec;
  fs::create_directories(options.dir, ec);
  if (ec) return invalid_argument_error("engine.prefix_cache_dir {}: cannot be created: {}", options.dir, ec.message());
  auto store = std::unique_ptr<PrefixStore>(new PrefixStore(options));
  // What is there: every entry file (of any salt) counts against the bound, oldest first.
  std::vector<std::pair<fs::file_time_type, fs::directory_entry>> found;
  for (const auto& e : fs::directory_iterator(options.dir, ec)) {
    std::error_code e2;
    if (!e.is_regular_file(e2)) continue;
    if (e.path().extension() == ".tmp") {
      fs::remove(e.path(), e2);  // a write that never finished
      continue;
    }
    if (!ours(e.path())) continue;
    found.emplace_back(e.last_write_time(e2), e);
  }
  if (ec) return invalid_argument_error("engine.prefix_cache_dir {}: cannot be read: {}", options.dir, ec.message());
  std::sort(found.begin(), found.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
  {
    std::lock_guard<std::mutex> lock(store->mu_);
    for (const auto& [when, e] : found) {
      std::error_code e2;
      const std::string name = e.path().filename().string();
      store->add(name, e.file_size(e2), false);
    }
    store->evict_over_bound();
  }
  store->writer_ = std::thread([s = store.get()] { s->write_loop(); });
  log_info("prefix cache: {} holds {} entries of this model ({:.1f} MB in all)", options.dir,
           store->stats().blocks + store->stats().snapshots, static_cast<double>(store->stats().bytes) / 1e6);
  return store;
}

PrefixStore::~PrefixStore() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (writer_.joinable()) writer_.join();
}

std::string PrefixStore::name_of(Kind kind, std::uint64_t hash) const {
  return fmt::format("{:016x}-{:016x}.{}", options_.salt, hash, kind == Kind::kBlock ? "blk" : "snp");
}

bool PrefixStore::has_block(std::uint64_t hash) const {
  std::lock_guard<std::mutex> lock(mu_);
  return files_.count(name_of(Kind::kBlock, hash)) != 0;
}

bool PrefixStore::has_snapshot(std::uint64_t hash) const {
  std::lock_guard<std::mutex> lock(mu_);
  return files_.count(name_of(Kind::kSnapshot, hash)) != 0;
}

void PrefixStore::put_block(std::uint64_t hash, std::span<const std::int32_t> tokens, std::vector<std::byte> kv) {
  put(Kind::kBlock, hash, tokens, std::move(kv));
}

void PrefixStore::put_snapshot(std::uint64_t hash, std::vector<std::byte> states) {
  put(Kind::kSnapshot, hash, {}, std::move(states));
}

void PrefixStore::put(Kind kind, std::uint64_t hash, std::span<const std::int32_t> tokens,
                      std::vector<std::byte> payload) {
  const std::string name = name_of(kind, hash);
  Header h{};
  std::memcpy(h.magic, kMagic, sizeof(kMagic));
  h.kind = static_cast<std::uint32_t>(kind);
  h.n_tokens = static_cast<std::uint32_t>(tokens.size());
  h.salt = options_.salt;
  h.hash = hash;
  h.payload_bytes = payload.size();
  h.checksum = checksum(std::as_bytes(tokens), payload);
  std::vector<std::byte> file(sizeof(Header) + tokens.size_bytes() + payload.size());
  std::memcpy(file.data(), &h, sizeof(Header));
  if (!tokens.empty()) std::memcpy(file.data() + sizeof(Header), tokens.data(), tokens.size_bytes());
  if (!payload.empty()) std::memcpy(file.data() + sizeof(Header) + tokens.size_bytes(), payload.data(), payload.size());
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stop_ || files_.count(name) != 0) return;
    add(name, file.size(), true);
    queue_.push_back({name, std::move(file)});
  }
  cv_.notify_all();
}

std::optional<std::vector<std::byte>> PrefixStore::get_block(std::uint64_t hash, std::span<const std::int32_t> tokens,
                                                             std::size_t bytes) {
  return get(Kind::kBlock, hash, tokens, bytes);
}

std::optional<std::vector<std::byte>> PrefixStore::get_snapshot(std::uint64_t hash, std::size_t bytes) {
  return get(Kind::kSnapshot, hash, {}, bytes);
}

std::optional<std::vector<std::byte>> PrefixStore::get(Kind kind, std::uint64_t hash,
                                                       std::span<const std::int32_t> tokens, std::size_t bytes) {
  const std::string name = name_of(kind, hash);
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = files_.find(name);
    if (it == files_.end() || it->second.pending) return std::nullopt;
  }
  const fs::path path = fs::path(options_.dir) / name;
  std::string why;
  std::vector<std::byte> payload;
  {
    std::ifstream in(path, std::ios::binary);
    Header h{};
    const std::size_t want = sizeof(Header) + tokens.size_bytes() + bytes;
    std::error_code ec;
    const auto size = fs::file_size(path, ec);
    if (!in || ec) {
      why = "cannot be read";
    } else if (size != want) {
      why = fmt::format("has {} bytes, not the {} of its kind (torn or of another layout)", size, want);
    } else if (!in.read(reinterpret_cast<char*>(&h), sizeof(Header)) || std::memcmp(h.magic, kMagic, sizeof(kMagic)) != 0 ||
               h.kind != static_cast<std::uint32_t>(kind) || h.salt != options_.salt || h.hash != hash ||
               h.n_tokens != tokens.size() || h.payload_bytes != bytes) {
      why = "has a foreign header";
    } else {
      std::vector<std::int32_t> stored(tokens.size());
      payload.resize(bytes);
      if (!in.read(reinterpret_cast<char*>(stored.data()), static_cast<std::streamsize>(tokens.size_bytes())) ||
          !in.read(reinterpret_cast<char*>(payload.data()), static_cast<std::streamsize>(bytes))) {
        why = "is short";
      } else if (!std::equal(stored.begin(), stored.end(), tokens.begin())) {
        why = "holds other tokens under its hash";
      } else if (checksum(std::as_bytes(std::span(stored)), payload) != h.checksum) {
        why = "fails its checksum";
      }
    }
  }
  std::lock_guard<std::mutex> lock(mu_);
  if (!why.empty()) {
    log_warn("prefix cache: {} {}: ignored and removed", path.string(), why);
    drop(name, true);
    return std::nullopt;
  }
  auto it = files_.find(name);
  if (it != files_.end()) {
    lru_.erase({it->second.used, name});
    it->second.used = ++tick_;
    lru_.emplace(it->second.used, name);
  }
  ++counters_.read;
  return payload;
}

std::uint64_t* PrefixStore::count_of(const std::string& name) {
  if (name.compare(0, 17, fmt::format("{:016x}-", options_.salt)) != 0) return nullptr;  // another salt's
  return name.ends_with(".blk") ? &counters_.blocks : &counters_.snapshots;
}

void PrefixStore::add(const std::string& name, std::uint64_t bytes, bool pending) {
  File f;
  f.bytes = bytes;
  f.used = ++tick_;
  f.pending = pending;
  files_[name] = f;
  lru_.emplace(f.used, name);
  bytes_ += bytes;
  if (std::uint64_t* n = count_of(name)) ++*n;
}

void PrefixStore::forget(const std::string& name) {
  auto it = files_.find(name);
  if (it == files_.end()) return;
  lru_.erase({it->second.used, name});
  bytes_ -= std::min(bytes_, it->second.bytes);
  files_.erase(it);
  if (std::uint64_t* n = count_of(name)) --*n;
}

void PrefixStore::drop(const std::string& name, bool rejected) {
  if (files_.count(name) == 0) return;
  std::error_code ec;
  fs::remove(fs::path(options_.dir) / name, ec);
  forget(name);
  ++(rejected ? counters_.rejected : counters_.evicted);
}

void PrefixStore::evict_over_bound() {
  while (bytes_ > options_.max_bytes && !lru_.empty()) {
    auto oldest = lru_.begin();
    const std::string name = oldest->second;
    auto f = files_.find(name);
    if (f != files_.end() && f->second.pending) {
      // Queued: it is dropped from the queue instead of written.
      queue_.erase(std::remove_if(queue_.begin(), queue_.end(), [&](const Job& j) { return j.name == name; }),
                   queue_.end());
    }
    drop(name, false);
  }
}

void PrefixStore::write_loop() {
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    cv_.wait(lock, [this] { return stop_ || !queue_.empty(); });
    if (queue_.empty()) break;  // stopping, everything written
    Job job = std::move(queue_.front());
    queue_.pop_front();
    writing_ = true;
    lock.unlock();
    const fs::path path = fs::path(options_.dir) / job.name;
    const fs::path tmp = fs::path(options_.dir) / (job.name + ".tmp");  // one writer: one at a time
    bool ok = false;
    {
      std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
      ok = out && out.write(reinterpret_cast<const char*>(job.file.data()), static_cast<std::streamsize>(job.file.size()))
                      .flush()
                      .good();
    }
    std::error_code ec;
    if (ok) fs::rename(tmp, path, ec);
    if (!ok || ec) {
      fs::remove(tmp, ec);
      log_warn("prefix cache: {} could not be written{}", path.string(), ec ? ": " + ec.message() : "");
    }
    lock.lock();
    writing_ = false;
    auto it = files_.find(job.name);
    if (it != files_.end()) {
      if (ok) {
        it->second.pending = false;
        ++counters_.written;
      } else {
        forget(job.name);
      }
    } else if (ok) {
      fs::remove(path, ec);  // evicted while it was being written
    }
    evict_over_bound();
    idle_.notify_all();
  }
  idle_.notify_all();
}

void PrefixStore::flush() {
  std::unique_lock<std::mutex> lock(mu_);
  idle_.wait(lock, [this] { return queue_.empty() && !writing_; });
}

PrefixStoreStats PrefixStore::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  PrefixStoreStats s = counters_;
  s.bytes = bytes_;
  return s;
}

}  // namespace sx::engine
