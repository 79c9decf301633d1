// `sextant make-model`: writes a random-weight qwen2 GGUF of any shape and weight type (default:
// the exact Qwen2.5-0.5B shape), with the real Qwen tokenizer when given one.
#include <cstdio>
#include <string>

#include "daemon/commands/commands.h"
#include "daemon/commands/model_session.h"
#include "runtime/model/random_model.h"
#include "runtime/tokenizer/tokenizer.h"

namespace sx::daemon {

namespace {

Status make_model(const Args& args) {
  auto out = args.get("--out");
  if (!out) return invalid_argument_error("--out FILE is required");
  SX_ASSIGN_OR_RETURN(std::string shape, args.get_string("--shape", "0.5b"));
  model::RandomModelSpec spec;
  SX_ASSIGN_OR_RETURN(spec.config, model::find_qwen2_5_config(shape));
  model::ModelConfig& c = spec.config;
  SX_ASSIGN_OR_RETURN(c.n_layers, args.get_int("--layers", c.n_layers, 1, 1024));
  SX_ASSIGN_OR_RETURN(c.n_heads, args.get_int("--heads", c.n_heads, 1, 1024));
  SX_ASSIGN_OR_RETURN(c.n_kv_heads, args.get_int("--kv-heads", c.n_kv_heads, 1, 1024));
  SX_ASSIGN_OR_RETURN(c.head_dim, args.get_int("--head-dim", c.head_dim, 2, 1024));
  SX_ASSIGN_OR_RETURN(c.hidden, args.get_int("--hidden", c.n_heads * c.head_dim, 1, 1 << 20));
  SX_ASSIGN_OR_RETURN(c.ffn, args.get_int("--ffn", c.ffn, 1, 1 << 22));
  SX_ASSIGN_OR_RETURN(c.context_length, args.get_int("--ctx", c.context_length, 1, 1 << 24));
  if (args.has("--untied")) c.tied_embeddings = false;
  if (args.has("--tied")) c.tied_embeddings = true;
  SX_ASSIGN_OR_RETURN(std::string type_name, args.get_string("--type", "f16"));
  auto type = hal::dtype_from_name(type_name);
  if (!type || (*type != hal::DType::kF32 && *type != hal::DType::kF16 && *type != hal::DType::kBF16 &&
                *type != hal::DType::kQ8_0)) {
    return invalid_argument_error("--type must be f32, f16, bf16 or q8_0, got '{}'", type_name);
  }
  spec.weight_type = *type;
  SX_ASSIGN_OR_RETURN(std::int64_t seed, args.get_int("--seed", 0, 0, INT64_MAX));
  spec.seed = static_cast<std::uint64_t>(seed);
  if (auto tok_path = args.get("--tokenizer")) {
    SX_ASSIGN_OR_RETURN(auto tok, tokenizer::Tokenizer::from_hf_json(*tok_path));
    const tokenizer::TokenizerData& d = tok->data();
    model::TokenizerMetadata& t = spec.tokenizer;
    t.tokens = d.tokens;
    t.merges = d.merges;
    t.token_types = d.token_types;
    t.pre = d.pre;
    t.eos_id = d.eos_id.value_or(-1);
    t.bos_id = d.bos_id.value_or(-1);
    t.pad_id = d.pad_id.value_or(-1);
    t.add_bos = d.add_bos;
    t.chat_template = d.chat_template;
    if (static_cast<std::int64_t>(t.tokens.size()) > c.vocab) {
      return invalid_argument_error("the tokenizer has {} tokens but the shape's vocabulary is {}", t.tokens.size(), c.vocab);
    }
  }
  SX_ASSIGN_OR_RETURN(c.vocab, args.get_int("--vocab", c.vocab, 1, 1 << 24));
  SX_RETURN_IF_ERROR(model::write_random_qwen2_gguf(spec, *out));
  std::printf("wrote %s: qwen2 %lld layers, hidden %lld, %lld/%lld heads, ffn %lld, vocab %lld, %s weights\n",
              out->c_str(), static_cast<long long>(c.n_layers), static_cast<long long>(c.hidden),
              static_cast<long long>(c.n_heads), static_cast<long long>(c.n_kv_heads), static_cast<long long>(c.ffn),
              static_cast<long long>(c.vocab), std::string(hal::dtype_name(spec.weight_type)).c_str());
  return ok_status();
}

}  // namespace

int cmd_make_model(int argc, char** argv) {
  Args args("make-model", "Write a random-weight qwen2 GGUF (default: the Qwen2.5-0.5B shape).",
            {
                {{"-o", "--out"}, true, false, "output file", "FILE"},
                {{"--shape"}, true, false, "Qwen2.5 size: 0.5b (default), 1.5b, 3b, 7b, 14b, 32b, 72b", "SIZE"},
                {{"--type"}, true, false, "2-D weight format: f32, f16 (default), bf16, q8_0", "TYPE"},
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
