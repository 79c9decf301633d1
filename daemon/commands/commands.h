// The sextant subcommands. Each returns the process exit code (0 ok, 1 failure, 2 usage error).
#pragma once

#include <string>

#include "runtime/base/status.h"

namespace sx::daemon {

int cmd_generate(int argc, char** argv);
int cmd_bench(int argc, char** argv);
int cmd_make_model(int argc, char** argv);
int cmd_convert(int argc, char** argv);
int cmd_inspect(int argc, char** argv);
int cmd_plan(int argc, char** argv);
int cmd_doctor(int argc, char** argv);
int cmd_logs(int argc, char** argv);
int cmd_tokenize(int argc, char** argv);
int cmd_ctl(int argc, char** argv);
int cmd_serve(int argc, char** argv);
int cmd_pull(int argc, char** argv);
int cmd_ls(int argc, char** argv);
int cmd_rm(int argc, char** argv);

// `--model` / model.path: a model reference (ORG/NAME[:QUANT], hf: / ms: prefixed; an existing
// file or directory of that name wins) -> what its cached snapshot serves (the directory, or the
// quantisation's GGUF file), pulled first when `pull_if_missing`; anything else is returned as
// is. NOT_FOUND names the `sextant pull` command that would fetch a missing model.
Result<std::string> resolve_model_path(const std::string& text, bool pull_if_missing);

}  // namespace sx::daemon
