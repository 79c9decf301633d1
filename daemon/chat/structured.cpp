// Grammars on xgrammar (structured.h). xgrammar's headers are included here only.
#include "daemon/chat/structured.h"

#include <dlpack/dlpack.h>
#include <xgrammar/xgrammar.h>

#include <algorithm>
#include <chrono>
#include <exception>
#include <optional>
#include <thread>

#include <fmt/format.h>

#include "runtime/base/json_depth.h"

namespace sx::chat {

class CompiledFormat {
 public:
  explicit CompiledFormat(xgrammar::CompiledGrammar g) : grammar(std::move(g)) {}
  xgrammar::CompiledGrammar grammar;
};

namespace {

using nlohmann::ordered_json;

// What a template that opened <think> in the prompt needs before the format: the thinking closed.
constexpr std::string_view kCloseThinking = "</think>\n\n";

// The compile cache's bound (xgrammar keeps compiled grammars and their token-mask caches; a client
// sending a new schema with every request would otherwise grow it without end): vLLM's default.
constexpr std::int64_t kCompileCacheBytes = std::int64_t{512} << 20;

// One choice's place in its grammar.
class GrammarConstraint final : public engine::TokenConstraint {
 public:
  GrammarConstraint(const xgrammar::CompiledGrammar& g, int vocab, const std::vector<std::int32_t>& stops)
      : matcher_(g), words_(xgrammar::GetBitmaskSize(vocab)), stops_(stops) {}

  void fill_mask(std::span<std::uint32_t> words) override {
    const auto n = static_cast<std::int64_t>(std::min<std::size_t>(words.size(), static_cast<std::size_t>(words_)));
    bool any = false;
    if (!matcher_.IsTerminated() && !broken_) {
      std::int64_t shape[1] = {n};
      DLTensor t{};
      t.data = words.data();
      t.device = DLDevice{kDLCPU, 0};
      t.ndim = 1;
      t.dtype = xgrammar::GetBitmaskDLType();
      t.shape = shape;
      try {
        matcher_.FillNextTokenBitmask(&t);
      } catch (const std::exception&) {
        broken_ = true;
        std::fill(words.begin(), words.end(), 0u);
      }
      any = std::any_of(words.begin(), words.begin() + n, [](std::uint32_t w) { return w != 0; });
    }
    // A grammar at its end (or at a dead end) leaves the stop tokens: the answer ends.
    if (!any) {
      for (const std::int32_t s : stops_) {
        if (s >= 0 && static_cast<std::size_t>(s) / 32 < words.size()) words[static_cast<std::size_t>(s) / 32] |= 1u << (s % 32);
      }
    }
  }

  void accept(std::int32_t token) override {
    if (matcher_.IsTerminated() || broken_) return;
    try {
      if (!matcher_.AcceptToken(token)) broken_ = true;  // only a token the mask refused (a test script)
    } catch (const std::exception&) {
      broken_ = true;
    }
  }

 private:
  xgrammar::GrammarMatcher matcher_;
  int words_;
  std::vector<std::int32_t> stops_;
  bool broken_ = false;
};

std::string dump(const ordered_json& j) { return j.dump(-1, ' ', false, ordered_json::error_handler_t::replace); }

// An EBNF string literal of `s`: xgrammar reads JSON's escapes (\", \\, \n, \u0001) in them.
std::string ebnf_literal(std::string_view s) { return dump(ordered_json(std::string(s))); }

xgrammar::Grammar literal_grammar(std::string_view s) { return xgrammar::Grammar::FromEBNF("root ::= " + ebnf_literal(s)); }

// xgrammar's message without its time, source file and line ("[08:58:58] .../regex_converter.cc:83:
// Regex parsing error ...") and without the lines after the first.
std::string xgrammar_message(const std::exception& e) {
  std::string what = e.what();
  if (const std::size_t nl = what.find('\n'); nl != std::string::npos) what.resize(nl);
  if (!what.empty() && what.front() == '[') {
    if (const std::size_t cc = what.find(".cc:"); cc != std::string::npos) {
      if (const std::size_t colon = what.find(": ", cc); colon != std::string::npos) what.erase(0, colon + 2);
    }
  }
  return what;
}

using Clock = std::chrono::steady_clock;

// The budget of one call as xgrammar's interrupt check on this thread (the patched hook, called
// between a compile's steps), removed when the call returns.
class Interrupts {
 public:
  enum class Why { kNone, kDeadline, kCancelled };

