// GGUF writer: serialises metadata and tensor infos, then streams tensor data with padding.
#include "runtime/model/gguf_writer.h"

#include <bit>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fcntl.h>
#include <limits>
#include <type_traits>
#include <unistd.h>

#include <fmt/format.h>

#include "runtime/model/gguf.h"

namespace sx::model {

static_assert(std::endian::native == std::endian::little, "the GGUF writer assumes a little-endian host");

namespace {

class Encoder {
 public:
  template <typename T>
  void put(T v) {
    const auto* p = reinterpret_cast<const std::uint8_t*>(&v);
    out.insert(out.end(), p, p + sizeof(T));
  }
  void put_string(std::string_view s) {
    put<std::uint64_t>(s.size());
    out.insert(out.end(), s.begin(), s.end());
  }
  std::vector<std::uint8_t> out;
};

Status encode_array(Encoder& e, const GgufArray& a, std::string_view key);

template <typename T>
Status put_checked(Encoder& e, const GgufValue& v, std::string_view key) {
  if constexpr (std::is_unsigned_v<T>) {
    const auto* u = std::get_if<std::uint64_t>(&v.payload);
    if (u != nullptr && *u <= std::numeric_limits<T>::max()) {
      e.put<T>(static_cast<T>(*u));
      return ok_status();
    }
  } else {
    const auto* i = std::get_if<std::int64_t>(&v.payload);
    if (i != nullptr && *i >= std::numeric_limits<T>::min() && *i <= std::numeric_limits<T>::max()) {
      e.put<T>(static_cast<T>(*i));
      return ok_status();
    }
  }
  return invalid_argument_error("metadata key '{}': the {} value holds a payload of another type or out of range",
                                key, gguf_type_name(v.type));
}

Status encode_value(Encoder& e, const GgufValue& v, std::string_view key) {
  switch (v.type) {
    case GgufType::kUint8: return put_checked<std::uint8_t>(e, v, key);
    case GgufType::kUint16: return put_checked<std::uint16_t>(e, v, key);
    case GgufType::kUint32: return put_checked<std::uint32_t>(e, v, key);
    case GgufType::kUint64: return put_checked<std::uint64_t>(e, v, key);
    case GgufType::kInt8: return put_checked<std::int8_t>(e, v, key);
    case GgufType::kInt16: return put_checked<std::int16_t>(e, v, key);
    case GgufType::kInt32: return put_checked<std::int32_t>(e, v, key);
    case GgufType::kInt64: return put_checked<std::int64_t>(e, v, key);
    case GgufType::kFloat32:
    case GgufType::kFloat64:
      if (const auto* f = std::get_if<double>(&v.payload)) {
        if (v.type == GgufType::kFloat32) {
          e.put<float>(static_cast<float>(*f));
        } else {
          e.put<double>(*f);
        }
        return ok_status();
      }
      break;
    case GgufType::kBool:
      if (const bool* b = v.if_bool()) {
        e.put<std::uint8_t>(*b ? 1 : 0);
        return ok_status();
      }
      break;
    case GgufType::kString:
      if (const std::string* s = v.if_string()) {
        e.put_string(*s);
        return ok_status();
      }
      break;
    case GgufType::kArray:
      if (const GgufArray* a = v.if_array()) return encode_array(e, *a, key);
      break;
    default:
      return invalid_argument_error("metadata key '{}': unknown value type {}", key, static_cast<std::uint32_t>(v.type));
  }
  return invalid_argument_error("metadata key '{}': the {} value holds a payload of another type", key,
                                gguf_type_name(v.type));
}

Status encode_array(Encoder& e, const GgufArray& a, std::string_view key) {
  e.put<std::uint32_t>(static_cast<std::uint32_t>(a.elem_type));
  if (a.elem_type == GgufType::kString) {
    e.put<std::uint64_t>(a.strings.size());
    for (const std::string& s : a.strings) e.put_string(s);
    return ok_status();
  }
  if (a.elem_type == GgufType::kArray) {
    e.put<std::uint64_t>(a.arrays.size());
    for (const GgufValue& item : a.arrays) {
      const GgufArray* inner = item.if_array();
      if (inner == nullptr) {
        return invalid_argument_error("metadata key '{}': an array of arrays holds a {} item", key,
                                      gguf_type_name(item.type));
      }
      SX_RETURN_IF_ERROR(encode_array(e, *inner, key));
    }
    return ok_status();
  }
  const std::size_t s = gguf_scalar_size(a.elem_type);
  if (s == 0 || a.raw.size() % s != 0) {
    return invalid_argument_error("metadata key '{}': array of {} has {} packed bytes, not a multiple of {}", key,
                                  gguf_type_name(a.elem_type), a.raw.size(), s);
  }
  e.put<std::uint64_t>(a.raw.size() / s);
  e.out.insert(e.out.end(), a.raw.begin(), a.raw.end());
  return ok_status();
}

std::uint64_t align_up(std::uint64_t x, std::uint64_t a) { return (x + a - 1) / a * a; }

// `n` zero bytes, a bounded chunk at a time (padding to a large alignment allocates nothing).
Status write_zeros(GgufByteSink& sink, std::uint64_t n) {
  static constexpr std::uint8_t kZeros[512] = {};
  while (n > 0) {
    const std::size_t k = static_cast<std::size_t>(std::min<std::uint64_t>(n, sizeof(kZeros)));
    SX_RETURN_IF_ERROR(sink.write({kZeros, k}));
    n -= k;
  }
  return ok_status();
}

// Counts bytes and refuses more than the tensor holds.
class CountingSink : public GgufByteSink {
 public:
  CountingSink(GgufByteSink& inner, std::uint64_t limit) : inner_(inner), limit_(limit) {}
  Status write(std::span<const std::uint8_t> bytes) override {
    if (bytes.size() > limit_ - written_) {
      return internal_error("producer wrote {} bytes, more than the tensor's {}", written_ + bytes.size(), limit_);
    }
    written_ += bytes.size();
    return inner_.write(bytes);
  }
  std::uint64_t written() const { return written_; }

