// Host-side launch decisions of the CUDA backend (launch_plan.h).
#include "backends/cuda/launch_plan.h"

#include <algorithm>
#include <cstring>
#include <functional>
#include <type_traits>

namespace sx::cuda {

MatmulPlan plan_matmul(hal::DType w_type, std::int64_t m, std::int64_t n, std::int64_t k,
                       std::size_t workspace_bytes) {
  MatmulPlan p;
  if (m <= kMaxGemvRows) {
    p.path = MatmulPath::kGemv;
    p.threads = 128;  // 4 warps, one output row each
    p.rows_per_block = p.threads / 32;
    p.blocks = grid_blocks(n, p.rows_per_block);
    return p;
  }
  p.path = MatmulPath::kGemm;
  if (w_type == hal::DType::kF32) return p;  // SGEMM straight on the weights
  const std::size_t row = static_cast<std::size_t>(std::max<std::int64_t>(k, 1)) * sizeof(float);
  std::int64_t rows = static_cast<std::int64_t>(workspace_bytes / row);
  if (rows >= 64) rows = rows / 64 * 64;
  p.chunk_rows = std::clamp<std::int64_t>(rows, 1, std::max<std::int64_t>(n, 1));
  return p;
}

std::size_t min_workspace_bytes(std::int64_t k) { return static_cast<std::size_t>(std::max<std::int64_t>(k, 1)) * 4; }

std::int64_t q8_rows_per_pass(std::int64_t k, std::size_t workspace_bytes) {
  if (k <= 0) return 0;
  const auto row = static_cast<std::size_t>(k) + static_cast<std::size_t>(k / 32) * sizeof(float);
  return std::min<std::int64_t>(static_cast<std::int64_t>(workspace_bytes / row), kMaxQ8RowsPerPass);
}

std::int64_t grid_blocks(std::int64_t n, std::int64_t per_block) {
  if (n <= 0 || per_block <= 0) return 1;
  return std::clamp<std::int64_t>((n + per_block - 1) / per_block, 1, kMaxGridX);
}

AttentionPlan plan_attention(std::int64_t n_tokens, std::int64_t n_heads, std::int64_t n_kv_heads,
                             std::int64_t head_dim, std::int64_t ctx_bound, int multiprocessors,
                             std::size_t partial_floats) {
  AttentionPlan p;
  const std::int64_t blocks = n_tokens * n_kv_heads, states = n_tokens * n_heads;
  if (blocks <= 0 || states <= 0 || ctx_bound <= kMinSplitPositions || multiprocessors <= 0) return p;
  const std::int64_t want = (2 * static_cast<std::int64_t>(multiprocessors) + blocks - 1) / blocks;
  const std::int64_t by_ctx = ctx_bound / kMinSplitPositions;
  const auto by_space = static_cast<std::int64_t>(partial_floats / static_cast<std::size_t>(states * (head_dim + 2)));
  const std::int64_t splits = std::min({want, by_ctx, by_space, kMaxSplits});
  if (splits < 2) return p;
  std::int64_t chunk = (ctx_bound + splits - 1) / splits;
  chunk = (chunk + kAttentionTile - 1) / kAttentionTile * kAttentionTile;
  p.splits = (ctx_bound + chunk - 1) / chunk;  // rounding the chunk up may leave one split fewer
  p.chunk = p.splits > 1 ? chunk : 0;
  if (p.splits < 2) p.splits = 1;
  return p;
}

MoeWorkspace plan_moe_workspace(std::int64_t n_tokens, std::int64_t k, std::int64_t dim, std::int64_t ffn,
                                std::int64_t n_local) {
  const auto z = [](std::int64_t v) { return static_cast<std::size_t>(std::max<std::int64_t>(v, 0)); };
  const auto aligned = [](std::size_t b) { return (b + kMoeAlign - 1) / kMoeAlign * kMoeAlign; };
  const std::size_t slots = z(n_tokens) * z(k);
  MoeWorkspace w;
  w.routes = 0;
  w.counts = aligned(z(n_local) * z(n_tokens) * 4);
  w.gate = w.counts + aligned(z(n_local) * 4);
  w.up = w.gate + aligned(slots * z(ffn) * 4);
  w.down = w.up + aligned(slots * z(ffn) * 4);
  w.bytes = w.down + aligned(slots * z(dim) * 4);
  return w;
}

namespace {

void put(std::string& key, const void* p, std::size_t n) { key.append(static_cast<const char*>(p), n); }
template <typename T>
void put(std::string& key, const T& v) {
  static_assert(std::is_trivially_copyable_v<T> && !std::is_class_v<T>);
  put(key, &v, sizeof v);
}
void put(std::string& key, const hal::BufView& v) {
  put(key, static_cast<const void*>(v.buffer));
  put(key, v.offset);
}

}  // namespace

void append_op_key(std::string& key, const hal::Op& op) {
  put(key, static_cast<std::uint8_t>(op.index()));
  std::visit(
      [&](const auto& a) {
        using T = std::decay_t<decltype(a)>;
        if constexpr (std::is_same_v<T, hal::EmbeddingArgs>) {
          put(key, a.table), put(key, a.table_type), put(key, a.ids), put(key, a.out);
          put(key, a.n_tokens), put(key, a.dim), put(key, a.vocab), put(key, a.shard), put(key, a.vocab_offset);
        } else if constexpr (std::is_same_v<T, hal::RmsNormArgs>) {
          put(key, a.x), put(key, a.add), put(key, a.weight), put(key, a.out);
          put(key, a.n_rows), put(key, a.dim), put(key, a.eps);
        } else if constexpr (std::is_same_v<T, hal::MatmulArgs>) {
          put(key, a.w), put(key, a.w_type), put(key, a.x), put(key, a.bias), put(key, a.y);
          put(key, a.m), put(key, a.n), put(key, a.k);
        } else if constexpr (std::is_same_v<T, hal::RopeArgs>) {
          put(key, a.x), put(key, a.positions);
          put(key, a.n_tokens), put(key, a.n_heads), put(key, a.head_dim), put(key, a.rot_dim), put(key, a.theta);
        } else if constexpr (std::is_same_v<T, hal::KvWriteArgs>) {
          put(key, a.k), put(key, a.v), put(key, a.k_cache), put(key, a.v_cache), put(key, a.cache_type);
          put(key, a.slot_mapping);
          put(key, a.n_tokens), put(key, a.n_kv_heads), put(key, a.head_dim), put(key, a.n_slots);
        } else if constexpr (std::is_same_v<T, hal::AttentionArgs>) {
          put(key, a.q), put(key, a.k_cache), put(key, a.v_cache), put(key, a.cache_type), put(key, a.out);
          put(key, a.seq_token_start), put(key, a.seq_context_len), put(key, a.block_table);
          put(key, a.n_seqs), put(key, a.n_tokens), put(key, a.n_heads), put(key, a.n_kv_heads), put(key, a.head_dim);
          put(key, a.block_size), put(key, a.max_blocks_per_seq), put(key, a.n_slots);
          put(key, a.q_head_offset), put(key, a.kv_head_offset), put(key, a.heads_per_kv), put(key, a.scale);
        } else if constexpr (std::is_same_v<T, hal::SiluMulArgs>) {
          put(key, a.gate), put(key, a.up), put(key, a.out);
          put(key, a.n_rows), put(key, a.n_cols), put(key, a.gate_stride), put(key, a.up_stride), put(key, a.out_stride);
        } else if constexpr (std::is_same_v<T, hal::AddArgs>) {
          put(key, a.a), put(key, a.b), put(key, a.out), put(key, a.n);
        } else if constexpr (std::is_same_v<T, hal::TopKArgs>) {
          put(key, a.x), put(key, a.values), put(key, a.ids);
          put(key, a.n_rows), put(key, a.n_cols), put(key, a.k), put(key, a.id_offset);
        } else if constexpr (std::is_same_v<T, hal::MoeRouterArgs>) {
          put(key, a.logits), put(key, a.ids), put(key, a.weights);
          put(key, a.n_tokens), put(key, a.n_experts), put(key, a.k), put(key, a.normalize);
        } else if constexpr (std::is_same_v<T, hal::MoeFfnArgs>) {
          put(key, a.x), put(key, a.ids), put(key, a.weights), put(key, a.gate), put(key, a.up), put(key, a.down);
          put(key, a.gate_type), put(key, a.up_type), put(key, a.down_type), put(key, a.out);
          put(key, a.n_tokens), put(key, a.dim), put(key, a.ffn), put(key, a.k), put(key, a.expert_begin);
          put(key, a.n_local);
        } else if constexpr (std::is_same_v<T, hal::ConvStateArgs>) {
          put(key, a.x), put(key, a.weight), put(key, a.state), put(key, a.out);
          put(key, a.seq_token_start), put(key, a.seq_context_len), put(key, a.seq_slot);
          put(key, a.n_seqs), put(key, a.n_tokens), put(key, a.channels), put(key, a.kernel), put(key, a.n_slots);
          put(key, a.x_stride);
        } else if constexpr (std::is_same_v<T, hal::DeltaRuleArgs>) {
          put(key, a.q), put(key, a.k), put(key, a.v), put(key, a.alpha), put(key, a.beta), put(key, a.a);
          put(key, a.dt_bias), put(key, a.state), put(key, a.out);
          put(key, a.seq_token_start), put(key, a.seq_context_len), put(key, a.seq_slot);
          put(key, a.n_seqs), put(key, a.n_tokens), put(key, a.n_k_heads), put(key, a.n_v_heads), put(key, a.d_k);
          put(key, a.d_v), put(key, a.n_slots), put(key, a.qkv_stride), put(key, a.gate_stride), put(key, a.chunk);
          put(key, a.tiled), put(key, a.eps), put(key, a.scale);
        } else if constexpr (std::is_same_v<T, hal::GatedNormArgs>) {
          put(key, a.x), put(key, a.z), put(key, a.weight), put(key, a.out);
          put(key, a.n_rows), put(key, a.dim), put(key, a.eps);
        } else if constexpr (std::is_same_v<T, hal::SigmoidMulArgs>) {
          put(key, a.x), put(key, a.gate), put(key, a.out);
          put(key, a.n_rows), put(key, a.n_cols), put(key, a.x_stride), put(key, a.gate_stride), put(key, a.out_stride);
          put(key, a.gate_per_row);
        } else {
          static_assert(sizeof(T) == 0, "append_op_key: an op without a key");
        }
      },
      op);
}

std::int64_t op_tokens(const hal::Op& op) {
  return std::visit(
      [](const auto& a) -> std::int64_t {
        using T = std::decay_t<decltype(a)>;
        if constexpr (std::is_same_v<T, hal::MatmulArgs>) return a.m;
        else if constexpr (std::is_same_v<T, hal::AddArgs>) return 1;  // element count, not tokens
        else if constexpr (std::is_same_v<T, hal::RmsNormArgs> || std::is_same_v<T, hal::SiluMulArgs> ||
                           std::is_same_v<T, hal::TopKArgs> || std::is_same_v<T, hal::GatedNormArgs> ||
                           std::is_same_v<T, hal::SigmoidMulArgs>) return a.n_rows;
        else return a.n_tokens;
      },
      op);
}

GraphCache::Decision GraphCache::decide(const std::string& key, std::int64_t max_tokens) {
  Decision d;
  if (!policy_.enabled || max_tokens > policy_.max_tokens || key.empty()) return d;
  const std::size_t hash = std::hash<std::string>{}(key);
  const auto same = [&](const Entry& e) { return e.hash == hash && e.key == key; };
  for (auto it = lru_.begin(); it != lru_.end(); ++it) {
    if (same(*it)) {
      lru_.splice(lru_.begin(), lru_, it);
      d.action = Action::kReplay;
      d.id = lru_.front().id;
      return d;
    }
  }
  auto it = std::find_if(pending_.begin(), pending_.end(), same);
  if (it == pending_.end()) {
    pending_.push_front({key, hash, 0, 0, false});
    if (pending_.size() > 2 * policy_.max_graphs) pending_.pop_back();
    it = pending_.begin();
  } else {
    pending_.splice(pending_.begin(), pending_, it);
    it = pending_.begin();
  }
  if (it->refused) return d;
  if (it->seen < policy_.capture_after) {
    ++it->seen;
    return d;
  }
  if (policy_.max_graphs == 0) return d;
  if (lru_.size() >= policy_.max_graphs) {
    d.evict = lru_.back().id;
    lru_.pop_back();
  }
  Entry e = std::move(*it);
  pending_.erase(it);
  e.id = next_id_++;
  lru_.push_front(std::move(e));
  d.action = Action::kCapture;
  d.id = lru_.front().id;
  return d;
}

void GraphCache::forget(std::uint64_t id) {
  for (auto it = lru_.begin(); it != lru_.end(); ++it) {
    if (it->id == id) {
      Entry e = std::move(*it);
      lru_.erase(it);
      e.id = 0;
      e.refused = true;
      pending_.push_front(std::move(e));
      return;
    }
  }
}

}  // namespace sx::cuda