  explicit Interrupts(const CompileBudget& budget) : budget_(budget), start_(Clock::now()) {
    xgrammar::SetCompileInterruptCheck([this] { return why() != Why::kNone; });
  }
  ~Interrupts() { xgrammar::SetCompileInterruptCheck({}); }
  Interrupts(const Interrupts&) = delete;
  Interrupts& operator=(const Interrupts&) = delete;

  Why why() const {
    if (budget_.cancelled && budget_.cancelled()) return Why::kCancelled;
    if (budget_.timeout.count() > 0 && Clock::now() - start_ >= budget_.timeout) return Why::kDeadline;
    return Why::kNone;
  }

  // fn() (which may throw xgrammar's exceptions) as a Result: an interruption of this call's own is
  // DEADLINE_EXCEEDED or CANCELLED naming `param`; another call's (a compile of the same grammar
  // that this one waited for in xgrammar's cache, stopped by that call's budget) is not this one's
  // failure: fn runs again (the cache dropped the failed entry, so this thread now compiles it;
  // each retry needs another thread's compile of it to have been stopped, so a few are plenty).
  // Any other exception is INVALID_ARGUMENT naming `param`, with xgrammar's message.
  template <typename T, typename Fn>
  Result<T> run(std::string_view param, Fn&& fn) const {
    constexpr int kTries = 8;
    for (int tries = 1;; ++tries) {
      try {
        return fn();
      } catch (const xgrammar::CompileInterruptedError&) {
        switch (why()) {
          case Why::kCancelled: return cancelled_error("'{}': the compile was cancelled", param);
          case Why::kDeadline:
            return deadline_exceeded_error("'{}' did not compile within {} ms: the grammar engine needs longer for "
                                           "it on this model's vocabulary; send a simpler one (fewer nested levels, "
                                           "rules or alternatives)",
                                           param, budget_.timeout.count());
          case Why::kNone:
            if (tries == kTries) {
              return unavailable_error("'{}': {} compiles of it by other requests were stopped while this one waited "
                                       "for them; retry", param, kTries);
            }
            // The waiters of a failed cache entry can ask again before its computing thread has
            // dropped it, and meet the same failure (seen under AddressSanitizer: 8 tries within
            // microseconds): back off 1, 2, 4 ... ms.
            std::this_thread::sleep_for(std::chrono::milliseconds(1 << (tries - 1)));
            continue;
        }
      } catch (const std::exception& e) {
        return invalid_argument_error("'{}' cannot be used: {}", param, xgrammar_message(e));
      }
    }
  }

