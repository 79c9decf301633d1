// Fuzz target: the safetensors header parser (SafetensorsFile::parse). Invariants checked after a
// successful parse (safetensors.h): every tensor's data lies inside the input's data section,
// holds exactly numel * dtype size bytes, tensors are in ascending begin order and the non-empty
// ones do not overlap, names are findable; and writing the parsed tensors back with
// SafetensorsWriter and parsing that gives the same metadata and tensors.
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <string>

#include "runtime/model/safetensors.h"
#include "runtime/model/safetensors_writer.h"
#include "tests/fuzz/fuzz_check.h"

namespace {

using namespace sx::model;

void check_tensors(const SafetensorsFile& f, std::span<const std::uint8_t> bytes) {
  FUZZ_CHECK(f.data_offset() <= bytes.size());
  const std::span<const std::uint8_t> data_section = bytes.subspan(f.data_offset());
  const SafetensorsTensor* prev_nonempty = nullptr;
  std::uint64_t prev_begin = 0;
  for (const SafetensorsTensor& t : f.tensors()) {
    FUZZ_CHECK(t.name != "__metadata__");
    FUZZ_CHECK(t.begin <= t.end);
    FUZZ_CHECK(t.begin >= prev_begin);
    prev_begin = t.begin;
    FUZZ_CHECK(t.data.size() == t.n_bytes());
    FUZZ_CHECK(sx::fuzz::span_inside(t.data, data_section));
    FUZZ_CHECK(t.n_bytes() == 0 || t.data.data() == data_section.data() + t.begin);
    const auto elem = safetensors_dtype_size(t.dtype_name);
    FUZZ_CHECK(elem.has_value() && *elem == t.elem_bytes);
    FUZZ_CHECK(safetensors_to_hal_dtype(t.dtype_name) == t.dtype);
    std::int64_t n = 1;
    for (std::int64_t d : t.shape) {
      FUZZ_CHECK(d >= 0);
      if (d == 0) n = 0;
    }
    if (n != 0) {
      for (std::int64_t d : t.shape) n *= d;  // the parser rejects overflow
    }
    FUZZ_CHECK(n == t.n_elements);
    FUZZ_CHECK(t.n_bytes() == static_cast<std::uint64_t>(n) * t.elem_bytes);
    if (t.n_bytes() > 0) {
      FUZZ_CHECK(prev_nonempty == nullptr || t.begin >= prev_nonempty->end);
      prev_nonempty = &t;
    }
    FUZZ_CHECK(f.find(t.name) == &t);
    (void)t.shape_string();
  }
}

// Writing the tensors back and reading them again must give the same names, dtypes, shapes, bytes.
void check_round_trip(const SafetensorsFile& f) {
  SafetensorsWriter w;
  for (const auto& [k, v] : f.metadata()) w.set_metadata(k, v);
  for (const SafetensorsTensor& t : f.tensors()) {
    const sx::Status s = w.add_tensor(t.name, t.dtype_name, t.shape, t.data);
    if (!s.ok()) {
      std::fprintf(stderr, "round trip: writer refused a tensor the reader accepted: %s\n", s.to_string().c_str());
      std::abort();
    }
  }
  const std::vector<std::uint8_t> bytes = w.to_bytes();
  auto g = SafetensorsFile::parse(bytes, "round-trip");
  if (!g.ok()) {
    std::fprintf(stderr, "round trip: re-parse failed: %s\n", g.status().to_string().c_str());
    std::abort();
  }
  FUZZ_CHECK(g->metadata() == f.metadata());
  FUZZ_CHECK(g->tensors().size() == f.tensors().size());
  for (const SafetensorsTensor& a : f.tensors()) {
    const SafetensorsTensor* b = g->find(a.name);
    FUZZ_CHECK(b != nullptr);
    FUZZ_CHECK(b->dtype_name == a.dtype_name && b->shape == a.shape && b->n_bytes() == a.n_bytes());
    FUZZ_CHECK(a.n_bytes() == 0 || std::memcmp(a.data.data(), b->data.data(), a.n_bytes()) == 0);
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::span<const std::uint8_t> bytes(data, size);
  auto parsed = SafetensorsFile::parse(bytes, "fuzz.safetensors");
  if (!parsed.ok()) return 0;
  const SafetensorsFile& f = *parsed;
  FUZZ_CHECK(f.file_size() == size);
  FUZZ_CHECK(f.header_size() <= kSafetensorsMaxHeader);
  check_tensors(f, bytes);
  check_round_trip(f);
  return 0;
}
