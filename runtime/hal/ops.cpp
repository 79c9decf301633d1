// Op names and descriptions.
#include "runtime/hal/ops.h"

#include "runtime/hal/op_checks.h"

#include <iterator>
#include <set>
#include <tuple>

#include <fmt/format.h>

namespace sx::hal {

std::string_view op_name(const Op& op) {
  static constexpr std::string_view kNames[] = {"embedding", "rmsnorm", "matmul",   "rope",       "kv_write", "attention",
                                                "silu_mul",  "add",     "top_k",    "moe_router", "moe_ffn",
                                                "conv_state", "delta_rule", "gated_norm", "sigmoid_mul"};
  static_assert(std::size(kNames) == std::variant_size_v<Op>);
  return kNames[op.index()];
}

namespace {

struct Describe {
  std::string operator()(const EmbeddingArgs& a) const {
    return fmt::format("embedding with a {} table [{} x {}]", dtype_name(a.table_type), a.vocab, a.dim);
  }
  std::string operator()(const RmsNormArgs& a) const { return fmt::format("rmsnorm of rows of {}", a.dim); }
  std::string operator()(const MatmulArgs& a) const {
    return fmt::format("matmul with {} weights [{} x {}]", dtype_name(a.w_type), a.n, a.k);
  }
  std::string operator()(const RopeArgs& a) const {
    return fmt::format("rope with head size {} (rotating {})", a.head_dim, a.rot_dim);
  }
  std::string operator()(const KvWriteArgs& a) const {
    return fmt::format("kv_write with head size {}, KV cache in {}", a.head_dim, dtype_name(a.cache_type));
  }
  std::string operator()(const AttentionArgs& a) const {
    return fmt::format("attention with head size {}, {} query heads per KV head, KV cache in {}", a.head_dim,
                       a.heads_per_kv, dtype_name(a.cache_type));
  }
  std::string operator()(const SiluMulArgs& a) const { return fmt::format("silu_mul of rows of {}", a.n_cols); }
  std::string operator()(const AddArgs&) const { return "add"; }
  std::string operator()(const TopKArgs& a) const { return fmt::format("top-{} over rows of {}", a.k, a.n_cols); }
  std::string operator()(const MoeRouterArgs& a) const {
    return fmt::format("moe_router choosing {} of {} experts", a.k, a.n_experts);
  }
  std::string operator()(const MoeFfnArgs& a) const {
    return fmt::format("moe_ffn with {} / {} / {} experts [{} x {}]", dtype_name(a.gate_type), dtype_name(a.up_type),
                       dtype_name(a.down_type), a.ffn, a.dim);
  }
  std::string operator()(const ConvStateArgs& a) const {
    return fmt::format("conv_state over {} channels with kernel {}", a.channels, a.kernel);
  }
  std::string operator()(const DeltaRuleArgs& a) const {
    return fmt::format("delta_rule with {} K heads of {} and {} V heads of {}, {} form", a.n_k_heads, a.d_k,
                       a.n_v_heads, a.d_v, a.chunk > 0 ? "chunked" : "recurrent");
  }
  std::string operator()(const GatedNormArgs& a) const { return fmt::format("gated_norm of rows of {}", a.dim); }
  std::string operator()(const SigmoidMulArgs& a) const { return fmt::format("sigmoid_mul of rows of {}", a.n_cols); }
};

}  // namespace

std::string describe_op(const Op& op) { return std::visit(Describe{}, op); }

Status check_moe_ffn(const MoeFfnArgs& a) {
  if (a.n_tokens < 0 || a.dim <= 0 || a.ffn <= 0 || a.k < 1 || a.k > kMaxTopK || a.n_local < 0 || a.expert_begin < 0 ||
      a.expert_begin + a.n_local > INT32_MAX) {
    return invalid_argument_error("moe_ffn: {} tokens of {}, experts of {} rows, k {}, {} local experts from {}",
                                  a.n_tokens, a.dim, a.ffn, a.k, a.n_local, a.expert_begin);
  }
  for (const auto& [type, cols, what] : {std::tuple{a.gate_type, a.dim, "gate"}, std::tuple{a.up_type, a.dim, "up"},
                                         std::tuple{a.down_type, a.ffn, "down"}}) {
    if (cols % dtype_info(type).block_elems != 0) {
      return invalid_argument_error("moe_ffn: {} experts' rows of {} are not whole {} blocks", what, cols,
                                    dtype_name(type));
    }
  }
  return ok_status();
}

Status check_conv_state(const ConvStateArgs& a) {
  const std::int64_t stride = a.x_stride ? a.x_stride : a.channels;
  if (a.n_seqs < 0 || a.n_tokens < 0 || a.channels <= 0 || a.kernel < 2 || a.kernel > kMaxConvKernel ||
      a.n_slots < 0 || stride < a.channels) {
    return invalid_argument_error("conv_state: {} sequences, {} tokens, {} channels (rows of {}), kernel {} (2 to {}), "
                                  "{} state slots",
                                  a.n_seqs, a.n_tokens, a.channels, stride, a.kernel, kMaxConvKernel, a.n_slots);
  }
  return ok_status();
}

Status check_delta_rule(const DeltaRuleArgs& a) {
  const std::int64_t qkv = 2 * a.n_k_heads * a.d_k + a.n_v_heads * a.d_v;
  const std::int64_t qkv_stride = a.qkv_stride ? a.qkv_stride : qkv;
  const std::int64_t gate_stride = a.gate_stride ? a.gate_stride : a.n_v_heads;
  if (a.n_seqs < 0 || a.n_tokens < 0 || a.n_k_heads <= 0 || a.n_v_heads <= 0 || a.n_v_heads % a.n_k_heads != 0 ||
      a.d_k <= 0 || a.d_v <= 0 || a.d_k > kMaxDeltaHeadDim || a.d_v > kMaxDeltaHeadDim || a.n_slots < 0 ||
      a.chunk < 0 || a.chunk > kMaxDeltaChunk || qkv_stride < qkv || gate_stride < a.n_v_heads) {
    return invalid_argument_error("delta_rule: {} sequences, {} tokens, {} K heads of {}, {} V heads of {} (a multiple "
                                  "of the K heads; heads of at most {}), rows of {} and {}, chunk {} (at most {}), "
                                  "{} state slots",
                                  a.n_seqs, a.n_tokens, a.n_k_heads, a.d_k, a.n_v_heads, a.d_v, kMaxDeltaHeadDim,
                                  qkv_stride, gate_stride, a.chunk, kMaxDeltaChunk, a.n_slots);
  }
  return ok_status();
}

Status check_state_batch(std::string_view op, const std::int32_t* seq_token_start, const std::int32_t* seq_context_len,
                         const std::int32_t* seq_slot, std::int64_t n_seqs, std::int64_t n_tokens,
                         std::int64_t n_slots) {
  if (n_seqs > 0 && (seq_token_start[0] != 0 || seq_token_start[n_seqs] != n_tokens)) {
    return invalid_argument_error("{}: seq_token_start must span [0, {}]", op, n_tokens);
  }
  std::set<std::int32_t> slots;
  for (std::int64_t s = 0; s < n_seqs; ++s) {
    const std::int64_t n_new = seq_token_start[s + 1] - seq_token_start[s];
    if (n_new < 0 || seq_context_len[s] < n_new) {
      return invalid_argument_error("{}: sequence {} has {} new tokens and context {}", op, s, n_new,
                                    seq_context_len[s]);
    }
    if (seq_slot[s] < 0 || seq_slot[s] >= n_slots) {
      return out_of_range_error("{}: sequence {} has state slot {} outside the pool of {}", op, s, seq_slot[s], n_slots);
    }
    if (!slots.insert(seq_slot[s]).second) {
      return invalid_argument_error("{}: state slot {} is given to two sequences", op, seq_slot[s]);
    }
  }
  return ok_status();
}

}  // namespace sx::hal