 private:
  GgufByteSink& inner_;
  std::uint64_t limit_;
  std::uint64_t written_ = 0;
};

class VectorSink : public GgufByteSink {
 public:
  Status write(std::span<const std::uint8_t> bytes) override {
    out.insert(out.end(), bytes.begin(), bytes.end());
    return ok_status();
  }
  std::vector<std::uint8_t> out;
};

// Buffered writes to a file descriptor; errors name the path.
class FdSink : public GgufByteSink {
 public:
  FdSink(int fd, std::string path) : fd_(fd), path_(std::move(path)) { buf_.reserve(kBuf); }
  Status write(std::span<const std::uint8_t> bytes) override {
    if (buf_.size() + bytes.size() > kBuf) SX_RETURN_IF_ERROR(flush());
    if (bytes.size() >= kBuf) return write_all(bytes);
    buf_.insert(buf_.end(), bytes.begin(), bytes.end());
    return ok_status();
  }
  Status flush() {
    Status s = write_all(buf_);
    buf_.clear();
    return s;
  }

 private:
  static constexpr std::size_t kBuf = 4 << 20;
  Status write_all(std::span<const std::uint8_t> bytes) {
    std::size_t done = 0;
    while (done < bytes.size()) {
      const ssize_t n = ::write(fd_, bytes.data() + done, bytes.size() - done);
      if (n < 0) {
        if (errno == EINTR) continue;
        const int e = errno;
        return make_status(e == ENOSPC ? StatusCode::kResourceExhausted : StatusCode::kInternal,
                           "{}: write failed: {}", path_, std::strerror(e));
      }
      done += static_cast<std::size_t>(n);
    }
    return ok_status();
  }
  int fd_;
  std::string path_;
  std::vector<std::uint8_t> buf_;
};

}  // namespace

Result<std::uint64_t> ggml_tensor_bytes(std::string_view name, std::span<const std::int64_t> dims,
                                        std::uint32_t ggml_type) {
  const GgmlTypeInfo* info = ggml_type_info(ggml_type);
  if (info == nullptr) return invalid_argument_error("tensor '{}': unknown ggml type id {}", name, ggml_type);
  if (dims.empty() || dims.size() > kGgufMaxDims) {
    return invalid_argument_error("tensor '{}': {} dimensions; GGUF allows 1..{}", name, dims.size(), kGgufMaxDims);
  }
  std::uint64_t n = 1;
  for (std::size_t i = 0; i < dims.size(); ++i) {
    if (dims[i] < 1) return invalid_argument_error("tensor '{}': dimension {} is {}; it must be >= 1", name, i, dims[i]);
    if (__builtin_mul_overflow(n, static_cast<std::uint64_t>(dims[i]), &n) ||
        n > static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max())) {
      return invalid_argument_error("tensor '{}': element count overflows", name);
    }
  }
  if (dims[0] % info->block_elems != 0) {
    return invalid_argument_error("tensor '{}': ne[0] = {} is not a multiple of the {} block size {}", name, dims[0],
                                  info->name, info->block_elems);
  }
  std::uint64_t bytes;
  if (__builtin_mul_overflow(n / info->block_elems, std::uint64_t{info->block_bytes}, &bytes)) {
    return invalid_argument_error("tensor '{}': byte size overflows", name);
  }
  return bytes;
}

