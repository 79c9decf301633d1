// Helpers for the model tests: a raw little-endian byte builder for hand-made GGUF files, byte
// patching of writer output, and status matchers.
#pragma once

#include <unistd.h>

#include <cstdint>
#include <cstring>
#include <filesystem>
#include <initializer_list>
#include <string>
#include <string_view>
#include <vector>

#include <gtest/gtest.h>

#include "runtime/base/status.h"
#include "runtime/model/gguf.h"
#include "runtime/model/gguf_writer.h"
#include "runtime/model/model_config.h"

namespace sx::model::testing {

// Appends raw little-endian values.
struct Bytes {
  std::vector<std::uint8_t> b;
  template <typename T>
  Bytes& put(T v) {
    const auto* p = reinterpret_cast<const std::uint8_t*>(&v);
    b.insert(b.end(), p, p + sizeof(T));
    return *this;
  }
  Bytes& u32(std::uint32_t v) { return put(v); }
  Bytes& u64(std::uint64_t v) { return put(v); }
  Bytes& str(std::string_view s) {
    u64(s.size());
    b.insert(b.end(), s.begin(), s.end());
    return *this;
  }
  Bytes& raw(std::string_view s) {
    b.insert(b.end(), s.begin(), s.end());
    return *this;
  }
  Bytes& header(std::uint32_t version, std::uint64_t n_tensors, std::uint64_t n_kv) {
    raw("GGUF");
    u32(version);
    u64(n_tensors);
    return u64(n_kv);
  }
  Bytes& pad_to(std::size_t align) {
    b.resize((b.size() + align - 1) / align * align, 0);
    return *this;
  }
};

inline std::size_t find_bytes(const std::vector<std::uint8_t>& hay, std::string_view needle, std::size_t from = 0) {
  if (needle.size() > hay.size()) return std::string::npos;
  for (std::size_t i = from; i + needle.size() <= hay.size(); ++i) {
    if (std::memcmp(hay.data() + i, needle.data(), needle.size()) == 0) return i;
  }
  return std::string::npos;
}

template <typename T>
void patch(std::vector<std::uint8_t>& b, std::size_t pos, T v) {
  ASSERT_LE(pos + sizeof(T), b.size());
  std::memcpy(b.data() + pos, &v, sizeof(T));
}

template <typename T>
T peek(const std::vector<std::uint8_t>& b, std::size_t pos) {
  T v{};
  std::memcpy(&v, b.data() + pos, sizeof(T));
  return v;
}

// Byte positions of a tensor info in a file, found by its name (which must be unique in the file).
struct TensorInfoPos {
  std::size_t name = 0;    // first byte of the name string's length field
  std::size_t n_dims = 0;
  std::size_t dims = 0;    // first dim
  std::size_t type = 0;
  std::size_t offset = 0;
};

inline TensorInfoPos locate_tensor_info(const std::vector<std::uint8_t>& b, std::string_view name) {
  std::vector<std::uint8_t> needle(8);
  const std::uint64_t len = name.size();
  std::memcpy(needle.data(), &len, 8);
  needle.insert(needle.end(), name.begin(), name.end());
  const std::size_t at = find_bytes(b, std::string_view(reinterpret_cast<const char*>(needle.data()), needle.size()));
  EXPECT_NE(at, std::string::npos) << "tensor info '" << name << "' not found";
  TensorInfoPos p;
  p.name = at;
  p.n_dims = at + 8 + name.size();
  const std::uint32_t n_dims = peek<std::uint32_t>(b, p.n_dims);
  p.dims = p.n_dims + 4;
  p.type = p.dims + 8 * n_dims;
  p.offset = p.type + 4;
  return p;
}

inline bool contains(std::string_view hay, std::string_view needle) { return hay.find(needle) != std::string_view::npos; }

// Expects `s` to fail with `code` and a message containing every fragment.
inline ::testing::AssertionResult fails_with(const Status& s, StatusCode code,
                                             std::initializer_list<std::string_view> fragments) {
  if (s.ok()) return ::testing::AssertionFailure() << "expected " << status_code_name(code) << " but got OK";
  if (s.code() != code) {
    return ::testing::AssertionFailure() << "expected " << status_code_name(code) << " but got " << s.to_string();
  }
  for (std::string_view f : fragments) {
    if (!contains(s.message(), f)) {
      return ::testing::AssertionFailure() << "message lacks \"" << f << "\": " << s.to_string();
    }
  }
  return ::testing::AssertionSuccess();
}

template <typename T>
::testing::AssertionResult fails_with(const Result<T>& r, StatusCode code,
                                      std::initializer_list<std::string_view> fragments) {
  return fails_with(r.status(), code, fragments);
}

inline Result<std::unique_ptr<GgufFile>> parse_bytes(const std::vector<std::uint8_t>& b,
                                                    std::string name = "test.gguf") {
  return GgufFile::parse(b, std::move(name));
}

// A fresh directory under the system temp dir, removed with the object.
class TempDir {
 public:
  TempDir() {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    std::string name = info ? std::string(info->test_suite_name()) + "_" + info->name() : "x";
    for (char& c : name) {
      if (c == '/') c = '_';
    }
    path_ = std::filesystem::temp_directory_path() / ("sx_model_" + std::to_string(::getpid()) + "_" + name);
    std::filesystem::remove_all(path_);
    std::filesystem::create_directories(path_);
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  std::string file(std::string_view name) const { return (path_ / name).string(); }
  const std::filesystem::path& path() const { return path_; }

 private:
  std::filesystem::path path_;
};

// A small qwen2 config (2 layers, hidden 64, 4/2 heads of 16, FFN 96) for model tests.
inline ModelConfig tiny_qwen2_config(std::int64_t vocab, bool tied) {
  ModelConfig c;
  c.architecture = "qwen2";
  c.name = "tiny";
  c.n_layers = 2;
  c.hidden = 64;
  c.n_heads = 4;
  c.n_kv_heads = 2;
  c.head_dim = 16;
  c.ffn = 96;
  c.vocab = vocab;
  c.context_length = 256;
  c.rope_theta = 1e6;
  c.rms_eps = 1e-6;
  c.tied_embeddings = tied;
  c.qkv_bias = true;
  return c;
}

}  // namespace sx::model::testing