 private:
  const CompileBudget& budget_;
  Clock::time_point start_;
};

// A JSON schema's grammar in xgrammar's strict mode, or where strict mode's reading allows nothing
// (an array without "items" takes no items in it, so {"type": "array", "minItems": 1} is refused as
// unsatisfiable), by JSON Schema's own rules. The strict mode's error when neither converts.
xgrammar::Grammar schema_grammar(const std::string& schema) {
  try {
    return xgrammar::Grammar::FromJSONSchema(schema, /*any_whitespace=*/false);
  } catch (const xgrammar::CompileInterruptedError&) {
    throw;
  } catch (const std::exception&) {
    const std::exception_ptr strict_error = std::current_exception();
    std::optional<xgrammar::Grammar> lax;
    try {
      lax = xgrammar::Grammar::FromJSONSchema(schema, /*any_whitespace=*/false, std::nullopt, std::nullopt,
                                              /*strict_mode=*/false);
    } catch (const xgrammar::CompileInterruptedError&) {
      throw;
    } catch (const std::exception&) {
    }
    if (!lax) std::rethrow_exception(strict_error);
    return *lax;
  }
}

// The parameters schema of a tool (an empty object schema when it gives none).
ordered_json parameters_of(const ordered_json& tool) {
  const ordered_json& fn = tool["function"];
  if (fn.contains("parameters") && fn["parameters"].is_object()) return fn["parameters"];
  return ordered_json{{"type", "object"}};
}

// An XML parameter's value as the template writes it: an enum's members, a plain string as it is
// (within its lengths), anything else as JSON held to its schema.
xgrammar::Grammar xml_value_grammar(const ordered_json& schema) {
  const std::string type = schema.is_object() && schema.contains("type") && schema["type"].is_string()
                               ? schema["type"].get<std::string>()
                               : "";
  if (schema.is_object() && schema.contains("enum") && schema["enum"].is_array() && !schema["enum"].empty()) {
    std::string alts;
    for (const ordered_json& v : schema["enum"]) {
      alts += (alts.empty() ? "" : " | ") + ebnf_literal(v.is_string() ? v.get<std::string>() : dump(v));
    }
    return xgrammar::Grammar::FromEBNF("root ::= " + alts);
  }
  if (type == "string") {
    // The string as it is, without a '<' (which would open the next tag), within its lengths.
    const auto bound = [&](const char* key) {
      return schema.contains(key) && schema[key].is_number_unsigned() ? schema[key].get<std::uint64_t>() : 0;
    };
    const std::uint64_t lo = bound("minLength"), hi = bound("maxLength");
    if (schema.contains("maxLength")) return xgrammar::Grammar::FromEBNF(fmt::format("root ::= [^<]{{{},{}}}", lo, hi));
    return xgrammar::Grammar::FromEBNF(lo > 0 ? fmt::format("root ::= [^<]{{{},}}", lo) : "root ::= [^<]*");
  }
  // Anything else as JSON, held to its schema (numbers within their bounds, true / false, objects).
  return schema_grammar(dump(schema.is_object() ? schema : ordered_json::object()));
}

// What a hermes call writes before its arguments.
std::string hermes_head(const std::string& name) {
  return "<tool_call>\n{\"name\": " + dump(ordered_json(name)) + ", \"arguments\": ";
}

// The required parameters of a tool's schema, in its order (what an XML call writes).
std::vector<std::string> required_parameters(const ordered_json& params) {
  std::vector<std::string> out;
  if (!params.contains("properties") || !params["properties"].is_object()) return out;
  const ordered_json required = params.value("required", ordered_json::array());
  if (!required.is_array()) return out;
  for (const auto& [key, schema] : params["properties"].items()) {
    if (std::find(required.begin(), required.end(), ordered_json(key)) != required.end()) out.push_back(key);
  }
  return out;
}

// What an XML call writes before its first value (or its end, with no required parameter).
std::string xml_head(const std::string& name, const ordered_json& params) {
  const std::vector<std::string> required = required_parameters(params);
  return "<tool_call>\n<function=" + name + ">\n" + (required.empty() ? "" : "<parameter=" + required[0] + ">\n");
}

xgrammar::Grammar tool_call_grammar(ToolSyntax syntax, const ordered_json& tool) {
  const std::string name = tool["function"]["name"].get<std::string>();
  const ordered_json params = parameters_of(tool);
  if (syntax == ToolSyntax::kHermes) {
    return xgrammar::Grammar::Concat(
        {literal_grammar(hermes_head(name)), schema_grammar(dump(params)), literal_grammar("}\n</tool_call>")});
  }
  // XML: the required parameters, in the schema's order.
  std::vector<xgrammar::Grammar> parts{literal_grammar("<tool_call>\n<function=" + name + ">\n")};
  for (const std::string& key : required_parameters(params)) {
    parts.push_back(literal_grammar("<parameter=" + key + ">\n"));
    parts.push_back(xml_value_grammar(params["properties"][key]));
    parts.push_back(literal_grammar("\n</parameter>\n"));
  }
  parts.push_back(literal_grammar("</function>\n</tool_call>"));
  return xgrammar::Grammar::Concat(parts);
}

}  // namespace

struct Grammars::Impl {
  int vocab;
  std::vector<std::int32_t> stops;
  xgrammar::TokenizerInfo info;
  xgrammar::GrammarCompiler compiler;

  static std::vector<std::string> vocabulary(const tokenizer::Tokenizer& tok) {
    const tokenizer::TokenizerData& data = tok.data();
    std::vector<std::string> out(static_cast<std::size_t>(tok.vocab_size()));
    for (std::size_t i = 0; i < out.size(); ++i) {
      const std::int32_t type = i < data.token_types.size() ? data.token_types[i] : tokenizer::kTokenNormal;
      if (type == tokenizer::kTokenControl || type == tokenizer::kTokenUnused || type == tokenizer::kTokenUnknown) continue;
      out[i] = tok.token_bytes(static_cast<std::int32_t>(i));
    }
    return out;
  }

  Impl(const tokenizer::Tokenizer& tok, std::vector<std::int32_t> stop_ids)
      : vocab(tok.vocab_size()),
        stops(std::move(stop_ids)),
        info(vocabulary(tok), xgrammar::VocabType::RAW, tok.vocab_size(), stops, false),
        compiler(info, /*max_threads=*/1, /*cache_enabled=*/true, kCompileCacheBytes) {}

