// Structured output (issue 41 item 4): answers held to a JSON schema, any JSON object, a regex, a
// list of choices, an EBNF grammar, or a tool call of the model's own syntax, on xgrammar (the
// xgrammar wrap). A format is compiled once against the model's vocabulary (xgrammar's compiler
// caches what it compiled: the same schema again costs a lookup); each choice of a request then
// gets an engine::TokenConstraint of its own, which the engine asks for a token mask every step,
// beside the forward (runtime/engine/constraint.h).
//
// The vocabulary is given to xgrammar as each token's bytes; control and unused tokens
// (<|im_start|>, padding) as empty, so the grammar never allows them (detokenization skips them,
// and the text the client sees must be what the grammar matched). The stop tokens end the grammar.
//
// Threading: Grammars is built once per model (its construction sorts the vocabulary: tens of
// milliseconds for 150,000 tokens) and compile() may run on several threads at once. A compile can
// take seconds on a large vocabulary (a mask per parser state over every token): callers run it on
// threads of their own, never on the loop or beside tokenization, within a CompileBudget.
//
// Errors: a format the engine cannot compile, or whose grammar allows no answer at all, is
// INVALID_ARGUMENT naming the request's field; a compile past its budget DEADLINE_EXCEEDED naming
// it; one whose `cancelled` answered true CANCELLED. No exception leaves this module (xgrammar's are
// caught here).
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "daemon/chat/tool_calls.h"
#include "runtime/base/status.h"
#include "runtime/engine/constraint.h"
#include "runtime/tokenizer/tokenizer.h"

namespace sx::chat {

// What a request asks its answer to be: OpenAI's response_format, vLLM's structured_outputs.
struct OutputFormat {
  enum class Kind { kText, kJsonObject, kJsonSchema, kRegex, kChoice, kGrammar };
  Kind kind = Kind::kText;
  std::string source;                // kJsonSchema: the schema's JSON; kRegex: the pattern; kGrammar: EBNF
  std::vector<std::string> choices;  // kChoice
  std::string param;                 // the request's field, for errors ("response_format.json_schema.schema")
};

// The largest schema, pattern or grammar a request may send (its text).
inline constexpr std::size_t kMaxFormatBytes = std::size_t{1} << 16;
// The deepest a JSON schema (or a tool's parameters) may nest. xgrammar walks a schema
// recursively (its cache key, its converter), so depth costs stack; an HTTP request cannot nest
// past OpenAiLimits::max_json_depth (32) anyway, this bounds callers of the library itself.
inline constexpr std::size_t kMaxFormatDepth = 64;

// What one compile may spend. xgrammar's compiler is patched to call back (the xgrammar wrap's
// xgrammar-compile-interrupt.patch) between a schema's nodes, between its optimizer's passes,
// before each parser state whose token mask it computes and every 128 tokens within one: a compile
// stops within milliseconds of its deadline or its cancellation.
struct CompileBudget {
  // The time the compile may take; zero or less: no limit.
  std::chrono::milliseconds timeout{0};
  // Asked from the compiling thread at those points; true: stop now (the client left, the server
  // stops). Empty: never.
  std::function<bool()> cancelled;
};

class CompiledFormat;

class Grammars {
 public:
  Grammars(const tokenizer::Tokenizer& tok, std::vector<std::int32_t> stop_ids);
  ~Grammars();
  Grammars(const Grammars&) = delete;
  Grammars& operator=(const Grammars&) = delete;

  // INVALID_ARGUMENT naming format.param and the part at fault (xgrammar's message) when the
  // format cannot be compiled: a schema it does not support, a regex or grammar that does not
  // parse, a format over kMaxFormatBytes or a schema nested deeper than kMaxFormatDepth; likewise when its grammar allows no first token and no
  // end (a $ref cycle with no way out: the answer could only be empty and broken). A grammar that
  // allows only the empty text is accepted: its answer is empty.
  // A JSON schema is compiled in xgrammar's strict mode (an array without "items" takes no items, an
  // object without "additionalProperties" no other properties: the model writes what the schema
  // lists); where that reading allows nothing ({"type": "array", "minItems": 1}), by JSON Schema's
  // own rules instead (such items or properties may be any JSON).
  // DEADLINE_EXCEEDED past budget.timeout, CANCELLED when budget.cancelled answered true.
  // `close_thinking`: the chat template opened <think> in the prompt (Qwen3.5, 3.6, Thinking-2507):
  // the answer starts with "</think>\n\n", then the format, so that it lands in content, not in the
  // reasoning (the model's thinking is skipped, the price of a format).
  Result<std::shared_ptr<const CompiledFormat>> compile(const OutputFormat& format, bool close_thinking = false,
                                                        const CompileBudget& budget = {});
  // A tool call in the model's `syntax` (a call of `name`, or of any of `tools` when empty), its
  // arguments held to the tool's parameters schema: tool_choice "required" or named. INVALID_ARGUMENT
  // naming tools[i].function.parameters where a schema does not compile or allows no arguments;
  // the budget as in compile().
  // XML: the required parameters, in the schema's order (an optional one is not written); a string
  // value holds no '<'.
  Result<std::shared_ptr<const CompiledFormat>> compile_tool_call(ToolSyntax syntax, const nlohmann::ordered_json& tools,
                                                                   const std::string& name, bool close_thinking = false,
                                                                   const CompileBudget& budget = {});
  // A new constraint at the start of `format` (one per choice); INTERNAL when xgrammar cannot start
  // one.
  Result<std::shared_ptr<engine::TokenConstraint>> constraint(const CompiledFormat& format) const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace sx::chat
