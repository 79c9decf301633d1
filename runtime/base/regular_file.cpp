// open_regular_file / read_regular_file: O_NONBLOCK open, fstat, refuse non-regular files.
#include "runtime/base/regular_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

namespace sx {

namespace {

Status errno_status(int err, std::string_view label, std::string_view doing) {
  const StatusCode code = err == ENOENT                   ? StatusCode::kNotFound
                          : err == EACCES || err == EPERM ? StatusCode::kPermissionDenied
                                                          : StatusCode::kInvalidArgument;
  return Status(code, fmt::format("{}: {}{}", label, doing, std::strerror(err)));
}

}  // namespace

void UniqueFd::reset() {
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
}

std::string_view file_kind_name(mode_t mode) {
  if (S_ISREG(mode)) return "a regular file";
  if (S_ISDIR(mode)) return "a directory";
  if (S_ISFIFO(mode)) return "a FIFO";
  if (S_ISSOCK(mode)) return "a socket";
  if (S_ISCHR(mode)) return "a character device";
  if (S_ISBLK(mode)) return "a block device";
  if (S_ISLNK(mode)) return "a symlink";
  return "an unknown kind of file";
}

Result<RegularFile> open_regular_file(const std::string& path, std::string_view label) {
  if (label.empty()) label = path;
  int raw = -1;
  do {
    raw = ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_NOCTTY | O_CLOEXEC);
  } while (raw < 0 && errno == EINTR);
  if (raw < 0) {
    // A socket file cannot be opened at all (ENXIO): say what it is rather than "No such device".
    const int err = errno;
    struct stat st {};
    if (err == ENXIO && ::stat(path.c_str(), &st) == 0 && !S_ISREG(st.st_mode)) {
      return invalid_argument_error("{}: not a regular file ({})", label, file_kind_name(st.st_mode));
    }
    return errno_status(err, label, "");
  }
  UniqueFd fd(raw);
  struct stat st {};
  if (::fstat(fd.get(), &st) != 0) return errno_status(errno, label, "cannot stat: ");
  if (!S_ISREG(st.st_mode)) {
    return invalid_argument_error("{}: not a regular file ({})", label, file_kind_name(st.st_mode));
  }
  const int flags = ::fcntl(fd.get(), F_GETFL);
  if (flags < 0 || ::fcntl(fd.get(), F_SETFL, flags & ~O_NONBLOCK) != 0) {
    return errno_status(errno, label, "cannot clear O_NONBLOCK: ");
  }
  RegularFile file;
  file.fd = std::move(fd);
  file.size = static_cast<std::uint64_t>(st.st_size);
  return file;
}

Status check_library_path(const std::string& path, std::string_view label) {
  if (path.find('/') == std::string::npos) return ok_status();
  SX_ASSIGN_OR_RETURN(RegularFile file, open_regular_file(path, label));
  (void)file;
  return ok_status();
}

Result<std::string> read_regular_file(const std::string& path, std::uint64_t max_bytes, std::string_view label) {
  if (label.empty()) label = path;
  SX_ASSIGN_OR_RETURN(RegularFile file, open_regular_file(path, label));
  auto too_large = [&](std::uint64_t size, std::string_view at_least) {
    return invalid_argument_error("{}: {}{} bytes, more than the limit of {} bytes", label, at_least, size,
                                  max_bytes);
  };
  if (file.size > max_bytes) return too_large(file.size, "");
  std::string text;
  text.resize(static_cast<std::size_t>(file.size));
  std::size_t got = 0;
  for (;;) {
    if (got == text.size()) {
      if (text.size() > max_bytes) return too_large(text.size(), "at least ");
      // The file may have grown since fstat: read on, one byte past the limit at most.
      const std::uint64_t room = max_bytes - text.size();  // + 1: one byte past the limit tells
      text.resize(text.size() + static_cast<std::size_t>(room >= 65536 ? 65536 : room + 1));
    }
    const ssize_t n = ::read(file.fd.get(), text.data() + got, text.size() - got);
    if (n < 0) {
      if (errno == EINTR) continue;
      return errno_status(errno, label, "cannot read: ");
    }
    if (n == 0) break;
    got += static_cast<std::size_t>(n);
  }
  text.resize(got);
  return text;
}

Status write_file_atomically(const std::string& path, std::string_view content) {
  const std::string tmp = fmt::format("{}.tmp.{}", path, ::getpid());
  int raw = -1;
  do {
    raw = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_NOFOLLOW | O_CLOEXEC, 0600);
  } while (raw < 0 && errno == EINTR);
  if (raw < 0) return errno_status(errno, path, "cannot write: ");
  UniqueFd fd(raw);
  auto fail = [&](int err) {
    fd.reset();
    ::unlink(tmp.c_str());
    return errno_status(err, path, "cannot write: ");
  };
  for (std::size_t done = 0; done < content.size();) {
    const ssize_t n = ::write(fd.get(), content.data() + done, content.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return fail(n < 0 ? errno : ENOSPC);
    done += static_cast<std::size_t>(n);
  }
  if (::close(fd.release()) != 0) {
    const int err = errno;
    ::unlink(tmp.c_str());
    return errno_status(err, path, "cannot write: ");
  }
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    const int err = errno;
    ::unlink(tmp.c_str());
    return errno_status(err, path, "cannot replace: ");
  }
  return ok_status();
}

}  // namespace sx
