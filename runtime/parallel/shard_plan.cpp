// The shard planner: head / KV-head / FFN / vocab / layer ranges per rank, their weight and KV
// bytes, and the table `sextant plan` prints. The rules are in shard_plan.h.
#include "runtime/parallel/shard_plan.h"

#include <algorithm>
#include <cctype>
#include <numeric>

#include <fmt/format.h>

#include "runtime/model/tensor_names.h"

namespace sx::parallel {

namespace {

constexpr int kMaxTp = 64;
constexpr std::uint64_t kF32Bytes = 4;

using hal::DType;

// Part i of n of [0, total): [floor(i * total / n), floor((i + 1) * total / n)).
Range even_part(std::int64_t total, int i, int n) {
  return {total * i / n, total * (i + 1) / n};
}

// Part i of n of [0, total) with the remainder on the first ranks: 128 on 6 is 22, 22, 21, 21, 21, 21.
Range front_part(std::int64_t total, int i, int n) {
  const std::int64_t base = total / n, extra = total % n;
  const std::int64_t begin = i * base + std::min<std::int64_t>(i, extra);
  return {begin, begin + base + (i < extra ? 1 : 0)};
}

std::int64_t block_of(DType t) { return hal::dtype_info(t).block_elems; }

// The format of one weight (o or down) with the largest block over the layers.
DType largest_block_type(const WeightTypes& types, DType LayerWeightTypes::*field) {
  DType worst = DType::kF32;
  for (const LayerWeightTypes& t : types.layers) {
    if (block_of(t.*field) > block_of(worst)) worst = t.*field;
  }
  return worst;
}

std::uint64_t matrix_bytes(DType t, std::int64_t rows, std::int64_t cols) {
  return static_cast<std::uint64_t>(rows) * hal::row_bytes(t, cols);
}

std::string upper_name(DType t) {
  std::string s(hal::dtype_name(t));
  for (char& c : s) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  return s;
}

// "blocks of 32 columns"
std::string block_words(DType t) {
  return fmt::format("blocks of {} column{}", block_of(t), block_of(t) == 1 ? "" : "s");
}

Status check_config(const model::ModelConfig& c) {
  const std::pair<std::string_view, std::int64_t> sizes[] = {
      {"layers", c.n_layers}, {"hidden", c.hidden}, {"heads", c.n_heads}, {"KV heads", c.n_kv_heads},
      {"head_dim", c.head_dim}, {"FFN size", c.ffn},  {"vocab", c.vocab},
  };
  for (const auto& [what, v] : sizes) {
    if (v < 1 || v > (std::int64_t{1} << 31)) {
      return invalid_argument_error("shard plan: the model's {} is {}; it must be in 1..2^31", what, v);
    }
  }
  if (c.n_heads % c.n_kv_heads != 0) {
    return invalid_argument_error("shard plan: {} query heads is not a multiple of {} KV heads", c.n_heads,
                                  c.n_kv_heads);
  }
  return ok_status();
}

// Every matrix's input dimension (the contiguous one) must be whole blocks of its format (down's,
// the FFN size, is checked against the split unit by plan_shards).
Status check_inner_dims(const model::ModelConfig& c, const WeightTypes& types) {
  struct Inner {
    std::string_view what;
    DType type;
    std::int64_t cols;
  };
  std::vector<Inner> checks = {{"token_embd", types.token_embd, c.hidden}};
  if (!c.tied_embeddings) checks.push_back({"output (LM head)", types.output, c.hidden});
  for (std::size_t l = 0; l < types.layers.size(); ++l) {
    const LayerWeightTypes& t = types.layers[l];
    if (c.is_recurrent(static_cast<std::int64_t>(l))) {
      checks.insert(checks.end(), {{"attn_qkv", t.qkv, c.hidden},
                                   {"attn_gate", t.z, c.hidden},
                                   {"ssm_alpha", t.alpha, c.hidden},
                                   {"ssm_beta", t.beta, c.hidden},
                                   {"ssm_out", t.ssm_out, c.ssm_inner()}});
    } else {
      checks.insert(checks.end(), {{"q", t.q, c.hidden}, {"k", t.k, c.hidden}, {"v", t.v, c.hidden},
                                   {"o", t.o, c.q_dim()}});
    }
    checks.insert(checks.end(), {{"gate", t.gate, c.hidden}, {"up", t.up, c.hidden}});
    if (c.is_moe()) checks.insert(checks.end(), {{"router", t.router, c.hidden}, {"down", t.down, c.expert_ffn}});
  }
  for (const Inner& i : checks) {
    if (i.type == DType::kI32) {
      return invalid_argument_error("shard plan: the {} weights are i32, which is not a weight format", i.what);
    }
    if (i.cols % block_of(i.type) != 0) {
      return invalid_argument_error(
          "shard plan: the {} weights are {} ({}) but have {} input columns, not a whole number of blocks", i.what,
          upper_name(i.type), block_words(i.type), i.cols);
    }
  }
  return ok_status();
}

// Query heads are split in units of `head_unit` heads so that every rank boundary of the o weights
// (split by input columns, head * head_dim) falls on a block of their format: the smallest u with
// u * head_dim a multiple of the largest o block (heads move in pairs for head_dim 128 and 256-column
// K-quant blocks). The last unit may be shorter (the matrix's end is always a block boundary).
std::int64_t head_unit(const model::ModelConfig& c, const WeightTypes& types) {
  const std::int64_t block = block_of(largest_block_type(types, &LayerWeightTypes::o));
  return block / std::gcd(block, c.head_dim);
}

// Part i of tp of the query heads, in whole head units.
Range head_part(const model::ModelConfig& c, std::int64_t unit, int i, int tp) {
  const std::int64_t units = (c.n_heads + unit - 1) / unit;
  const Range u = even_part(units, i, tp);
  return {std::min(u.begin * unit, c.n_heads), std::min(u.end * unit, c.n_heads)};
}

std::int64_t head_units(const model::ModelConfig& c, const WeightTypes& types) {
  const std::int64_t unit = head_unit(c, types);
  return (c.n_heads + unit - 1) / unit;
}

// Every rank needs at least one head unit.
Status check_head_units(const model::ModelConfig& c, const WeightTypes& types, int tp) {
  const std::int64_t unit = head_unit(c, types);
  const std::int64_t units = head_units(c, types);
  if (units >= tp) return ok_status();
  const DType worst = largest_block_type(types, &LayerWeightTypes::o);
  return invalid_argument_error(
      "tp {}: the o weights are {} ({}), split by input columns at head boundaries, so ranks take whole units of "
      "{} heads ({} columns, head_dim {}): {} heads make {} units, fewer than {} ranks; use tp <= {}, store "
      "the o weights in a float format, or --requantize-unaligned (re-quantises them to Q8_0 at load)",
      tp, upper_name(worst), block_words(worst), unit, unit * c.head_dim, c.head_dim, c.n_heads, units, tp, units);
}

// A hybrid's DeltaNet K heads per split unit: the fewest whose V heads' columns of ssm_out (split
// by input columns, ssm_head_dim per V head, in each tiled group of K heads, or in one run of
// grouped ones) make whole blocks.
std::int64_t ssm_head_unit(const model::ModelConfig& c, const WeightTypes& types) {
  std::int64_t block = 1;
  for (std::size_t l = 0; l < types.layers.size(); ++l) {
    if (c.is_recurrent(static_cast<std::int64_t>(l))) block = std::max(block, block_of(types.layers[l].ssm_out));
  }
  return block / std::gcd(block, c.ssm_head_dim);
}

Status check_ssm_head_units(const model::ModelConfig& c, const WeightTypes& types, int tp) {
  if (!c.is_hybrid()) return ok_status();
  const std::int64_t unit = ssm_head_unit(c, types);
  const std::int64_t units = (c.ssm_k_heads + unit - 1) / unit;
  if (units >= tp && c.ssm_k_heads % unit == 0) return ok_status();
  return invalid_argument_error(
      "tp {}: the DeltaNet ssm_out weights are split by input columns at head boundaries in units of {} K heads "
      "(V heads of {} columns in whole blocks of their format): {} K heads make {} whole units, and every rank "
      "needs one; use tp <= {} or store ssm_out in a float format (any head boundary is a block boundary)",
      tp, unit, c.ssm_head_dim, c.ssm_k_heads, c.ssm_k_heads / unit, c.ssm_k_heads / unit);
}

// The FFN's split unit: the largest block of the down weights.
std::int64_t ffn_unit(const WeightTypes& types) { return block_of(largest_block_type(types, &LayerWeightTypes::down)); }
bool ffn_splits(const model::ModelConfig& c, const WeightTypes& types, int tp) {
  const std::int64_t unit = ffn_unit(types);
  return c.ffn % unit == 0 && c.ffn / unit >= tp;
}

std::string human_bytes(std::uint64_t b);

// PlanOptions::requantize_unaligned: the o (down) weights of every layer whose block is larger
// than Q8_0's as Q8_0 when the heads (FFN rows) do not make a unit per rank otherwise; `what`
// describes the change and its cost.
WeightTypes requantize_unaligned(const model::ModelConfig& c, const WeightTypes& in, int tp, std::string& what) {
  WeightTypes out = in;
  const std::int64_t q8 = block_of(DType::kQ8_0);
  auto redo = [&](DType LayerWeightTypes::*field, const char* name, std::int64_t rows, std::int64_t cols) {
    std::int64_t layers = 0;
    std::int64_t grown = 0;
    std::string from;
    for (LayerWeightTypes& t : out.layers) {
      const DType old = t.*field;
      if (block_of(old) <= q8 || cols % q8 != 0 || !hal::can_dequantize(old)) continue;
      if (from.find(upper_name(old)) == std::string::npos) from += (from.empty() ? "" : "/") + upper_name(old);
      t.*field = DType::kQ8_0;
      ++layers;
      grown += static_cast<std::int64_t>(hal::tensor_bytes(DType::kQ8_0, rows, cols)) -
               static_cast<std::int64_t>(hal::tensor_bytes(old, rows, cols));
    }
    if (layers == 0) return;
    what += fmt::format("{}the {} weights of {} layer{}, {} -> Q8_0 at load ({}{} over the file's)",
                        what.empty() ? "" : "; ", name, layers, layers == 1 ? "" : "s", from, grown < 0 ? "-" : "+",
                        human_bytes(static_cast<std::uint64_t>(grown < 0 ? -grown : grown)));
  };
  if (head_units(c, out) < tp) redo(&LayerWeightTypes::o, "o", c.hidden, c.n_heads * c.head_dim);
  // Experts are held whole: their down weights are never split.
  if (!c.is_moe() && !ffn_splits(c, out, tp)) redo(&LayerWeightTypes::down, "down", c.hidden, c.ffn);
  return out;
}

// Weight bytes of one layer held by a rank with these ranges (`experts`: a mixture of experts').
std::uint64_t layer_bytes(const model::ModelConfig& c, std::int64_t layer, const LayerWeightTypes& t,
                          const Range& q_heads, const Range& kv_heads, const Range& ffn, const Range& experts,
                          const Range& ssm_k_heads, bool shared_expert) {
  const std::int64_t q_rows = q_heads.size() * c.head_dim;
  const std::int64_t kv_rows = kv_heads.size() * c.head_dim;
  std::uint64_t b = 2 * static_cast<std::uint64_t>(c.hidden) * kF32Bytes;  // attn_norm, ffn_norm
  if (c.is_recurrent(layer)) {
    // A DeltaNet layer's share: its K heads' q and k, their V heads' v, z, alpha, beta, conv taps,
    // decay and dt, the shared norm, and ssm_out's columns.
    const std::int64_t d = c.ssm_head_dim, nk = ssm_k_heads.size();
    const std::int64_t nv = nk * (c.ssm_v_heads / c.ssm_k_heads);
    b += matrix_bytes(t.qkv, (2 * nk + nv) * d, c.hidden);
    b += matrix_bytes(t.z, nv * d, c.hidden);
    b += matrix_bytes(t.alpha, nv, c.hidden) + matrix_bytes(t.beta, nv, c.hidden);
    b += static_cast<std::uint64_t>((2 * nk + nv) * d * c.ssm_conv_kernel + 2 * nv + d) * kF32Bytes;
    b += matrix_bytes(t.ssm_out, c.hidden, nv * d);
  } else {
    b += matrix_bytes(t.q, q_rows * (c.is_hybrid() ? 2 : 1), c.hidden);  // a hybrid's [query | gate]
    b += matrix_bytes(t.k, kv_rows, c.hidden);
    b += matrix_bytes(t.v, kv_rows, c.hidden);
    if (c.qkv_bias) b += static_cast<std::uint64_t>(q_rows + 2 * kv_rows) * kF32Bytes;
    if (model::has_qk_norm(c)) b += 2 * static_cast<std::uint64_t>(c.head_dim) * kF32Bytes;  // q_norm, k_norm
    b += matrix_bytes(t.o, c.hidden, q_rows);
  }
  if (shared_expert && c.shared_expert_ffn > 0) {
    b += matrix_bytes(t.sh_gate, c.shared_expert_ffn, c.hidden) + matrix_bytes(t.sh_up, c.shared_expert_ffn, c.hidden) +
         matrix_bytes(t.sh_down, c.hidden, c.shared_expert_ffn) + static_cast<std::uint64_t>(c.hidden) * kF32Bytes;
  }
  if (c.is_moe()) {
    b += matrix_bytes(t.router, c.n_experts, c.hidden);  // every rank routes
    const auto n = static_cast<std::uint64_t>(experts.size());
    b += n * (matrix_bytes(t.gate, c.expert_ffn, c.hidden) + matrix_bytes(t.up, c.expert_ffn, c.hidden) +
              matrix_bytes(t.down, c.hidden, c.expert_ffn));
    return b;
  }
  b += matrix_bytes(t.gate, ffn.size(), c.hidden);
  b += matrix_bytes(t.up, ffn.size(), c.hidden);
  b += matrix_bytes(t.down, c.hidden, ffn.size());
  return b;
}

// "0-9 (10)", "3 (1)", "-" for an empty range.
std::string range_cell(const Range& r) {
  if (r.size() <= 0) return "-";
  if (r.size() == 1) return fmt::format("{} (1)", r.begin);
  return fmt::format("{}-{} ({})", r.begin, r.end - 1, r.size());
}

std::string human_bytes(std::uint64_t b) {
  constexpr const char* kUnits[] = {"KiB", "MiB", "GiB", "TiB"};
  if (b < 1024) return fmt::format("{} B", b);
  double v = static_cast<double>(b) / 1024.0;
  int u = 0;
  while (v >= 1024.0 && u < 3) {
    v /= 1024.0;
    ++u;
  }
  return fmt::format("{:.2f} {}", v, kUnits[u]);
}

// Marks a space the wrapping must not break at ("229.69 KiB").
constexpr char kNoBreak = '\x01';
std::string unbreakable(std::string s) {
  std::replace(s.begin(), s.end(), ' ', kNoBreak);
  return s;
}

// Appends `text` word-wrapped to kWrap columns; `label` (padded to `indent`) starts the first line
// and continuation lines are indented by `indent`.
void append_wrapped(std::string& out, std::string_view label, std::string_view text, std::size_t indent) {
  constexpr std::size_t kWrap = 110;
  std::string line = fmt::format("{:<{}}", label, indent);
  bool line_has_words = false;
  std::size_t p = 0;
  while (p < text.size()) {
    const std::size_t q = std::min(text.find(' ', p), text.size());
    const std::string_view word = text.substr(p, q - p);
    if (line_has_words && line.size() + 1 + word.size() > kWrap) {
      out += line + "\n";
      line = std::string(indent, ' ');
      line_has_words = false;
    }
    if (line_has_words) line += ' ';
    line += word;
    line_has_words = true;
    p = q + 1;
  }
  out += line + "\n";
  std::replace(out.begin(), out.end(), kNoBreak, ' ');
}

}  // namespace

WeightTypes uniform_weight_types(const model::ModelConfig& config, hal::DType type) {
  WeightTypes w;
  w.token_embd = type;
  w.output = type;
  LayerWeightTypes l;
  l.q = l.k = l.v = l.o = l.gate = l.up = l.down = type;
  if (config.is_hybrid()) l.qkv = l.z = l.alpha = l.beta = l.ssm_out = type;
  if (config.shared_expert_ffn > 0) l.sh_gate = l.sh_up = l.sh_down = type;
  // A mixture of experts' router stays F32 in quantised files (llama.cpp keeps ffn_gate_inp F32);
  // a dense model has none (F32, the default, compares equal whatever the file).
  if (config.is_moe() && !hal::dtype_info(type).quantized) l.router = type;
  w.layers.assign(static_cast<std::size_t>(std::max<std::int64_t>(config.n_layers, 0)), l);
  return w;
}

Result<WeightTypes> weight_types_from_source(const model::TensorSource& file, const model::ModelConfig& config,
                                           WeightTypeCheck check) {
  auto type_of = [&](std::string_view name) -> Result<DType> {
    const model::TensorInfo* t = file.find_tensor(name);
    if (t == nullptr) return not_found_error("{}: tensor '{}' is missing", file.path(), name);
    if (check == WeightTypeCheck::kLoadable) SX_RETURN_IF_ERROR(model::require_supported(*t));
    if (!t->dtype.has_value() || *t->dtype == DType::kI32) {
      return unimplemented_error("{}: tensor '{}' has type {} (ggml type {}), which Sextant cannot plan for; known: "
                                 "f32, f16, bf16, q8_0, q4_0, q5_0, q4_k, q6_k",
                                 file.path(), name, t->type_name, t->ggml_type);
    }
    return *t->dtype;
  };
  WeightTypes w;
  SX_ASSIGN_OR_RETURN(w.token_embd, type_of(model::kTokenEmbdName));
  if (config.tied_embeddings) {
    w.output = w.token_embd;
  } else {
    SX_ASSIGN_OR_RETURN(w.output, type_of(model::kOutputName));
  }
  w.layers.resize(static_cast<std::size_t>(config.n_layers));
  for (std::int64_t i = 0; i < config.n_layers; ++i) {
    LayerWeightTypes& l = w.layers[static_cast<std::size_t>(i)];
    using model::LayerTensor;
    if (config.is_recurrent(i)) {
      SX_ASSIGN_OR_RETURN(l.qkv, type_of(model::layer_tensor_name(i, LayerTensor::kAttnQkv)));
      SX_ASSIGN_OR_RETURN(l.z, type_of(model::layer_tensor_name(i, LayerTensor::kAttnGate)));
      SX_ASSIGN_OR_RETURN(l.alpha, type_of(model::layer_tensor_name(i, LayerTensor::kSsmAlpha)));
      SX_ASSIGN_OR_RETURN(l.beta, type_of(model::layer_tensor_name(i, LayerTensor::kSsmBeta)));
      SX_ASSIGN_OR_RETURN(l.ssm_out, type_of(model::layer_tensor_name(i, LayerTensor::kSsmOut)));
    } else {
      SX_ASSIGN_OR_RETURN(l.q, type_of(model::attn_q_name(i)));
      SX_ASSIGN_OR_RETURN(l.k, type_of(model::attn_k_name(i)));
      SX_ASSIGN_OR_RETURN(l.v, type_of(model::attn_v_name(i)));
      SX_ASSIGN_OR_RETURN(l.o, type_of(model::attn_output_name(i)));
    }
    if (config.shared_expert_ffn > 0) {
      SX_ASSIGN_OR_RETURN(l.sh_gate, type_of(model::layer_tensor_name(i, LayerTensor::kFfnGateShexp)));
      SX_ASSIGN_OR_RETURN(l.sh_up, type_of(model::layer_tensor_name(i, LayerTensor::kFfnUpShexp)));
      SX_ASSIGN_OR_RETURN(l.sh_down, type_of(model::layer_tensor_name(i, LayerTensor::kFfnDownShexp)));
      SX_ASSIGN_OR_RETURN(l.sh_router, type_of(model::layer_tensor_name(i, LayerTensor::kFfnGateInpShexp)));
    }
    if (config.is_moe()) {
      SX_ASSIGN_OR_RETURN(l.router, type_of(model::layer_tensor_name(i, LayerTensor::kFfnGateInp)));
      SX_ASSIGN_OR_RETURN(l.gate, type_of(model::layer_tensor_name(i, LayerTensor::kFfnGateExps)));
      SX_ASSIGN_OR_RETURN(l.up, type_of(model::layer_tensor_name(i, LayerTensor::kFfnUpExps)));
      SX_ASSIGN_OR_RETURN(l.down, type_of(model::layer_tensor_name(i, LayerTensor::kFfnDownExps)));
      continue;
    }
    SX_ASSIGN_OR_RETURN(l.gate, type_of(model::ffn_gate_name(i)));
    SX_ASSIGN_OR_RETURN(l.up, type_of(model::ffn_up_name(i)));
    SX_ASSIGN_OR_RETURN(l.down, type_of(model::ffn_down_name(i)));
  }
  return w;
}

std::uint64_t ShardPlan::total_weight_bytes() const {
  std::uint64_t sum = 0;
  for (const RankPlan& r : ranks) sum += r.weight_bytes;
  return sum;
}

Result<ShardPlan> plan_shards(const model::ModelConfig& config, const WeightTypes& file_types,
                              const PlanOptions& options) {
  const model::ModelConfig& c = config;
  const int tp = options.tp;
  const int pp = options.pp;
  if (tp < 1) return invalid_argument_error("tp {}: the tensor-parallel size must be at least 1", tp);
  if (pp < 1) return invalid_argument_error("pp {}: the pipeline-parallel size must be at least 1", pp);
  if (tp > kMaxTp) return invalid_argument_error("tp {}: at most {} ranks per stage are supported", tp, kMaxTp);
  SX_RETURN_IF_ERROR(check_config(c));
  if (tp > c.n_heads) {
    return invalid_argument_error("tp {}: the model has only {} query heads, so at most tp {} (every rank needs a head)",
                                  tp, c.n_heads, c.n_heads);
  }
  if (pp > c.n_layers) {
    return invalid_argument_error("pp {}: the model has only {} layers, so at most pp {} (every stage needs a layer)",
                                  pp, c.n_layers, c.n_layers);
  }
  if (static_cast<std::int64_t>(file_types.layers.size()) != c.n_layers) {
    return invalid_argument_error("shard plan: weight types are given for {} layers but the model has {}",
                                  file_types.layers.size(), c.n_layers);
  }
  if (c.vocab < tp) {
    return invalid_argument_error("tp {}: the vocabulary has only {} rows to split; use tp <= {}", tp, c.vocab, c.vocab);
  }
  const hal::DTypeInfo& kv_info = hal::dtype_info(options.kv_dtype);
  if (kv_info.block_elems != 1 || options.kv_dtype == DType::kI32) {
    return invalid_argument_error("shard plan: the KV cache cannot be stored as {}; use f32, f16 or bf16",
                                  kv_info.name);
  }
  SX_RETURN_IF_ERROR(check_inner_dims(c, file_types));
  std::string requantized;
  const WeightTypes types = options.requantize_unaligned && tp > 1 && tp <= c.n_heads
                                ? requantize_unaligned(c, file_types, tp, requantized)
                                : file_types;

  const DType unit_type = largest_block_type(types, &LayerWeightTypes::down);
  const std::int64_t unit = block_of(unit_type);
  std::int64_t units = 0;  // of the dense FFN
  if (c.is_moe()) {
    // A mixture of experts splits whole experts (expert parallelism), never an expert's rows.
    if (c.n_experts < tp) {
      return invalid_argument_error("tp {}: the model has {} experts per layer; expert parallelism needs one per "
                                    "rank, so tp <= {}", tp, c.n_experts, c.n_experts);
    }
  } else {
    // The largest block is a multiple of the others (all are powers of two: 1 ... 256), so a whole number of units is
    // a whole number of blocks of every layer's down format.
    if (c.ffn % unit != 0) {
      return invalid_argument_error(
          "shard plan: FFN size {} is not a whole number of {}-row units (the down weights are {}, {}); the model "
          "cannot be stored in that format",
          c.ffn, unit, upper_name(unit_type), block_words(unit_type));
    }
    units = c.ffn / unit;
    if (units < tp) {
      return invalid_argument_error(
          "tp {}: the FFN has {} rows = {} units of {} (the down weights are {}), fewer units than ranks; use tp <= {} "
          "or --requantize-unaligned (re-quantises them to Q8_0 at load)",
          tp, c.ffn, units, unit, upper_name(unit_type), units);
    }
  }
  SX_RETURN_IF_ERROR(check_head_units(c, types, tp));
  SX_RETURN_IF_ERROR(check_ssm_head_units(c, types, tp));
  const std::int64_t hunit = head_unit(c, types);
  const std::int64_t sunit = c.is_hybrid() ? ssm_head_unit(c, types) : 1;

  ShardPlan plan;
  plan.tp = tp;
  plan.pp = pp;
  plan.ffn_unit = unit;
  plan.kv_dtype = options.kv_dtype;
  plan.types = types;
  plan.requantized = std::move(requantized);
  const std::int64_t group = c.n_heads / c.n_kv_heads;

  // The tensor-parallel split is the same on every stage.
  struct TpSlice {
    Range q, kv, ffn, vocab, experts, ssm_k;
    std::vector<std::int64_t> replicated;
  };
  std::vector<TpSlice> slices(static_cast<std::size_t>(tp));
  for (int i = 0; i < tp; ++i) {
    TpSlice& s = slices[static_cast<std::size_t>(i)];
    s.q = head_part(c, hunit, i, tp);
    s.kv = {s.q.begin / group, (s.q.end - 1) / group + 1};
    if (c.is_moe()) {
      s.ffn = {0, c.expert_ffn};  // every expert held whole
      s.experts = front_part(c.n_experts, i, tp);  // 128 on 6: 22, 22, 21, 21, 21, 21
    } else {
      const Range u = even_part(units, i, tp);
      s.ffn = {u.begin * unit, u.end * unit};
    }
    s.vocab = even_part(c.vocab, i, tp);
    if (c.is_hybrid()) {
      const Range u = even_part(c.ssm_k_heads / sunit, i, tp);
      s.ssm_k = {u.begin * sunit, u.end * sunit};
    }
  }
  for (int i = 0; i < tp; ++i) {
    TpSlice& s = slices[static_cast<std::size_t>(i)];
    for (std::int64_t h = s.kv.begin; h < s.kv.end; ++h) {
      for (int j = 0; j < tp; ++j) {
        if (j != i && slices[static_cast<std::size_t>(j)].kv.contains(h)) {
          s.replicated.push_back(h);
          break;
        }
      }
    }
  }

  const bool tied_single_stage = c.tied_embeddings && pp == 1;
  for (int stage = 0; stage < pp; ++stage) {
    const Range layers = even_part(c.n_layers, stage, pp);
    for (int i = 0; i < tp; ++i) {
      const TpSlice& s = slices[static_cast<std::size_t>(i)];
      RankPlan r;
      r.rank = stage * tp + i;
      r.stage = stage;
      r.tp_rank = i;
      r.q_heads = s.q;
      r.kv_heads = s.kv;
      r.replicated_kv_heads = s.replicated;
      r.ffn = s.ffn;
      r.experts = s.experts;
      r.vocab = s.vocab;
      r.layers = layers;
      r.ssm_k_heads = s.ssm_k;
      r.has_shared_expert = c.shared_expert_ffn > 0 && i == 0;
      r.has_embedding = stage == 0;
      r.has_lm_head = stage == pp - 1;
      std::int64_t kv_layers = 0;  // a hybrid's DeltaNet layers keep no KV
      for (std::int64_t l = layers.begin; l < layers.end; ++l) {
        r.weight_bytes += layer_bytes(c, l, types.layers[static_cast<std::size_t>(l)], s.q, s.kv, s.ffn, s.experts,
                                      s.ssm_k, r.has_shared_expert);
        kv_layers += c.is_recurrent(l) ? 0 : 1;
      }
      if (r.has_embedding) r.weight_bytes += matrix_bytes(types.token_embd, s.vocab.size(), c.hidden);
      if (r.has_lm_head) {
        r.weight_bytes += static_cast<std::uint64_t>(c.hidden) * kF32Bytes;  // output_norm
        if (!tied_single_stage) {
          r.weight_bytes +=
              matrix_bytes(c.tied_embeddings ? types.token_embd : types.output, s.vocab.size(), c.hidden);
        }
      }
      r.kv_bytes_per_token = static_cast<std::uint64_t>(kv_layers) * 2 * static_cast<std::uint64_t>(s.kv.size()) *
                             static_cast<std::uint64_t>(c.head_dim) * static_cast<std::uint64_t>(kv_info.block_bytes);
      plan.ranks.push_back(std::move(r));
    }
  }

  // The whole model once: every layer with all heads and FFN rows, one embedding, one LM head.
  const Range all_heads{0, c.n_heads}, all_kv{0, c.n_kv_heads}, all_ffn{0, c.ffn}, all_experts{0, c.n_experts};
  for (std::size_t l = 0; l < file_types.layers.size(); ++l) {
    plan.model_weight_bytes += layer_bytes(c, static_cast<std::int64_t>(l), file_types.layers[l], all_heads, all_kv,
                                           all_ffn, all_experts, {0, c.ssm_k_heads}, true);
  }
  plan.model_weight_bytes += matrix_bytes(file_types.token_embd, c.vocab, c.hidden);
  plan.model_weight_bytes += static_cast<std::uint64_t>(c.hidden) * kF32Bytes;
  if (!c.tied_embeddings) plan.model_weight_bytes += matrix_bytes(file_types.output, c.vocab, c.hidden);
  return plan;
}

std::uint64_t idle_expert_bytes(const model::ModelConfig& config, const WeightTypes& types) {
  if (!config.is_moe()) return 0;
  const auto E = static_cast<std::uint64_t>(config.n_experts);
  const std::uint64_t idle = E - static_cast<std::uint64_t>(std::min(config.n_experts_used, config.n_experts));
  std::uint64_t bytes = 0;
  for (const LayerWeightTypes& t : types.layers) {
    const std::uint64_t experts = hal::tensor_bytes(t.gate, config.n_experts * config.expert_ffn, config.hidden) +
                                  hal::tensor_bytes(t.up, config.n_experts * config.expert_ffn, config.hidden) +
                                  hal::tensor_bytes(t.down, config.n_experts * config.hidden, config.expert_ffn);
    bytes += experts / E * idle;
  }
  return bytes;
}

std::uint64_t active_weight_bytes_per_token(const model::ModelConfig& config, const WeightTypes& types,
                                            std::uint64_t model_weight_bytes) {
  const std::uint64_t table = hal::tensor_bytes(types.token_embd, config.vocab, config.hidden);
  // A tied table is also the LM head, read whole.
  const std::uint64_t skipped = (config.tied_embeddings ? 0 : table - hal::row_bytes(types.token_embd, config.hidden)) +
                                idle_expert_bytes(config, types);
  return model_weight_bytes - std::min(model_weight_bytes, skipped);
}

std::string format_plan(const ShardPlan& plan, const model::ModelConfig& config) {
  const std::vector<std::string> header = {"rank", "stage", "tp", "q heads", "KV heads",
                                           config.is_moe() ? "experts" : "FFN rows",
                                           "vocab rows", "layers", "weights", "KV/token"};
  const std::vector<bool> right = {true, true, true, false, false, false, false, false, true, true};
  std::vector<std::vector<std::string>> rows;
  std::uint64_t total_weights = 0, total_kv = 0;
  bool any_replica = false;
  for (const RankPlan& r : plan.ranks) {
    std::string kv = range_cell(r.kv_heads);
    if (!r.replicated_kv_heads.empty()) {
      any_replica = true;
      for (std::int64_t h : r.replicated_kv_heads) kv += fmt::format(" *{}", h);
    }
    rows.push_back({std::to_string(r.rank), std::to_string(r.stage), std::to_string(r.tp_rank), range_cell(r.q_heads),
                    kv, range_cell(config.is_moe() ? r.experts : r.ffn), r.has_embedding || r.has_lm_head ? range_cell(r.vocab) : "-",
                    range_cell(r.layers), human_bytes(r.weight_bytes), human_bytes(r.kv_bytes_per_token)});
    total_weights += r.weight_bytes;
    total_kv += r.kv_bytes_per_token;
  }
  std::vector<std::string> totals(header.size());
  totals.front() = "total";
  totals[8] = human_bytes(total_weights);
  totals[9] = human_bytes(total_kv);

  std::vector<std::size_t> width(header.size());
  for (std::size_t i = 0; i < header.size(); ++i) {
    width[i] = std::max(header[i].size(), i == 0 ? 0 : totals[i].size());
    for (const auto& row : rows) width[i] = std::max(width[i], row[i].size());
  }
  auto line = [&](const std::vector<std::string>& cells) {
    std::string out;
    for (std::size_t i = 0; i < cells.size(); ++i) {
      if (i > 0) out += "  ";
      const std::size_t pad = width[i] - cells[i].size();
      if (right[i]) out += std::string(pad, ' ');
      out += cells[i];
      if (!right[i]) out += std::string(pad, ' ');
    }
    while (!out.empty() && out.back() == ' ') out.pop_back();
    return out + "\n";
  };
  std::string out = line(header);
  for (const auto& row : rows) out += line(row);
  // "total" starts the line and runs into the (empty) stage column: the rank column is at least
  // "rank" wide, plus the two-space gap.
  totals.front().clear();
  std::string total_line = line(totals);
  total_line.replace(0, 5, "total");
  out += total_line;
  if (config.is_hybrid() && !plan.ranks.empty()) {
    // The DeltaNet layers' split (their heads are no column of the table above).
    const auto recurrent = std::count(config.recurrent_layers.begin(), config.recurrent_layers.end(), true);
    const std::int64_t per_k = config.ssm_v_heads / config.ssm_k_heads;
    std::string ranks;
    for (int i = 0; i < plan.tp; ++i) {
      const Range& k = plan.ranks[static_cast<std::size_t>(i)].ssm_k_heads;
      ranks += fmt::format("{}{}", i == 0 ? "" : ", ", unbreakable(fmt::format("{} + {} V", range_cell(k), k.size() * per_k)));
    }
    std::string text = fmt::format(
        "{} of the {} layers are Gated DeltaNet ({} K heads and {} V heads of {}; V head j reads K head j {} {}), "
        "split by K heads with their V heads, tp rank by tp rank: {}. Their state, instead of a KV cache: {} "
        "per sequence over all ranks, whatever its length.",
        recurrent, config.n_layers, config.ssm_k_heads, config.ssm_v_heads, config.ssm_head_dim,
        config.ssm_v_grouped ? "div" : "mod", config.ssm_v_grouped ? per_k : config.ssm_k_heads, ranks,
        unbreakable(human_bytes(static_cast<std::uint64_t>(recurrent) * kF32Bytes *
                                static_cast<std::uint64_t>((config.ssm_conv_kernel - 1) * config.ssm_conv_channels() +
                                                           config.ssm_v_heads * config.ssm_head_dim *
                                                               config.ssm_head_dim))));
    if (config.shared_expert_ffn > 0) text += " The shared expert is held whole by each stage's tp rank 0.";
    out += "\n";
    append_wrapped(out, "", text, 0);
  }

  // The model held once, and what the ranks hold beyond it.
  std::uint64_t model_kv = 0;  // every rank stores the same bytes per (KV head, layer)
  if (!plan.ranks.empty()) {
    const RankPlan& r0 = plan.ranks.front();
    const auto head_layers = static_cast<std::uint64_t>(r0.layers.size() * r0.kv_heads.size());
    if (head_layers > 0) {
      model_kv = r0.kv_bytes_per_token / head_layers * static_cast<std::uint64_t>(config.n_layers * config.n_kv_heads);
    }
  }
  std::string summary = fmt::format("Held once, the model is {} of weights and {} of KV cache per token",
                                    unbreakable(human_bytes(plan.model_weight_bytes)),
                                    unbreakable(human_bytes(model_kv)));
  if (plan.ranks.size() > 1 && plan.model_weight_bytes > 0 && model_kv > 0) {
    const std::uint64_t extra_w = total_weights > plan.model_weight_bytes ? total_weights - plan.model_weight_bytes : 0;
    const std::uint64_t extra_kv = total_kv > model_kv ? total_kv - model_kv : 0;
    std::string why = "norms on every rank";
    if (any_replica) why += ", replicated KV heads";
    if (config.tied_embeddings && plan.pp > 1) why += ", the tied table on both the first and the last stage";
    if (!plan.requantized.empty()) why += ", matrices re-quantised to Q8_0";
    summary += fmt::format("; the ranks together hold {} (+{:.1f}%) more weights and {} (+{:.1f}%) more KV per token ({})",
                           unbreakable(human_bytes(extra_w)),
                           100.0 * static_cast<double>(extra_w) / static_cast<double>(plan.model_weight_bytes),
                           unbreakable(human_bytes(extra_kv)), 100.0 * static_cast<double>(extra_kv) / static_cast<double>(model_kv),
                           why);
  }
  if (config.is_moe()) {
    summary += fmt::format(". A decode token reads {} of them: attention, the router and {} of the {} experts of "
                           "each layer, one embedding row, the LM head",
                           unbreakable(human_bytes(active_weight_bytes_per_token(config, plan.types,
                                                                                 plan.model_weight_bytes))),
                           config.n_experts_used, config.n_experts);
  }
  append_wrapped(out, "", summary + ".", 0);
  if (!plan.requantized.empty()) {
    append_wrapped(out, "", fmt::format("Re-quantised (--requantize-unaligned, no aligned split for this tp): {}.",
                                        plan.requantized),
                   0);
  }
  out += "\n";

  constexpr std::size_t kIndent = 12;
  append_wrapped(out, "",
                 plan.tp > 1 ? "Ranges are global indices, first-last (count). Within a stage, q/k/v and gate/up are "
                               "split by output rows (column-parallel) and o and down by input columns (row-parallel, "
                               "one all-reduce each)."
                             : "Ranges are global indices, first-last (count).",
                 0);
  if (any_replica) {
    append_wrapped(out, "*N",
                   fmt::format("KV head N is also held by another rank of the stage: the {} query heads sharing it are "
                               "split across ranks, so each of those ranks stores its k/v weights and its KV cache.",
                               config.n_heads / config.n_kv_heads),
                   kIndent);
  }
  std::string vocab;
  if (plan.pp == 1) {
    vocab = config.tied_embeddings
                ? "each rank holds these rows of the tied embedding / LM head table (one table, held once)"
                : "each rank holds these rows of the token embedding and of the LM head";
  } else {
    vocab = fmt::format("stage 0 holds these rows of the token embedding and stage {} these rows of the LM head{}",
                        plan.pp - 1, config.tied_embeddings ? " (its own copy of the tied table)" : "");
    if (plan.pp > 2) vocab += "; '-': a middle stage holds neither";
  }
  if (plan.tp > 1) {
    vocab += ". A step's embedding is the all-reduce of the ranks' rows, its logits the all-gather of theirs";
  }
  append_wrapped(out, "vocab rows", vocab + ".", kIndent);
  append_wrapped(out, "weights", "every byte of weights the rank holds.", kIndent);
  append_wrapped(out, "KV/token", "the rank's KV-cache bytes per token of context, over its layers.", kIndent);
  return out;
}

}  // namespace sx::parallel
