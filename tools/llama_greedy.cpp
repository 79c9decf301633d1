// The llama.cpp oracle of an architecture (tools/README.md, scripts/llama-cpp-oracle): loads a GGUF
// with llama.cpp's own code, tokenizes a prompt with its tokenizer, and greedy-decodes N tokens (the
// argmax of each step's logits, end-of-sequence ignored), printing one JSON line
//   {"prompt_ids": [...], "ids": [...], "kv": "f32" | "f16"}
// that Sextant's greedy ids are compared with. Built against the pinned llama.cpp release by
// scripts/llama-cpp-oracle; not part of the Sextant build.
//
// Usage: llama_greedy MODEL.gguf PROMPT N [f32|f16]
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "llama.h"

int main(int argc, char** argv) {
  if (argc < 4) {
    std::fprintf(stderr, "usage: %s MODEL.gguf PROMPT N [f32|f16]\n", argv[0]);
    return 2;
  }
  const char* path = argv[1];
  const std::string prompt = argv[2];
  const int n = std::atoi(argv[3]);
  const bool f32 = argc < 5 || std::strcmp(argv[4], "f16") != 0;
  llama_log_set([](ggml_log_level, const char*, void*) {}, nullptr);
  llama_backend_init();
  llama_model_params mp = llama_model_default_params();
  mp.n_gpu_layers = 0;
  llama_model* model = llama_model_load_from_file(path, mp);
  if (model == nullptr) {
    std::fprintf(stderr, "llama_greedy: llama.cpp cannot load %s\n", path);
    return 1;
  }
  const llama_vocab* vocab = llama_model_get_vocab(model);
  std::vector<llama_token> tokens(prompt.size() + 8);
  const int np = llama_tokenize(vocab, prompt.data(), static_cast<int>(prompt.size()), tokens.data(),
                                static_cast<int>(tokens.size()), /*add_special=*/true, /*parse_special=*/false);
  if (np <= 0) {
    std::fprintf(stderr, "llama_greedy: the prompt tokenizes to nothing\n");
    return 1;
  }
  tokens.resize(static_cast<std::size_t>(np));
  llama_context_params cp = llama_context_default_params();
  cp.n_ctx = static_cast<uint32_t>(np + n + 8);
  cp.n_batch = cp.n_ctx;
  cp.n_ubatch = cp.n_ctx;
  cp.n_threads = 2;
  cp.n_threads_batch = 2;
  cp.flash_attn_type = LLAMA_FLASH_ATTN_TYPE_DISABLED;
  cp.type_k = f32 ? GGML_TYPE_F32 : GGML_TYPE_F16;
  cp.type_v = f32 ? GGML_TYPE_F32 : GGML_TYPE_F16;
  llama_context* ctx = llama_init_from_model(model, cp);
  if (ctx == nullptr) {
    std::fprintf(stderr, "llama_greedy: cannot create a context\n");
    return 1;
  }
  const int n_vocab = llama_vocab_n_tokens(vocab);
  std::vector<llama_token> out;
  std::vector<llama_token> step = tokens;
  for (int i = 0; i < n; ++i) {
    if (llama_decode(ctx, llama_batch_get_one(step.data(), static_cast<int32_t>(step.size()))) != 0) {
      std::fprintf(stderr, "llama_greedy: llama_decode failed at step %d\n", i);
      return 1;
    }
    const float* logits = llama_get_logits_ith(ctx, -1);
    int best = 0;
    for (int t = 1; t < n_vocab; ++t) {
      if (logits[t] > logits[best]) best = t;
    }
    out.push_back(best);
    step.assign(1, best);
  }
  std::printf("{\"prompt_ids\": [");
  for (int i = 0; i < np; ++i) std::printf("%s%d", i ? ", " : "", tokens[static_cast<std::size_t>(i)]);
  std::printf("], \"ids\": [");
  for (std::size_t i = 0; i < out.size(); ++i) std::printf("%s%d", i ? ", " : "", out[i]);
  std::printf("], \"kv\": \"%s\"}\n", f32 ? "f32" : "f16");
  llama_free(ctx);
  llama_model_free(model);
  llama_backend_free();
  return 0;
}