  // Whether an answer of `g` that begins with `head` can go on: `head` matches, and then a token or
  // the end (a stop token) is allowed. False for a grammar that matches no text at all (a $ref
  // cycle with no way out), whose answer would be empty and broken.
  bool can_continue(const xgrammar::CompiledGrammar& g, const std::string& head) const {
    xgrammar::GrammarMatcher m(g);
    if (!head.empty() && !m.AcceptString(head)) return false;
    if (m.IsTerminated()) return true;
    std::vector<std::int32_t> words(static_cast<std::size_t>(xgrammar::GetBitmaskSize(vocab)), 0);
    std::int64_t shape[1] = {static_cast<std::int64_t>(words.size())};
    DLTensor t{};
    t.data = words.data();
    t.device = DLDevice{kDLCPU, 0};
    t.ndim = 1;
    t.dtype = xgrammar::GetBitmaskDLType();
    t.shape = shape;
    m.FillNextTokenBitmask(&t);
    return std::any_of(words.begin(), words.end(), [](std::int32_t w) { return w != 0; });
  }
};

namespace {

// INVALID_ARGUMENT naming `param` when the JSON `text` nests deeper than kMaxFormatDepth.
Status check_format_depth(std::string_view param, std::string_view text) {
  if (const std::size_t depth = json_shape(text).depth; depth > kMaxFormatDepth) {
    return invalid_argument_error("'{}' nests {} levels deep; at most {} are accepted", param, depth, kMaxFormatDepth);
  }
  return ok_status();
}

std::string no_answer(std::string_view param) {
  return fmt::format("'{}' cannot be used: no text matches it (its grammar allows neither a first token nor an "
                     "empty answer, e.g. a $ref that leads only to itself)",
                     param);
}

}  // namespace

Grammars::Grammars(const tokenizer::Tokenizer& tok, std::vector<std::int32_t> stop_ids)
    : impl_(std::make_unique<Impl>(tok, std::move(stop_ids))) {}
Grammars::~Grammars() = default;

Result<std::shared_ptr<const CompiledFormat>> Grammars::compile(const OutputFormat& f, bool close_thinking,
                                                                const CompileBudget& budget) {
  std::size_t bytes = f.source.size();
  for (const std::string& c : f.choices) bytes += c.size();
  if (bytes > kMaxFormatBytes) {
    return invalid_argument_error("'{}' has {} bytes; at most {} are accepted", f.param, bytes, kMaxFormatBytes);
  }
  if (f.kind == OutputFormat::Kind::kJsonSchema) SX_RETURN_IF_ERROR(check_format_depth(f.param, f.source));
  // A format's grammar; an object for json_object (xgrammar's built-in JSON grammar allows arrays too).
  auto grammar = [&]() -> xgrammar::Grammar {
    switch (f.kind) {
      case OutputFormat::Kind::kJsonObject:
        return xgrammar::Grammar::FromJSONSchema(R"({"type": "object"})", /*any_whitespace=*/false, std::nullopt,
                                                 std::nullopt, /*strict_mode=*/false);
      case OutputFormat::Kind::kJsonSchema: return schema_grammar(f.source);
      case OutputFormat::Kind::kRegex: return xgrammar::Grammar::FromRegex(f.source);
      case OutputFormat::Kind::kGrammar: return xgrammar::Grammar::FromEBNF(f.source, "root");
      case OutputFormat::Kind::kChoice: {
        std::string alts;
        for (const std::string& c : f.choices) alts += (alts.empty() ? "" : " | ") + ebnf_literal(c);
        return xgrammar::Grammar::FromEBNF("root ::= " + alts);
      }
      case OutputFormat::Kind::kText: break;
    }
    throw std::runtime_error("no format to compile");
  };
  const Interrupts interrupts(budget);
  auto compiled = interrupts.run<xgrammar::CompiledGrammar>(f.param, [&]() -> xgrammar::CompiledGrammar {
    if (!close_thinking && f.kind == OutputFormat::Kind::kJsonSchema) {  // keyed by the schema's text
      try {
        return impl_->compiler.CompileJSONSchema(f.source, /*any_whitespace=*/false);
      } catch (const xgrammar::CompileInterruptedError&) {
        throw;
      } catch (const std::exception&) {
        // Refused in strict mode: JSON Schema's own reading, as schema_grammar (the cache keeps both).
        const std::exception_ptr strict_error = std::current_exception();
        try {
          return impl_->compiler.CompileJSONSchema(f.source, /*any_whitespace=*/false, std::nullopt, std::nullopt,
                                                   /*strict_mode=*/false);
        } catch (const xgrammar::CompileInterruptedError&) {
          throw;
        } catch (const std::exception&) {
        }
        std::rethrow_exception(strict_error);
      }
    }
    xgrammar::Grammar g = grammar();
    if (close_thinking) g = xgrammar::Grammar::Concat({literal_grammar(kCloseThinking), g});
    return impl_->compiler.CompileGrammar(g);
  });
  if (!compiled.ok()) return compiled.status();
  auto can_continue = interrupts.run<bool>(f.param, [&] {
    return impl_->can_continue(*compiled, close_thinking ? std::string(kCloseThinking) : std::string());
  });
  if (!can_continue.ok()) return can_continue.status();
  if (!*can_continue) return invalid_argument_error("{}", no_answer(f.param));
  return std::make_shared<const CompiledFormat>(std::move(compiled).value());
}

Result<std::shared_ptr<const CompiledFormat>> Grammars::compile_tool_call(ToolSyntax syntax, const ordered_json& tools,
                                                                        const std::string& name, bool close_thinking,
                                                                        const CompileBudget& budget) {
  if (syntax == ToolSyntax::kNone) return invalid_argument_error("'tool_choice': the model's template shows no calls");
  const Interrupts interrupts(budget);
  std::vector<xgrammar::Grammar> calls;
  std::vector<std::size_t> called;  // the index in `tools` of each of `calls`
  for (std::size_t i = 0; i < tools.size(); ++i) {
    const ordered_json& t = tools[i];
    if (!name.empty() && t["function"]["name"] != name) continue;
    const std::string param = fmt::format("tools[{}].function.parameters", i);
    const std::string text = dump(parameters_of(t));
    if (text.size() > kMaxFormatBytes) {
      return invalid_argument_error("'{}' is over {} bytes", param, kMaxFormatBytes);
    }
    SX_RETURN_IF_ERROR(check_format_depth(param, text));
    auto call = interrupts.run<xgrammar::Grammar>(param, [&] { return tool_call_grammar(syntax, t); });
    if (!call.ok()) return call.status();
    calls.push_back(std::move(call).value());
    called.push_back(i);
  }
  if (calls.empty()) return invalid_argument_error("'tool_choice' names no tool of 'tools'");
  auto compiled = interrupts.run<xgrammar::CompiledGrammar>("tools", [&] {
    xgrammar::Grammar g = calls.size() == 1 ? calls[0] : xgrammar::Grammar::Union(calls);
    if (close_thinking) g = xgrammar::Grammar::Concat({literal_grammar(kCloseThinking), g});
    return impl_->compiler.CompileGrammar(g);
  });
  if (!compiled.ok()) return compiled.status();
  // Each called tool's arguments can begin (a schema that matches nothing would end the call there).
  for (std::size_t c = 0; c < called.size(); ++c) {
    const ordered_json& t = tools[called[c]];
    const std::string fn = t["function"]["name"].get<std::string>();
    const std::string head = std::string(close_thinking ? kCloseThinking : "") +
                             (syntax == ToolSyntax::kHermes ? hermes_head(fn) : xml_head(fn, parameters_of(t)));
    const std::string param = fmt::format("tools[{}].function.parameters", called[c]);
    auto ok = interrupts.run<bool>(param, [&] {
      xgrammar::CheckCompileInterrupt();  // between tools: a mask each
      return impl_->can_continue(*compiled, head);
    });
    if (!ok.ok()) return ok.status();
    if (!*ok) return invalid_argument_error("{}", no_answer(param));
  }
  return std::make_shared<const CompiledFormat>(std::move(compiled).value());
}

Result<std::shared_ptr<engine::TokenConstraint>> Grammars::constraint(const CompiledFormat& format) const {
  try {
    return std::shared_ptr<engine::TokenConstraint>(
        std::make_shared<GrammarConstraint>(format.grammar, impl_->vocab, impl_->stops));
  } catch (const std::exception& e) {
    return internal_error("structured output: xgrammar cannot start a matcher: {}", xgrammar_message(e));
  }
}

}  // namespace sx::chat
