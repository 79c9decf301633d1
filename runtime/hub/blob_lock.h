// An advisory lock (flock) per file being downloaded, so that two pulls of one repository on one
// cache (two replicas or pods sharing it, `serve --pull` beside a manual pull, two files of one
// pull with the same content) never write the same .partial at once: the second waits, then finds
// the file done. The lock lives in its own file, never in the .partial (which is truncated,
// renamed and deleted): in the cache huggingface_hub's CACHE/.locks/models--ORG--NAME/<etag>.lock,
// so a `huggingface_hub` download of the same blob excludes a pull too; beside the partial
// (PATH.partial.lock) in a --local-dir folder, deleted when done.
//
// acquire() opens (creating) the lock file and takes LOCK_EX without blocking; while another
// process or thread holds it, `on_wait` is called once and the lock is tried again every 100 ms
// (so the cancel flag stops the wait). Once held, the file must still be the one at its path (a
// holder that deleted it when done leaves waiters on an orphan: they open it again).
//
// Lifetime: the lock is held until the BlobLock is destroyed (or moved from); with `remove_when_done`
// the lock file is deleted first, while still held.
// Threading: flock locks belong to an open file description, so two threads of one process exclude
// each other as two processes do; a BlobLock itself is used by one thread.
// Errors: CANCELLED when the cancel flag is set while waiting; a file system without flock (ENOLCK,
// EOPNOTSUPP, ENOSYS) is not an error: acquire() returns an unlocked BlobLock (locked() false) and
// the caller relies on what it verifies on disk. Any other open/flock error: INTERNAL naming the path.
#pragma once

#include <atomic>
#include <functional>
#include <string>

#include "runtime/base/regular_file.h"
#include "runtime/base/status.h"

namespace sx::hub {

class BlobLock {
 public:
  BlobLock() = default;
  ~BlobLock();
  BlobLock(BlobLock&& other) noexcept;
  BlobLock& operator=(BlobLock&& other) noexcept;
  BlobLock(const BlobLock&) = delete;
  BlobLock& operator=(const BlobLock&) = delete;

  static Result<BlobLock> acquire(const std::string& path, bool remove_when_done,
                                  const std::atomic<bool>* cancel, const std::function<void()>& on_wait);
  bool locked() const { return fd_.valid(); }
  const std::string& path() const { return path_; }

 private:
  void release();

  UniqueFd fd_;
  std::string path_;
  bool remove_ = false;
};

}  // namespace sx::hub
