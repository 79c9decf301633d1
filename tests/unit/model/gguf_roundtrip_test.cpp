// Writer -> reader round trips: every metadata value type (nested arrays included), GGUF v2 and v3,
// alignments 32 and 64, tensor data of every HAL format, files on disk, typed getters.
#include <cmath>
#include <filesystem>
#include <limits>
#include <set>
#include <tuple>

#include <gtest/gtest.h>

#include "runtime/base/half.h"
#include "runtime/model/gguf.h"
#include "runtime/model/gguf_writer.h"
#include "tests/unit/model/gguf_test_util.h"

namespace sx::model {
namespace {

using testing::fails_with;
using testing::parse_bytes;

std::vector<std::uint8_t> bytes_of(const std::vector<float>& v) {
  std::vector<std::uint8_t> b(v.size() * 4);
  std::memcpy(b.data(), v.data(), b.size());
  return b;
}

// Every scalar type, strings, arrays of each element type, empty arrays, nested arrays.
void set_all_value_types(GgufWriter& w) {
  w.set_uint8("t.u8", 250);
  w.set_int8("t.i8", -120);
  w.set_uint16("t.u16", 65000);
  w.set_int16("t.i16", -32000);
  w.set_uint32("t.u32", 4000000000u);
  w.set_int32("t.i32", -2000000000);
  w.set_float32("t.f32", 1.5f);
  w.set_bool("t.bool_true", true);
  w.set_bool("t.bool_false", false);
  w.set_string("t.str", "héllo \"world\"\n");
  w.set_string("t.empty_str", "");
  w.set_uint64("t.u64", std::numeric_limits<std::uint64_t>::max());
  w.set_int64("t.i64", std::numeric_limits<std::int64_t>::min());
  w.set_float64("t.f64", 3.141592653589793);
  w.set_string_array("t.str_arr", {"a", "", "ccc"});
  w.set_int32_array("t.i32_arr", {1, -2, 3});
  w.set_float32_array("t.f32_arr", {0.5f, -0.25f});
  w.set("t.i64_arr", GgufValue::int64_array({5, -6}));
  w.set("t.u32_arr", GgufValue::uint32_array({7, 8, 9}));
  GgufArray bools;
  bools.elem_type = GgufType::kBool;
  bools.raw = {1, 0, 1};
  w.set("t.bool_arr", GgufValue::array(bools));
  w.set_string_array("t.empty_arr", {});
  w.set("t.nested", GgufValue::array_of_arrays({GgufValue::int32_array({1, 2}), GgufValue::string_array({"x"}),
                                                GgufValue::array_of_arrays({GgufValue::float32_array({})})}));
}

class RoundTripTest : public ::testing::TestWithParam<std::tuple<std::uint32_t, std::uint32_t>> {};

TEST_P(RoundTripTest, AllValueTypesAndTensors) {
  const auto [version, alignment] = GetParam();
  GgufWriter w;
  w.set_version(version);
  if (alignment != 32) w.set_uint32("general.alignment", alignment);
  w.set_string("general.architecture", "test");
  set_all_value_types(w);

  const std::vector<float> f32 = {1, 2, 3, 4, 5, 6};
  ASSERT_TRUE(w.add_tensor("a.f32", {3, 2}, hal::DType::kF32, bytes_of(f32)).ok());
  std::vector<std::uint8_t> f16(2 * 5);
  for (int i = 0; i < 5; ++i) {
    const std::uint16_t h = f32_to_f16(static_cast<float>(i) * 0.5f);
    std::memcpy(f16.data() + 2 * i, &h, 2);
  }
  ASSERT_TRUE(w.add_tensor("b.f16", {5}, hal::DType::kF16, f16).ok());
  std::vector<std::uint8_t> bf16(2 * 7, 0x3f);
  ASSERT_TRUE(w.add_tensor("c.bf16", {7, 1, 1}, hal::DType::kBF16, bf16).ok());
  std::vector<float> q8_src(64);
  for (int i = 0; i < 64; ++i) q8_src[i] = std::sin(static_cast<float>(i));
  std::vector<std::uint8_t> q8(hal::row_bytes(hal::DType::kQ8_0, 64));
  hal::quantize_row(hal::DType::kQ8_0, q8_src.data(), q8.data(), 64);
  ASSERT_TRUE(w.add_tensor("d.q8_0", {32, 2}, hal::DType::kQ8_0, q8).ok());
  std::vector<std::uint8_t> q4k(144 * 3, 0x11);
  ASSERT_TRUE(w.add_tensor("e.q4_k", {256, 3}, static_cast<std::uint32_t>(GgmlType::kQ4_K), q4k).ok());
  std::vector<std::uint8_t> four_d(2 * 3 * 4 * 5 * 4, 0x7);
  ASSERT_TRUE(w.add_tensor("f.i32", {2, 3, 4, 5}, static_cast<std::uint32_t>(GgmlType::kI32), four_d).ok());

  auto bytes = w.to_bytes();
  ASSERT_TRUE(bytes.ok()) << bytes.status().to_string();
  auto f = parse_bytes(*bytes);
  ASSERT_TRUE(f.ok()) << f.status().to_string();
  const GgufFile& g = **f;

  EXPECT_EQ(g.version(), version);
  EXPECT_EQ(g.alignment(), alignment);
  EXPECT_EQ(g.data_offset() % alignment, 0u);
  EXPECT_EQ(g.path(), "test.gguf");

  // Metadata: same keys, same order, same values.
  ASSERT_EQ(g.metadata().size(), w.metadata().size());
  for (std::size_t i = 0; i < w.metadata().size(); ++i) {
    EXPECT_EQ(g.metadata()[i].first, w.metadata()[i].first);
    EXPECT_TRUE(g.metadata()[i].second == w.metadata()[i].second) << w.metadata()[i].first;
  }
  EXPECT_EQ(*g.get_uint("t.u8"), 250u);
  EXPECT_EQ(*g.get_int("t.i8"), -120);
  EXPECT_EQ(*g.get_uint("t.u16"), 65000u);
  EXPECT_EQ(*g.get_int("t.i16"), -32000);
  EXPECT_EQ(*g.get_uint("t.u32"), 4000000000u);
  EXPECT_EQ(*g.get_int("t.i32"), -2000000000);
  EXPECT_EQ(*g.get_float("t.f32"), 1.5);
  EXPECT_TRUE(*g.get_bool("t.bool_true"));
  EXPECT_FALSE(*g.get_bool("t.bool_false"));
  EXPECT_EQ(*g.get_string("t.str"), "héllo \"world\"\n");
  EXPECT_EQ(*g.get_string("t.empty_str"), "");
  EXPECT_EQ(*g.get_uint("t.u64"), std::numeric_limits<std::uint64_t>::max());
  EXPECT_EQ(*g.get_int("t.i64"), std::numeric_limits<std::int64_t>::min());
  EXPECT_DOUBLE_EQ(*g.get_float("t.f64"), 3.141592653589793);
  EXPECT_EQ(*g.get_string_array("t.str_arr"), (std::vector<std::string>{"a", "", "ccc"}));
  EXPECT_EQ(*g.get_int_array("t.i32_arr"), (std::vector<std::int64_t>{1, -2, 3}));
  EXPECT_EQ(*g.get_int_array("t.u32_arr"), (std::vector<std::int64_t>{7, 8, 9}));
  EXPECT_EQ(*g.get_float_array("t.f32_arr"), (std::vector<double>{0.5, -0.25}));
  EXPECT_EQ(*g.get_array_size("t.empty_arr"), 0u);
  const GgufArray* bools = g.find("t.bool_arr")->if_array();
  ASSERT_NE(bools, nullptr);
  EXPECT_EQ(bools->size(), 3u);
  EXPECT_EQ(*bools->bool_at(0), true);
  EXPECT_EQ(*bools->bool_at(1), false);
  const GgufArray* nested = g.find("t.nested")->if_array();
  ASSERT_NE(nested, nullptr);
  ASSERT_EQ(nested->elem_type, GgufType::kArray);
  ASSERT_EQ(nested->size(), 3u);
  EXPECT_EQ(*nested->arrays[0].if_array()->int_at(1), 2);
  EXPECT_EQ(nested->arrays[1].if_array()->strings[0], "x");
  EXPECT_EQ(nested->arrays[2].if_array()->arrays[0].if_array()->elem_type, GgufType::kFloat32);

  // Tensors in order, with sizes, types and data.
  ASSERT_EQ(g.tensors().size(), 6u);
  const TensorInfo* a = g.find_tensor("a.f32");
  ASSERT_NE(a, nullptr);
  EXPECT_EQ(a->dims, (std::vector<std::int64_t>{3, 2}));
  EXPECT_EQ(a->n_elements, 6);
  EXPECT_EQ(a->n_bytes, 24u);
  EXPECT_EQ(a->dtype, hal::DType::kF32);
  EXPECT_EQ(a->type_name, "f32");
  EXPECT_EQ(a->file, "test.gguf");
  EXPECT_EQ(std::memcmp(a->data.data(), f32.data(), 24), 0);
  EXPECT_EQ(g.find_tensor("b.f16")->dtype, hal::DType::kF16);
  EXPECT_EQ(std::vector<std::uint8_t>(g.find_tensor("b.f16")->data.begin(), g.find_tensor("b.f16")->data.end()), f16);
  EXPECT_EQ(g.find_tensor("c.bf16")->dtype, hal::DType::kBF16);
  EXPECT_EQ(g.find_tensor("c.bf16")->dims, (std::vector<std::int64_t>{7, 1, 1}));
  const TensorInfo* d = g.find_tensor("d.q8_0");
  EXPECT_EQ(d->dtype, hal::DType::kQ8_0);
  EXPECT_EQ(d->n_bytes, 68u);
  EXPECT_EQ(std::vector<std::uint8_t>(d->data.begin(), d->data.end()), q8);
  const TensorInfo* e = g.find_tensor("e.q4_k");
  EXPECT_EQ(e->dtype, hal::DType::kQ4_K);
  EXPECT_TRUE(require_supported(*e).ok());
  EXPECT_TRUE(fails_with(require_supported(*g.find_tensor("f.i32")), StatusCode::kUnimplemented,
                         {"f.i32", "i32", "not supported yet"}));
  EXPECT_EQ(e->type_name, "q4_k");
  EXPECT_EQ(e->n_bytes, 432u);
  EXPECT_EQ(g.find_tensor("f.i32")->n_elements, 120);
  EXPECT_EQ(g.find_tensor("nope"), nullptr);
  for (const TensorInfo& t : g.tensors()) {
    EXPECT_EQ(t.offset % alignment, 0u) << t.name;
    EXPECT_EQ(t.data.data(), bytes->data() + g.data_offset() + t.offset) << t.name;
  }
  EXPECT_EQ(g.tensors()[0].name, "a.f32");
  EXPECT_EQ(g.tensors()[5].name, "f.i32");
}

INSTANTIATE_TEST_SUITE_P(VersionsAndAlignments, RoundTripTest,
                         ::testing::Combine(::testing::Values(2u, 3u), ::testing::Values(32u, 64u)));

TEST(GgufRoundTrip, EmptyFileHasNoTensors) {
  GgufWriter w;
  auto bytes = w.to_bytes();
  ASSERT_TRUE(bytes.ok());
  EXPECT_EQ(bytes->size(), 24u);  // the header alone: no data section, nothing to pad
  auto f = parse_bytes(*bytes);
  ASSERT_TRUE(f.ok()) << f.status().to_string();
  EXPECT_TRUE((*f)->metadata().empty());
  EXPECT_TRUE((*f)->tensors().empty());
  // A tensor-less file padded to the alignment (as older writers made it) reads the same.
  std::vector<std::uint8_t> padded = *bytes;
  padded.resize(32, 0);
  EXPECT_TRUE(parse_bytes(padded).ok());
}

// general.alignment = 2^30 on a file without tensors: writing it back stays small (it once padded the
// header to 1 GiB in memory; found by fuzz_gguf), and the alignment survives the round trip.
TEST(GgufRoundTrip, HugeAlignmentWithoutTensorsIsNotPadded) {
  GgufWriter w;
  w.set_uint32("general.alignment", 1u << 30);
  auto bytes = w.to_bytes();
  ASSERT_TRUE(bytes.ok()) << bytes.status().to_string();
  EXPECT_LT(bytes->size(), 100u);
  auto f = parse_bytes(*bytes);
  ASSERT_TRUE(f.ok()) << f.status().to_string();
  EXPECT_EQ((*f)->alignment(), 1u << 30);
  EXPECT_TRUE((*f)->tensors().empty());
}

TEST(GgufRoundTrip, FileOnDiskAtomicWriteAndOpen) {
  testing::TempDir dir;
  const std::string path = dir.file("m.gguf");
  GgufWriter w;
  w.set_string("general.architecture", "test");
  ASSERT_TRUE(w.add_tensor("x", {4}, hal::DType::kF32, bytes_of({1, 2, 3, 4})).ok());
  ASSERT_TRUE(w.write(path).ok());
  EXPECT_TRUE(std::filesystem::exists(path));
  EXPECT_FALSE(std::filesystem::exists(path + ".tmp"));
  auto f = GgufFile::open(path);
  ASSERT_TRUE(f.ok()) << f.status().to_string();
  EXPECT_EQ((*f)->path(), path);
  EXPECT_EQ((*f)->file_size(), std::filesystem::file_size(path));
  const TensorInfo* x = (*f)->find_tensor("x");
  ASSERT_NE(x, nullptr);
  float v[4];
  std::memcpy(v, x->data.data(), 16);
  EXPECT_EQ(v[3], 4.0f);
  EXPECT_EQ(x->file, path);
}

TEST(GgufRoundTrip, WriteErrorsNameThePath) {
  GgufWriter w;
  const Status s = w.write("/nonexistent-dir/sub/m.gguf");
  EXPECT_TRUE(fails_with(s, StatusCode::kNotFound, {"/nonexistent-dir/sub/m.gguf"}));
  auto f = GgufFile::open("/nonexistent-dir/m.gguf");
  EXPECT_TRUE(fails_with(f, StatusCode::kNotFound, {"/nonexistent-dir/m.gguf"}));
}

TEST(GgufRoundTrip, StreamedTensors) {
  GgufWriter w;
  ASSERT_TRUE(w.add_tensor_streamed("s", {8, 3}, 0,
                                    [](GgufByteSink& sink) -> Status {
                                      for (int r = 0; r < 3; ++r) {
                                        std::vector<float> row(8, static_cast<float>(r));
                                        SX_RETURN_IF_ERROR(sink.write(bytes_of(row)));
                                      }
                                      return ok_status();
                                    })
                  .ok());
  auto bytes = w.to_bytes();
  ASSERT_TRUE(bytes.ok()) << bytes.status().to_string();
  auto f = parse_bytes(*bytes);
  ASSERT_TRUE(f.ok());
  const TensorInfo* s = (*f)->find_tensor("s");
  float last;
  std::memcpy(&last, s->data.data() + s->n_bytes - 4, 4);
  EXPECT_EQ(last, 2.0f);
}

TEST(GgufWriterErrors, ProducerWritingTheWrongSizeIsNamed) {
  GgufWriter w;
  ASSERT_TRUE(w.add_tensor_streamed("short", {8}, 0, [](GgufByteSink& sink) {
                 return sink.write(bytes_of({1, 2}));
               }).ok());
  EXPECT_TRUE(fails_with(w.to_bytes(), StatusCode::kInternal, {"short", "wrote 8 bytes, expected 32"}));
  GgufWriter w2;
  ASSERT_TRUE(w2.add_tensor_streamed("long", {2}, 0, [](GgufByteSink& sink) {
                  return sink.write(bytes_of({1, 2, 3}));
                }).ok());
  EXPECT_TRUE(fails_with(w2.to_bytes(), StatusCode::kInternal, {"long", "more than"}));
  GgufWriter w3;
  ASSERT_TRUE(w3.add_tensor_streamed("failing", {2}, 0, [](GgufByteSink&) {
                  return data_loss_error("source broke");
                }).ok());
  EXPECT_TRUE(fails_with(w3.to_bytes(), StatusCode::kDataLoss, {"failing", "source broke"}));
}

TEST(GgufWriterErrors, AddTensorValidates) {
  GgufWriter w;
  ASSERT_TRUE(w.add_tensor("t", {2}, hal::DType::kF32, bytes_of({1, 2})).ok());
  EXPECT_TRUE(fails_with(w.add_tensor("t", {2}, hal::DType::kF32, bytes_of({1, 2})), StatusCode::kAlreadyExists,
                         {"'t'"}));
  EXPECT_TRUE(fails_with(w.add_tensor("u", {3}, hal::DType::kF32, bytes_of({1, 2})), StatusCode::kInvalidArgument,
                         {"'u'", "needs 12 bytes but 8"}));
  EXPECT_TRUE(fails_with(w.add_tensor("v", {}, hal::DType::kF32, {}), StatusCode::kInvalidArgument, {"'v'"}));
  EXPECT_TRUE(fails_with(w.add_tensor("v", {1, 1, 1, 1, 1}, hal::DType::kF32, bytes_of({1})),
                         StatusCode::kInvalidArgument, {"'v'", "5 dimensions"}));
  EXPECT_TRUE(fails_with(w.add_tensor("v", {0}, hal::DType::kF32, {}), StatusCode::kInvalidArgument,
                         {"'v'", "dimension 0 is 0"}));
  EXPECT_TRUE(fails_with(w.add_tensor("v", {16}, hal::DType::kQ8_0, std::vector<std::uint8_t>(17)),
                         StatusCode::kInvalidArgument, {"'v'", "block size 32"}));
  EXPECT_TRUE(fails_with(w.add_tensor("v", {4}, 4u, {}), StatusCode::kInvalidArgument, {"'v'", "unknown ggml type id 4"}));
  EXPECT_TRUE(fails_with(w.add_tensor(std::string(65, 'n'), {1}, hal::DType::kF32, bytes_of({1})),
                         StatusCode::kInvalidArgument, {"at most 64"}));
}

TEST(GgufWriterErrors, BadAlignmentKey) {
  GgufWriter w;
  w.set_uint32("general.alignment", 48);
  EXPECT_TRUE(fails_with(w.to_bytes(), StatusCode::kInvalidArgument, {"general.alignment", "power of two"}));
  w.set_uint64("general.alignment", 64);
  EXPECT_TRUE(fails_with(w.to_bytes(), StatusCode::kInvalidArgument, {"general.alignment", "uint32"}));
  w.set_uint32("general.alignment", 64);
  EXPECT_TRUE(w.to_bytes().ok());
}

TEST(GgufWriterErrors, MismatchedPayloadIsRejected) {
  GgufWriter w;
  w.set("k.u8", GgufValue{GgufType::kUint8, std::uint64_t{300}});
  EXPECT_TRUE(fails_with(w.to_bytes(), StatusCode::kInvalidArgument, {"'k.u8'", "uint8"}));
  GgufWriter w2;
  w2.set("k.f", GgufValue{GgufType::kFloat32, std::string("x")});
  EXPECT_TRUE(fails_with(w2.to_bytes(), StatusCode::kInvalidArgument, {"'k.f'", "float32"}));
  GgufWriter w3;
  GgufArray bad;
  bad.elem_type = GgufType::kInt32;
  bad.raw = {1, 2, 3};  // not a multiple of 4
  w3.set("k.arr", GgufValue::array(bad));
  EXPECT_TRUE(fails_with(w3.to_bytes(), StatusCode::kInvalidArgument, {"'k.arr'"}));
  GgufWriter w4;
  w4.set("k.nest", GgufValue::array_of_arrays({GgufValue::uint8(1)}));
  EXPECT_TRUE(fails_with(w4.to_bytes(), StatusCode::kInvalidArgument, {"'k.nest'"}));
}

TEST(GgufWriter, SetReplacesInPlaceAndRemove) {
  GgufWriter w;
  w.set_uint32("a", 1);
  w.set_uint32("b", 2);
  w.set_string("a", "x");
  ASSERT_EQ(w.metadata().size(), 2u);
  EXPECT_EQ(w.metadata()[0].first, "a");
  EXPECT_EQ(*w.find("a")->if_string(), "x");
  EXPECT_TRUE(w.remove("a"));
  EXPECT_FALSE(w.remove("a"));
  EXPECT_EQ(w.find("a"), nullptr);
}

TEST(GgufGetters, ErrorsNameKeyFileAndTypes) {
  GgufWriter w;
  w.set_string("s", "text");
  w.set_int32("neg", -5);
  w.set_uint64("big", std::numeric_limits<std::uint64_t>::max());
  w.set_int32_array("ints", {1});
  w.set_float32("f", 2.5f);
  w.set_uint32("u", 7);
  auto bytes = w.to_bytes();
  auto f = parse_bytes(*bytes, "model.gguf");
  ASSERT_TRUE(f.ok());
  const GgufFile& g = **f;
  EXPECT_TRUE(fails_with(g.get_uint("missing.key"), StatusCode::kNotFound, {"model.gguf", "'missing.key'"}));
  EXPECT_TRUE(fails_with(g.get_uint("s"), StatusCode::kInvalidArgument, {"model.gguf", "'s'", "string", "integer"}));
  EXPECT_TRUE(fails_with(g.get_uint("neg"), StatusCode::kOutOfRange, {"model.gguf", "'neg'", "-5"}));
  EXPECT_TRUE(fails_with(g.get_int("big"), StatusCode::kOutOfRange, {"'big'"}));
  EXPECT_TRUE(fails_with(g.get_string("u"), StatusCode::kInvalidArgument, {"'u'", "uint32", "string"}));
  EXPECT_TRUE(fails_with(g.get_bool("u"), StatusCode::kInvalidArgument, {"'u'", "bool"}));
  EXPECT_TRUE(fails_with(g.get_float("s"), StatusCode::kInvalidArgument, {"'s'"}));
  EXPECT_TRUE(fails_with(g.get_string_array("ints"), StatusCode::kInvalidArgument,
                         {"'ints'", "array of int32", "array of string"}));
  EXPECT_TRUE(fails_with(g.get_int_array("s"), StatusCode::kInvalidArgument, {"'s'"}));
  EXPECT_EQ(*g.get_float("u"), 7.0);  // integers read as floats
  EXPECT_EQ(*g.get_int("u"), 7);
  EXPECT_EQ(*g.get_float("f"), 2.5);
}

TEST(GgufValueToString, RendersScalarsStringsAndArrays) {
  EXPECT_EQ(gguf_value_to_string(GgufValue::uint32(7)), "7");
  EXPECT_EQ(gguf_value_to_string(GgufValue::int8(-3)), "-3");
  EXPECT_EQ(gguf_value_to_string(GgufValue::float32(0.5f)), "0.5");
  EXPECT_EQ(gguf_value_to_string(GgufValue::boolean(true)), "true");
  EXPECT_EQ(gguf_value_to_string(GgufValue::string("a\"b\n")), "\"a\\\"b\\n\"");
  EXPECT_EQ(gguf_value_to_string(GgufValue::int32_array({1, 2, 3}), 2), "[1, 2, ... (3 int32 items)]");
  EXPECT_EQ(gguf_value_to_string(GgufValue::string_array({"x", "y"})), "[\"x\", \"y\"]");
  EXPECT_EQ(gguf_value_to_string(GgufValue::array_of_arrays({GgufValue::int32_array({1})})), "[[1]]");
  EXPECT_EQ(gguf_value_to_string(GgufValue::string_array({})), "[]");
  const std::string long_str(500, 'z');
  EXPECT_LT(gguf_value_to_string(GgufValue::string(long_str)).size(), 200u);
}

TEST(GgmlTypes, TableMatchesGgml) {
  const std::pair<GgmlType, std::pair<std::uint32_t, std::uint32_t>> expected[] = {
      {GgmlType::kF32, {1, 4}},       {GgmlType::kF16, {1, 2}},       {GgmlType::kQ4_0, {32, 18}},
      {GgmlType::kQ4_1, {32, 20}},    {GgmlType::kQ5_0, {32, 22}},    {GgmlType::kQ5_1, {32, 24}},
      {GgmlType::kQ8_0, {32, 34}},    {GgmlType::kQ8_1, {32, 36}},    {GgmlType::kQ2_K, {256, 84}},
      {GgmlType::kQ3_K, {256, 110}},  {GgmlType::kQ4_K, {256, 144}},  {GgmlType::kQ5_K, {256, 176}},
      {GgmlType::kQ6_K, {256, 210}},  {GgmlType::kQ8_K, {256, 292}},  {GgmlType::kIQ2_XXS, {256, 66}},
      {GgmlType::kIQ2_XS, {256, 74}}, {GgmlType::kIQ3_XXS, {256, 98}}, {GgmlType::kIQ1_S, {256, 50}},
      {GgmlType::kIQ4_NL, {32, 18}},  {GgmlType::kIQ3_S, {256, 110}}, {GgmlType::kIQ2_S, {256, 82}},
      {GgmlType::kIQ4_XS, {256, 136}}, {GgmlType::kI8, {1, 1}},       {GgmlType::kI16, {1, 2}},
      {GgmlType::kI32, {1, 4}},       {GgmlType::kI64, {1, 8}},       {GgmlType::kF64, {1, 8}},
      {GgmlType::kIQ1_M, {256, 56}},  {GgmlType::kBF16, {1, 2}},      {GgmlType::kTQ1_0, {256, 54}},
      {GgmlType::kTQ2_0, {256, 66}},  {GgmlType::kMXFP4, {32, 17}},
  };
  EXPECT_EQ(ggml_type_table().size(), std::size(expected));
  for (const auto& [type, layout] : expected) {
    const GgmlTypeInfo* info = ggml_type_info(static_cast<std::uint32_t>(type));
    ASSERT_NE(info, nullptr) << static_cast<std::uint32_t>(type);
    EXPECT_EQ(info->block_elems, layout.first) << info->name;
    EXPECT_EQ(info->block_bytes, layout.second) << info->name;
  }
  for (std::uint32_t removed : {4u, 5u, 31u, 32u, 33u, 36u, 37u, 38u, 40u, 1000u}) {
    EXPECT_EQ(ggml_type_info(removed), nullptr) << removed;
  }
  std::set<std::string_view> with_dtype;
  for (const GgmlTypeInfo& t : ggml_type_table()) {
    if (t.dtype) {
      with_dtype.insert(t.name);
      EXPECT_EQ(ggml_type_of(*t.dtype), t.id);
      EXPECT_EQ(hal::dtype_info(*t.dtype).block_elems, static_cast<int>(t.block_elems));
      EXPECT_EQ(hal::dtype_info(*t.dtype).block_bytes, static_cast<int>(t.block_bytes));
    }
  }
  EXPECT_EQ(with_dtype, (std::set<std::string_view>{"f32", "f16", "bf16", "q8_0", "q4_0", "q4_1", "q5_0", "q5_1",
                                                     "q2_k", "q3_k", "q4_k", "q5_k", "q6_k"}));
  EXPECT_EQ(ggml_type_of(hal::DType::kAwqInt4), kNoGgmlType);  // not a GGUF format
  EXPECT_EQ(ggml_type_info(kNoGgmlType), nullptr);
  EXPECT_EQ(ggml_type_name(12), "q4_k");
  EXPECT_EQ(ggml_type_name(99), "unknown#99");
}

TEST(RequireSupported, NamesFileTensorAndType) {
  GgufWriter w;
  ASSERT_TRUE(w.add_tensor("blk.0.ffn_down.weight", {32}, static_cast<std::uint32_t>(GgmlType::kIQ4_NL),
                           std::vector<std::uint8_t>(18))
                  .ok());
  ASSERT_TRUE(w.add_tensor("q6", {256}, static_cast<std::uint32_t>(GgmlType::kQ6_K), std::vector<std::uint8_t>(210))
                  .ok());
  ASSERT_TRUE(w.add_tensor("ok", {1}, hal::DType::kF32, bytes_of({1})).ok());
  auto bytes = w.to_bytes();
  auto f = parse_bytes(*bytes, "iq.gguf");
  ASSERT_TRUE(f.ok());
  EXPECT_TRUE(fails_with(require_supported(*(*f)->find_tensor("blk.0.ffn_down.weight")), StatusCode::kUnimplemented,
                         {"iq.gguf", "blk.0.ffn_down.weight", "iq4_nl", "not supported yet"}));
  EXPECT_TRUE(require_supported(*(*f)->find_tensor("q6")).ok());  // every GGML block format loads
  EXPECT_TRUE(require_supported(*(*f)->find_tensor("ok")).ok());
}

}  // namespace
}  // namespace sx::model
