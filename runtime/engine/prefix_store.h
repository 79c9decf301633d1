// A prefix cache's persistent tier (engine.prefix_cache_dir, issue 55): KV blocks and a hybrid's
// state snapshots in files, so that a conversation evicted from device memory, or one that
// outlived a reload or an upgrade of the same model, is read back instead of computed again.
//
// - One file per block (`<salt>-<hash>.blk`: its tokens and its KV, every rank's part) and per
//   snapshot (`<salt>-<hash>.snp`: the states after the block of that hash), both keyed by the
//   block hash of kv_cache_manager.h, under a salt that names the weights and the layout (a file
//   of another salt is never read).
// - Each file has a header (magic, kind, salt, hash, sizes) and a checksum of its tokens and
//   payload; it is written to a temporary name and renamed, so a reader sees whole files only. A
//   file that fails any check (torn, foreign, corrupt) is ignored with a warning and removed.
// - Writes run on a thread of the store's own: put_*() copies nothing to disk on the caller's
//   thread. The directory is bounded by max_bytes: the least recently used files (of any salt)
//   are removed first.
//
// Threading: every method may be called from any thread. Errors: open() fails (naming the
// directory) when the directory cannot be created or read; later I/O errors are warnings (the
// entry is simply not there).
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <span>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "runtime/base/status.h"

namespace sx::engine {

struct PrefixStoreOptions {
  std::string dir;
  std::uint64_t max_bytes = std::uint64_t{16} << 30;
  std::uint64_t salt = 0;
};

struct PrefixStoreStats {
  std::uint64_t blocks = 0, snapshots = 0, bytes = 0;  // held now (this salt's entries; bytes: all files)
  std::uint64_t written = 0, read = 0, rejected = 0, evicted = 0;  // files, since open
};

class PrefixStore {
 public:
  static Result<std::unique_ptr<PrefixStore>> open(const PrefixStoreOptions& options);
  ~PrefixStore();  // finishes the queued writes

  bool has_block(std::uint64_t hash) const;
  bool has_snapshot(std::uint64_t hash) const;
  // Queue a write (nothing when the entry is there or queued).
  void put_block(std::uint64_t hash, std::span<const std::int32_t> tokens, std::vector<std::byte> kv);
  void put_snapshot(std::uint64_t hash, std::vector<std::byte> states);
  // The entry's payload when its file passes every check against these tokens and size.
  std::optional<std::vector<std::byte>> get_block(std::uint64_t hash, std::span<const std::int32_t> tokens,
                                                  std::size_t bytes);
  std::optional<std::vector<std::byte>> get_snapshot(std::uint64_t hash, std::size_t bytes);
  void flush();  // waits until every queued write is on disk
  PrefixStoreStats stats() const;
  const std::string& dir() const { return options_.dir; }

 private:
  enum class Kind : std::uint32_t { kBlock = 1, kSnapshot = 2 };
  struct Job {
    std::string name;
    std::vector<std::byte> file;
  };
  struct File {
    std::uint64_t bytes = 0;
    std::uint64_t used = 0;  // LRU tick
    bool pending = false;    // queued, not yet written
  };
  explicit PrefixStore(PrefixStoreOptions options);
  std::string name_of(Kind kind, std::uint64_t hash) const;
  void put(Kind kind, std::uint64_t hash, std::span<const std::int32_t> tokens, std::vector<std::byte> payload);
  std::optional<std::vector<std::byte>> get(Kind kind, std::uint64_t hash, std::span<const std::int32_t> tokens,
                                            std::size_t bytes);
  // mu_ held: an entry in files_ / lru_ / bytes_ and this salt's counts, and out of them again.
  void add(const std::string& name, std::uint64_t bytes, bool pending);
  void forget(const std::string& name);
  std::uint64_t* count_of(const std::string& name);  // counters_.blocks / snapshots, or null (another salt)
  void drop(const std::string& name, bool rejected);  // mu_ held: forget() and remove the file
  void evict_over_bound();                           // mu_ held
  void write_loop();

  PrefixStoreOptions options_;
  mutable std::mutex mu_;
  std::condition_variable cv_, idle_;
  std::deque<Job> queue_;
  bool writing_ = false, stop_ = false;
  std::unordered_map<std::string, File> files_;  // file name -> entry
  std::set<std::pair<std::uint64_t, std::string>> lru_;
  std::uint64_t tick_ = 0, bytes_ = 0;
  PrefixStoreStats counters_;  // blocks and snapshots kept as files come and go (stats() is per step)
  std::thread writer_;
};

}  // namespace sx::engine
