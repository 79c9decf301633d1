// mmap-backed MappedFile.
#include "runtime/base/mapped_file.h"

#include <sys/mman.h>

#include <cerrno>
#include <cstring>

#include "runtime/base/regular_file.h"

namespace sx {

Result<std::unique_ptr<MappedFile>> MappedFile::open(const std::string& path) {
  // Never a blocking open(): a FIFO or a device is refused before anything waits on it.
  SX_ASSIGN_OR_RETURN(RegularFile file, open_regular_file(path));
  std::size_t size = static_cast<std::size_t>(file.size);
  const std::uint8_t* data = nullptr;
  if (size > 0) {
    void* p = ::mmap(nullptr, size, PROT_READ, MAP_PRIVATE, file.fd.get(), 0);
    if (p == MAP_FAILED) {
      return invalid_argument_error("{}: cannot mmap {} bytes: {}", path, size, std::strerror(errno));
    }
    data = static_cast<const std::uint8_t*>(p);
  }
  return std::unique_ptr<MappedFile>(new MappedFile(path, data, size));
}

MappedFile::~MappedFile() {
  if (data_ != nullptr) ::munmap(const_cast<std::uint8_t*>(data_), size_);
}

}  // namespace sx
