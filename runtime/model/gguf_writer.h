// GGUF writer: metadata of every value type (nested arrays included) plus tensors whose bytes are
// given up front, borrowed, or produced on demand while the file is written (streaming: a model can
// be written tensor by tensor, or row by row, without holding its weights in memory).
//
// Output: GGUF v3 (or v2 on request; the little-endian encodings are identical), tensors in the
// order they were added, each at an offset that is a multiple of the alignment (general.alignment
// when set, else 32) and padded with zeros to it, as llama.cpp writes them. A file without tensors
// ends after its header (it has no data section to align).
//
// Lifetime: add_tensor_view() borrows its span and the producers of add_tensor_streamed() are called
// during write()/to_bytes(); both must stay valid until then. Threading: not thread-safe; one
// writer per thread. Errors: add_* report INVALID_ARGUMENT (bad dims, unknown type, size mismatch,
// name too long) and ALREADY_EXISTS (duplicate name) naming the tensor; write() reports I/O errors
// naming the path, and a producer's error is passed through with the tensor named.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "runtime/base/status.h"
#include "runtime/hal/dtype.h"
#include "runtime/model/gguf_types.h"

namespace sx::model {

// Where a streamed tensor's bytes go. write() fails if more bytes arrive than the tensor holds.
class GgufByteSink {
 public:
  virtual ~GgufByteSink() = default;
  virtual Status write(std::span<const std::uint8_t> bytes) = 0;
};

// Writes exactly the tensor's n_bytes into the sink (in as many pieces as it likes).
using GgufTensorProducer = std::function<Status(GgufByteSink&)>;

class GgufWriter {
 public:
  GgufWriter() = default;

  // 2 or 3 (default 3).
  void set_version(std::uint32_t version) { version_ = version; }

  // Sets a metadata value; an existing key keeps its position and gets the new value.
  void set(std::string key, GgufValue value);
  void set_uint8(std::string key, std::uint8_t v) { set(std::move(key), GgufValue::uint8(v)); }
  void set_int8(std::string key, std::int8_t v) { set(std::move(key), GgufValue::int8(v)); }
  void set_uint16(std::string key, std::uint16_t v) { set(std::move(key), GgufValue::uint16(v)); }
  void set_int16(std::string key, std::int16_t v) { set(std::move(key), GgufValue::int16(v)); }
  void set_uint32(std::string key, std::uint32_t v) { set(std::move(key), GgufValue::uint32(v)); }
  void set_int32(std::string key, std::int32_t v) { set(std::move(key), GgufValue::int32(v)); }
  void set_uint64(std::string key, std::uint64_t v) { set(std::move(key), GgufValue::uint64(v)); }
  void set_int64(std::string key, std::int64_t v) { set(std::move(key), GgufValue::int64(v)); }
  void set_float32(std::string key, float v) { set(std::move(key), GgufValue::float32(v)); }
  void set_float64(std::string key, double v) { set(std::move(key), GgufValue::float64(v)); }
  void set_bool(std::string key, bool v) { set(std::move(key), GgufValue::boolean(v)); }
  void set_string(std::string key, std::string v) { set(std::move(key), GgufValue::string(std::move(v))); }
  void set_string_array(std::string key, std::vector<std::string> v) {
    set(std::move(key), GgufValue::string_array(std::move(v)));
  }
  void set_int32_array(std::string key, const std::vector<std::int32_t>& v) {
    set(std::move(key), GgufValue::int32_array(v));
  }
  void set_float32_array(std::string key, const std::vector<float>& v) {
    set(std::move(key), GgufValue::float32_array(v));
  }
  void set_bool_array(std::string key, const std::vector<bool>& v) { set(std::move(key), GgufValue::bool_array(v)); }
  bool remove(std::string_view key);
  const GgufValue* find(std::string_view key) const;
  const std::vector<std::pair<std::string, GgufValue>>& metadata() const { return metadata_; }

  // dims in ne order (dims[0] innermost). `data` must hold exactly the tensor's bytes.
  Status add_tensor(std::string name, std::vector<std::int64_t> dims, std::uint32_t ggml_type,
                    std::vector<std::uint8_t> data);
  Status add_tensor(std::string name, std::vector<std::int64_t> dims, hal::DType dtype, std::vector<std::uint8_t> data);
  // Borrowed bytes: must stay alive until write()/to_bytes() returns.
  Status add_tensor_view(std::string name, std::vector<std::int64_t> dims, std::uint32_t ggml_type,
                         std::span<const std::uint8_t> data);
  // Bytes produced while writing; the producer is called once per write()/to_bytes().
  Status add_tensor_streamed(std::string name, std::vector<std::int64_t> dims, std::uint32_t ggml_type,
                             GgufTensorProducer producer);

  std::size_t tensor_count() const { return tensors_.size(); }

  // The alignment the file will use (general.alignment or 32); INVALID_ARGUMENT if that key is not
  // a uint32 power of two.
  Result<std::uint64_t> alignment() const;

  // Writes `path` atomically (path + ".tmp", then rename); on failure the temporary is removed.
  Status write(const std::string& path) const;
  // The whole file in memory (for tests and fuzz seeds).
  Result<std::vector<std::uint8_t>> to_bytes() const;
  // Streams the whole file into a sink.
  Status write_to(GgufByteSink& sink, std::string_view display_name) const;

 private:
  struct PendingTensor {
    std::string name;
    std::vector<std::int64_t> dims;
    std::uint32_t ggml_type = 0;
    std::uint64_t n_bytes = 0;
    GgufTensorProducer producer;
  };
  Result<PendingTensor> make_tensor(std::string name, std::vector<std::int64_t> dims, std::uint32_t ggml_type,
                                    std::uint64_t given_bytes, bool check_bytes) const;

  std::uint32_t version_ = 3;
  std::vector<std::pair<std::string, GgufValue>> metadata_;
  std::vector<PendingTensor> tensors_;
};

// The byte size of a tensor of `ggml_type` with `dims`, or INVALID_ARGUMENT naming `name`
// (unknown type, n_dims not 1..4, a dim < 1, ne[0] not a multiple of the block, overflow).
Result<std::uint64_t> ggml_tensor_bytes(std::string_view name, std::span<const std::int64_t> dims,
                                        std::uint32_t ggml_type);

}  // namespace sx::model
