// Shard planner: every Qwen2.5 and Qwen3 shape at TP 1..8 and a set of TP x PP grids, checked
// against facts recomputed here from the model's tensor list (coverage, balance, byte totals), the
// error cases, the weight types of a GGUF file, and the table `sextant plan` prints.
#include <algorithm>
#include <map>
#include <ostream>
#include <set>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "runtime/model/gguf.h"
#include "runtime/model/model_config.h"
#include "runtime/model/random_model.h"
#include "runtime/parallel/shard_plan.h"
#include "runtime/parallel/weight_recipes.h"
#include "tests/unit/model/gguf_test_util.h"

namespace sx::parallel {
namespace {

using hal::DType;
using model::ModelConfig;
using model::testing::fails_with;

// ---- the model as a list of tensors, built here from the config (not from the planner) ----

enum class Kind {
  kEmbd, kOutputNorm, kOutput,                              // global
  kAttnNorm, kFfnNorm, kQNorm, kKNorm,                      // per layer, 1-D, whole on every tp rank
  kQ, kQBias, kK, kKBias, kV, kVBias, kO, kGate, kUp, kDown  // per layer, split
};

struct Tensor {
  std::string name;
  std::int64_t layer = -1;  // -1: global
  Kind kind;
  std::int64_t cols = 0, rows = 1;  // GGUF ne[0], ne[1] (rows 1 for 1-D)
  DType type = DType::kF32;
  bool one_d = false;
};

std::uint64_t tensor_bytes(const Tensor& t) {
  const hal::DTypeInfo& info = hal::dtype_info(t.type);
  EXPECT_EQ(t.cols % info.block_elems, 0) << t.name;
  return static_cast<std::uint64_t>(t.rows) * static_cast<std::uint64_t>(t.cols / info.block_elems) *
         static_cast<std::uint64_t>(info.block_bytes);
}

std::vector<Tensor> model_tensors(const ModelConfig& c, const WeightTypes& w) {
  std::vector<Tensor> out;
  auto vec = [&](std::string name, std::int64_t layer, Kind k, std::int64_t n) {
    out.push_back({std::move(name), layer, k, n, 1, DType::kF32, true});
  };
  auto mat = [&](std::string name, std::int64_t layer, Kind k, std::int64_t in, std::int64_t o, DType t) {
    out.push_back({std::move(name), layer, k, in, o, t, false});
  };
  const std::int64_t qd = c.n_heads * c.head_dim, kvd = c.n_kv_heads * c.head_dim;
  mat("token_embd.weight", -1, Kind::kEmbd, c.hidden, c.vocab, w.token_embd);
  for (std::int64_t i = 0; i < c.n_layers; ++i) {
    const LayerWeightTypes& t = w.layers[static_cast<std::size_t>(i)];
    const std::string p = "blk." + std::to_string(i) + ".";
    vec(p + "attn_norm.weight", i, Kind::kAttnNorm, c.hidden);
    mat(p + "attn_q.weight", i, Kind::kQ, c.hidden, qd, t.q);
    if (c.qkv_bias) vec(p + "attn_q.bias", i, Kind::kQBias, qd);
    mat(p + "attn_k.weight", i, Kind::kK, c.hidden, kvd, t.k);
    if (c.qkv_bias) vec(p + "attn_k.bias", i, Kind::kKBias, kvd);
    mat(p + "attn_v.weight", i, Kind::kV, c.hidden, kvd, t.v);
    if (c.qkv_bias) vec(p + "attn_v.bias", i, Kind::kVBias, kvd);
    if (c.architecture == "qwen3") {
      vec(p + "attn_q_norm.weight", i, Kind::kQNorm, c.head_dim);
      vec(p + "attn_k_norm.weight", i, Kind::kKNorm, c.head_dim);
    }
    mat(p + "attn_output.weight", i, Kind::kO, qd, c.hidden, t.o);
    vec(p + "ffn_norm.weight", i, Kind::kFfnNorm, c.hidden);
    mat(p + "ffn_gate.weight", i, Kind::kGate, c.hidden, c.ffn, t.gate);
    mat(p + "ffn_up.weight", i, Kind::kUp, c.hidden, c.ffn, t.up);
    mat(p + "ffn_down.weight", i, Kind::kDown, c.ffn, c.hidden, t.down);
  }
  vec("output_norm.weight", -1, Kind::kOutputNorm, c.hidden);
  if (!c.tied_embeddings) mat("output.weight", -1, Kind::kOutput, c.hidden, c.vocab, w.output);
  return out;
}

bool whole_on_every_rank(Kind k) {
  return k == Kind::kAttnNorm || k == Kind::kFfnNorm || k == Kind::kQNorm || k == Kind::kKNorm ||
         k == Kind::kOutputNorm;
}
bool per_kv_head(Kind k) { return k == Kind::kK || k == Kind::kKBias || k == Kind::kV || k == Kind::kVBias; }

std::uint64_t model_bytes(const ModelConfig& c, const WeightTypes& w) {
  std::uint64_t sum = 0;
  for (const Tensor& t : model_tensors(c, w)) sum += tensor_bytes(t);
  return sum;
}

std::vector<std::int64_t> counts(std::int64_t n, const std::vector<Range>& ranges) {
  std::vector<std::int64_t> c(static_cast<std::size_t>(n), 0);
  for (const Range& r : ranges) {
    EXPECT_LE(0, r.begin);
    EXPECT_LE(r.begin, r.end);
    EXPECT_LE(r.end, n);
    for (std::int64_t i = std::max<std::int64_t>(r.begin, 0); i < std::min(r.end, n); ++i) ++c[static_cast<std::size_t>(i)];
  }
  return c;
}

void expect_exactly_once(std::int64_t n, const std::vector<Range>& ranges, const std::string& what) {
  const std::vector<std::int64_t> c = counts(n, ranges);
  for (std::int64_t i = 0; i < n; ++i) {
    ASSERT_EQ(c[static_cast<std::size_t>(i)], 1) << what << " " << i;
  }
}

template <typename F>
std::int64_t spread(const std::vector<RankPlan>& ranks, F size) {
  std::int64_t lo = INT64_MAX, hi = INT64_MIN;
  for (const RankPlan& r : ranks) {
    lo = std::min(lo, size(r));
    hi = std::max(hi, size(r));
  }
  return hi - lo;
}

// Everything the plan must satisfy, recomputed from the config, the tensor list and the ranges.
void check_plan(const ModelConfig& c, const WeightTypes& w, const PlanOptions& o, const ShardPlan& plan) {
  const int tp = o.tp, pp = o.pp;
  ASSERT_EQ(plan.tp, tp);
  ASSERT_EQ(plan.pp, pp);
  ASSERT_EQ(plan.ranks.size(), static_cast<std::size_t>(tp * pp));

  std::int64_t unit = 1, o_block = 1;
  for (const LayerWeightTypes& t : w.layers) {
    unit = std::max<std::int64_t>(unit, hal::dtype_info(t.down).block_elems);
    o_block = std::max<std::int64_t>(o_block, hal::dtype_info(t.o).block_elems);
  }
  EXPECT_EQ(plan.ffn_unit, unit);
  // Heads move in units whose o columns are whole blocks: the fewest heads of head_dim columns
  // making a multiple of the block.
  std::int64_t head_unit = 1;
  while (head_unit * c.head_dim % o_block != 0) ++head_unit;
  const std::int64_t group = c.n_heads / c.n_kv_heads;
  const std::size_t kv_elem = hal::dtype_info(o.kv_dtype).block_bytes;
  const std::vector<Tensor> tensors = model_tensors(c, w);

  std::vector<Range> all_layers;
  std::vector<RankPlan> stage_heads;  // rank 0 of every stage
  for (int s = 0; s < pp; ++s) {
    std::vector<RankPlan> ranks;
    for (int i = 0; i < tp; ++i) {
      const RankPlan& r = plan.at(s, i);
      EXPECT_EQ(r.rank, s * tp + i);
      EXPECT_EQ(r.stage, s);
      EXPECT_EQ(r.tp_rank, i);
      EXPECT_EQ(&r, &plan.ranks[static_cast<std::size_t>(s * tp + i)]);
      EXPECT_EQ(r.has_embedding, s == 0);
      EXPECT_EQ(r.has_lm_head, s == pp - 1);
      ranks.push_back(r);
    }
    const std::string where = "stage " + std::to_string(s);
    auto ranges = [&](auto member) {
      std::vector<Range> v;
      for (const RankPlan& r : ranks) v.push_back(r.*member);
      return v;
    };

    // Coverage within the stage.
    expect_exactly_once(c.n_heads, ranges(&RankPlan::q_heads), where + " query head");
    expect_exactly_once(c.ffn, ranges(&RankPlan::ffn), where + " FFN row");
    expect_exactly_once(c.vocab, ranges(&RankPlan::vocab), where + " vocab row");
    const std::vector<std::int64_t> holders = counts(c.n_kv_heads, ranges(&RankPlan::kv_heads));
    for (const RankPlan& r : ranks) {
      std::set<std::int64_t> used, held;
      for (std::int64_t h = r.q_heads.begin; h < r.q_heads.end; ++h) used.insert(h / group);
      for (std::int64_t h = r.kv_heads.begin; h < r.kv_heads.end; ++h) held.insert(h);
      EXPECT_EQ(used, held) << where << " rank " << r.rank;
      std::vector<std::int64_t> shared;
      for (std::int64_t h : held) {
        if (holders[static_cast<std::size_t>(h)] > 1) shared.push_back(h);
      }
      EXPECT_EQ(r.replicated_kv_heads, shared) << where << " rank " << r.rank;
      EXPECT_EQ(r.ffn.begin % unit, 0) << r.rank;
      EXPECT_EQ(r.ffn.end % unit, 0) << r.rank;
      // Every o split falls on a block of its format (the matrix's end always does).
      EXPECT_EQ(r.q_heads.begin * c.head_dim % o_block, 0) << where << " rank " << r.rank;
      if (r.q_heads.end != c.n_heads) EXPECT_EQ(r.q_heads.end * c.head_dim % o_block, 0) << where << " rank " << r.rank;
      EXPECT_EQ(r.layers, ranks[0].layers) << r.rank;
      EXPECT_GE(r.q_heads.size(), 1);
    }
    for (std::int64_t h = 0; h < c.n_kv_heads; ++h) EXPECT_GE(holders[static_cast<std::size_t>(h)], 1) << h;

    // Balance within the stage.
    // Head counts differ by at most one unit (a short last unit may add its shortfall).
    EXPECT_LE(spread(ranks, [](const RankPlan& r) { return r.q_heads.size(); }), 2 * head_unit - 1) << where;
    if (head_unit == 1) EXPECT_LE(spread(ranks, [](const RankPlan& r) { return r.q_heads.size(); }), 1) << where;
    EXPECT_LE(spread(ranks, [](const RankPlan& r) { return r.ffn.size(); }), unit) << where;
    EXPECT_LE(spread(ranks, [](const RankPlan& r) { return r.vocab.size(); }), 1) << where;

    // Bytes: the stage's share of the model, plus what is whole on every rank or replicated.
    const Range layers = ranks[0].layers;
    std::uint64_t want = 0;
    for (const Tensor& t : tensors) {
      const std::uint64_t b = tensor_bytes(t);
      if (t.layer >= 0) {
        if (!layers.contains(t.layer)) continue;
        if (whole_on_every_rank(t.kind)) {
          want += b * static_cast<std::uint64_t>(tp);
        } else if (per_kv_head(t.kind)) {
          std::uint64_t copies = 0;
          for (std::int64_t h = 0; h < c.n_kv_heads; ++h) copies += static_cast<std::uint64_t>(holders[static_cast<std::size_t>(h)]);
          want += b / static_cast<std::uint64_t>(c.n_kv_heads) * copies;
        } else {
          want += b;
        }
        continue;
      }
      const bool first = s == 0, last = s == pp - 1;
      switch (t.kind) {
        case Kind::kEmbd:
          if (first) want += b;
          if (last && c.tied_embeddings && pp > 1) want += b;  // the last stage's LM head shard of the one table
          break;
        case Kind::kOutputNorm:
          if (last) want += b * static_cast<std::uint64_t>(tp);
          break;
        case Kind::kOutput:
          if (last) want += b;
          break;
        default: ADD_FAILURE() << t.name;
      }
    }
    std::uint64_t got = 0;
    for (const RankPlan& r : ranks) got += r.weight_bytes;
    EXPECT_EQ(got, want) << where;

    // KV cache: K and V of every held head, every layer of the stage.
    for (const RankPlan& r : ranks) {
      std::uint64_t kv = 0;
      for (std::int64_t l = r.layers.begin; l < r.layers.end; ++l) {
        kv += 2 * static_cast<std::uint64_t>(r.kv_heads.size() * c.head_dim) * kv_elem;
      }
      EXPECT_EQ(r.kv_bytes_per_token, kv) << r.rank;
    }
    all_layers.push_back(layers);
    stage_heads.push_back(ranks[0]);
  }
  expect_exactly_once(c.n_layers, all_layers, "layer");
  EXPECT_LE(spread(stage_heads, [](const RankPlan& r) { return r.layers.size(); }), 1);
  for (std::size_t s = 1; s < all_layers.size(); ++s) EXPECT_EQ(all_layers[s].begin, all_layers[s - 1].end);

  std::uint64_t total = 0;
  for (const RankPlan& r : plan.ranks) total += r.weight_bytes;
  EXPECT_EQ(plan.total_weight_bytes(), total);
  // (A re-quantising plan's w is what the ranks hold; the model once is the file's formats.)
  if (plan.requantized.empty()) {
    EXPECT_EQ(plan.model_weight_bytes, model_bytes(c, w));
  }
  if (tp == 1 && pp == 1) {
    EXPECT_EQ(plan.ranks[0].weight_bytes, model_bytes(c, w));
  }
}

// ---- the shapes ----

struct Shape {
  std::string name;
  ModelConfig config;
};

std::vector<Shape> all_shapes() {
  std::vector<Shape> v;
  for (std::string_view s : model::qwen2_5_sizes()) v.push_back({"qwen2_5_" + std::string(s), model::qwen2_5_config(s)});
  for (std::string_view s : model::qwen3_sizes()) v.push_back({"qwen3_" + std::string(s), model::qwen3_config(s)});
  for (Shape& s : v) std::replace(s.name.begin(), s.name.end(), '.', '_');
  return v;
}

struct Case {
  Shape shape;
  DType type;
  int tp, pp;
};

void PrintTo(const Case& c, std::ostream* os) {
  *os << c.shape.name << " " << hal::dtype_name(c.type) << " tp " << c.tp << " pp " << c.pp;
}

std::string case_name(const ::testing::TestParamInfo<Case>& info) {
  const Case& c = info.param;
  return c.shape.name + "_" + std::string(hal::dtype_name(c.type)) + "_tp" + std::to_string(c.tp) + "_pp" +
         std::to_string(c.pp);
}

std::vector<Case> tp_cases() {
  std::vector<Case> v;
  for (const Shape& s : all_shapes()) {
    for (DType t : {DType::kF16, DType::kQ8_0}) {
      for (int tp = 1; tp <= 8; ++tp) v.push_back({s, t, tp, 1});
    }
  }
  return v;
}

std::vector<Case> grid_cases() {
  std::vector<Case> v;
  const std::set<std::string> picked = {"qwen2_5_0_5b", "qwen2_5_7b", "qwen2_5_72b", "qwen3_0_6b", "qwen3_14b"};
  for (const Shape& s : all_shapes()) {
    if (picked.count(s.name) == 0) continue;
    for (DType t : {DType::kF16, DType::kQ8_0}) {
      for (auto [tp, pp] : {std::pair{2, 2}, {3, 2}, {2, 3}, {1, 4}, {8, 2}, {1, 2}}) v.push_back({s, t, tp, pp});
    }
  }
  return v;
}

class ShardPlanShapes : public ::testing::TestWithParam<Case> {};

TEST_P(ShardPlanShapes, CoversBalancesAndCountsEveryByte) {
  const Case& k = GetParam();
  const ModelConfig& c = k.shape.config;
  const WeightTypes w = uniform_weight_types(c, k.type);
  for (DType kv : {DType::kF32, DType::kF16}) {
    const PlanOptions o{k.tp, k.pp, kv};
    auto plan = plan_shards(c, w, o);
    ASSERT_TRUE(plan.ok()) << plan.status().to_string();
    check_plan(c, w, o, *plan);
  }
}

INSTANTIATE_TEST_SUITE_P(Tp, ShardPlanShapes, ::testing::ValuesIn(tp_cases()), case_name);
INSTANTIATE_TEST_SUITE_P(TpPp, ShardPlanShapes, ::testing::ValuesIn(grid_cases()), case_name);

// For qwen2 the test's tensor list is the loader's (names, dims, order).
TEST(ShardPlan, TestTensorListMatchesTheLoadersForQwen2) {
  for (std::string_view size : model::qwen2_5_sizes()) {
    const ModelConfig c = model::qwen2_5_config(size);
    const std::vector<Tensor> mine = model_tensors(c, uniform_weight_types(c, DType::kF16));
    const std::vector<model::ExpectedTensor> theirs = model::expected_tensors(c);
    ASSERT_EQ(mine.size(), theirs.size()) << size;
    for (std::size_t i = 0; i < mine.size(); ++i) {
      EXPECT_EQ(mine[i].name, theirs[i].name);
      const std::vector<std::int64_t> dims =
          mine[i].one_d ? std::vector<std::int64_t>{mine[i].cols} : std::vector<std::int64_t>{mine[i].cols, mine[i].rows};
      EXPECT_EQ(dims, theirs[i].dims) << mine[i].name;
    }
  }
}

// One rank holds exactly the bytes of every tensor the loader expects (1-D F32, 2-D in the type).
TEST(ShardPlan, SingleRankHoldsTheWholeModel) {
  for (std::string_view size : model::qwen2_5_sizes()) {
    for (DType t : {DType::kF32, DType::kF16, DType::kBF16, DType::kQ8_0}) {
      const ModelConfig c = model::qwen2_5_config(size);
      std::uint64_t want = 0;
      for (const model::ExpectedTensor& e : model::expected_tensors(c)) {
        const DType type = e.dims.size() == 1 ? DType::kF32 : t;
        std::int64_t rows = 1;
        for (std::size_t i = 1; i < e.dims.size(); ++i) rows *= e.dims[i];
        want += static_cast<std::uint64_t>(rows) * hal::row_bytes(type, e.dims[0]);
      }
      auto plan = plan_shards(c, uniform_weight_types(c, t), {});
      ASSERT_TRUE(plan.ok()) << plan.status().to_string();
      EXPECT_EQ(plan->ranks[0].weight_bytes, want) << size << " " << hal::dtype_name(t);
      EXPECT_EQ(plan->model_weight_bytes, want);
    }
  }
}

// Known facts of real shapes, written out by hand.
TEST(ShardPlan, Qwen2_5_72bAtTp6) {
  const ModelConfig c = model::qwen2_5_config("72b");
  auto plan = plan_shards(c, uniform_weight_types(c, DType::kF16), {.tp = 6});
  ASSERT_TRUE(plan.ok());
  const std::vector<Range> q = {{0, 10}, {10, 21}, {21, 32}, {32, 42}, {42, 53}, {53, 64}};
  const std::vector<Range> kv = {{0, 2}, {1, 3}, {2, 4}, {4, 6}, {5, 7}, {6, 8}};
  const std::vector<std::vector<std::int64_t>> rep = {{1}, {1, 2}, {2}, {5}, {5, 6}, {6}};
  for (int i = 0; i < 6; ++i) {
    const RankPlan& r = plan->ranks[static_cast<std::size_t>(i)];
    EXPECT_EQ(r.q_heads, q[static_cast<std::size_t>(i)]) << i;
    EXPECT_EQ(r.kv_heads, kv[static_cast<std::size_t>(i)]) << i;
    EXPECT_EQ(r.replicated_kv_heads, rep[static_cast<std::size_t>(i)]) << i;
    EXPECT_EQ(r.ffn, (Range{4928 * i, 4928 * (i + 1)})) << i;
    EXPECT_EQ(r.vocab, (Range{25344 * i, 25344 * (i + 1)})) << i;
    EXPECT_EQ(r.layers, (Range{0, 80}));
    EXPECT_EQ(r.kv_bytes_per_token, 80u * 2 * 2 * 128 * 4);
  }
}

TEST(ShardPlan, TpAboveTheKvHeadCountReplicatesEveryHead) {
  const ModelConfig c = model::qwen2_5_config("0.5b");  // 14 heads in 2 groups of 7
  const WeightTypes w = uniform_weight_types(c, DType::kF16);
  auto plan = plan_shards(c, w, {.tp = 14});
  ASSERT_TRUE(plan.ok());
  for (const RankPlan& r : plan->ranks) {
    EXPECT_EQ(r.q_heads.size(), 1);
    EXPECT_EQ(r.kv_heads, (Range{r.q_heads.begin / 7, r.q_heads.begin / 7 + 1}));
    EXPECT_EQ(r.replicated_kv_heads, std::vector<std::int64_t>{r.kv_heads.begin});
  }
  // tp 7: two heads per rank; rank 3 (heads 6 and 7) straddles both groups.
  plan = plan_shards(c, w, {.tp = 7});
  ASSERT_TRUE(plan.ok());
  EXPECT_EQ(plan->ranks[3].kv_heads, (Range{0, 2}));
  EXPECT_EQ(plan->ranks[3].replicated_kv_heads, (std::vector<std::int64_t>{0, 1}));
  EXPECT_EQ(plan->ranks[2].kv_heads, (Range{0, 1}));
  EXPECT_EQ(plan->ranks[4].kv_heads, (Range{1, 2}));
}

TEST(ShardPlan, MixedWeightTypesPerLayer) {
  ModelConfig c = model::qwen2_5_config("0.5b");
  c.n_layers = 4;
  WeightTypes w = uniform_weight_types(c, DType::kF16);
  w.output = DType::kF32;
  w.token_embd = DType::kQ8_0;
  w.layers[1].down = DType::kQ8_0;
  w.layers[2].q = DType::kBF16;
  w.layers[3].o = DType::kQ8_0;
  w.layers[3].gate = DType::kF32;
  c.tied_embeddings = false;
  for (auto [tp, pp] : {std::pair{1, 1}, {3, 1}, {2, 2}, {5, 4}}) {
    const PlanOptions o{tp, pp, DType::kBF16};
    auto plan = plan_shards(c, w, o);
    ASSERT_TRUE(plan.ok()) << plan.status().to_string();
    EXPECT_EQ(plan->ffn_unit, 32);  // one Q8_0 down sets the unit for all layers
    check_plan(c, w, o, *plan);
  }
}

TEST(ShardPlan, TiedEmbeddingsAcrossStagesHoldTheTableTwice) {
  const ModelConfig c = model::qwen3_config("0.6b");
  ASSERT_TRUE(c.tied_embeddings);
  const WeightTypes w = uniform_weight_types(c, DType::kF16);
  auto one = plan_shards(c, w, {.tp = 1, .pp = 1});
  auto two = plan_shards(c, w, {.tp = 1, .pp = 2});
  ASSERT_TRUE(one.ok() && two.ok());
  const std::uint64_t table = static_cast<std::uint64_t>(c.vocab) * c.hidden * 2;
  EXPECT_EQ(two->total_weight_bytes(), one->total_weight_bytes() + table);
}

// ---- errors ----

ModelConfig small_config() {
  // 4 heads of 48: a Q8_0 o weight splits cleanly only where a rank starts at an even head.
  ModelConfig c = model::testing::tiny_qwen2_config(300, /*tied=*/false);
  c.n_heads = 4;
  c.n_kv_heads = 2;
  c.head_dim = 48;
  c.hidden = 192;
  c.ffn = 256;
  c.n_layers = 3;
  return c;
}

TEST(ShardPlanErrors, BadCounts) {
  const ModelConfig c = model::qwen2_5_config("0.5b");
  const WeightTypes w = uniform_weight_types(c, DType::kF16);
  EXPECT_TRUE(fails_with(plan_shards(c, w, {.tp = 0}), StatusCode::kInvalidArgument, {"tp 0"}));
  EXPECT_TRUE(fails_with(plan_shards(c, w, {.tp = -3}), StatusCode::kInvalidArgument, {"tp -3"}));
  EXPECT_TRUE(fails_with(plan_shards(c, w, {.pp = 0}), StatusCode::kInvalidArgument, {"pp 0"}));
  EXPECT_TRUE(fails_with(plan_shards(c, w, {.tp = 15}), StatusCode::kInvalidArgument, {"tp 15", "14 query heads"}));
  EXPECT_TRUE(fails_with(plan_shards(c, w, {.pp = 25}), StatusCode::kInvalidArgument, {"pp 25", "24 layers"}));
  EXPECT_TRUE(plan_shards(c, w, {.tp = 14, .pp = 24}).ok());
  ModelConfig big = c;
  big.n_heads = 128;
  big.n_kv_heads = 8;
  big.head_dim = 7;  // F16: any column count works
  big.hidden = 896;
  EXPECT_TRUE(fails_with(plan_shards(big, uniform_weight_types(big, DType::kF16), {.tp = 65}),
                         StatusCode::kInvalidArgument, {"tp 65", "64"}));
  EXPECT_TRUE(plan_shards(big, uniform_weight_types(big, DType::kF16), {.tp = 64}).ok());
}

// Heads move in units whose o columns are whole blocks: 4 heads of 48 with Q8_0 o (blocks of 32)
// move in pairs (96 columns), so TP 2 works and TP 3 has fewer units than ranks.
TEST(ShardPlanErrors, FewerHeadUnitsThanRanks) {
  const ModelConfig c = small_config();
  const WeightTypes q8 = uniform_weight_types(c, DType::kQ8_0);
  auto two = plan_shards(c, q8, {.tp = 2});
  ASSERT_TRUE(two.ok()) << two.status().to_string();
  check_plan(c, q8, {.tp = 2}, *two);
  EXPECT_TRUE(fails_with(plan_shards(c, q8, {.tp = 3}), StatusCode::kInvalidArgument,
                         {"tp 3", "Q8_0", "blocks of 32 columns", "units of 2 heads (96 columns, head_dim 48)",
                          "4 heads make 2 units", "use tp <= 2"}));
  EXPECT_TRUE(fails_with(plan_shards(c, q8, {.tp = 4}), StatusCode::kInvalidArgument, {"tp 4", "use tp <= 2"}));
  // Only the o weights matter: everything else Q8_0 and o F16 splits anywhere.
  WeightTypes o_f16 = q8;
  for (LayerWeightTypes& l : o_f16.layers) l.o = DType::kF16;
  auto plan = plan_shards(c, o_f16, {.tp = 3});
  ASSERT_TRUE(plan.ok()) << plan.status().to_string();
  check_plan(c, o_f16, {.tp = 3}, *plan);
  // One Q8_0 o among F16 ones is enough to move heads in pairs.
  WeightTypes one = o_f16;
  one.layers[2].o = DType::kQ8_0;
  EXPECT_TRUE(fails_with(plan_shards(c, one, {.tp = 3}), StatusCode::kInvalidArgument, {"units of 2 heads"}));
}

// Every Qwen2.5 / Qwen3 dense size, TP 2 to 8, in every weight format and llama.cpp's mixes: the
// plan either holds every invariant (o and down splits on their blocks, heads in whole units,
// every head, FFN row and vocab row once) or says which TP works, and that TP does.
TEST(ShardPlan, AlignedSplitsForEverySizeTpAndFormat) {
  std::vector<ModelConfig> shapes;
  for (std::string_view size : model::qwen2_5_sizes()) shapes.push_back(model::qwen2_5_config(size));
  for (std::string_view size : model::qwen3_sizes()) shapes.push_back(model::qwen3_config(size));
  int planned = 0, refused = 0, requantized = 0;
  for (const ModelConfig& c : shapes) {
    std::vector<std::pair<std::string, WeightTypes>> formats;
    for (const WeightRecipe r : {WeightRecipe::kF16, WeightRecipe::kBF16, WeightRecipe::kQ8_0, WeightRecipe::kQ4_0,
                                 WeightRecipe::kQ4_K_M, WeightRecipe::kAwqInt4}) {
      formats.emplace_back(std::string(recipe_name(r)), recipe_weight_types(c, r));
    }
    for (const DType t : {DType::kQ5_0, DType::kQ4_K, DType::kQ6_K}) {
      formats.emplace_back(std::string(hal::dtype_name(t)), uniform_weight_types(c, t));
    }
    for (const auto& [format, types] : formats) {
      if (!plan_shards(c, types, {.tp = 1}).ok()) continue;  // the shape cannot be stored so (K-quants of 896 columns)
      for (int tp = 2; tp <= 8; ++tp) {
        SCOPED_TRACE(fmt::format("{} {} tp {}", c.name, format, tp));
        auto plan = plan_shards(c, types, {.tp = tp});
        if (plan.ok()) {
          check_plan(c, types, {.tp = tp}, *plan);
          ++planned;
          continue;
        }
        ++refused;
        const std::string m = plan.status().message();
        const std::size_t at = m.find("use tp <= ");
        ASSERT_NE(at, std::string::npos) << m;
        const int largest = std::stoi(m.substr(at + 10));
        ASSERT_LT(largest, tp) << m;
        auto smaller = plan_shards(c, types, {.tp = largest});
        EXPECT_TRUE(smaller.ok()) << m << " / tp " << largest << ": " << smaller.status().to_string();
        // The way out the message names: o / down re-quantised to Q8_0 at load, and then the plan
        // holds every invariant for the formats the ranks hold.
        EXPECT_NE(m.find("--requantize-unaligned"), std::string::npos) << m;
        auto redo = plan_shards(c, types, {.tp = tp, .requantize_unaligned = true});
        ASSERT_TRUE(redo.ok()) << redo.status().to_string();
        EXPECT_NE(redo->requantized.find("-> Q8_0 at load"), std::string::npos) << redo->requantized;
        check_plan(c, redo->types, {.tp = tp}, *redo);
        EXPECT_EQ(redo->model_weight_bytes, model_bytes(c, types));
        std::printf("%s %s tp %d: %s\n", c.name.c_str(), format.c_str(), tp, redo->requantized.c_str());
        ++requantized;
      }
    }
  }
  std::printf("aligned plans: %d planned, %d refused naming a tp that works, %d of them planned re-quantised\n",
              planned, refused, requantized);
  EXPECT_EQ(requantized, refused);
  EXPECT_GT(planned, 500);
}

TEST(ShardPlanErrors, FfnUnits) {
  ModelConfig c = small_config();
  c.ffn = 100;  // not a multiple of 32
  EXPECT_TRUE(fails_with(plan_shards(c, uniform_weight_types(c, DType::kQ8_0), {.tp = 2}), StatusCode::kInvalidArgument,
                         {"FFN size 100", "32"}));
  EXPECT_TRUE(plan_shards(c, uniform_weight_types(c, DType::kF16), {.tp = 2}).ok());  // unit 1
  c.ffn = 64;  // 2 units of 32
  EXPECT_TRUE(plan_shards(c, uniform_weight_types(c, DType::kQ8_0), {.tp = 2}).ok());
  EXPECT_TRUE(fails_with(plan_shards(c, uniform_weight_types(c, DType::kQ8_0), {.tp = 4}), StatusCode::kInvalidArgument,
                         {"tp 4", "2 units of 32"}));
}

TEST(ShardPlanErrors, VocabTypesAndKvFormat) {
  ModelConfig c = small_config();
  c.vocab = 2;
  EXPECT_TRUE(fails_with(plan_shards(c, uniform_weight_types(c, DType::kF16), {.tp = 3}), StatusCode::kInvalidArgument,
                         {"tp 3", "2 rows"}));
  c = small_config();
  WeightTypes w = uniform_weight_types(c, DType::kF16);
  w.layers.pop_back();
  EXPECT_TRUE(fails_with(plan_shards(c, w, {}), StatusCode::kInvalidArgument, {"2 layers", "has 3"}));
  EXPECT_TRUE(fails_with(plan_shards(c, uniform_weight_types(c, DType::kF16), {.kv_dtype = DType::kQ8_0}),
                         StatusCode::kInvalidArgument, {"q8_0"}));
  c.hidden = 200;  // Q8_0 rows of 200 are not whole blocks
  c.n_heads = 4;
  EXPECT_TRUE(fails_with(plan_shards(c, uniform_weight_types(c, DType::kQ8_0), {}), StatusCode::kInvalidArgument,
                         {"200 input columns"}));
  c = small_config();
  c.n_kv_heads = 3;
  EXPECT_TRUE(fails_with(plan_shards(c, uniform_weight_types(c, DType::kF16), {}), StatusCode::kInvalidArgument,
                         {"4 query heads", "3 KV heads"}));
}

// ---- GGUF ----

TEST(ShardPlan, WeightTypesFromAGgufFileAndItsBytes) {
  for (bool tied : {false, true}) {
    for (DType t : {DType::kF16, DType::kQ8_0}) {
      model::RandomModelSpec spec;
      spec.config = model::testing::tiny_qwen2_config(320, tied);
      spec.weight_type = t;
      model::GgufWriter writer;
      ASSERT_TRUE(model::add_random_model(spec, writer).ok());
      auto bytes = writer.to_bytes();
      ASSERT_TRUE(bytes.ok());
      auto file = model::testing::parse_bytes(*bytes);
      ASSERT_TRUE(file.ok()) << file.status().to_string();
      auto config = model::model_config_from_gguf(**file);
      ASSERT_TRUE(config.ok());
      auto types = weight_types_from_source(**file, *config);
      ASSERT_TRUE(types.ok()) << types.status().to_string();
      const WeightTypes want = uniform_weight_types(*config, t);
      EXPECT_EQ(types->token_embd, want.token_embd);
      if (!tied) {
        EXPECT_EQ(types->output, want.output);
      }
      EXPECT_EQ(types->layers, want.layers);
      std::uint64_t file_bytes = 0;
      for (const model::TensorInfo& info : (*file)->tensors()) file_bytes += info.n_bytes;
      auto one = plan_shards(*config, *types, {});
      ASSERT_TRUE(one.ok());
      EXPECT_EQ(one->ranks[0].weight_bytes, file_bytes);
      auto two = plan_shards(*config, *types, {.tp = 2});
      ASSERT_TRUE(two.ok()) << two.status().to_string();
      check_plan(*config, *types, {.tp = 2}, *two);
    }
  }
}

TEST(ShardPlan, WeightTypesFromGgufNameAMissingTensor) {
  model::RandomModelSpec spec;
  spec.config = model::testing::tiny_qwen2_config(320, false);
  model::GgufWriter writer;
  ASSERT_TRUE(model::add_random_model(spec, writer).ok());
  auto bytes = writer.to_bytes();
  ASSERT_TRUE(bytes.ok());
  auto file = model::testing::parse_bytes(*bytes);
  ASSERT_TRUE(file.ok());
  ModelConfig more = spec.config;
  more.n_layers = 3;
  EXPECT_TRUE(fails_with(weight_types_from_source(**file, more), StatusCode::kNotFound, {"blk.2.attn_q.weight"}));
}

// A file of llama.cpp K-quant tensors (Q4_K, Q6_K for ffn_down): `sextant plan` sizes it and the
// loader's check accepts it (issue 6: every GGML block format loads).
TEST(ShardPlan, KQuantGgufIsSizedAndLoadable) {
  ModelConfig c = model::testing::tiny_qwen2_config(320, false);
  c.hidden = 256;
  c.head_dim = 64;  // 4 heads x 64 = 256
  c.ffn = 512;
  model::GgufWriter w;
  model::set_model_config_metadata(w, c);
  for (const model::ExpectedTensor& t : model::expected_tensors(c)) {
    std::uint32_t ggml = static_cast<std::uint32_t>(model::GgmlType::kF32);
    std::uint64_t bytes = 4;
    for (std::int64_t d : t.dims) bytes *= static_cast<std::uint64_t>(d);
    if (t.dims.size() == 2) {
      const bool down = t.name.find("ffn_down") != std::string::npos;
      ggml = static_cast<std::uint32_t>(down ? model::GgmlType::kQ6_K : model::GgmlType::kQ4_K);
      bytes = static_cast<std::uint64_t>(t.dims[1]) * hal::row_bytes(down ? DType::kQ6_K : DType::kQ4_K, t.dims[0]);
    }
    ASSERT_TRUE(w.add_tensor(t.name, t.dims, ggml, std::vector<std::uint8_t>(bytes)).ok()) << t.name;
  }
  auto bytes = w.to_bytes();
  ASSERT_TRUE(bytes.ok()) << bytes.status().to_string();
  auto file = model::testing::parse_bytes(*bytes, "k.gguf");
  ASSERT_TRUE(file.ok()) << file.status().to_string();
  auto config = model::model_config_from_gguf(**file);
  ASSERT_TRUE(config.ok()) << config.status().to_string();
  ASSERT_TRUE(model::check_model_tensors(**file, *config).ok());
  EXPECT_TRUE(weight_types_from_source(**file, *config).ok());
  auto types = weight_types_from_source(**file, *config, WeightTypeCheck::kSized);
  ASSERT_TRUE(types.ok()) << types.status().to_string();
  EXPECT_EQ(types->token_embd, DType::kQ4_K);
  EXPECT_EQ(types->layers[1].q, DType::kQ4_K);
  EXPECT_EQ(types->layers[1].down, DType::kQ6_K);
  std::uint64_t file_bytes = 0;
  for (const model::TensorInfo& info : (*file)->tensors()) file_bytes += info.n_bytes;
  auto plan = plan_shards(*config, *types, {});
  ASSERT_TRUE(plan.ok()) << plan.status().to_string();
  EXPECT_EQ(plan->ranks[0].weight_bytes, file_bytes);
  EXPECT_EQ(plan->model_weight_bytes, file_bytes);
  EXPECT_EQ(plan->ffn_unit, 256);  // Q6_K down: FFN rows split in whole 256-blocks
}

// ---- the table ----

TEST(ShardPlan, FormatShowsEveryRankAndTheLegend) {
  const ModelConfig c = model::qwen2_5_config("72b");
  auto plan = plan_shards(c, uniform_weight_types(c, DType::kF16), {.tp = 6});
  ASSERT_TRUE(plan.ok());
  const std::string text = format_plan(*plan, c);
  for (std::string_view s : {"0-9 (10)", "10-20 (11)", "21-31 (11)", "32-41 (10)", "42-52 (11)", "53-63 (11)",
                             "0-1 (2) *1", "1-2 (2) *1 *2", "4-5 (2) *5", "0-4927 (4928)", "126720-152063 (25344)",
                             "0-79 (80)", "160.00 KiB", "total", "*N", "vocab rows"}) {
    EXPECT_NE(text.find(s), std::string::npos) << s << "\n" << text;
  }
  // One line per rank between the header and the totals, all the same width.
  std::vector<std::string> lines;
  for (std::size_t p = 0, q; p < text.size(); p = q + 1) {
    q = text.find('\n', p);
    lines.push_back(text.substr(p, q - p));
  }
  ASSERT_GE(lines.size(), 8u);
  EXPECT_EQ(lines[0].rfind("rank", 0), 0u) << lines[0];
  for (int i = 1; i <= 6; ++i) EXPECT_EQ(lines[static_cast<std::size_t>(i)].size(), lines[0].size()) << lines[i];
  EXPECT_EQ(lines[7].rfind("total", 0), 0u) << lines[7];

  // A single-rank plan has no replicas and no '*'.
  auto single = plan_shards(c, uniform_weight_types(c, DType::kF16), {});
  ASSERT_TRUE(single.ok());
  EXPECT_EQ(format_plan(*single, c).find('*'), std::string::npos);
}

TEST(ShardPlan, FormatMarksStagesWithoutVocabRows) {
  const ModelConfig c = model::qwen2_5_config("7b");
  auto plan = plan_shards(c, uniform_weight_types(c, DType::kQ8_0), {.tp = 2, .pp = 3});
  ASSERT_TRUE(plan.ok());
  const std::string text = format_plan(*plan, c);
  for (std::string_view s : {"0-8 (9)", "9-17 (9)", "18-27 (10)", "stage 0 holds", "stage 2"}) {
    EXPECT_NE(text.find(s), std::string::npos) << s << "\n" << text;
  }
  // Ranks 2 and 3 (stage 1) hold neither the embedding nor the LM head.
  std::size_t line_start = 0;
  for (int i = 0; i < 3; ++i) line_start = text.find('\n', line_start) + 1;  // the header, ranks 0 and 1
  const std::string rank2 = text.substr(line_start, text.find('\n', line_start) - line_start);
  EXPECT_NE(rank2.find("  -  "), std::string::npos) << rank2;
  EXPECT_EQ(rank2.find("(76032)"), std::string::npos) << rank2;
}

// Issue 40 item 3: a mixture of experts splits whole experts over the ranks (expert parallelism),
// unevenly where they do not divide: Qwen3-30B-A3B's 128 experts on 6 ranks are 22, 22, 21, 21, 21,
// 21, every expert on exactly one rank; the router is on every rank; attention keeps its uneven head
// split (32 / 4 heads). A rank's bytes are its experts' plus its attention's.
TEST(ShardPlan, ExpertsSplitWholeAndUnevenlyAcrossRanks) {
  const ModelConfig c = *model::find_qwen3moe_config("30b-a3b");
  const WeightTypes w = recipe_weight_types(c, WeightRecipe::kQ4_K_M);
  auto plan = plan_shards(c, w, {.tp = 6});
  ASSERT_TRUE(plan.ok()) << plan.status().to_string();
  std::vector<std::int64_t> counts;
  std::int64_t next = 0;
  for (const RankPlan& r : plan->ranks) {
    EXPECT_EQ(r.experts.begin, next);
    next = r.experts.end;
    counts.push_back(r.experts.size());
  }
  EXPECT_EQ(next, 128);
  EXPECT_EQ(counts, (std::vector<std::int64_t>{22, 22, 21, 21, 21, 21}));
  // Every rank holds its experts' matrices whole and the whole router of every layer.
  const std::uint64_t expert = hal::tensor_bytes(w.layers[0].gate, c.expert_ffn, c.hidden) +
                               hal::tensor_bytes(w.layers[0].up, c.expert_ffn, c.hidden);
  EXPECT_GT(plan->ranks[0].weight_bytes, plan->ranks[3].weight_bytes);  // one expert more (and no fewer heads)
  EXPECT_GT(plan->ranks[0].weight_bytes, 22 * 48 * expert);
  EXPECT_GT(plan->model_weight_bytes, 128ull * 48 * expert);
  // The 235B: 128 experts on 4 ranks are 32 each; more ranks than experts is refused by name.
  const ModelConfig big = *model::find_qwen3moe_config("235b-a22b");
  auto four = plan_shards(big, recipe_weight_types(big, WeightRecipe::kQ4_K_M), {.tp = 4});
  ASSERT_TRUE(four.ok()) << four.status().to_string();
  for (const RankPlan& r : four->ranks) EXPECT_EQ(r.experts.size(), 32);
  ModelConfig few = c;
  few.n_experts = 4;
  few.n_experts_used = 2;
  EXPECT_TRUE(fails_with(plan_shards(few, recipe_weight_types(few, WeightRecipe::kF16), {.tp = 6}),
                         StatusCode::kInvalidArgument, {"tp 6", "4 experts", "tp <= 4"}));
}

// Issue 40 item 4: the active bytes of a decode token. Qwen3-30B-A3B's published 3.3B active
// parameters, less its 0.31B-parameter embedding table (a token reads one row), at Q4_K_M's 4.5 to
// 6.6 bits per weight (Q4_K / Q6_K): between 1.6 and 2.4 GiB; and every expert used is every byte
// but the table's other rows. `plan` says it.
TEST(ShardPlan, ADecodeTokenReadsTheUsedExpertsAndOneEmbeddingRow) {
  const ModelConfig c = *model::find_qwen3moe_config("30b-a3b");
  const WeightTypes w = recipe_weight_types(c, WeightRecipe::kQ4_K_M);
  auto plan = plan_shards(c, w, {.tp = 6});
  ASSERT_TRUE(plan.ok()) << plan.status().to_string();
  const double gib = static_cast<double>(active_weight_bytes_per_token(c, w, plan->model_weight_bytes)) / (1u << 30);
  EXPECT_GT(gib, 1.6);
  EXPECT_LT(gib, 2.4);
  ModelConfig all = c;
  all.n_experts_used = all.n_experts;
  const std::uint64_t table = hal::tensor_bytes(w.token_embd, c.vocab, c.hidden);
  EXPECT_EQ(active_weight_bytes_per_token(all, w, plan->model_weight_bytes),
            plan->model_weight_bytes - table + hal::row_bytes(w.token_embd, c.hidden));
  EXPECT_EQ(idle_expert_bytes(*model::find_qwen3_config("8b"), uniform_weight_types(*model::find_qwen3_config("8b"),
                                                                                    hal::DType::kF16)),
            0u);
  const std::string text = format_plan(*plan, c);
  EXPECT_NE(text.find(fmt::format("A decode token reads {:.2f} GiB", gib)), std::string::npos) << text;
  EXPECT_NE(text.find("8 of the 128 experts of each layer"), std::string::npos) << text;
}

}  // namespace
}  // namespace sx::parallel