void GgufWriter::set(std::string key, GgufValue value) {
  for (auto& kv : metadata_) {
    if (kv.first == key) {
      kv.second = std::move(value);
      return;
    }
  }
  metadata_.emplace_back(std::move(key), std::move(value));
}

bool GgufWriter::remove(std::string_view key) {
  for (auto it = metadata_.begin(); it != metadata_.end(); ++it) {
    if (it->first == key) {
      metadata_.erase(it);
      return true;
    }
  }
  return false;
}

const GgufValue* GgufWriter::find(std::string_view key) const {
  for (const auto& kv : metadata_) {
    if (kv.first == key) return &kv.second;
  }
  return nullptr;
}

Result<GgufWriter::PendingTensor> GgufWriter::make_tensor(std::string name, std::vector<std::int64_t> dims,
                                                          std::uint32_t ggml_type, std::uint64_t given_bytes,
                                                          bool check_bytes) const {
  if (name.size() > kGgufMaxTensorName) {
    return invalid_argument_error("tensor '{}': name is {} bytes; GGUF allows at most {}", name, name.size(),
                                  kGgufMaxTensorName);
  }
  for (const PendingTensor& t : tensors_) {
    if (t.name == name) return make_status(StatusCode::kAlreadyExists, "tensor '{}' was already added", name);
  }
  SX_ASSIGN_OR_RETURN(std::uint64_t n_bytes, ggml_tensor_bytes(name, dims, ggml_type));
  if (check_bytes && given_bytes != n_bytes) {
    return invalid_argument_error("tensor '{}': {} {} needs {} bytes but {} were given", name,
                                  ggml_type_name(ggml_type), dims_to_string(dims), n_bytes,
                                  given_bytes);
  }
  PendingTensor t;
  t.name = std::move(name);
  t.dims = std::move(dims);
  t.ggml_type = ggml_type;
  t.n_bytes = n_bytes;
  return t;
}

Status GgufWriter::add_tensor(std::string name, std::vector<std::int64_t> dims, std::uint32_t ggml_type,
                              std::vector<std::uint8_t> data) {
  SX_ASSIGN_OR_RETURN(PendingTensor t, make_tensor(std::move(name), std::move(dims), ggml_type, data.size(), true));
  auto owned = std::make_shared<std::vector<std::uint8_t>>(std::move(data));
  t.producer = [owned](GgufByteSink& sink) { return sink.write(*owned); };
  tensors_.push_back(std::move(t));
  return ok_status();
}

Status GgufWriter::add_tensor(std::string name, std::vector<std::int64_t> dims, hal::DType dtype,
                              std::vector<std::uint8_t> data) {
  return add_tensor(std::move(name), std::move(dims), ggml_type_of(dtype), std::move(data));
}

Status GgufWriter::add_tensor_view(std::string name, std::vector<std::int64_t> dims, std::uint32_t ggml_type,
                                   std::span<const std::uint8_t> data) {
  SX_ASSIGN_OR_RETURN(PendingTensor t, make_tensor(std::move(name), std::move(dims), ggml_type, data.size(), true));
  t.producer = [data](GgufByteSink& sink) { return sink.write(data); };
  tensors_.push_back(std::move(t));
  return ok_status();
}

Status GgufWriter::add_tensor_streamed(std::string name, std::vector<std::int64_t> dims, std::uint32_t ggml_type,
                                       GgufTensorProducer producer) {
  if (!producer) return invalid_argument_error("tensor '{}': empty producer", name);
  SX_ASSIGN_OR_RETURN(PendingTensor t, make_tensor(std::move(name), std::move(dims), ggml_type, 0, false));
  t.producer = std::move(producer);
  tensors_.push_back(std::move(t));
  return ok_status();
}

