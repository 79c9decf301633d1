// Read-only memory-mapped files (model weights are read in place, never copied up front).
//
// Lifetime: the mapping lives as long as the MappedFile; spans from bytes() die with it.
// Threading: immutable after open(); safe to read from any thread.
// Errors: open() reports NOT_FOUND / PERMISSION_DENIED / INVALID_ARGUMENT naming the path; a path
// that is not a regular file (a FIFO, a directory, a device, a socket) is INVALID_ARGUMENT
// "<path>: not a regular file (a FIFO)" at once, without blocking (runtime/base/regular_file.h).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>

#include "runtime/base/status.h"

namespace sx {

class MappedFile {
 public:
  static Result<std::unique_ptr<MappedFile>> open(const std::string& path);
  ~MappedFile();
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;

  const std::string& path() const { return path_; }
  std::span<const std::uint8_t> bytes() const { return {data_, size_}; }
  std::size_t size() const { return size_; }

 private:
  MappedFile(std::string path, const std::uint8_t* data, std::size_t size)
      : path_(std::move(path)), data_(data), size_(size) {}
  std::string path_;
  const std::uint8_t* data_ = nullptr;
  std::size_t size_ = 0;
};

}  // namespace sx
