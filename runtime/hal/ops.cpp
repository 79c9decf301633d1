// Op names and descriptions.
#include "runtime/hal/ops.h"

#include "runtime/hal/op_checks.h"

#include <tuple>

#include <fmt/format.h>

namespace sx::hal {

std::string_view op_name(const Op& op) {
  static constexpr std::string_view kNames[] = {"embedding", "rmsnorm", "matmul",   "rope",       "kv_write", "attention",
                                                "silu_mul",  "add",     "top_k",    "moe_router", "moe_ffn"};
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

}  // namespace sx::hal
