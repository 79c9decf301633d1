// safetensors reader: round trips through SafetensorsWriter (one file, a 1-shard and a 4-shard
// model directory) and every integrity check, each asserting the status code and the message.
#include <filesystem>
#include <fstream>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "runtime/base/half.h"
#include "runtime/model/gguf_writer.h"
#include "runtime/model/safetensors.h"
#include "runtime/model/safetensors_writer.h"
#include "tests/unit/model/gguf_test_util.h"

namespace sx::model {
namespace {

using testing::fails_with;
using testing::TempDir;
namespace fs = std::filesystem;

template <typename T>
std::span<const std::uint8_t> as_bytes(const std::vector<T>& v) {
  return {reinterpret_cast<const std::uint8_t*>(v.data()), v.size() * sizeof(T)};
}

std::vector<float> ramp(std::size_t n, float scale = 0.25f, float bias = -3.0f) {
  std::vector<float> v(n);
  for (std::size_t i = 0; i < n; ++i) v[i] = bias + scale * static_cast<float>(i);
  return v;
}

std::vector<std::uint8_t> read_all(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

void write_text(const std::string& path, const std::string& s) {
  std::ofstream out(path, std::ios::trunc);
  out << s;
}

void truncate_by(const std::string& path, std::size_t n) {
  fs::resize_file(path, fs::file_size(path) - n);
}

// A raw file: u64 length + header text + `data_bytes` zero bytes.
std::vector<std::uint8_t> raw_file(std::string_view header, std::size_t data_bytes) {
  testing::Bytes b;
  b.u64(header.size()).raw(header);
  b.b.resize(b.b.size() + data_bytes, 0);
  return b.b;
}

Result<SafetensorsFile> parse_raw(std::string_view header, std::size_t data_bytes, std::vector<std::uint8_t>& keep) {
  keep = raw_file(header, data_bytes);
  return SafetensorsFile::parse(keep, "raw.safetensors");
}

// ---- values ----

TEST(Safetensors, RoundTripF32F16Bf16) {
  TempDir dir;
  const std::vector<float> f32 = ramp(6);
  std::vector<std::uint16_t> f16, bf16;
  for (float x : ramp(8, 0.5f, -2.0f)) f16.push_back(f32_to_f16(x));
  for (float x : ramp(4, 1.5f, -1.0f)) bf16.push_back(f32_to_bf16(x));
  const std::vector<std::int64_t> i64 = {1, -2, 3};

  SafetensorsWriter w;
  w.set_metadata("format", "pt");
  ASSERT_TRUE(w.add_tensor("a.f32", hal::DType::kF32, {2, 3}, as_bytes(f32)).ok());
  ASSERT_TRUE(w.add_tensor("b.f16", hal::DType::kF16, {8}, as_bytes(f16)).ok());
  ASSERT_TRUE(w.add_tensor("c.bf16", hal::DType::kBF16, {2, 2}, as_bytes(bf16)).ok());
  ASSERT_TRUE(w.add_tensor("d.i64", "I64", {3}, as_bytes(i64)).ok());
  ASSERT_TRUE(w.add_tensor("e.empty", "F32", {0, 4}, {}).ok());
  const std::string path = dir.file("w.safetensors");
  ASSERT_TRUE(w.write(path).ok());

  auto f = SafetensorsFile::open(path);
  ASSERT_TRUE(f.ok()) << f.status().to_string();
  EXPECT_EQ(f->header_size() % 8, 0u);
  EXPECT_EQ(f->tensors().size(), 5u);
  EXPECT_EQ(f->metadata().at("format"), "pt");

  auto a = f->tensor("a.f32");
  ASSERT_TRUE(a.ok());
  EXPECT_EQ((*a)->dtype_name, "F32");
  EXPECT_EQ((*a)->dtype, hal::DType::kF32);
  EXPECT_EQ((*a)->shape, (std::vector<std::int64_t>{2, 3}));
  EXPECT_EQ((*a)->shape_string(), "[2, 3]");
  EXPECT_EQ((*a)->n_elements, 6);
  ASSERT_EQ((*a)->data.size(), 24u);
  std::vector<float> got(6);
  std::memcpy(got.data(), (*a)->data.data(), 24);
  EXPECT_EQ(got, f32);

  const SafetensorsTensor* b = f->find("b.f16");
  ASSERT_NE(b, nullptr);
  EXPECT_EQ(b->dtype, hal::DType::kF16);
  ASSERT_EQ(b->data.size(), 16u);
  for (std::size_t i = 0; i < 8; ++i) {
    std::uint16_t h;
    std::memcpy(&h, b->data.data() + 2 * i, 2);
    EXPECT_EQ(f16_to_f32(h), -2.0f + 0.5f * static_cast<float>(i));
  }
  const SafetensorsTensor* c = f->find("c.bf16");
  ASSERT_NE(c, nullptr);
  EXPECT_EQ(c->dtype, hal::DType::kBF16);
  for (std::size_t i = 0; i < 4; ++i) {
    std::uint16_t h;
    std::memcpy(&h, c->data.data() + 2 * i, 2);
    EXPECT_EQ(bf16_to_f32(h), -1.0f + 1.5f * static_cast<float>(i));
  }
  const SafetensorsTensor* d = f->find("d.i64");
  ASSERT_NE(d, nullptr);
  EXPECT_FALSE(d->dtype.has_value());
  EXPECT_EQ(d->elem_bytes, 8u);
  EXPECT_EQ(std::memcmp(d->data.data(), i64.data(), 24), 0);
  const SafetensorsTensor* e = f->find("e.empty");
  ASSERT_NE(e, nullptr);
  EXPECT_EQ(e->n_elements, 0);
  EXPECT_EQ(e->data.size(), 0u);

  EXPECT_TRUE(fails_with(f->tensor("nope"), StatusCode::kNotFound, {path, "no tensor 'nope'"}));
}

TEST(Safetensors, DTypeTable) {
  EXPECT_EQ(safetensors_dtype_size("F64"), 8u);
  EXPECT_EQ(safetensors_dtype_size("U8"), 1u);
  EXPECT_EQ(safetensors_to_hal_dtype("I32"), hal::DType::kI32);
  EXPECT_EQ(safetensors_to_hal_dtype("I64"), std::nullopt);
  EXPECT_EQ(safetensors_dtype_size("f32"), std::nullopt);  // dtype strings are case-sensitive
  EXPECT_EQ(hal_to_safetensors_dtype(hal::DType::kBF16), "BF16");
  EXPECT_EQ(hal_to_safetensors_dtype(hal::DType::kQ8_0), std::nullopt);
}

// ---- model directories ----

struct Tensor {
  std::string name;
  std::vector<float> values;
};

// `n` tensors of `elems` floats each, named layer.<i>.weight.
std::vector<Tensor> some_tensors(int n, std::size_t elems) {
  std::vector<Tensor> t;
  for (int i = 0; i < n; ++i) {
    t.push_back({fmt::format("layer.{}.weight", i), ramp(elems, 0.125f, static_cast<float>(i))});
  }
  return t;
}

std::string shard_name(int k, int n) { return fmt::format("model-{:05d}-of-{:05d}.safetensors", k, n); }

// Writes tensors round-robin into `n_shards` shards plus an index; returns the index JSON.
nlohmann::json write_sharded(const TempDir& dir, const std::vector<Tensor>& tensors, int n_shards) {
  std::vector<SafetensorsWriter> w(n_shards);
  nlohmann::json index;
  std::size_t total = 0;
  for (std::size_t i = 0; i < tensors.size(); ++i) {
    const int s = static_cast<int>(i % n_shards);
    EXPECT_TRUE(w[s].add_tensor(tensors[i].name, hal::DType::kF32,
                                {static_cast<std::int64_t>(tensors[i].values.size())}, as_bytes(tensors[i].values))
                    .ok());
    index["weight_map"][tensors[i].name] = shard_name(s + 1, n_shards);
    total += tensors[i].values.size() * 4;
  }
  index["metadata"]["total_size"] = total;
  for (int s = 0; s < n_shards; ++s) EXPECT_TRUE(w[s].write(dir.file(shard_name(s + 1, n_shards))).ok());
  write_text(dir.file(kSafetensorsIndexFile), index.dump(2));
  return index;
}

void expect_values(const SafetensorsModel& m, const std::vector<Tensor>& tensors) {
  ASSERT_EQ(m.tensor_count(), tensors.size());
  for (const Tensor& t : tensors) {
    auto got = m.tensor(t.name);
    ASSERT_TRUE(got.ok()) << got.status().to_string();
    ASSERT_EQ((*got)->data.size(), t.values.size() * 4);
    EXPECT_EQ(std::memcmp((*got)->data.data(), t.values.data(), t.values.size() * 4), 0) << t.name;
  }
}

TEST(SafetensorsDir, SingleFile) {
  TempDir dir;
  const auto tensors = some_tensors(3, 16);
  SafetensorsWriter w;
  for (const Tensor& t : tensors) {
    ASSERT_TRUE(w.add_tensor(t.name, hal::DType::kF32, {4, 4}, as_bytes(t.values)).ok());
  }
  ASSERT_TRUE(w.write(dir.file(kSafetensorsSingleFile)).ok());
  auto m = open_safetensors_dir(dir.path().string());
  ASSERT_TRUE(m.ok()) << m.status().to_string();
  EXPECT_TRUE(m->index_path().empty());
  EXPECT_EQ(m->shards().size(), 1u);
  expect_values(*m, tensors);
  EXPECT_TRUE(m->warnings().empty());
  EXPECT_TRUE(fails_with(m->tensor("x"), StatusCode::kNotFound, {"no tensor 'x'"}));
}

TEST(SafetensorsDir, OneShardIndex) {
  TempDir dir;
  const auto tensors = some_tensors(3, 16);
  write_sharded(dir, tensors, 1);
  auto m = open_safetensors_dir(dir.path().string());
  ASSERT_TRUE(m.ok()) << m.status().to_string();
  EXPECT_EQ(m->shards().size(), 1u);
  EXPECT_EQ(m->metadata().at("total_size"), "192");
  expect_values(*m, tensors);
  EXPECT_TRUE(m->warnings().empty());
}

TEST(SafetensorsDir, FourShardIndex) {
  TempDir dir;
  const auto tensors = some_tensors(10, 64);
  write_sharded(dir, tensors, 4);
  auto m = open_safetensors_dir(dir.path().string());
  ASSERT_TRUE(m.ok()) << m.status().to_string();
  ASSERT_EQ(m->shards().size(), 4u);
  EXPECT_NE(m->shards()[1].path().find(shard_name(2, 4)), std::string::npos);
  EXPECT_EQ(m->tensors().size(), 10u);
  expect_values(*m, tensors);
  EXPECT_NE(m->find("layer.5.weight")->file.find(shard_name(2, 4)), std::string::npos);
  EXPECT_TRUE(m->warnings().empty());
}

// ---- corruption: one file ----

TEST(SafetensorsCorruption, TruncatedByOneByte) {
  TempDir dir;
  SafetensorsWriter w;
  const auto v = ramp(100);
  ASSERT_TRUE(w.add_tensor("w", hal::DType::kF32, {100}, as_bytes(v)).ok());
  const std::string path = dir.file("t.safetensors");
  ASSERT_TRUE(w.write(path).ok());
  truncate_by(path, 1);
  auto f = SafetensorsFile::open(path);
  ASSERT_FALSE(f.ok());
  EXPECT_EQ(f.status().code(), StatusCode::kDataLoss);
  EXPECT_EQ(f.status().message(),
            path + " is truncated: its header needs 400 bytes of data, the file has 399 "
                   "(tensor 'w' ends at data byte 400)");
}

TEST(SafetensorsCorruption, ShardTruncatedByHalf) {
  TempDir dir;
  const auto tensors = some_tensors(8, 1024);  // 4 KiB per tensor, 2 per shard: data dominates the file
  write_sharded(dir, tensors, 4);
  const std::string shard = dir.file(shard_name(2, 4));
  const auto size = fs::file_size(shard);
  const std::uint64_t header = read_all(shard).size() - 8192 - 8;
  truncate_by(shard, size / 2);
  const std::uint64_t has = size - size / 2 - 8 - header;
  auto m = open_safetensors_dir(dir.path().string());
  EXPECT_TRUE(fails_with(m, StatusCode::kDataLoss,
                         {fmt::format("model-00002-of-00004.safetensors is truncated: its header needs 8192 bytes of "
                                      "data, the file has {}",
                                      has)}));
}

TEST(SafetensorsCorruption, ShorterThanEightBytes) {
  std::vector<std::uint8_t> b = {1, 2, 3, 4, 5};
  EXPECT_TRUE(fails_with(SafetensorsFile::parse(b, "tiny.safetensors"), StatusCode::kDataLoss,
                         {"tiny.safetensors is truncated: 5 bytes, shorter than the 8-byte header length"}));
  EXPECT_TRUE(fails_with(SafetensorsFile::parse({}, "empty.safetensors"), StatusCode::kDataLoss,
                         {"empty.safetensors is truncated: 0 bytes"}));
}

TEST(SafetensorsCorruption, AbsurdHeaderLength) {
  std::vector<std::uint8_t> keep;
  auto f = parse_raw(R"({"w":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})", 4, keep);
  ASSERT_TRUE(f.ok()) << f.status().to_string();
  testing::patch<std::uint64_t>(keep, 0, 1ull << 40);
  EXPECT_TRUE(fails_with(SafetensorsFile::parse(keep, "big.safetensors"), StatusCode::kDataLoss,
                         {"big.safetensors: header length 1099511627776 is absurd (limit 100000000 bytes)"}));
  testing::patch<std::uint64_t>(keep, 0, keep.size());  // under the limit but past the end
  EXPECT_TRUE(fails_with(SafetensorsFile::parse(keep, "big.safetensors"), StatusCode::kDataLoss,
                         {fmt::format("big.safetensors: header length {} exceeds the {} bytes after the length field",
                                      keep.size(), keep.size() - 8)}));
}

TEST(SafetensorsCorruption, InvalidJson) {
  std::vector<std::uint8_t> keep;
  EXPECT_TRUE(fails_with(parse_raw(R"({"w":{"dtype":"F32",)", 0, keep), StatusCode::kDataLoss,
                         {"raw.safetensors: the 20-byte header is not valid JSON"}));
  EXPECT_TRUE(fails_with(parse_raw("[1, 2]", 0, keep), StatusCode::kDataLoss,
                         {"raw.safetensors: the header is an array, expected a JSON object"}));
}

// JSON lets an object name a key twice and nlohmann keeps the last; a header doing that is corrupt.
TEST(SafetensorsCorruption, DuplicateTensorInOneHeader) {
  std::vector<std::uint8_t> keep;
  EXPECT_TRUE(fails_with(parse_raw(R"({"w":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},)"
                                   R"("w":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})",
                                   8, keep),
                         StatusCode::kDataLoss, {"raw.safetensors: the header names 'w' twice"}));
}

TEST(SafetensorsCorruption, WrongFieldTypes) {
  std::vector<std::uint8_t> keep;
  EXPECT_TRUE(fails_with(parse_raw(R"({"w":{"dtype":"F32","shape":"4","data_offsets":[0,16]}})", 16, keep),
                         StatusCode::kDataLoss,
                         {"raw.safetensors: tensor 'w': 'shape' is a string (\"4\"); expected an array"}));
  EXPECT_TRUE(fails_with(parse_raw(R"({"w":{"dtype":"F32","shape":[-4],"data_offsets":[0,16]}})", 16, keep),
                         StatusCode::kDataLoss, {"tensor 'w': 'shape' is an array ([-4])"}));
  EXPECT_TRUE(fails_with(parse_raw(R"({"w":{"dtype":"F32","shape":[4],"data_offsets":[16]}})", 16, keep),
                         StatusCode::kDataLoss,
                         {"tensor 'w': 'data_offsets' is an array ([16]); expected [begin, end]"}));
  EXPECT_TRUE(fails_with(parse_raw(R"({"w":{"dtype":7,"shape":[4],"data_offsets":[0,16]}})", 16, keep),
                         StatusCode::kDataLoss, {"tensor 'w': 'dtype' is an integer (7)"}));
  EXPECT_TRUE(fails_with(parse_raw(R"({"w":{"dtype":"F32","shape":[4]}})", 16, keep), StatusCode::kDataLoss,
                         {"raw.safetensors: tensor 'w' has no 'data_offsets'"}));
  EXPECT_TRUE(fails_with(parse_raw(R"({"w":[1]})", 16, keep), StatusCode::kDataLoss,
                         {"raw.safetensors: tensor 'w' is an array ([1]); expected an object"}));
  EXPECT_TRUE(fails_with(parse_raw(R"({"__metadata__":{"n":1}})", 0, keep), StatusCode::kDataLoss,
                         {"raw.safetensors: '__metadata__.n' is an integer (1), expected a string"}));
}

TEST(SafetensorsCorruption, UnknownDtype) {
  std::vector<std::uint8_t> keep;
  EXPECT_TRUE(fails_with(parse_raw(R"({"w":{"dtype":"F33","shape":[4],"data_offsets":[0,16]}})", 16, keep),
                         StatusCode::kUnimplemented,
                         {"raw.safetensors: tensor 'w' has dtype 'F33', which is not a safetensors dtype "
                          "(known: BOOL"}));
}

TEST(SafetensorsCorruption, SizeAndRangeChecks) {
  std::vector<std::uint8_t> keep;
  EXPECT_TRUE(fails_with(parse_raw(R"({"w":{"dtype":"F32","shape":[4],"data_offsets":[0,12]}})", 16, keep),
                         StatusCode::kDataLoss,
                         {"tensor 'w' has data_offsets [0, 12] (12 bytes) but F32 [4] needs 4 elements x 4 bytes = 16 "
                          "bytes"}));
  EXPECT_TRUE(fails_with(parse_raw(R"({"w":{"dtype":"F32","shape":[0],"data_offsets":[8,4]}})", 16, keep),
                         StatusCode::kDataLoss, {"tensor 'w' has data_offsets [8, 4]: begin is after end"}));
  EXPECT_TRUE(fails_with(
      parse_raw(R"({"w":{"dtype":"F32","shape":[1099511627776,1099511627776],"data_offsets":[0,16]}})", 16, keep),
      StatusCode::kDataLoss, {"tensor 'w' has shape [1099511627776,1099511627776] whose element count or byte size "
                              "overflows 64 bits"}));
  EXPECT_TRUE(fails_with(
      parse_raw(R"({"w":{"dtype":"F64","shape":[4611686018427387904],"data_offsets":[0,16]}})", 16, keep),
      StatusCode::kDataLoss, {"overflows 64 bits"}));
}

TEST(SafetensorsCorruption, Overlapping) {
  std::vector<std::uint8_t> keep;
  EXPECT_TRUE(fails_with(parse_raw(R"({"a":{"dtype":"F32","shape":[4],"data_offsets":[0,16]},)"
                                   R"("b":{"dtype":"F32","shape":[4],"data_offsets":[8,24]}})",
                                   24, keep),
                         StatusCode::kDataLoss, {"raw.safetensors: tensors 'a' [0, 16) and 'b' [8, 24) overlap"}));
  // A short tensor inside a long one, with a later tensor in between in key order.
  EXPECT_TRUE(fails_with(parse_raw(R"({"a":{"dtype":"U8","shape":[32],"data_offsets":[0,32]},)"
                                   R"("b":{"dtype":"U8","shape":[4],"data_offsets":[4,8]},)"
                                   R"("c":{"dtype":"U8","shape":[4],"data_offsets":[20,24]}})",
                                   32, keep),
                         StatusCode::kDataLoss, {"tensors 'a' [0, 32) and 'b' [4, 8) overlap"}));
  // Adjacent and empty tensors are fine.
  auto ok = parse_raw(R"({"a":{"dtype":"U8","shape":[4],"data_offsets":[0,4]},)"
                      R"("z":{"dtype":"U8","shape":[0],"data_offsets":[2,2]},)"
                      R"("b":{"dtype":"U8","shape":[4],"data_offsets":[4,8]}})",
                      8, keep);
  EXPECT_TRUE(ok.ok()) << ok.status().to_string();
}

TEST(SafetensorsCorruption, GgufGivenInstead) {
  TempDir dir;
  GgufWriter g;
  g.set_string("general.architecture", "qwen2");
  ASSERT_TRUE(g.add_tensor("t", {4}, hal::DType::kF32, std::vector<std::uint8_t>(16)).ok());
  const std::string path = dir.file("model.gguf");
  ASSERT_TRUE(g.write(path).ok());
  EXPECT_TRUE(fails_with(SafetensorsFile::open(path), StatusCode::kInvalidArgument,
                         {path + " is a GGUF file, not safetensors"}));
  fs::copy_file(path, dir.file(kSafetensorsSingleFile));
  EXPECT_TRUE(fails_with(open_safetensors_dir(dir.path().string()), StatusCode::kInvalidArgument,
                         {"model.safetensors is a GGUF file, not safetensors"}));
}

TEST(SafetensorsCorruption, DirectoryAndFileConfused) {
  TempDir dir;
  EXPECT_TRUE(fails_with(SafetensorsFile::open(dir.path().string()), StatusCode::kInvalidArgument,
                         {dir.path().string() + " is a directory, not a safetensors file"}));
  SafetensorsWriter w;
  const std::string path = dir.file(kSafetensorsSingleFile);
  ASSERT_TRUE(w.write(path).ok());
  EXPECT_TRUE(fails_with(open_safetensors_dir(path), StatusCode::kInvalidArgument,
                         {path + " is a file, not a model directory"}));
  EXPECT_TRUE(fails_with(SafetensorsFile::open(dir.file("absent.safetensors")), StatusCode::kNotFound,
                         {"absent.safetensors: no such file"}));
  EXPECT_TRUE(fails_with(open_safetensors_dir(dir.file("absent")), StatusCode::kNotFound, {"no such directory"}));
  fs::remove(path);
  EXPECT_TRUE(fails_with(open_safetensors_dir(dir.path().string()), StatusCode::kNotFound,
                         {"holds neither model.safetensors nor model.safetensors.index.json"}));
}

// ---- corruption: directories ----

TEST(SafetensorsDirCorruption, MissingShard) {
  TempDir dir;
  write_sharded(dir, some_tensors(8, 16), 4);
  fs::remove(dir.file(shard_name(3, 4)));
  EXPECT_TRUE(fails_with(open_safetensors_dir(dir.path().string()), StatusCode::kNotFound,
                         {"model.safetensors.index.json names shard model-00003-of-00004.safetensors (for tensor "
                          "'layer.2.weight'), but",
                          "model-00003-of-00004.safetensors does not exist"}));
}

TEST(SafetensorsDirCorruption, IndexNamesTheWrongShard) {
  TempDir dir;
  nlohmann::json index = write_sharded(dir, some_tensors(8, 16), 4);
  index["weight_map"]["layer.1.weight"] = shard_name(3, 4);  // really in shard 2
  write_text(dir.file(kSafetensorsIndexFile), index.dump());
  EXPECT_TRUE(fails_with(open_safetensors_dir(dir.path().string()), StatusCode::kDataLoss,
                         {"model.safetensors.index.json maps tensor 'layer.1.weight' to shard "
                          "model-00003-of-00004.safetensors, which does not contain it (it is in ",
                          "model-00002-of-00004.safetensors)"}));
  index["weight_map"]["ghost"] = shard_name(1, 4);
  index["weight_map"]["layer.1.weight"] = shard_name(2, 4);
  write_text(dir.file(kSafetensorsIndexFile), index.dump());
  EXPECT_TRUE(fails_with(open_safetensors_dir(dir.path().string()), StatusCode::kDataLoss,
                         {"maps tensor 'ghost' to shard model-00001-of-00004.safetensors, which does not contain it "
                          "(no shard does)"}));
}

TEST(SafetensorsDirCorruption, DuplicateAcrossShards) {
  TempDir dir;
  const auto v = ramp(4);
  SafetensorsWriter s1, s2;
  ASSERT_TRUE(s1.add_tensor("x", hal::DType::kF32, {4}, as_bytes(v)).ok());
  ASSERT_TRUE(s1.add_tensor("a", hal::DType::kF32, {4}, as_bytes(v)).ok());
  ASSERT_TRUE(s2.add_tensor("x", hal::DType::kF32, {4}, as_bytes(v)).ok());
  ASSERT_TRUE(s2.add_tensor("b", hal::DType::kF32, {4}, as_bytes(v)).ok());
  ASSERT_TRUE(s1.write(dir.file(shard_name(1, 2))).ok());
  ASSERT_TRUE(s2.write(dir.file(shard_name(2, 2))).ok());
  write_text(dir.file(kSafetensorsIndexFile),
             nlohmann::json{{"weight_map", {{"x", shard_name(1, 2)}, {"a", shard_name(1, 2)}, {"b", shard_name(2, 2)}}}}
                 .dump());
  EXPECT_TRUE(fails_with(open_safetensors_dir(dir.path().string()), StatusCode::kDataLoss,
                         {"tensor 'x' is in both shard ", "model-00001-of-00002.safetensors and shard ",
                          "model-00002-of-00002.safetensors"}));
}

TEST(SafetensorsDirCorruption, UnmentionedTensorIsAWarning) {
  TempDir dir;
  nlohmann::json index = write_sharded(dir, some_tensors(4, 16), 2);
  index["weight_map"].erase("layer.3.weight");
  write_text(dir.file(kSafetensorsIndexFile), index.dump());
  auto m = open_safetensors_dir(dir.path().string());
  ASSERT_TRUE(m.ok()) << m.status().to_string();
  ASSERT_EQ(m->warnings().size(), 1u);
  EXPECT_NE(m->warnings()[0].find("model-00002-of-00002.safetensors holds tensor 'layer.3.weight', which "),
            std::string::npos)
      << m->warnings()[0];
  EXPECT_NE(m->warnings()[0].find("model.safetensors.index.json does not mention"), std::string::npos);
  EXPECT_NE(m->find("layer.3.weight"), nullptr);
}

TEST(SafetensorsDirCorruption, BadIndex) {
  TempDir dir;
  const std::string root = dir.path().string();
  write_text(dir.file(kSafetensorsIndexFile), "{\"weight_map\": ");
  EXPECT_TRUE(fails_with(open_safetensors_dir(root), StatusCode::kInvalidArgument,
                         {"model.safetensors.index.json: not valid JSON"}));
  write_text(dir.file(kSafetensorsIndexFile), R"({"metadata": {}})");
  EXPECT_TRUE(fails_with(open_safetensors_dir(root), StatusCode::kInvalidArgument, {"no 'weight_map'"}));
  // The index naming one tensor twice (two shards claimed for it).
  write_text(dir.file(kSafetensorsIndexFile), R"({"weight_map": {"w": "a.safetensors", "w": "b.safetensors"}})");
  EXPECT_TRUE(fails_with(open_safetensors_dir(root), StatusCode::kInvalidArgument,
                         {"model.safetensors.index.json: names 'w' twice"}));
  write_text(dir.file(kSafetensorsIndexFile), R"({"weight_map": {"w": 3}})");
  EXPECT_TRUE(fails_with(open_safetensors_dir(root), StatusCode::kInvalidArgument,
                         {"'weight_map.w' is an integer (3), expected a shard file name"}));
  write_text(dir.file(kSafetensorsIndexFile), R"({"weight_map": {"w": "../escape.safetensors"}})");
  EXPECT_TRUE(fails_with(open_safetensors_dir(root), StatusCode::kInvalidArgument,
                         {"not a plain file name in the model directory"}));
  write_text(dir.file(kSafetensorsIndexFile), R"({"weight_map": {"w": "sub"}})");
  fs::create_directory(dir.file("sub"));
  EXPECT_TRUE(fails_with(open_safetensors_dir(root), StatusCode::kInvalidArgument,
                         {"sub is a directory, not a safetensors file"}));
}

TEST(SafetensorsWriter, RejectsBadInput) {
  SafetensorsWriter w;
  const std::vector<float> v(4);
  EXPECT_TRUE(fails_with(w.add_tensor("w", "F32", {3}, as_bytes(v)), StatusCode::kInvalidArgument,
                         {"tensor 'w': 3 elements of F32 need 12 bytes, got 16"}));
  EXPECT_TRUE(fails_with(w.add_tensor("w", "X", {4}, as_bytes(v)), StatusCode::kInvalidArgument,
                         {"unknown safetensors dtype 'X'"}));
  ASSERT_TRUE(w.add_tensor("w", "F32", {4}, as_bytes(v)).ok());
  EXPECT_TRUE(fails_with(w.add_tensor("w", "F32", {4}, as_bytes(v)), StatusCode::kAlreadyExists, {"added twice"}));
  EXPECT_TRUE(fails_with(w.add_tensor("q", hal::DType::kQ8_0, {32}, {}), StatusCode::kInvalidArgument,
                         {"has no safetensors dtype"}));
}

}  // namespace
}  // namespace sx::model
