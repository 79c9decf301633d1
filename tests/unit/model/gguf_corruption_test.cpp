// Every way a GGUF file can be broken: each case builds a valid file, breaks one thing, and checks
// the status code and that the message names the file and the key or tensor at fault.
#include <random>

#include <gtest/gtest.h>

#include "runtime/model/gguf.h"
#include "runtime/model/gguf_writer.h"
#include "tests/unit/model/gguf_test_util.h"

namespace sx::model {
namespace {

using testing::Bytes;
using testing::fails_with;
using testing::locate_tensor_info;
using testing::parse_bytes;
using testing::patch;
using testing::peek;

constexpr const char* kFile = "broken.gguf";

// A small valid file: a few keys of several types and three tensors.
std::vector<std::uint8_t> base_file(std::uint32_t alignment = 32) {
  GgufWriter w;
  w.set_string("general.architecture", "qwen2");
  if (alignment != 32) w.set_uint32("general.alignment", alignment);
  w.set_uint32("aaaa.key", 1);
  w.set_uint32("bbbb.key", 2);
  w.set_bool("t.bool", true);
  w.set_int32_array("t.arr", {1, 2, 3});
  w.set_string_array("t.strs", {"x", "yy"});
  auto f32 = [](std::size_t n) { return std::vector<std::uint8_t>(n * 4, 0); };
  EXPECT_TRUE(w.add_tensor("tensor_a", {8, 2}, hal::DType::kF32, f32(16)).ok());
  EXPECT_TRUE(w.add_tensor("tensor_b", {32, 2}, hal::DType::kQ8_0, std::vector<std::uint8_t>(68)).ok());
  EXPECT_TRUE(w.add_tensor("tensor_c", {4}, hal::DType::kF32, f32(4)).ok());
  auto b = w.to_bytes();
  EXPECT_TRUE(b.ok());
  return *b;
}

Result<std::unique_ptr<GgufFile>> parse(const std::vector<std::uint8_t>& b) { return parse_bytes(b, kFile); }

// Position of a metadata key's length field.
std::size_t key_pos(const std::vector<std::uint8_t>& b, std::string_view key) {
  const std::size_t at = testing::find_bytes(b, key);
  EXPECT_NE(at, std::string::npos) << key;
  return at - 8;
}
// Position of the value type field of a key.
std::size_t value_type_pos(const std::vector<std::uint8_t>& b, std::string_view key) {
  return key_pos(b, key) + 8 + key.size();
}

TEST(GgufCorruption, BaseFileIsValid) {
  auto f = parse(base_file());
  ASSERT_TRUE(f.ok()) << f.status().to_string();
  EXPECT_EQ((*f)->tensors().size(), 3u);
}

// ---- magic and version ----

TEST(GgufCorruption, BadMagicShowsTheFirstBytes) {
  auto b = base_file();
  std::memcpy(b.data(), "PK\x03\x04", 4);
  EXPECT_TRUE(fails_with(parse(b), StatusCode::kInvalidArgument, {kFile, "not a GGUF file", "50 4b 03 04"}));
}

TEST(GgufCorruption, SafetensorsIsRecognised) {
  const std::string header = R"({"w":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})";
  Bytes b;
  b.u64(header.size()).raw(header).u32(0);
  EXPECT_TRUE(fails_with(parse(b.b), StatusCode::kInvalidArgument, {kFile, "this looks like a safetensors file"}));
}

TEST(GgufCorruption, EmptyAndTinyFiles) {
  EXPECT_TRUE(fails_with(parse({}), StatusCode::kDataLoss, {kFile, "truncated"}));
  EXPECT_TRUE(fails_with(parse({'G', 'G'}), StatusCode::kDataLoss, {kFile, "truncated"}));
  EXPECT_TRUE(fails_with(parse({'x'}), StatusCode::kInvalidArgument, {kFile, "not a GGUF file"}));
}

TEST(GgufCorruption, Version1IsUnsupported) {
  auto b = base_file();
  patch<std::uint32_t>(b, 4, 1);
  EXPECT_TRUE(fails_with(parse(b), StatusCode::kUnimplemented, {kFile, "unsupported version 1"}));
}

TEST(GgufCorruption, UnknownVersions) {
  for (std::uint32_t v : {0u, 4u, 77u}) {
    auto b = base_file();
    patch<std::uint32_t>(b, 4, v);
    EXPECT_TRUE(fails_with(parse(b), StatusCode::kUnimplemented, {kFile, fmt::format("unsupported version {}", v)}));
  }
}

TEST(GgufCorruption, BigEndianIsNamed) {
  auto b = base_file();
  patch<std::uint32_t>(b, 4, 0x03000000u);
  EXPECT_TRUE(fails_with(parse(b), StatusCode::kUnimplemented, {kFile, "big-endian"}));
  std::memcpy(b.data(), "FUGG", 4);
  EXPECT_TRUE(fails_with(parse(b), StatusCode::kUnimplemented, {kFile, "big-endian"}));
}

// ---- truncation ----

TEST(GgufCorruption, TruncatedAnywhereIsDataLoss) {
  const auto full = base_file();
  auto f = parse(full);
  ASSERT_TRUE(f.ok());
  std::uint64_t data_end = 0;
  for (const TensorInfo& t : (*f)->tensors()) data_end = std::max(data_end, t.offset + t.n_bytes);
  const std::size_t needed = (*f)->data_offset() + data_end;  // trailing padding is optional
  for (std::size_t n = 4; n < full.size(); ++n) {
    std::vector<std::uint8_t> cut(full.begin(), full.begin() + n);
    auto r = parse(cut);
    if (n >= needed) {
      EXPECT_TRUE(r.ok()) << n << ": " << r.status().to_string();
    } else {
      ASSERT_TRUE(fails_with(r, StatusCode::kDataLoss, {kFile})) << "cut at " << n;
    }
  }
}

TEST(GgufCorruption, TruncatedHeader) {
  auto b = base_file();
  b.resize(12);
  EXPECT_TRUE(fails_with(parse(b), StatusCode::kDataLoss, {kFile, "truncated", "tensor_count"}));
}

TEST(GgufCorruption, TruncatedStringNamesTheKey) {
  // (Cutting a small file anywhere is caught by the count check first; these are hand-made so
  // the counts still fit.)
  Bytes h;
  h.header(3, 0, 1).str("general.architecture").u32(8).u64(10).raw("qwe");
  EXPECT_TRUE(fails_with(parse(h.b), StatusCode::kDataLoss, {kFile, "'general.architecture'", "string value"}));
  Bytes k;
  k.header(3, 0, 1).u64(40).raw("general.arch");
  EXPECT_TRUE(fails_with(parse(k.b), StatusCode::kDataLoss, {kFile, "metadata pair #0", "key"}));
}

TEST(GgufCorruption, TruncatedArrayNamesTheKey) {
  Bytes h;
  h.header(3, 0, 1).str("t.arr").u32(9).u32(5).u64(3).u32(1).u32(2).raw("xx");
  EXPECT_TRUE(fails_with(parse(h.b), StatusCode::kDataLoss, {kFile, "'t.arr'"}));
  Bytes s;
  s.header(3, 0, 1).str("t.strs").u32(9).u32(8).u64(2).str("abc").u64(5).raw("ab");
  EXPECT_TRUE(fails_with(parse(s.b), StatusCode::kDataLoss, {kFile, "'t.strs'", "array item"}));
}

TEST(GgufCorruption, TruncatedTensorInfoNamesTheTensor) {
  auto b = base_file();
  const auto p = locate_tensor_info(b, "tensor_b");
  b.resize(p.dims + 3);
  EXPECT_TRUE(fails_with(parse(b), StatusCode::kDataLoss, {kFile, "'tensor_b'", "truncated"}));
}

TEST(GgufCorruption, TruncatedDataNamesTheTensor) {
  auto b = base_file();
  auto f = parse(b);
  ASSERT_TRUE(f.ok());
  const TensorInfo* c = (*f)->find_tensor("tensor_c");
  const std::size_t end = (*f)->data_offset() + c->offset + c->n_bytes;
  b.resize(end - 1);
  EXPECT_TRUE(fails_with(parse(b), StatusCode::kDataLoss, {kFile, "'tensor_c'", "outside the file"}));
}

TEST(GgufCorruption, DataSectionMissing) {
  auto b = base_file();
  auto f = parse(b);
  ASSERT_TRUE(f.ok());
  b.resize((*f)->data_offset() - 1);
  EXPECT_TRUE(fails_with(parse(b), StatusCode::kDataLoss, {kFile, "data section", "tensor_a"}));
}

// ---- absurd counts and lengths ----

TEST(GgufCorruption, AbsurdTensorCount) {
  auto b = base_file();
  patch<std::uint64_t>(b, 8, 1ull << 60);
  EXPECT_TRUE(fails_with(parse(b), StatusCode::kDataLoss, {kFile, "tensor_count", "larger than the file"}));
}

TEST(GgufCorruption, AbsurdKvCount) {
  auto b = base_file();
  patch<std::uint64_t>(b, 16, ~0ull);
  EXPECT_TRUE(fails_with(parse(b), StatusCode::kDataLoss, {kFile, "metadata_kv_count", "larger than the file"}));
}

TEST(GgufCorruption, KvCountTooLargeRunsOffTheEnd) {
  auto b = base_file();
  patch<std::uint64_t>(b, 16, peek<std::uint64_t>(b, 16) + 20);  // plausible but wrong: keys read past the infos
  EXPECT_TRUE(fails_with(parse(b), StatusCode::kDataLoss, {kFile}));
}

TEST(GgufCorruption, AbsurdStringLength) {
  auto b = base_file();
  patch<std::uint64_t>(b, key_pos(b, "aaaa.key"), 1ull << 62);
  EXPECT_TRUE(fails_with(parse(b), StatusCode::kDataLoss, {kFile, "metadata pair #", "key", "claims"}));
  auto c = base_file();
  patch<std::uint64_t>(c, value_type_pos(c, "general.architecture") + 4, ~0ull);
  EXPECT_TRUE(fails_with(parse(c), StatusCode::kDataLoss, {kFile, "'general.architecture'", "claims"}));
}

TEST(GgufCorruption, AbsurdArrayLength) {
  auto b = base_file();
  patch<std::uint64_t>(b, value_type_pos(b, "t.arr") + 8, 1ull << 61);
  EXPECT_TRUE(fails_with(parse(b), StatusCode::kDataLoss, {kFile, "'t.arr'", "cannot fit"}));
  auto c = base_file();
  patch<std::uint64_t>(c, value_type_pos(c, "t.strs") + 8, ~0ull);
  EXPECT_TRUE(fails_with(parse(c), StatusCode::kDataLoss, {kFile, "'t.strs'", "cannot fit"}));
}

TEST(GgufCorruption, AbsurdTensorNameLength) {
  auto b = base_file();
  const auto p = locate_tensor_info(b, "tensor_b");
  patch<std::uint64_t>(b, p.name, 1ull << 40);
  EXPECT_TRUE(fails_with(parse(b), StatusCode::kDataLoss, {kFile, "tensor info #1", "claims"}));
}

// ---- metadata values ----

TEST(GgufCorruption, DuplicateMetadataKey) {
  auto b = base_file();
  std::memcpy(b.data() + key_pos(b, "bbbb.key") + 8, "aaaa", 4);
  EXPECT_TRUE(fails_with(parse(b), StatusCode::kDataLoss, {kFile, "duplicate metadata key 'aaaa.key'"}));
}

TEST(GgufCorruption, UnknownValueType) {
  auto b = base_file();
  patch<std::uint32_t>(b, value_type_pos(b, "aaaa.key"), 13);
  EXPECT_TRUE(fails_with(parse(b), StatusCode::kDataLoss, {kFile, "'aaaa.key'", "unknown value type 13"}));
}

TEST(GgufCorruption, UnknownArrayElementType) {
  auto b = base_file();
  patch<std::uint32_t>(b, value_type_pos(b, "t.arr") + 4, 99);
  EXPECT_TRUE(fails_with(parse(b), StatusCode::kDataLoss, {kFile, "'t.arr'", "array element type 99"}));
}

TEST(GgufCorruption, InvalidBool) {
  auto b = base_file();
  patch<std::uint8_t>(b, value_type_pos(b, "t.bool") + 4, 2);
  EXPECT_TRUE(fails_with(parse(b), StatusCode::kDataLoss, {kFile, "'t.bool'", "invalid bool value 2"}));
  Bytes h;
  h.header(3, 0, 1).str("bools").u32(9).u32(7).u64(2).put<std::uint8_t>(1).put<std::uint8_t>(5);
  EXPECT_TRUE(fails_with(parse(h.b), StatusCode::kDataLoss, {kFile, "'bools'", "invalid bool value 5", "item 1"}));
}

TEST(GgufCorruption, ArraysNestedTooDeep) {
  Bytes h;
  h.header(3, 0, 1).str("deep").u32(9);
  for (int i = 0; i < kMaxArrayDepth + 2; ++i) h.u32(9).u64(1);
  h.u32(4).u64(0);
  EXPECT_TRUE(fails_with(parse(h.b), StatusCode::kUnimplemented, {kFile, "'deep'", "nested"}));
  // Nesting within the limit is fine.
  Bytes ok;
  ok.header(3, 0, 1).str("nested").u32(9);
  for (int i = 0; i < 3; ++i) ok.u32(9).u64(1);
  ok.u32(4).u64(1).u32(42);
  auto f = parse(ok.b);
  ASSERT_TRUE(f.ok()) << f.status().to_string();
  EXPECT_EQ(gguf_value_to_string(*(*f)->find("nested")), "[[[[42]]]]");
}

TEST(GgufCorruption, AlignmentNotUint32) {
  Bytes h;
  h.header(3, 0, 1).str("general.alignment").u32(10).u64(64);
  EXPECT_TRUE(fails_with(parse(h.b), StatusCode::kInvalidArgument,
                         {kFile, "'general.alignment'", "uint64", "requires uint32"}));
}

TEST(GgufCorruption, AlignmentNotPowerOfTwo) {
  for (std::uint32_t a : {0u, 48u, 3u}) {
    auto b = base_file(64);
    patch<std::uint32_t>(b, value_type_pos(b, "general.alignment") + 4, a);
    EXPECT_TRUE(fails_with(parse(b), StatusCode::kInvalidArgument, {kFile, "'general.alignment'", "power of two"}))
        << a;
  }
}

TEST(GgufCorruption, WellKnownKeyWithWrongType) {
  Bytes h;
  h.header(3, 0, 1).str("general.architecture").u32(4).u32(2);
  EXPECT_TRUE(fails_with(parse(h.b), StatusCode::kInvalidArgument,
                         {kFile, "'general.architecture'", "uint32", "requires string"}));
  Bytes t;
  t.header(3, 0, 1).str("tokenizer.ggml.tokens").u32(9).u32(5).u64(1).u32(7);
  EXPECT_TRUE(fails_with(parse(t.b), StatusCode::kInvalidArgument,
                         {kFile, "'tokenizer.ggml.tokens'", "array of int32", "array of string"}));
}

// ---- tensor infos ----

TEST(GgufCorruption, DuplicateTensorName) {
  auto b = base_file();
  const auto p = locate_tensor_info(b, "tensor_c");
  b[p.name + 8 + 7] = 'a';  // tensor_c -> tensor_a
  EXPECT_TRUE(fails_with(parse(b), StatusCode::kDataLoss, {kFile, "duplicate tensor name 'tensor_a'"}));
}

TEST(GgufCorruption, NDimsZeroOrTooMany) {
  for (std::uint32_t n : {0u, 5u, 1000u}) {
    auto b = base_file();
    patch<std::uint32_t>(b, locate_tensor_info(b, "tensor_b").n_dims, n);
    EXPECT_TRUE(fails_with(parse(b), StatusCode::kDataLoss, {kFile, "'tensor_b'", fmt::format("n_dims {}", n)}));
  }
}

TEST(GgufCorruption, DimZero) {
  auto b = base_file();
  patch<std::uint64_t>(b, locate_tensor_info(b, "tensor_a").dims + 8, 0);
  EXPECT_TRUE(fails_with(parse(b), StatusCode::kDataLoss, {kFile, "'tensor_a'", "dimension 1 equal to 0"}));
}

TEST(GgufCorruption, DimProductOverflow) {
  auto b = base_file();
  const auto p = locate_tensor_info(b, "tensor_a");
  patch<std::uint64_t>(b, p.dims, 1ull << 40);
  patch<std::uint64_t>(b, p.dims + 8, 1ull << 40);
  EXPECT_TRUE(fails_with(parse(b), StatusCode::kDataLoss, {kFile, "'tensor_a'", "overflows"}));
  auto c = base_file();
  patch<std::uint64_t>(c, locate_tensor_info(c, "tensor_a").dims, ~0ull);
  EXPECT_TRUE(fails_with(parse(c), StatusCode::kDataLoss, {kFile, "'tensor_a'", "overflows"}));
}

TEST(GgufCorruption, HugeButNonOverflowingDimsAreOutsideTheFile) {
  auto b = base_file();
  patch<std::uint64_t>(b, locate_tensor_info(b, "tensor_a").dims + 8, 1ull << 50);
  EXPECT_TRUE(fails_with(parse(b), StatusCode::kDataLoss, {kFile, "'tensor_a'", "outside the file"}));
}

TEST(GgufCorruption, UnknownGgmlType) {
  for (std::uint32_t t : {4u, 31u, 1000u}) {
    auto b = base_file();
    patch<std::uint32_t>(b, locate_tensor_info(b, "tensor_c").type, t);
    EXPECT_TRUE(fails_with(parse(b), StatusCode::kUnimplemented,
                           {kFile, "'tensor_c'", fmt::format("unknown ggml type id {}", t)}));
  }
}

TEST(GgufCorruption, NeZeroNotMultipleOfBlock) {
  auto b = base_file();
  patch<std::uint64_t>(b, locate_tensor_info(b, "tensor_b").dims, 33);
  EXPECT_TRUE(fails_with(parse(b), StatusCode::kDataLoss, {kFile, "'tensor_b'", "ne[0] = 33", "q8_0", "32"}));
  auto c = base_file();  // q4_k needs multiples of 256
  const auto p = locate_tensor_info(c, "tensor_a");
  patch<std::uint32_t>(c, p.type, static_cast<std::uint32_t>(GgmlType::kQ4_K));
  EXPECT_TRUE(fails_with(parse(c), StatusCode::kDataLoss, {kFile, "'tensor_a'", "q4_k", "256"}));
}

TEST(GgufCorruption, TensorNameTooLong) {
  Bytes h;
  h.header(3, 1, 0).str(std::string(65, 'n')).u32(1).u64(1).u32(0).u64(0).pad_to(32).u32(0);
  EXPECT_TRUE(fails_with(parse(h.b), StatusCode::kInvalidArgument, {kFile, "nnnn", "at most 64"}));
}

TEST(GgufCorruption, MisalignedOffset) {
  auto b = base_file();
  const auto p = locate_tensor_info(b, "tensor_c");
  patch<std::uint64_t>(b, p.offset, peek<std::uint64_t>(b, p.offset) + 4);
  EXPECT_TRUE(fails_with(parse(b), StatusCode::kDataLoss, {kFile, "'tensor_c'", "not a multiple of the alignment 32"}));
  auto c = base_file(64);  // 32-aligned is not enough when the file says 64
  const auto q = locate_tensor_info(c, "tensor_b");
  patch<std::uint64_t>(c, q.offset, 96);
  EXPECT_TRUE(fails_with(parse(c), StatusCode::kDataLoss, {kFile, "'tensor_b'", "alignment 64"}));
}

TEST(GgufCorruption, DataOutsideTheFile) {
  auto b = base_file();
  patch<std::uint64_t>(b, locate_tensor_info(b, "tensor_c").offset, 1ull << 20);
  EXPECT_TRUE(fails_with(parse(b), StatusCode::kDataLoss, {kFile, "'tensor_c'", "outside the file"}));
}

TEST(GgufCorruption, OffsetPlusSizeOverflows) {
  auto b = base_file();
  patch<std::uint64_t>(b, locate_tensor_info(b, "tensor_c").offset, ~0ull & ~31ull);
  EXPECT_TRUE(fails_with(parse(b), StatusCode::kDataLoss, {kFile, "'tensor_c'"}));
}

TEST(GgufCorruption, OverlappingTensors) {
  auto b = base_file();
  const auto a = locate_tensor_info(b, "tensor_a");
  const auto c = locate_tensor_info(b, "tensor_c");
  patch<std::uint64_t>(b, c.offset, peek<std::uint64_t>(b, a.offset));
  EXPECT_TRUE(fails_with(parse(b), StatusCode::kDataLoss, {kFile, "overlaps", "tensor_a", "tensor_c"}));
  // Partial overlap: tensor_a is 64 bytes; start tensor_b 32 bytes in.
  auto d = base_file();
  patch<std::uint64_t>(d, locate_tensor_info(d, "tensor_b").offset, 32);
  EXPECT_TRUE(fails_with(parse(d), StatusCode::kDataLoss, {kFile, "overlaps", "tensor_a", "tensor_b"}));
}

TEST(GgufCorruption, OutOfOrderButDisjointTensorsAreFine) {
  // Data section: 192 bytes. Lay the tensors out as b [0, 68), c [96, 112), a [128, 192).
  auto b = base_file();
  patch<std::uint64_t>(b, locate_tensor_info(b, "tensor_a").offset, 128);
  patch<std::uint64_t>(b, locate_tensor_info(b, "tensor_b").offset, 0);
  patch<std::uint64_t>(b, locate_tensor_info(b, "tensor_c").offset, 96);
  auto f = parse(b);
  ASSERT_TRUE(f.ok()) << f.status().to_string();
  EXPECT_EQ((*f)->find_tensor("tensor_a")->offset, 128u);
}

// ---- robustness: random damage never crashes (run under ASan/UBSan) ----

TEST(GgufCorruption, RandomByteDamageNeverCrashes) {
  const auto full = base_file();
  std::mt19937_64 rng(1234);
  int failures = 0;
  for (int iter = 0; iter < 3000; ++iter) {
    auto b = full;
    const int flips = 1 + static_cast<int>(rng() % 4);
    for (int k = 0; k < flips; ++k) {
      const std::size_t pos = rng() % 400 % b.size();  // mostly the header, keys and infos
      switch (rng() % 3) {
        case 0: b[pos] = static_cast<std::uint8_t>(rng()); break;
        case 1: b[pos] ^= static_cast<std::uint8_t>(1u << (rng() % 8)); break;
        default: b[pos] = 0xff; break;
      }
    }
    if (rng() % 4 == 0) b.resize(rng() % b.size());
    auto r = parse(b);
    if (!r.ok()) {
      ++failures;
      EXPECT_TRUE(testing::contains(r.status().message(), kFile)) << r.status().to_string();
    }
  }
  EXPECT_GT(failures, 100);
}

}  // namespace
}  // namespace sx::model
