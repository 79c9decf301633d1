// `sextant generate`: streams a completion for one prompt and reports speed on stderr.
#include <cstdio>
#include <string>

#include "daemon/commands/chat_args.h"
#include "daemon/commands/commands.h"
#include "daemon/commands/model_session.h"
#include "runtime/engine/generator.h"

namespace sx::daemon {

namespace {

Result<engine::GenerateOptions> generate_options(const Args& args) {
  engine::GenerateOptions o;
  SX_ASSIGN_OR_RETURN(o.max_tokens, args.get_int("--max-tokens", 128, 0, 1 << 24));
  SX_ASSIGN_OR_RETURN(double temp, args.get_double("--temp", 0.0));
  SX_ASSIGN_OR_RETURN(std::int64_t top_k, args.get_int("--top-k", 0, -1, 1 << 30));
  SX_ASSIGN_OR_RETURN(double top_p, args.get_double("--top-p", 1.0));
  SX_ASSIGN_OR_RETURN(double min_p, args.get_double("--min-p", 0.0));
  SX_ASSIGN_OR_RETURN(double rep, args.get_double("--repeat-penalty", 1.0));
  SX_ASSIGN_OR_RETURN(double pres, args.get_double("--presence-penalty", 0.0));
  SX_ASSIGN_OR_RETURN(double freq, args.get_double("--frequency-penalty", 0.0));
  o.sampling.temperature = static_cast<float>(temp);
  o.sampling.top_k = static_cast<std::int32_t>(top_k);
  o.sampling.top_p = static_cast<float>(top_p);
  o.sampling.min_p = static_cast<float>(min_p);
  o.sampling.repetition_penalty = static_cast<float>(rep);
  o.sampling.presence_penalty = static_cast<float>(pres);
  o.sampling.frequency_penalty = static_cast<float>(freq);
  if (args.has("--seed")) {
    SX_ASSIGN_OR_RETURN(std::int64_t seed, args.get_int("--seed", 0, 0, INT64_MAX));
    o.sampling.seed = static_cast<std::uint64_t>(seed);
  }
  SX_RETURN_IF_ERROR(o.sampling.validate());
  o.stop_strings = args.get_all("--stop");
  for (const std::string& id : args.get_all("--stop-id")) {
    char* end = nullptr;
    const long v = std::strtol(id.c_str(), &end, 10);
    if (id.empty() || *end != '\0' || v < 0) return invalid_argument_error("--stop-id expects a token id, got '{}'", id);
    o.stop_ids.push_back(static_cast<std::int32_t>(v));
  }
  o.ignore_eos = args.has("--ignore-eos");
  return o;
}

}  // namespace

int cmd_generate(int argc, char** argv) {
  std::vector<Args::Spec> specs = model_session_specs();
  std::vector<Args::Spec> own = {
      {{"-p", "--prompt"}, true, false, "prompt text (or give it as the argument)", "TEXT"},
      {{"-n", "--max-tokens"}, true, false, "tokens to generate (default 128)", "N"},
      {{"--temp", "--temperature"}, true, false, "sampling temperature; 0 = greedy (default 0)", "T"},
      {{"--top-k"}, true, false, "top-k (0 = off)", "K"},
      {{"--top-p"}, true, false, "nucleus sampling mass (default 1)", "P"},
      {{"--min-p"}, true, false, "min-p (default 0)", "P"},
      {{"--repeat-penalty", "--repetition-penalty"}, true, false, "repetition penalty (default 1)", "X"},
      {{"--presence-penalty"}, true, false, "presence penalty (default 0)", "X"},
      {{"--frequency-penalty"}, true, false, "frequency penalty (default 0)", "X"},
      {{"--seed"}, true, false, "random seed (same seed, same output)", "N"},
      {{"--stop"}, true, true, "stop string (repeatable)", "TEXT"},
      {{"--stop-id"}, true, true, "stop token id (repeatable)", "ID"},
      {{"--ignore-eos"}, false, false, "do not stop at end-of-sequence tokens", ""},
      {{"--ids"}, false, false, "print generated token ids instead of text", ""},
  };
  const std::vector<Args::Spec> chat_flags = chat_specs("the prompt");
  own.insert(own.begin() + 1, chat_flags.begin(), chat_flags.end());  // after --prompt
  specs.insert(specs.end(), own.begin(), own.end());
  Args args("generate", "Generate text from a prompt, streaming it to stdout.", specs, "[PROMPT]");
  if (Status s = args.parse(argc, argv); !s.ok()) return report_error("generate", s);
  if (args.has("--help")) {
    std::fputs(args.usage().c_str(), stdout);
    return 0;
  }
  std::string prompt;
  if (auto p = args.get("--prompt")) {
    prompt = *p;
  } else if (args.positional().size() == 1) {
    prompt = args.positional()[0];
  } else {
    return report_error("generate", invalid_argument_error("give one prompt (--prompt TEXT or a single argument)"));
  }
  auto opts = generate_options(args);
  if (!opts.ok()) return report_error("generate", opts.status());
  auto chat = chat_args(args);
  if (!chat.ok()) return report_error("generate", chat.status());

  // Open the model first to tokenize, then size the cache for prompt + max_tokens.
  auto opened = open_model_arg(args);
  if (!opened.ok()) return report_error("generate", opened.status());
  if (chat->chat) {  // as serve's /apply-template renders [system?, user]
    std::string said;
    auto rendered = render_chat_args(*chat, *opened->tokenizer, *args.get("--model"), prompt, &said);
    if (!rendered.ok()) return report_error("generate", rendered.status());
    std::fprintf(stderr, "sextant generate: %s\n", said.c_str());
    prompt = std::move(rendered).value();
  }
  std::vector<std::int32_t> ids = opened->tokenizer->encode(prompt);
  const std::int64_t need = static_cast<std::int64_t>(ids.size()) + opts->max_tokens;
  const std::int64_t context_length = opened->config.context_length;
  auto session = open_session(args, std::move(opened).value(), std::min(need, context_length));
  if (!session.ok()) return report_error("generate", session.status());

  const bool print_ids = args.has("--ids");
  opts->eos_ids = session->opened.extra_eos_ids;
  auto result = engine::generate(*session->model, *session->opened.tokenizer, ids, *opts, [&](std::string_view piece) {
    if (!print_ids) {
      std::fwrite(piece.data(), 1, piece.size(), stdout);
      std::fflush(stdout);
    }
  });
  if (!result.ok()) {
    std::fputc('\n', stdout);
    return report_error("generate", result.status());
  }
  if (print_ids) {
    std::string line;
    for (std::int32_t id : result->tokens) line += (line.empty() ? "" : " ") + std::to_string(id);
    std::printf("%s\n", line.c_str());
  } else {
    std::fputc('\n', stdout);
  }
  const auto n_gen = static_cast<double>(result->tokens.size());
  std::fprintf(stderr,
               "sextant generate: prompt %zu tokens in %.3f s (%.1f tokens/s); generated %zu tokens in %.3f s "
               "(%.1f tokens/s); finish: %s\n",
               ids.size(), result->prefill_seconds, static_cast<double>(ids.size()) / result->prefill_seconds,
               result->tokens.size(), result->decode_seconds,
               n_gen > 1 && result->decode_seconds > 0 ? (n_gen - 1) / result->decode_seconds : 0.0,
               std::string(engine::finish_reason_name(result->finish)).c_str());
  return 0;
}

}  // namespace sx::daemon
