// The sextant subcommands. Each returns the process exit code (0 ok, 1 failure, 2 usage error).
#pragma once

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

}  // namespace sx::daemon
