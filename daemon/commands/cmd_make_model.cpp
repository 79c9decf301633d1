// `sextant make-model`: writes a random-weight qwen2, qwen3(moe) or qwen35(moe) GGUF of any shape and weight type
// (default: the exact Qwen2.5-0.5B shape; --arch qwen3: Qwen3-0.6B), with the real Qwen tokenizer when given one; or, with
// --format safetensors, the same weights (or those of --from FILE.gguf) as a Hugging Face directory.
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>

#include "daemon/commands/commands.h"
#include "daemon/commands/model_session.h"
#include "runtime/engine/model_export.h"
#include "runtime/model/random_model.h"
#include "runtime/tokenizer/tokenizer.h"

namespace sx::daemon {

namespace {

// A GGUF model (checked as a load would) -> a Hugging Face directory.
Status write_safetensors(const std::string& gguf_path, const std::string& dir, hal::DType dtype, int shards,
                         model::Int4Checkpoint int4) {
  SX_ASSIGN_OR_RETURN(engine::OpenedModel m, engine::open_model(gguf_path));
  SX_RETURN_IF_ERROR(engine::export_safetensors(m, dtype, shards, dir, int4));
  const std::string what = int4 == model::Int4Checkpoint::kAwq    ? "awq int4 (+ f16)"
                           : int4 == model::Int4Checkpoint::kGptq ? "gptq int4 (+ f16)"
                                                                  : std::string(hal::dtype_name(dtype));
  std::printf("wrote %s: %s weights of %s in %d safetensors file%s\n", dir.c_str(), what.c_str(), gguf_path.c_str(),
              shards, shards == 1 ? "" : "s");
  return ok_status();
}

Status make_model(const Args& args) {
  auto out = args.get("--out");
  if (!out) return invalid_argument_error("--out FILE is required");
  SX_ASSIGN_OR_RETURN(std::string format, args.get_string("--format", "gguf"));
  if (format != "gguf" && format != "safetensors") {
    return invalid_argument_error("--format must be gguf or safetensors, got '{}'", format);
  }
  SX_ASSIGN_OR_RETURN(std::int64_t shards, args.get_int("--shards", 1, 1, 99999));
  if (format == "gguf" && (args.has("--shards") || args.has("--from") || args.has("--awq") || args.has("--gptq"))) {
    return invalid_argument_error("--shards, --from, --awq and --gptq go with --format safetensors");
  }
  if (args.has("--awq") && args.has("--gptq")) return invalid_argument_error("--awq and --gptq exclude each other");
  const model::Int4Checkpoint int4 = args.has("--awq")    ? model::Int4Checkpoint::kAwq
                                     : args.has("--gptq") ? model::Int4Checkpoint::kGptq
                                                          : model::Int4Checkpoint::kNone;
  hal::DType st_dtype = hal::DType::kBF16;
  if (format == "safetensors") {
    const char* default_type = int4 != model::Int4Checkpoint::kNone ? "f16" : "bf16";
    SX_ASSIGN_OR_RETURN(std::string st_type, args.get_string("--type", default_type));
    auto st = hal::dtype_from_name(st_type);
    if (!st || (*st != hal::DType::kF32 && *st != hal::DType::kF16 && *st != hal::DType::kBF16)) {
      return invalid_argument_error("--type must be f32, f16 or bf16 with --format safetensors, got '{}'", st_type);
    }
    st_dtype = *st;
    if (auto from = args.get("--from")) return write_safetensors(*from, *out, st_dtype, static_cast<int>(shards), int4);
  }
  SX_ASSIGN_OR_RETURN(std::string arch, args.get_string("--arch", "qwen2"));
  if (arch != "qwen2" && arch != "qwen3" && arch != "qwen3moe" && arch != "qwen35" && arch != "qwen35moe") {
    return invalid_argument_error("--arch must be qwen2, qwen3, qwen3moe, qwen35 or qwen35moe, got '{}'", arch);
  }
  const char* default_shape = arch == "qwen3"       ? "0.6b"
                              : arch == "qwen3moe"  ? "30b-a3b"
                              : arch == "qwen35"    ? "0.8b"
                              : arch == "qwen35moe" ? "35b-a3b"
                                                    : "0.5b";
  SX_ASSIGN_OR_RETURN(std::string shape, args.get_string("--shape", default_shape));
  model::RandomModelSpec spec;
  if (arch == "qwen3") {
    SX_ASSIGN_OR_RETURN(spec.config, model::find_qwen3_config(shape));
  } else if (arch == "qwen3moe") {
    SX_ASSIGN_OR_RETURN(spec.config, model::find_qwen3moe_config(shape));
  } else if (arch == "qwen35") {
    SX_ASSIGN_OR_RETURN(spec.config, model::find_qwen35_config(shape));
  } else if (arch == "qwen35moe") {
    SX_ASSIGN_OR_RETURN(spec.config, model::find_qwen35moe_config(shape));
  } else {
    SX_ASSIGN_OR_RETURN(spec.config, model::find_qwen2_5_config(shape));
  }
  model::ModelConfig& c = spec.config;
  SX_ASSIGN_OR_RETURN(c.n_layers, args.get_int("--layers", c.n_layers, 1, 1024));
  if (c.is_hybrid()) {
    SX_ASSIGN_OR_RETURN(const std::int64_t interval, args.get_int("--full-attention-interval", 4, 1, 1024));
    model::set_hybrid_layers(c, c.n_layers, interval);
    SX_ASSIGN_OR_RETURN(c.ssm_k_heads, args.get_int("--ssm-k-heads", c.ssm_k_heads, 1, 1024));
    SX_ASSIGN_OR_RETURN(c.ssm_v_heads, args.get_int("--ssm-v-heads", c.ssm_v_heads, 1, 4096));
    SX_ASSIGN_OR_RETURN(c.ssm_head_dim, args.get_int("--ssm-head-dim", c.ssm_head_dim, 1, 256));
  } else if (args.has("--full-attention-interval") || args.has("--ssm-k-heads") || args.has("--ssm-v-heads") ||
             args.has("--ssm-head-dim")) {
    return invalid_argument_error("--full-attention-interval and --ssm-* go with --arch qwen35 or qwen35moe");
  }
  SX_ASSIGN_OR_RETURN(c.n_heads, args.get_int("--heads", c.n_heads, 1, 1024));
  SX_ASSIGN_OR_RETURN(c.n_kv_heads, args.get_int("--kv-heads", c.n_kv_heads, 1, 1024));
  SX_ASSIGN_OR_RETURN(c.head_dim, args.get_int("--head-dim", c.head_dim, 2, 1024));
  if (c.is_hybrid() && args.has("--head-dim")) {
    // Qwen3.5 rotates a quarter of each head, its sections in the published proportion 11 : 11 : 10.
    c.rot_dim = std::max<std::int64_t>(2, c.head_dim / 4 / 2 * 2);
    const std::int64_t pairs = c.rot_dim / 2, first = (pairs * 11 + 16) / 32;
    c.rope_sections = {first, first, pairs - 2 * first, 0};
  }
  // qwen2 ties hidden to heads x head_dim; qwen3's head size is its own (0.6B: 16 x 128 on 1024).
  SX_ASSIGN_OR_RETURN(c.hidden,
                      args.get_int("--hidden", arch == "qwen2" ? c.n_heads * c.head_dim : c.hidden, 1, 1 << 20));
  if (c.is_moe()) {
    SX_ASSIGN_OR_RETURN(c.n_experts, args.get_int("--experts", c.n_experts, 1, 4096));
    SX_ASSIGN_OR_RETURN(c.n_experts_used, args.get_int("--experts-used", c.n_experts_used, 1, 64));
    SX_ASSIGN_OR_RETURN(c.expert_ffn, args.get_int("--expert-ffn", c.expert_ffn, 1, 1 << 20));
    if (c.shared_expert_ffn > 0) {
      SX_ASSIGN_OR_RETURN(c.shared_expert_ffn, args.get_int("--shared-expert-ffn", c.shared_expert_ffn, 1, 1 << 20));
    }
  } else if (args.has("--experts") || args.has("--experts-used") || args.has("--expert-ffn")) {
    return invalid_argument_error("--experts, --experts-used and --expert-ffn go with --arch qwen3moe or qwen35moe");
  }
  if (args.has("--shared-expert-ffn") && c.shared_expert_ffn == 0) {
    return invalid_argument_error("--shared-expert-ffn goes with --arch qwen35moe");
  }
  SX_ASSIGN_OR_RETURN(c.ffn, args.get_int("--ffn", c.is_hybrid() && c.is_moe() ? c.expert_ffn : c.ffn, 1, 1 << 22));
  SX_ASSIGN_OR_RETURN(c.context_length, args.get_int("--ctx", c.context_length, 1, 1 << 24));
  if (args.has("--untied")) c.tied_embeddings = false;
  if (args.has("--tied")) c.tied_embeddings = true;
  SX_ASSIGN_OR_RETURN(std::string type_name, args.get_string("--type", format == "gguf" ? "f16" : "f32"));
  // A mix (llama.cpp's Q4_K_M / Q6_K files, model::WeightMix) or one format for every matrix.
  auto type = hal::dtype_from_name(type_name);
  if (type_name == "q4_k_m" || type_name == "Q4_K_M") {
    spec.mix = model::WeightMix::kQ4_K_M;
    type = hal::DType::kQ4_K;
  } else if (type && (*type == hal::DType::kQ6_K || *type == hal::DType::kQ5_K)) {
    spec.mix = *type == hal::DType::kQ6_K ? model::WeightMix::kQ6_K : model::WeightMix::kQ5_K;
  } else if (!type || !hal::can_quantize(*type)) {
    return invalid_argument_error(
        "--type must be f32, f16, bf16, q8_0, q4_0, q4_1, q5_0, q5_1, q2_k, q3_k, q4_k, q5_k, q6_k or q4_k_m, got '{}'", type_name);
  }
  spec.weight_type = *type;
  if (auto std_text = args.get("--init-std")) {
    char* end = nullptr;
    const double v = std::strtod(std_text->c_str(), &end);
    if (end == std_text->c_str() || *end != '\0' || !(v >= 0 && v <= 10)) {
      return invalid_argument_error("--init-std must be a number from 0 to 10, got '{}'", *std_text);
    }
    spec.init_std = static_cast<float>(v);
  }
  SX_ASSIGN_OR_RETURN(std::int64_t seed, args.get_int("--seed", 0, 0, INT64_MAX));
  spec.seed = static_cast<std::uint64_t>(seed);
  SX_ASSIGN_OR_RETURN(c.vocab, args.get_int("--vocab", c.vocab, 1, 1 << 24));
  if (auto tok_path = args.get("--tokenizer")) {
    SX_ASSIGN_OR_RETURN(auto tok, tokenizer::Tokenizer::from_hf_json(*tok_path));
    SX_ASSIGN_OR_RETURN(spec.tokenizer, engine::tokenizer_metadata_from_data(tok->data()));
    const model::TokenizerMetadata& t = spec.tokenizer;
    if (static_cast<std::int64_t>(t.tokens.size()) > c.vocab) {
      return invalid_argument_error("the tokenizer has {} tokens but the shape's vocabulary is {}", t.tokens.size(), c.vocab);
    }
  }
  if (format == "safetensors") {
    // The random weights in F32 first, then converted: the same values as an F32 GGUF of this seed.
    spec.weight_type = hal::DType::kF32;
    const std::string tmp = *out + ".source.gguf";
    SX_RETURN_IF_ERROR(model::write_random_gguf(spec, tmp));
    const Status s = write_safetensors(tmp, *out, st_dtype, static_cast<int>(shards), int4);
    std::error_code ec;
    std::filesystem::remove(tmp, ec);
    return s;
  }
  SX_RETURN_IF_ERROR(model::write_random_gguf(spec, *out));
  std::printf("wrote %s: %s %lld layers, hidden %lld, %lld/%lld heads of %lld, ffn %lld, vocab %lld, %s weights\n",
              out->c_str(), c.architecture.c_str(), static_cast<long long>(c.n_layers), static_cast<long long>(c.hidden),
              static_cast<long long>(c.n_heads), static_cast<long long>(c.n_kv_heads),
              static_cast<long long>(c.head_dim), static_cast<long long>(c.ffn),
              static_cast<long long>(c.vocab), std::string(hal::dtype_name(spec.weight_type)).c_str());
  return ok_status();
}

}  // namespace

int cmd_make_model(int argc, char** argv) {
  Args args("make-model",
            "Write a random-weight GGUF of a qwen2, qwen3, qwen3moe, qwen35 or qwen35moe model (--arch; default: "
            "the Qwen2.5-0.5B shape), or a Hugging Face safetensors directory of the same weights or of --from "
            "FILE.gguf.",
            {
                {{"-o", "--out"}, true, false, "output file (a directory with --format safetensors)", "PATH"},
                {{"--format"}, true, false, "gguf (default) or safetensors", "FORMAT"},
                {{"--shards"}, true, false, "safetensors: split the weights into N files with an index", "N"},
                {{"--from"}, true, false, "safetensors: write this GGUF model's weights and tokenizer", "FILE"},
                {{"--awq"}, false, false,
                 "safetensors: an AWQ 4-bit checkpoint (groups of 128; layer matrices need inputs in whole groups)", ""},
                {{"--gptq"}, false, false,
                 "safetensors: a GPTQ 4-bit checkpoint (AutoGPTQ format, symmetric, groups of 128, no act-order)", ""},
                {{"--arch"}, true, false,
                 "qwen2 (default: Qwen2 / Qwen2.5), qwen3 (Qwen3 dense: q/k head norms), qwen3moe (Qwen3-MoE), "
                 "qwen35 (Qwen3.5 / 3.6 / 3.8 dense: Gated DeltaNet + gated attention) or qwen35moe (their MoE "
                 "sizes, with a shared expert)",
                 "ARCH"},
                {{"--full-attention-interval"}, true, false,
                 "qwen35*: every N-th layer is full attention, the others Gated DeltaNet (default 4)", "N"},
                {{"--ssm-k-heads"}, true, false, "qwen35*: DeltaNet query/key heads (default 16)", "N"},
                {{"--ssm-v-heads"}, true, false, "qwen35*: DeltaNet value heads (default: the shape's)", "N"},
                {{"--ssm-head-dim"}, true, false, "qwen35*: DeltaNet head size (default 128)", "N"},
                {{"--shared-expert-ffn"}, true, false, "qwen35moe: rows of the shared expert (default: the shape's)",
                 "N"},
                {{"--experts"}, true, false, "qwen3moe: experts per layer (default: the shape's, 128)", "N"},
                {{"--experts-used"}, true, false, "qwen3moe: experts each token is routed to (default 8)", "K"},
                {{"--expert-ffn"}, true, false, "qwen3moe: rows of each expert's FFN (default: the shape's)", "N"},
                {{"--shape"}, true, false,
                 "Qwen2.5 size: 0.5b (default), 1.5b, 3b, 7b, 14b, 32b, 72b; with --arch qwen3: 0.6b (default), 1.7b, "
                 "4b, 8b, 14b, 32b; with --arch qwen3moe: 30b-a3b (default), 235b-a22b; qwen35: 0.8b (default), 2b, 4b, 9b, "
                 "27b (also Qwen3.6 / 3.8-27B); qwen35moe: 35b-a3b (default; also Qwen3.6-35B-A3B), 122b-a10b, "
                 "397b-a17b", "SIZE"},
                {{"--type"}, true, false, "2-D weight format: f32, f16 (default), bf16, q8_0, q4_0, q4_1, q5_0, q5_1, q2_k, q3_k, q4_k; q5_k, q6_k "
                 "(Q5_1, Q8_0 where rows are not whole 256-blocks, as llama.cpp falls back) or q4_k_m (llama.cpp's mix); safetensors: f32, f16, bf16 (default)", "TYPE"},
                {{"--tokenizer"}, true, false, "Hugging Face tokenizer.json to embed (default: a synthetic one)", "FILE"},
                {{"--layers"}, true, false, "override the layer count", "N"},
                {{"--hidden"}, true, false, "override the hidden size (default heads x head-dim)", "N"},
                {{"--heads"}, true, false, "override the query-head count", "N"},
                {{"--kv-heads"}, true, false, "override the KV-head count", "N"},
                {{"--head-dim"}, true, false, "override the head dimension", "N"},
                {{"--ffn"}, true, false, "override the FFN size", "N"},
                {{"--vocab"}, true, false, "override the vocabulary size", "N"},
                {{"--ctx"}, true, false, "override the context length", "N"},
                {{"--tied"}, false, false, "tie the LM head to the embedding", ""},
                {{"--untied"}, false, false, "separate LM head (output.weight)", ""},
                {{"--seed"}, true, false, "random seed (default 0)", "N"},
                {{"--init-std"}, true, false,
                 "standard deviation of the random weights (default 0.02; larger gives livelier greedy text)", "X"},
            });
  if (Status s = args.parse(argc, argv); !s.ok()) return report_error("make-model", s);
  if (args.has("--help")) {
    std::fputs(args.usage().c_str(), stdout);
    return 0;
  }
  if (Status s = make_model(args); !s.ok()) return report_error("make-model", s);
  return 0;
}

}  // namespace sx::daemon
