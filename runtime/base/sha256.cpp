// SHA-256 through OpenSSL's libcrypto (EVP), which uses the SHA extensions or AVX2 of the machine
// it runs on: checking 140 GB of shards runs at the speed of the disk.
#include "runtime/base/sha256.h"

#include <openssl/evp.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "runtime/base/regular_file.h"

namespace sx {

Sha256::Sha256() : ctx_(EVP_MD_CTX_new()) {
  // Only allocation can fail here; without a context nothing can be hashed.
  if (ctx_ == nullptr || EVP_DigestInit_ex(ctx_, EVP_sha256(), nullptr) != 1) {
    std::fputs("sextant: libcrypto cannot start a SHA-256 digest\n", stderr);
    std::abort();
  }
}

Sha256::~Sha256() { EVP_MD_CTX_free(ctx_); }

void Sha256::update(std::span<const std::uint8_t> data) {
  if (!data.empty()) (void)EVP_DigestUpdate(ctx_, data.data(), data.size());
}

std::array<std::uint8_t, 32> Sha256::finish() {
  std::array<std::uint8_t, 32> out{};
  unsigned int n = 0;
  (void)EVP_DigestFinal_ex(ctx_, out.data(), &n);
  return out;
}

std::string Sha256::finish_hex() {
  static constexpr char kHex[] = "0123456789abcdef";
  std::string s;
  for (std::uint8_t b : finish()) {
    s += kHex[b >> 4];
    s += kHex[b & 15];
  }
  return s;
}

Result<std::string> sha256_file(const std::string& path, const std::function<void(std::uint64_t, std::uint64_t)>& progress) {
  SX_ASSIGN_OR_RETURN(RegularFile file, open_regular_file(path));
  Sha256 sha;
  std::vector<std::uint8_t> chunk(std::size_t{4} << 20);
  std::uint64_t done = 0;
  for (;;) {
    const ssize_t n = ::read(file.fd.get(), chunk.data(), chunk.size());
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return data_loss_error("{}: read error after {} bytes: {}", path, done, std::strerror(errno));
    if (n == 0) break;
    sha.update({chunk.data(), static_cast<std::size_t>(n)});
    done += static_cast<std::uint64_t>(n);
    if (progress) progress(done, file.size);
  }
  return sha.finish_hex();
}

}  // namespace sx
