// SHA-256 (FIPS 180-4) through libcrypto, streaming, for checking model files against published
// checksums.
// Threading: one Sha256 per thread; sha256_file reads the file sequentially.
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <span>
#include <string>

#include "runtime/base/status.h"

struct evp_md_ctx_st;  // OpenSSL's EVP_MD_CTX

namespace sx {

class Sha256 {
 public:
  Sha256();
  ~Sha256();
  Sha256(const Sha256&) = delete;
  Sha256& operator=(const Sha256&) = delete;
  void update(std::span<const std::uint8_t> data);
  // The digest; the object must not be updated afterwards.
  std::array<std::uint8_t, 32> finish();
  // finish() as 64 lowercase hex digits.
  std::string finish_hex();

 private:
  ::evp_md_ctx_st* ctx_;  // EVP_MD_CTX
};

// Hex digest of a whole file; `progress(done, total)` is called after each chunk when set.
// Errors name the path: open_regular_file's (a FIFO or other non-regular file is refused without
// blocking, runtime/base/regular_file.h), DATA_LOSS for a read error.
Result<std::string> sha256_file(const std::string& path,
                                const std::function<void(std::uint64_t, std::uint64_t)>& progress = {});

}  // namespace sx
