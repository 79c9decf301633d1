// backends/cuda/launch_plan.h: the matmul path and its chunking, grid shapes, the op keys graphs
// are cached by, and the graph cache's decisions (capture on the second identical sequence,
// replay after, eager for prefill-sized sequences, LRU eviction, refusal after a failed capture),
// and moe_ffn's workspace layout.
#include "backends/cuda/launch_plan.h"

#include <string>
#include <tuple>

#include <gtest/gtest.h>

namespace sx::cuda {
namespace {

TEST(MatmulPlan, DecodeSizedProductsAreGemvPrefillIsChunkedSgemm) {
  const MatmulPlan d = plan_matmul(hal::DType::kBF16, 1, 18944, 3584, 64 << 20);
  EXPECT_EQ(d.path, MatmulPath::kGemv);
  EXPECT_EQ(d.rows_per_block * 32, d.threads);       // one warp per output row
  EXPECT_EQ(d.blocks, (18944 + d.rows_per_block - 1) / d.rows_per_block);
  EXPECT_EQ(plan_matmul(hal::DType::kQ4_K, kMaxGemvRows, 896, 4864, 1 << 20).path, MatmulPath::kGemv);

  const MatmulPlan p = plan_matmul(hal::DType::kQ4_K, kMaxGemvRows + 1, 18944, 3584, 64 << 20);
  EXPECT_EQ(p.path, MatmulPath::kGemm);
  // 64 MiB of F32 rows of 3584: 4681 rows, rounded down to a multiple of 64.
  EXPECT_EQ(p.chunk_rows, 4672);
  EXPECT_LE(static_cast<std::size_t>(p.chunk_rows) * 3584 * 4, std::size_t{64} << 20);
  // A matrix smaller than the workspace is one chunk; F32 weights need none.
  EXPECT_EQ(plan_matmul(hal::DType::kQ8_0, 512, 896, 896, 64 << 20).chunk_rows, 896);
  EXPECT_EQ(plan_matmul(hal::DType::kF32, 512, 896, 896, 64 << 20).chunk_rows, 0);
  // A workspace of fewer than 64 rows still takes at least one row a chunk.
  EXPECT_EQ(plan_matmul(hal::DType::kF16, 16, 100, 1000, 4000 * 10).chunk_rows, 10);
  EXPECT_EQ(plan_matmul(hal::DType::kF16, 16, 100, 1000, 100).chunk_rows, 1);
  EXPECT_EQ(min_workspace_bytes(3584), 3584u * 4);
}

TEST(MatmulPlan, Q8ActivationRowsPerPassFitTheWorkspace) {
  // A row of 3584 activations: 3584 int8 + 112 F32 scales = 4032 bytes.
  EXPECT_EQ(q8_rows_per_pass(3584, 64 << 20), (64 << 20) / 4032);
  EXPECT_EQ(q8_rows_per_pass(3584, 4031), 0);
  EXPECT_EQ(q8_rows_per_pass(32, std::size_t{1} << 40), kMaxQ8RowsPerPass);
  EXPECT_EQ(q8_rows_per_pass(0, 1 << 20), 0);
}

TEST(LaunchShape, GridBlocksCoverEveryItemAndStayWithinTheGrid) {
  EXPECT_EQ(grid_blocks(0, 256), 1);
  EXPECT_EQ(grid_blocks(1, 256), 1);
  EXPECT_EQ(grid_blocks(256, 256), 1);
  EXPECT_EQ(grid_blocks(257, 256), 2);
  EXPECT_EQ(grid_blocks(std::int64_t{1} << 50, 1), kMaxGridX);
}

TEST(AttentionPlan, DecodeSplitsLongContextsPrefillDoesNot) {
  // 7B at batch 1 (28 heads, 4 KV heads: 4 blocks) on 132 multiprocessors, a 4096-position bound:
  // 66 splits wanted (264 blocks), 16 allowed by the context: 16 splits of 256 positions.
  const AttentionPlan d = plan_attention(1, 28, 4, 128, 4096, 132, 2 << 20);
  EXPECT_EQ(d.splits, 16);
  EXPECT_EQ(d.chunk, 256);
  // 5000 positions: 19 splits of 264 rounded up to 288 (a multiple of the tile), 18 of them needed.
  const AttentionPlan odd = plan_attention(1, 28, 4, 128, 5000, 132, 2 << 20);
  EXPECT_EQ(odd.chunk % kAttentionTile, 0);
  EXPECT_EQ(odd.chunk, 288);
  EXPECT_EQ(odd.splits, 18);
  EXPECT_GE(odd.splits * odd.chunk, 5000);
  EXPECT_LT((odd.splits - 1) * odd.chunk, 5000);  // no split lies wholly past the bound
  // Prefill: blocks enough already.
  EXPECT_EQ(plan_attention(512, 28, 4, 128, 4096, 132, 2 << 20).splits, 1);
  // Short contexts are not split; nor where the partials (per query head) would not fit.
  EXPECT_EQ(plan_attention(1, 28, 4, 128, 256, 132, 2 << 20).splits, 1);
  EXPECT_EQ(plan_attention(1, 28, 4, 128, 4096, 132, 28 * 130).splits, 1);
  const AttentionPlan tight = plan_attention(1, 28, 4, 128, 4096, 132, 3 * 28 * 130);
  EXPECT_EQ(tight.splits, 3);
  EXPECT_EQ(tight.chunk, 1376);
  // Very long contexts: at most kMaxSplits.
  EXPECT_LE(plan_attention(1, 1, 1, 128, 1 << 20, 132, 64 << 20).splits, kMaxSplits);
  // Nothing to do: no split.
  EXPECT_EQ(plan_attention(0, 28, 4, 128, 4096, 132, 2 << 20).splits, 1);
}

hal::MatmulArgs matmul(hal::Buffer* w, std::int64_t m) {
  hal::MatmulArgs a;
  a.w = {w, 0};
  a.w_type = hal::DType::kQ8_0;
  a.m = m;
  a.n = 896;
  a.k = 896;
  return a;
}

// moe_ffn's workspace: routes, counts, gate, up and down outputs in that order, each aligned and
// large enough, none overlapping; Qwen3-30B-A3B's prefill of 512 tokens on one rank of 22 experts.
TEST(MoeWorkspace, PartsAreAlignedLargeEnoughAndApart) {
  for (const auto& [T, k, H, F, n] : {std::tuple<std::int64_t, std::int64_t, std::int64_t, std::int64_t, std::int64_t>{
                                          1, 8, 2048, 768, 128},
                                      {512, 8, 2048, 768, 22},
                                      {3, 2, 64, 32, 1},
                                      {7, 4, 256, 64, 0}}) {
    const MoeWorkspace w = plan_moe_workspace(T, k, H, F, n);
    const std::size_t slots = static_cast<std::size_t>(T * k);
    const std::pair<std::size_t, std::size_t> parts[] = {{w.routes, static_cast<std::size_t>(n * T) * 4},
                                                         {w.counts, static_cast<std::size_t>(n) * 4},
                                                         {w.gate, slots * F * 4},
                                                         {w.up, slots * F * 4},
                                                         {w.down, slots * H * 4}};
    for (std::size_t i = 0; i < std::size(parts); ++i) {
      EXPECT_EQ(parts[i].first % kMoeAlign, 0u) << i;
      const std::size_t end = i + 1 < std::size(parts) ? parts[i + 1].first : w.bytes;
      EXPECT_GE(end, parts[i].first + parts[i].second) << "part " << i << " of T " << T << ", " << n << " experts";
    }
  }
  EXPECT_GE(plan_moe_workspace(512, 8, 2048, 768, 22).bytes, std::size_t{512} * 8 * (2 * 768 + 2048) * 4);
}

TEST(OpKey, EqualOpsHaveEqualKeysAndEveryFieldCounts) {
  auto* b1 = reinterpret_cast<hal::Buffer*>(0x1000);
  auto* b2 = reinterpret_cast<hal::Buffer*>(0x2000);
  auto key = [](const hal::Op& op) {
    std::string k;
    append_op_key(k, op);
    return k;
  };
  EXPECT_EQ(key(matmul(b1, 1)), key(matmul(b1, 1)));
  EXPECT_NE(key(matmul(b1, 1)), key(matmul(b1, 2)));  // another batch size
  EXPECT_NE(key(matmul(b1, 1)), key(matmul(b2, 1)));  // another buffer
  hal::MatmulArgs off = matmul(b1, 1);
  off.x.offset = 64;
  EXPECT_NE(key(matmul(b1, 1)), key(off));
  hal::AttentionArgs a1, a2;
  a1.max_blocks_per_seq = 4;
  a2.max_blocks_per_seq = 5;
  EXPECT_NE(key(a1), key(a2));
  a2 = a1;
  a2.scale = 0.5f;
  EXPECT_NE(key(a1), key(a2));
  // Ops of different kinds never share a key, even with equal fields.
  EXPECT_NE(key(hal::AddArgs{}), key(hal::SiluMulArgs{}));
  EXPECT_EQ(op_tokens(matmul(b1, 7)), 7);
  hal::AttentionArgs at;
  at.n_tokens = 300;
  EXPECT_EQ(op_tokens(at), 300);
}

using A = GraphCache::Action;

TEST(GraphCache, CapturesTheSecondIdenticalSequenceAndReplaysItAfter) {
  GraphCache c(GraphPolicy{});
  EXPECT_EQ(c.decide("step-b1", 1).action, A::kEager);
  const auto cap = c.decide("step-b1", 1);
  ASSERT_EQ(cap.action, A::kCapture);
  EXPECT_FALSE(cap.evict.has_value());
  for (int i = 0; i < 3; ++i) {
    const auto r = c.decide("step-b1", 1);
    EXPECT_EQ(r.action, A::kReplay);
    EXPECT_EQ(r.id, cap.id);
  }
  // Another batch size is another sequence: its own graph, the first one kept.
  EXPECT_EQ(c.decide("step-b2", 2).action, A::kEager);
  EXPECT_EQ(c.decide("step-b2", 2).action, A::kCapture);
  EXPECT_EQ(c.decide("step-b1", 1).action, A::kReplay);
  EXPECT_EQ(c.graphs(), 2u);
}

TEST(GraphCache, PrefillSizedOrDisabledSequencesRunEagerly) {
  GraphCache c(GraphPolicy{});
  for (int i = 0; i < 4; ++i) EXPECT_EQ(c.decide("prefill", 65).action, A::kEager);
  EXPECT_EQ(c.decide("", 1).action, A::kEager);
  GraphPolicy off;
  off.enabled = false;
  GraphCache d(off);
  for (int i = 0; i < 4; ++i) EXPECT_EQ(d.decide("step", 1).action, A::kEager);
  EXPECT_EQ(d.graphs(), 0u);
}

TEST(GraphCache, EvictsTheLeastRecentlyUsedGraphPastTheLimit) {
  GraphPolicy p;
  p.max_graphs = 2;
  p.capture_after = 0;
  GraphCache c(p);
  const auto a = c.decide("a", 1), b = c.decide("b", 1);
  ASSERT_EQ(a.action, A::kCapture);
  ASSERT_EQ(b.action, A::kCapture);
  EXPECT_EQ(c.decide("a", 1).action, A::kReplay);  // a is now the most recent
  const auto d = c.decide("d", 1);
  ASSERT_EQ(d.action, A::kCapture);
  ASSERT_TRUE(d.evict.has_value());
  EXPECT_EQ(*d.evict, b.id);
  EXPECT_EQ(c.graphs(), 2u);
  EXPECT_EQ(c.decide("a", 1).action, A::kReplay);
}

TEST(GraphCache, ASequenceThatFailedToCaptureStaysEager) {
  GraphPolicy p;
  p.capture_after = 0;
  GraphCache c(p);
  const auto cap = c.decide("uncapturable", 1);
  ASSERT_EQ(cap.action, A::kCapture);
  c.forget(cap.id);
  EXPECT_EQ(c.graphs(), 0u);
  for (int i = 0; i < 3; ++i) EXPECT_EQ(c.decide("uncapturable", 1).action, A::kEager);
}

}  // namespace
}  // namespace sx::cuda
