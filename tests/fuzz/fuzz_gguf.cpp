// Fuzz target: the GGUF reader (GgufFile::parse), every typed metadata getter, and the model-config
// and tokenizer readers on whatever parses. Invariants checked after a successful parse (gguf.h):
// every tensor's data lies inside the input, holds n_bytes at data_offset + offset, is aligned,
// tensors do not overlap, names and keys are unique and findable; and writing the parsed file back
// with GgufWriter and parsing that gives the same keys, value types and tensors (check_round_trip).
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "runtime/model/gguf.h"
#include "runtime/model/gguf_writer.h"
#include "runtime/model/model_config.h"
#include "tests/fuzz/fuzz_check.h"

namespace {

using namespace sx::model;

void check_tensors(const GgufFile& f, std::span<const std::uint8_t> bytes) {
  // A file without tensors may end before the padding that precedes its (empty) data section: the
  // parser accepts that (as llama.cpp does), so data_offset() can exceed the file size only then.
  FUZZ_CHECK(f.tensors().empty() || f.data_offset() <= bytes.size());
  FUZZ_CHECK(f.alignment() > 0 && (f.alignment() & (f.alignment() - 1)) == 0);
  std::vector<const TensorInfo*> by_offset;
  for (const TensorInfo& t : f.tensors()) {
    FUZZ_CHECK(!t.dims.empty() && t.dims.size() <= kGgufMaxDims);
    FUZZ_CHECK(t.name.size() <= kGgufMaxTensorName);
    std::int64_t n = 1;
    for (std::int64_t d : t.dims) {
      FUZZ_CHECK(d > 0);
      n *= d;  // the parser rejects overflow, so this cannot overflow
    }
    FUZZ_CHECK(n == t.n_elements);
    FUZZ_CHECK(t.data.size() == t.n_bytes);
    FUZZ_CHECK(sx::fuzz::span_inside(t.data, bytes));
    FUZZ_CHECK(t.offset % f.alignment() == 0);
    FUZZ_CHECK(t.n_bytes == 0 || t.data.data() == bytes.data() + f.data_offset() + t.offset);
    FUZZ_CHECK(f.find_tensor(t.name) == &t);
    const GgmlTypeInfo* info = ggml_type_info(t.ggml_type);
    FUZZ_CHECK(info != nullptr);
    FUZZ_CHECK(t.dims[0] % info->block_elems == 0);
    FUZZ_CHECK(t.n_bytes == static_cast<std::uint64_t>(t.n_elements / info->block_elems) * info->block_bytes);
    (void)t.dims_string();
    (void)require_supported(t);
    by_offset.push_back(&t);
  }
  std::sort(by_offset.begin(), by_offset.end(),
            [](const TensorInfo* a, const TensorInfo* b) { return a->offset < b->offset; });
  for (std::size_t i = 1; i < by_offset.size(); ++i) {
    const TensorInfo& p = *by_offset[i - 1];
    if (p.n_bytes == 0) continue;
    FUZZ_CHECK(by_offset[i]->offset >= p.offset + p.n_bytes);
  }
}

void exercise_metadata(const GgufFile& f) {
  for (const auto& [key, value] : f.metadata()) {
    FUZZ_CHECK(f.find(key) == &value);
    (void)f.get_uint(key);
    (void)f.get_int(key);
    (void)f.get_float(key);
    (void)f.get_bool(key);
    (void)f.get_string(key);
    (void)f.get_string_array(key);
    (void)f.get_int_array(key);
    (void)f.get_float_array(key);
    if (auto n = f.get_array_size(key); n.ok()) {
      FUZZ_CHECK(value.if_array() != nullptr && value.if_array()->size() == *n);
    }
    (void)gguf_value_to_string(value, 4);
  }
}

void exercise_readers(const GgufFile& f) {
  if (auto c = model_config_from_gguf(f); c.ok()) {
    FUZZ_CHECK(validate_model_config(*c, "fuzz").ok());
    (void)check_model_tensors(f, *c);
  }
  if (auto t = tokenizer_metadata_from_gguf(f); t.ok()) {
    const auto n = static_cast<std::int64_t>(t->tokens.size());
    for (std::int64_t id : {t->eos_id, t->bos_id, t->pad_id}) FUZZ_CHECK(id >= -1 && id < n);
    FUZZ_CHECK(t->token_types.empty() || t->token_types.size() == t->tokens.size());
  }
}

// Writes a parsed file back with GgufWriter (aborts if the writer refuses what the reader accepted).
std::vector<std::uint8_t> write_back(const GgufFile& f) {
  GgufWriter w;
  w.set_version(f.version());
  for (const auto& [key, value] : f.metadata()) w.set(key, value);
  for (const TensorInfo& t : f.tensors()) {
    const sx::Status s = w.add_tensor_view(t.name, t.dims, t.ggml_type, t.data);
    if (!s.ok()) {
      std::fprintf(stderr, "round trip: writer refused a tensor the reader accepted: %s\n", s.to_string().c_str());
      std::abort();
    }
  }
  auto bytes = w.to_bytes();
  if (!bytes.ok()) {
    std::fprintf(stderr, "round trip: writer failed: %s\n", bytes.status().to_string().c_str());
    std::abort();
  }
  return std::move(*bytes);
}

// Writing back what was read and reading it again must give the same keys, value types and
// tensors; writing that again must give the same bytes (values compared as bytes, so a NaN float
// equals itself; a float32 signalling NaN may come back quieted from the first write, which is why
// the original input is not compared byte for byte).
void check_round_trip(const GgufFile& f) {
  const std::vector<std::uint8_t> once = write_back(f);
  auto g = GgufFile::parse(once, "round-trip");
  if (!g.ok()) {
    std::fprintf(stderr, "round trip: re-parse failed: %s\n", g.status().to_string().c_str());
    std::abort();
  }
  const GgufFile& r = **g;
  FUZZ_CHECK(r.version() == f.version());
  FUZZ_CHECK(r.alignment() == f.alignment());
  FUZZ_CHECK(r.metadata().size() == f.metadata().size());
  for (std::size_t i = 0; i < r.metadata().size(); ++i) {
    FUZZ_CHECK(r.metadata()[i].first == f.metadata()[i].first);
    FUZZ_CHECK(r.metadata()[i].second.type == f.metadata()[i].second.type);
  }
  FUZZ_CHECK(r.tensors().size() == f.tensors().size());
  for (std::size_t i = 0; i < r.tensors().size(); ++i) {
    const TensorInfo& a = f.tensors()[i];
    const TensorInfo& b = r.tensors()[i];
    FUZZ_CHECK(a.name == b.name && a.dims == b.dims && a.ggml_type == b.ggml_type && a.n_bytes == b.n_bytes);
    FUZZ_CHECK(a.n_bytes == 0 || std::memcmp(a.data.data(), b.data.data(), a.n_bytes) == 0);
  }
  FUZZ_CHECK(write_back(r) == once);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::span<const std::uint8_t> bytes(data, size);
  auto parsed = GgufFile::parse(bytes, "fuzz.gguf");
  if (!parsed.ok()) return 0;
  const GgufFile& f = **parsed;
  FUZZ_CHECK(f.version() == 2 || f.version() == 3);
  FUZZ_CHECK(f.bytes().data() == data && f.file_size() == size);
  check_tensors(f, bytes);
  exercise_metadata(f);
  exercise_readers(f);
  check_round_trip(f);
  return 0;
}