Result<std::uint64_t> GgufWriter::alignment() const {
  const GgufValue* a = find(kKeyAlignment);
  if (a == nullptr) return kGgufDefaultAlignment;
  if (a->type != GgufType::kUint32) {
    return invalid_argument_error("metadata key 'general.alignment' must be uint32, not {}", gguf_type_name(a->type));
  }
  const std::uint64_t v = *a->to_uint();
  if (v == 0 || !std::has_single_bit(v)) {
    return invalid_argument_error("metadata key 'general.alignment' is {}; it must be a power of two", v);
  }
  return v;
}

Status GgufWriter::write_to(GgufByteSink& sink, std::string_view display_name) const {
  if (version_ != 2 && version_ != 3) {
    return invalid_argument_error("{}: cannot write GGUF version {} (2 or 3)", display_name, version_);
  }
  auto aligned = alignment();
  if (!aligned.ok()) return aligned.status().with_context(display_name);
  const std::uint64_t align = *aligned;

  Encoder e;
  e.put<std::uint32_t>(kGgufMagic);
  e.put<std::uint32_t>(version_);
  e.put<std::uint64_t>(tensors_.size());
  e.put<std::uint64_t>(metadata_.size());
  for (const auto& [key, value] : metadata_) {
    e.put_string(key);
    e.put<std::uint32_t>(static_cast<std::uint32_t>(value.type));
    Status s = encode_value(e, value, key);
    if (!s.ok()) return s.with_context(display_name);
  }
  std::uint64_t offset = 0;
  for (const PendingTensor& t : tensors_) {
    e.put_string(t.name);
    e.put<std::uint32_t>(static_cast<std::uint32_t>(t.dims.size()));
    for (std::int64_t d : t.dims) e.put<std::uint64_t>(static_cast<std::uint64_t>(d));
    e.put<std::uint32_t>(t.ggml_type);
    e.put<std::uint64_t>(offset);
    offset += align_up(t.n_bytes, align);
  }
  // The data section starts at the next multiple of the alignment; a file without tensors has no
  // data section, so nothing is padded (the reader accepts such a file ending after its header,
  // and a huge general.alignment must not make a small file huge).
  const std::uint64_t header_pad = tensors_.empty() ? 0 : align_up(e.out.size(), align) - e.out.size();
  SX_RETURN_IF_ERROR(sink.write(e.out));
  e.out = {};
  SX_RETURN_IF_ERROR(write_zeros(sink, header_pad));

  for (const PendingTensor& t : tensors_) {
    CountingSink counted(sink, t.n_bytes);
    Status s = t.producer(counted);
    if (!s.ok()) return s.with_context(fmt::format("{}: writing tensor '{}'", display_name, t.name));
    if (counted.written() != t.n_bytes) {
      return internal_error("{}: the producer of tensor '{}' wrote {} bytes, expected {}", display_name, t.name,
                            counted.written(), t.n_bytes);
    }
    SX_RETURN_IF_ERROR(write_zeros(sink, align_up(t.n_bytes, align) - t.n_bytes));
  }
  return ok_status();
}

Result<std::vector<std::uint8_t>> GgufWriter::to_bytes() const {
  VectorSink sink;
  SX_RETURN_IF_ERROR(write_to(sink, "<memory>"));
  return std::move(sink.out);
}

Status GgufWriter::write(const std::string& path) const {
  const std::string tmp = path + ".tmp";
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) {
    const int e = errno;
    return make_status(e == EACCES ? StatusCode::kPermissionDenied
                       : e == ENOENT ? StatusCode::kNotFound
                                     : StatusCode::kInternal,
                       "{}: cannot create: {}", tmp, std::strerror(e));
  }
  FdSink sink(fd, tmp);
  Status s = write_to(sink, path);
  if (s.ok()) s = sink.flush();
  if (::close(fd) != 0 && s.ok()) {
    s = internal_error("{}: close failed: {}", tmp, std::strerror(errno));
  }
  if (s.ok() && std::rename(tmp.c_str(), path.c_str()) != 0) {
    s = internal_error("cannot rename {} to {}: {}", tmp, path, std::strerror(errno));
  }
  if (!s.ok()) ::unlink(tmp.c_str());
  return s;
}

}  // namespace sx::model
