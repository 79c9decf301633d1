// Advisory per-file download locks over flock(2) (blob_lock.h).
#include "runtime/hub/blob_lock.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <thread>

namespace sx::hub {

namespace {

bool no_flock_here(int err) { return err == ENOLCK || err == EOPNOTSUPP || err == ENOSYS; }

}  // namespace

BlobLock::~BlobLock() { release(); }

BlobLock::BlobLock(BlobLock&& other) noexcept
    : fd_(std::move(other.fd_)), path_(std::move(other.path_)), remove_(other.remove_) {}

BlobLock& BlobLock::operator=(BlobLock&& other) noexcept {
  if (this != &other) {
    release();
    fd_ = std::move(other.fd_);
    path_ = std::move(other.path_);
    remove_ = other.remove_;
  }
  return *this;
}

void BlobLock::release() {
  if (!fd_.valid()) return;
  if (remove_) ::unlink(path_.c_str());  // while held: a waiter then finds an orphan and opens again
  fd_.reset();                           // closing the last descriptor drops the lock
}

Result<BlobLock> BlobLock::acquire(const std::string& path, bool remove_when_done, const std::atomic<bool>* cancel,
                                   const std::function<void()>& on_wait) {
  std::error_code ec;
  std::filesystem::create_directories(std::filesystem::path(path).parent_path(), ec);
  bool waited = false;
  for (;;) {
    int raw = -1;
    do {
      raw = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0644);
    } while (raw < 0 && errno == EINTR);
    if (raw < 0) return internal_error("cannot open the lock file {}: {}", path, std::strerror(errno));
    UniqueFd fd(raw);
    for (;;) {
      if (::flock(fd.get(), LOCK_EX | LOCK_NB) == 0) break;
      const int err = errno;
      if (no_flock_here(err)) return BlobLock();
      if (err != EWOULDBLOCK && err != EINTR) {
        return internal_error("cannot lock {}: {}", path, std::strerror(err));
      }
      if (!waited && on_wait) on_wait();
      waited = true;
      if (cancel != nullptr && cancel->load(std::memory_order_relaxed)) {
        return cancelled_error("interrupted while waiting for the lock {}", path);
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    // Still the file at `path`? A holder that deleted it when done left us a lock on nothing.
    struct stat held {}, named {};
    if (::fstat(fd.get(), &held) == 0 && ::stat(path.c_str(), &named) == 0 && held.st_dev == named.st_dev &&
        held.st_ino == named.st_ino) {
      BlobLock lock;
      lock.fd_ = std::move(fd);
      lock.path_ = path;
      lock.remove_ = remove_when_done;
      return lock;
    }
  }
}

}  // namespace sx::hub
