// The `sextant` binary: dispatches to subcommands.
#include <cstdio>
#include <cstring>
#include <string_view>

#include "daemon/commands/commands.h"

namespace {

constexpr const char* kUsage =
    "usage: sextant <command> [options]\n"
    "\n"
    "commands:\n"
    "  serve        serve the model over an OpenAI-compatible HTTP API (and an admin socket)\n"
    "  generate     generate text from a prompt (streams to stdout)\n"
    "  bench        measure prefill/decode speed against the memory-bandwidth bound\n"
    "  tokenize     print the token ids of a text\n"
    "  make-model   write a random-weight Qwen2 / 2.5, Qwen3 (dense, MoE) or Qwen3.5 / 3.6 / 3.8 hybrid model\n"
    "               (GGUF or safetensors) of any shape and type\n"
    "  inspect      show a model's format, config, tokenizer and tensors, and whether it can be served\n"
    "  convert      convert a safetensors directory or GGUF file to GGUF (f16, bf16, q8_0, q4_k, ...)\n"
    "  plan         show what every rank of a TP x PP group holds (heads, FFN rows, bytes)\n"
    "  pull         fetch a model from the Hugging Face Hub or ModelScope, resumable and verified\n"
    "  ls           list the models in the Hugging Face cache\n"
    "  rm           remove models from the Hugging Face cache\n"
    "  doctor       check the machine, GPUs, links, NCCL, model and deployment before serving\n"
    "  logs         the starts serve kept: list, --show N, --diff (what changed between the last two)\n"
    "  ctl          send a command (status, plan, drain, ...) to a running daemon's admin socket\n"
    "\n"
    "Run 'sextant <command> --help' for the options of a command.\n";

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2 || std::strcmp(argv[1], "--help") == 0 || std::strcmp(argv[1], "-h") == 0) {
    std::fputs(kUsage, argc < 2 ? stderr : stdout);
    return argc < 2 ? 2 : 0;
  }
  const std::string_view cmd = argv[1];
  int sub_argc = argc - 2;
  char** sub_argv = argv + 2;
  if (cmd == "serve") return sx::daemon::cmd_serve(sub_argc, sub_argv);
  if (cmd == "generate") return sx::daemon::cmd_generate(sub_argc, sub_argv);
  if (cmd == "bench") return sx::daemon::cmd_bench(sub_argc, sub_argv);
  if (cmd == "tokenize") return sx::daemon::cmd_tokenize(sub_argc, sub_argv);
  if (cmd == "make-model") return sx::daemon::cmd_make_model(sub_argc, sub_argv);
  if (cmd == "convert") return sx::daemon::cmd_convert(sub_argc, sub_argv);
  if (cmd == "inspect") return sx::daemon::cmd_inspect(sub_argc, sub_argv);
  if (cmd == "plan") return sx::daemon::cmd_plan(sub_argc, sub_argv);
  if (cmd == "doctor") return sx::daemon::cmd_doctor(sub_argc, sub_argv);
  if (cmd == "logs") return sx::daemon::cmd_logs(sub_argc, sub_argv);
  if (cmd == "ctl") return sx::daemon::cmd_ctl(sub_argc, sub_argv);
  if (cmd == "pull") return sx::daemon::cmd_pull(sub_argc, sub_argv);
  if (cmd == "ls") return sx::daemon::cmd_ls(sub_argc, sub_argv);
  if (cmd == "rm") return sx::daemon::cmd_rm(sub_argc, sub_argv);
  std::fprintf(stderr, "sextant: unknown command '%.*s'\n\n%s", static_cast<int>(cmd.size()), cmd.data(), kUsage);
  return 2;
}
