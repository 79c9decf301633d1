// `sextant convert`: any model Sextant opens (a Hugging Face safetensors directory or a GGUF file)
// -> a GGUF file of the chosen weight format (or a safetensors directory with --format).
#include <cstdio>
#include <string>

#include "daemon/commands/commands.h"
#include "daemon/commands/model_session.h"
#include "runtime/engine/model_export.h"

namespace sx::daemon {

namespace {

Status convert(const Args& args) {
  if (args.positional().size() != 1) return invalid_argument_error("give exactly one model PATH to convert");
  const std::string in = args.positional()[0];
  auto out = args.get("--out");
  if (!out) return invalid_argument_error("--out PATH is required");
  SX_ASSIGN_OR_RETURN(std::string format, args.get_string("--format", "gguf"));
  if (format != "gguf" && format != "safetensors") {
    return invalid_argument_error("--format must be gguf or safetensors, got '{}'", format);
  }
  SX_ASSIGN_OR_RETURN(std::string type_name, args.get_string("--type", format == "gguf" ? "f16" : "bf16"));
  const auto type = hal::dtype_from_name(type_name);
  if (!type) return invalid_argument_error("--type '{}' is not a weight format", type_name);
  SX_ASSIGN_OR_RETURN(std::int64_t shards, args.get_int("--shards", 1, 1, 99999));
  SX_ASSIGN_OR_RETURN(const std::string path, resolve_model_path(in, false));  // ORG/NAME: its cached snapshot
  SX_ASSIGN_OR_RETURN(engine::OpenedModel m, engine::open_model(path));
  for (const std::string& w : m.check.warnings) std::fprintf(stderr, "warning: %s\n", w.c_str());
  if (format == "gguf") {
    if (args.has("--shards")) return invalid_argument_error("--shards goes with --format safetensors");
    SX_RETURN_IF_ERROR(engine::convert_to_gguf(m, *type, *out));
  } else {
    SX_RETURN_IF_ERROR(engine::export_safetensors(m, *type, static_cast<int>(shards), *out));
  }
  std::printf("wrote %s: %s (%s) as %s %s\n", out->c_str(), in.c_str(), std::string(m.weights->format()).c_str(),
              std::string(hal::dtype_name(*type)).c_str(), format.c_str());
  return ok_status();
}

}  // namespace

int cmd_convert(int argc, char** argv) {
  Args args("convert",
            "Convert a model (Hugging Face safetensors directory or GGUF file) to GGUF, or to a safetensors "
            "directory with --format safetensors. Matrices whose rows are not whole blocks of a K-quant fall back "
            "to q5_0 (q6_k: q8_0), as llama.cpp does; norms and biases stay f32.",
            {
                {{"-o", "--out"}, true, false, "output GGUF file (a directory with --format safetensors)", "PATH"},
                {{"--type"}, true, false,
                 "weight format: f32, f16 (default), bf16, q8_0, q4_0, q4_1, q5_0, q5_1, q4_k, q5_k, q6_k; "
                 "safetensors: f32, f16, bf16 (default)",
                 "TYPE"},
                {{"--format"}, true, false, "gguf (default) or safetensors", "FORMAT"},
                {{"--shards"}, true, false, "safetensors: split the weights into N files with an index", "N"},
            },
            "PATH");
  if (Status s = args.parse(argc, argv); !s.ok()) return report_error("convert", s);
  if (args.has("--help")) {
    std::fputs(args.usage().c_str(), stdout);
    return 0;
  }
  if (Status s = convert(args); !s.ok()) return report_error("convert", s);
  return 0;
}

}  // namespace sx::daemon
