// Opening files a user named (model, shards, config.json, tokenizer.json, the serve config,
// SHA256SUMS): only regular files, and never a blocking open().
//
// open_regular_file() opens with O_RDONLY | O_NONBLOCK | O_NOCTTY | O_CLOEXEC, so a FIFO without a
// writer or a device cannot block in open(); fstat()s the descriptor and refuses anything that is
// not a regular file, naming its kind; then clears O_NONBLOCK and hands the descriptor over. Every
// open of a user path for reading in runtime/ and daemon/ goes through here (MappedFile,
// sha256_file, read_regular_file and the config loader).
//
// Lifetime: UniqueFd owns its descriptor and closes it when destroyed.
// Threading: no shared state; any thread.
// Errors: each message starts with `label` (the path unless given) and then the reason:
//   NOT_FOUND          "<label>: No such file or directory"
//   PERMISSION_DENIED  "<label>: Permission denied"
//   INVALID_ARGUMENT   "<label>: not a regular file (a FIFO)"  (a directory, a socket, a character
//                      device, a block device), any other open/fstat/read error with strerror, and
//                      read_regular_file's "<label>: N bytes, more than the limit of M bytes".
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <string>
#include <string_view>

#include "runtime/base/status.h"

namespace sx {

class UniqueFd {
 public:
  UniqueFd() = default;
  explicit UniqueFd(int fd) : fd_(fd) {}
  ~UniqueFd() { reset(); }
  UniqueFd(UniqueFd&& other) noexcept : fd_(other.release()) {}
  UniqueFd& operator=(UniqueFd&& other) noexcept {
    if (this != &other) {
      reset();
      fd_ = other.release();
    }
    return *this;
  }
  UniqueFd(const UniqueFd&) = delete;
  UniqueFd& operator=(const UniqueFd&) = delete;

  int get() const { return fd_; }
  bool valid() const { return fd_ >= 0; }
  int release() {
    const int fd = fd_;
    fd_ = -1;
    return fd;
  }
  void reset();

 private:
  int fd_ = -1;
};

struct RegularFile {
  UniqueFd fd;             // blocking, read-only, close-on-exec
  std::uint64_t size = 0;  // st_size when opened
};

// "a FIFO", "a directory", "a socket", "a character device", "a block device", "a symlink",
// "a regular file", or "an unknown kind of file", for messages; from st_mode.
std::string_view file_kind_name(mode_t mode);

// Opens `path` for reading if it is a regular file (symlinks are followed; their target counts).
Result<RegularFile> open_regular_file(const std::string& path, std::string_view label = {});

// OK when `path` is a regular file that can be opened for reading, else open_regular_file's error;
// for paths handed to another reader that would block on a FIFO (dlopen of a library a variable
// names: SEXTANT_CUDA_MODULE, SEXTANT_VULKAN_LOADER). A name without '/' is a library search
// name, not a path: OK without a look.
Status check_library_path(const std::string& path, std::string_view label = {});

// The whole content of a regular file of at most `max_bytes` bytes. A larger file is refused from
// its size before anything is read (and a file that grows past the limit while being read is
// refused too).
Result<std::string> read_regular_file(const std::string& path, std::uint64_t max_bytes,
                                      std::string_view label = {});

// Replaces `path` with `content` atomically: written whole to a temporary file beside it (mode
// 0600, not following a symlink), then renamed over it. On any failure (a full disk: ENOSPC) the
// old file stays as it was, the temporary file is removed, and the error names `path`.
Status write_file_atomically(const std::string& path, std::string_view content);

}  // namespace sx
