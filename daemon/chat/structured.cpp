// Grammars on xgrammar (structured.h). xgrammar's headers are included here only.
#include "daemon/chat/structured.h"

#include <dlpack/dlpack.h>
#include <xgrammar/xgrammar.h>

#include <algorithm>
#include <exception>

#include <fmt/format.h>

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
  return xgrammar::Grammar::FromJSONSchema(dump(schema.is_object() ? schema : ordered_json::object()),
                                           /*any_whitespace=*/false);
}

xgrammar::Grammar tool_call_grammar(ToolSyntax syntax, const ordered_json& tool) {
  const std::string name = tool["function"]["name"].get<std::string>();
  const ordered_json params = parameters_of(tool);
  if (syntax == ToolSyntax::kHermes) {
    return xgrammar::Grammar::Concat(
        {literal_grammar("<tool_call>\n{\"name\": " + dump(ordered_json(name)) + ", \"arguments\": "),
         xgrammar::Grammar::FromJSONSchema(dump(params), /*any_whitespace=*/false), literal_grammar("}\n</tool_call>")});
  }
  // XML: the required parameters, in the schema's order.
  std::vector<xgrammar::Grammar> parts{literal_grammar("<tool_call>\n<function=" + name + ">\n")};
  if (params.contains("properties") && params["properties"].is_object()) {
    const ordered_json required = params.value("required", ordered_json::array());
    for (const auto& [key, schema] : params["properties"].items()) {
      if (!required.is_array() || std::find(required.begin(), required.end(), ordered_json(key)) == required.end()) {
        continue;
      }
      parts.push_back(literal_grammar("<parameter=" + key + ">\n"));
      parts.push_back(xml_value_grammar(schema));
      parts.push_back(literal_grammar("\n</parameter>\n"));
    }
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
};

Grammars::Grammars(const tokenizer::Tokenizer& tok, std::vector<std::int32_t> stop_ids)
    : impl_(std::make_unique<Impl>(tok, std::move(stop_ids))) {}
Grammars::~Grammars() = default;

Result<std::shared_ptr<const CompiledFormat>> Grammars::compile(const OutputFormat& f, bool close_thinking) {
  std::size_t bytes = f.source.size();
  for (const std::string& c : f.choices) bytes += c.size();
  if (bytes > kMaxFormatBytes) {
    return invalid_argument_error("'{}' has {} bytes; at most {} are accepted", f.param, bytes, kMaxFormatBytes);
  }
  // A format's grammar; an object for json_object (xgrammar's built-in JSON grammar allows arrays too).
  auto grammar = [&]() -> xgrammar::Grammar {
    switch (f.kind) {
      case OutputFormat::Kind::kJsonObject:
        return xgrammar::Grammar::FromJSONSchema(R"({"type": "object"})", /*any_whitespace=*/false, std::nullopt,
                                                 std::nullopt, /*strict_mode=*/false);
      case OutputFormat::Kind::kJsonSchema:
        return xgrammar::Grammar::FromJSONSchema(f.source, /*any_whitespace=*/false);
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
  try {
    if (!close_thinking && f.kind == OutputFormat::Kind::kJsonSchema) {  // keyed by the schema's text
      return std::make_shared<const CompiledFormat>(impl_->compiler.CompileJSONSchema(f.source, /*any_whitespace=*/false));
    }
    xgrammar::Grammar g = grammar();
    if (close_thinking) g = xgrammar::Grammar::Concat({literal_grammar(kCloseThinking), g});
    return std::make_shared<const CompiledFormat>(impl_->compiler.CompileGrammar(g));
  } catch (const std::exception& e) {
    return invalid_argument_error("'{}' cannot be used: {}", f.param, xgrammar_message(e));
  }
}

Result<std::shared_ptr<const CompiledFormat>> Grammars::compile_tool_call(ToolSyntax syntax, const ordered_json& tools,
                                                                        const std::string& name, bool close_thinking) {
  if (syntax == ToolSyntax::kNone) return invalid_argument_error("'tool_choice': the model's template shows no calls");
  std::vector<xgrammar::Grammar> calls;
  for (std::size_t i = 0; i < tools.size(); ++i) {
    const ordered_json& t = tools[i];
    if (!name.empty() && t["function"]["name"] != name) continue;
    if (dump(parameters_of(t)).size() > kMaxFormatBytes) {
      return invalid_argument_error("'tools[{}].function.parameters' is over {} bytes", i, kMaxFormatBytes);
    }
    try {
      calls.push_back(tool_call_grammar(syntax, t));
    } catch (const std::exception& e) {
      return invalid_argument_error("'tools[{}].function.parameters' cannot be used: {}", i, xgrammar_message(e));
    }
  }
  if (calls.empty()) return invalid_argument_error("'tool_choice' names no tool of 'tools'");
  try {
    xgrammar::Grammar g = calls.size() == 1 ? calls[0] : xgrammar::Grammar::Union(calls);
    if (close_thinking) g = xgrammar::Grammar::Concat({literal_grammar(kCloseThinking), g});
    return std::make_shared<const CompiledFormat>(impl_->compiler.CompileGrammar(g));
  } catch (const std::exception& e) {
    return invalid_argument_error("'tools' cannot be held to their schemas: {}", xgrammar_message(e));
  }
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
