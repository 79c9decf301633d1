// Tool calls out of an answer (issue 41 item 2), in the two syntaxes Qwen models write, told apart
// by the chat template that taught them:
//   hermes (Qwen2.5, Qwen3, Qwen3-2507):   <tool_call>\n{"name": NAME, "arguments": {...}}\n</tool_call>
//   XML (Qwen3-Coder, Qwen3.5, Qwen3.6):   <tool_call>\n<function=NAME>\n<parameter=K>\nV\n</parameter>
//                                          ...</function>\n</tool_call>
// ToolCallParser takes the answer in pieces cut anywhere, as it streams, and says at once what is
// plain text and what belongs to a call: text never holds a part of a tag (the bytes that could
// begin one wait for the next piece). A call is told as OpenAI streams it: a first delta with its
// id and function name (once the name is whole and names one of the request's tools), then
// fragments of its arguments (hermes: the JSON as written; XML: one parameter at a time, each value
// typed by the tool's schema), then its end. A call that does not follow the syntax (no name, a name
// no tool has, arguments that are not a JSON object, no closing tag) is given back as text, tags
// and all, and counted in malformed(): nothing the model wrote is dropped. A tag that no call head
// follows (prose that mentions <tool_call>) is text at once; only a hermes body that opens a JSON
// object other than the usual way ({"arguments": ..., "name": ...}) waits for </tool_call> to be
// read whole. When the fault shows only after the call's name went out (streamed arguments that turn
// out not to be JSON), the call ends where it is, ok = false, and its text follows as text too. An
// XML value ends at </parameter>, or where the next parameter or </function> begins.
//
// Pure; one per choice (and one for its reasoning, so that a call written while thinking is kept).
#pragma once

#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

namespace sx::chat {

enum class ToolSyntax { kNone, kHermes, kXml };

// kXml when the template writes <function=, else kHermes when it writes <tool_call>, else kNone
// (the model was not taught to call tools).
ToolSyntax tool_syntax_of(std::string_view template_source);
std::string_view tool_syntax_name(ToolSyntax s);

// One piece of the answer, in order: plain text, or a piece of a call as OpenAI's stream deltas
// carry it.
struct ToolCallEvent {
  enum class Kind { kText, kBegin, kArguments, kEnd };
  Kind kind = Kind::kText;
  std::size_t index = 0;  // the call's number in the answer (from the parser's first_index)
  std::string name;       // kBegin
  std::string text;       // kText: plain text; kArguments: a fragment
  bool ok = true;         // kEnd: false when the call failed after its name went out
};

class ToolCallParser {
 public:
  // `tools`: the request's tools array (names that may be called; parameters' schemas type XML
  // values). `counter`: numbers the calls (the next call's index), shared by the parsers of one
  // answer's reasoning and content; it must outlive the parser.
  ToolCallParser(ToolSyntax syntax, const nlohmann::ordered_json& tools, std::size_t* counter);

  // What can be told now, in the answer's order.
  using Output = std::vector<ToolCallEvent>;
  Output feed(std::string_view piece);
  // The end of the answer: a call still open ends (whole if its JSON closed, else given back as
  // text), held bytes are text.
  Output finish();

  std::size_t calls() const { return calls_; }  // calls begun (their kBegin told)
  std::size_t malformed() const { return malformed_; }

  // A whole answer: its text (every call's text taken out, malformed ones left in) and its calls.
  struct Call {
    std::string name, arguments;
  };
  struct Whole {
    std::string text;
    std::vector<Call> calls;
    std::size_t malformed = 0;
  };
  static Whole parse(std::string_view answer, ToolSyntax syntax, const nlohmann::ordered_json& tools);

 private:
  enum class State { kText, kHead, kArgs, kTail, kXmlBody, kFallback };
  void step(Output& out, bool at_end);
  bool known(const std::string& name) const;
  // The call's text back into the answer as text, counted as malformed.
  void give_back(Output& out);
  void begin(Output& out, std::string name);
  void arguments(Output& out, std::string fragment);
  // The call ends: whole (ok), or failed after its name went out: its text follows as text.
  void end(Output& out, bool ok);
  // kFallback: the call's text up to </tool_call> (or the end) read whole; a call if it is one.
  void read_whole(Output& out, std::string body);
  std::string xml_value(const std::string& key, std::string raw) const;

  ToolSyntax syntax_;
  nlohmann::ordered_json tools_;
  std::size_t* counter_;
  std::size_t index_ = 0;  // the current call's
  std::size_t calls_ = 0, malformed_ = 0;
  State state_ = State::kText;
  std::string buf_;   // undecided bytes
  std::string raw_;   // the current call's text so far (from <tool_call>), for give_back
  bool begun_ = false;  // the current call's kBegin went out
  // hermes arguments: the JSON object's scan state; kTail: its closing brace seen (XML: always)
  int depth_ = 0;
  bool in_string_ = false, escape_ = false, args_done_ = false, outer_closed_ = false;
  std::string args_;  // the current call's arguments so far
  std::string current_name_;
  std::size_t params_ = 0;  // XML: parameters told so far
};

}  // namespace sx::chat
