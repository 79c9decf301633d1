// ChatTemplate on google's minja (chat_template.h). minja.hpp is included here only: it is 3,000
// lines of templates, compiled once.
#include "daemon/chat/chat_template.h"

#include <cctype>

#include <charconv>
#include <cmath>
#include <cstdio>
#include <ctime>
#include <exception>

#include <fmt/format.h>
#include <minja.hpp>

#include "runtime/base/json_parse.h"
#include "runtime/base/regular_file.h"

namespace sx::chat {

struct ChatTemplate::Program {
  std::shared_ptr<minja::TemplateNode> root;
};

namespace {

// LF for every CRLF and lone CR, as jinja2's lexer reads template source.
std::string normalise_newlines(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  for (std::size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '\r') {
      out.push_back('\n');
      if (i + 1 < s.size() && s[i + 1] == '\n') ++i;
    } else {
      out.push_back(s[i]);
    }
  }
  return out;
}

// repr() of a Python float: the shortest digits that read back as `d`, fixed between 1e-4 and
// 1e16 (always with a fraction: 3.0), else scientific with a signed exponent of two or more
// digits (1e-05, 1.5e+16).
std::string python_float(double d) {
  if (std::isnan(d)) return "nan";
  if (std::isinf(d)) return d > 0 ? "inf" : "-inf";
  char buf[64];
  const auto r = std::to_chars(buf, buf + sizeof buf, d, std::chars_format::scientific);
  std::string sci(buf, r.ptr);  // "-1.2345e+02"
  std::string sign;
  if (sci[0] == '-') {
    sign = "-";
    sci.erase(0, 1);
  }
  const std::size_t e = sci.find('e');
  std::string digits = sci.substr(0, e);
  digits.erase(std::remove(digits.begin(), digits.end(), '.'), digits.end());
  const int exp = std::stoi(sci.substr(e + 1));
  if (exp >= -4 && exp < 16) {
    std::string out;
    if (exp < 0) {
      out = "0." + std::string(static_cast<std::size_t>(-exp - 1), '0') + digits;
    } else {
      const auto whole = static_cast<std::size_t>(exp + 1);
      if (digits.size() <= whole) {
        out = digits + std::string(whole - digits.size(), '0') + ".0";
      } else {
        out = digits.substr(0, whole) + "." + digits.substr(whole);
      }
    }
    return sign + out;
  }
  std::string mant = digits.substr(0, 1);
  if (digits.size() > 1) mant += "." + digits.substr(1);
  return fmt::format("{}{}e{}{:02d}", sign, mant, exp < 0 ? '-' : '+', std::abs(exp));
}

// repr() of a Python str: single quotes unless the text has a ' and no ", backslash escapes for
// the quote, \\, \n, \r, \t and other control characters; other characters as they are.
std::string python_repr_string(const std::string& s) {
  const bool dq = s.find('\'') != std::string::npos && s.find('"') == std::string::npos;
  const char q = dq ? '"' : '\'';
  std::string out(1, q);
  for (const char c : s) {
    const auto u = static_cast<unsigned char>(c);
    if (c == q || c == '\\') {
      out += '\\';
      out += c;
    } else if (c == '\n') {
      out += "\\n";
    } else if (c == '\r') {
      out += "\\r";
    } else if (c == '\t') {
      out += "\\t";
    } else if (u < 0x20 || u == 0x7f) {
      out += fmt::format("\\x{:02x}", u);
    } else {
      out += c;
    }
  }
  out += q;
  return out;
}

std::string python_repr(const nlohmann::ordered_json& v) {
  if (v.is_string()) return python_repr_string(v.get<std::string>());
  if (v.is_array()) {
    std::string out = "[";
    for (std::size_t i = 0; i < v.size(); ++i) out += (i ? ", " : "") + python_repr(v[i]);
    return out + "]";
  }
  if (v.is_object()) {
    std::string out = "{";
    bool first = true;
    for (const auto& [k, item] : v.items()) {
      out += (first ? "" : ", ") + python_repr_string(k) + ": " + python_repr(item);
      first = false;
    }
    return out + "}";
  }
  return python_str(v);
}

// Throws what minja's own functions throw, for the render to report.
minja::Value python_string_filter(const std::shared_ptr<minja::Context>&, minja::ArgumentsValue& args) {
  if (args.args.size() != 1 || !args.kwargs.empty()) throw std::runtime_error("string takes one value");
  const minja::Value& v = args.args[0];
  if (v.is_callable()) throw std::runtime_error("string of a function");
  return minja::Value(python_str(v.get<nlohmann::ordered_json>()));
}

minja::Value strftime_now(const std::shared_ptr<minja::Context>&, minja::ArgumentsValue& args) {
  if (args.args.size() != 1 || !args.args[0].is_string()) throw std::runtime_error("strftime_now takes a format");
  const std::time_t now = std::time(nullptr);
  std::tm tm{};
  localtime_r(&now, &tm);
  char buf[256];
  const std::size_t n = std::strftime(buf, sizeof buf, args.args[0].get<std::string>().c_str(), &tm);
  return minja::Value(std::string(buf, n));
}

// How deep minja's recursive-descent parser may go: brackets and block statements nest by
// recursion, and so do chains of prefix operators (`not not ...`, `- - ...`). The published
// templates nest a few levels (Qwen3.5's: brackets 6, blocks 7); a template deeper than these
// would only risk the parser's stack (a fuzzed template of a thousand `{` overflowed it).
constexpr int kMaxTemplateBrackets = 128, kMaxTemplateBlocks = 64, kMaxPrefixOperators = 64;

// A message naming the first limit `text` passes, or empty. Counted inside tags only ({{ }} and
// {% %}, outside their string literals): what the text around them holds is not parsed.
std::string template_nesting_error(std::string_view text) {
  int brackets = 0, blocks = 0, prefix = 0;
  auto is_word = [](char ch) { return std::isalnum(static_cast<unsigned char>(ch)) || ch == '_'; };
  auto word_at = [&](std::size_t i) {
    std::size_t j = i;
    while (j < text.size() && is_word(text[j])) ++j;
    return text.substr(i, j - i);
  };
  bool in_tag = false;
  for (std::size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    const char next = i + 1 < text.size() ? text[i + 1] : '\0';
    if (!in_tag) {
      if (c == '{' && (next == '{' || next == '%')) {
        in_tag = true;
        brackets = prefix = 0;
        if (next == '%') {
          // Block statements: {% if / for / macro / call / filter / generation %} ... {% end... %}.
          std::size_t j = i + 2;
          while (j < text.size() && (text[j] == '-' || text[j] == '+' || std::isspace(static_cast<unsigned char>(text[j])))) {
            ++j;
          }
          const std::string_view word = word_at(j);
          if (word == "if" || word == "for" || word == "macro" || word == "call" || word == "filter" ||
              word == "generation") {
            if (++blocks > kMaxTemplateBlocks) {
              return fmt::format("block statements nest deeper than {}", kMaxTemplateBlocks);
            }
          } else if (word.starts_with("end")) {
            blocks = std::max(0, blocks - 1);
          }
        }
        ++i;
      }
      continue;
    }
    if ((c == '}' || c == '%') && next == '}' && brackets == 0) {
      in_tag = false;
      ++i;
      continue;
    }
    if (c == '\'' || c == '"') {  // a string literal: skipped whole
      for (++i; i < text.size() && text[i] != c; ++i) {
        if (text[i] == '\\') ++i;
      }
      prefix = 0;
      continue;
    }
    if (c == '(' || c == '[' || c == '{') {
      if (++brackets > kMaxTemplateBrackets) return fmt::format("brackets nest deeper than {}", kMaxTemplateBrackets);
    } else if (c == ')' || c == ']' || c == '}') {
      brackets = std::max(0, brackets - 1);
    }
    // Prefix operators in a row: `not`, unary minus and plus (with only spaces between).
    if (c == '-' || c == '+' || ((i == 0 || !is_word(text[i - 1])) && word_at(i) == "not")) {
      if (++prefix > kMaxPrefixOperators) {
        return fmt::format("more than {} prefix operators follow one another", kMaxPrefixOperators);
      }
      if (c == 'n') i += 2;
    } else if (!std::isspace(static_cast<unsigned char>(c))) {
      prefix = 0;
    }
  }
  return {};
}

}  // namespace

std::string python_str(const nlohmann::ordered_json& v) {
  if (v.is_string()) return v.get<std::string>();
  if (v.is_boolean()) return v.get<bool>() ? "True" : "False";
  if (v.is_null()) return "None";
  if (v.is_number_integer()) return v.dump();
  if (v.is_number_float()) return python_float(v.get<double>());
  return python_repr(v);
}

ChatTemplate::ChatTemplate(std::string source, std::string origin, std::shared_ptr<Program> program)
    : source_(std::move(source)), origin_(std::move(origin)), program_(std::move(program)) {}
ChatTemplate::~ChatTemplate() = default;

Result<std::shared_ptr<const ChatTemplate>> ChatTemplate::parse(std::string_view source, std::string origin) {
  std::string text = normalise_newlines(source);
  if (const std::string why = template_nesting_error(text); !why.empty()) {
    return invalid_argument_error("{}: the chat template is refused: {}", origin, why);
  }
  auto program = std::make_shared<Program>();
  try {
    program->root = minja::Parser::parse(text, minja::Options{.trim_blocks = true, .lstrip_blocks = true,
                                                              .keep_trailing_newline = false});
  } catch (const std::exception& e) {
    return invalid_argument_error("{}: the chat template does not parse: {}", origin, e.what());
  }
  if (program->root == nullptr) return invalid_argument_error("{}: the chat template does not parse", origin);
  return std::shared_ptr<const ChatTemplate>(new ChatTemplate(std::move(text), std::move(origin), std::move(program)));
}

Result<std::string> ChatTemplate::render(const nlohmann::ordered_json& context) const {
  if (!context.is_object()) return invalid_argument_error("{}: the render context is not an object", origin_);
  try {
    auto globals = minja::Context::make(minja::Value::object(), minja::Context::builtins());
    globals->set("string", minja::Value::callable(python_string_filter));
    globals->set("strftime_now", minja::Value::callable(strftime_now));
    auto ctx = minja::Context::make(minja::Value(context), globals);
    return program_->root->render(ctx);
  } catch (const std::exception& e) {
    return invalid_argument_error("{}: {}", origin_, e.what());
  }
}

Result<std::shared_ptr<const ChatTemplate>> choose_chat_template(const std::string& override_path,
                                                                 const std::string& model_template,
                                                                 const std::string& model_origin, std::string* said) {
  if (!override_path.empty()) {
    // The label names the file: "chat template FILE: No such file or directory".
    SX_ASSIGN_OR_RETURN(std::string text, read_regular_file(override_path, std::uint64_t{1} << 20,
                                                            fmt::format("chat template {}", override_path)));
    SX_ASSIGN_OR_RETURN(auto t, ChatTemplate::parse(text, override_path));
    *said = fmt::format("chat template: {} ({} bytes, given instead of the model's own)", override_path, text.size());
    return t;
  }
  if (model_template.empty()) {
    *said = fmt::format("chat template: {} has none: the built-in ChatML (Qwen2.5's template without tools); "
                        "--chat-template FILE gives one", model_origin);
    return std::shared_ptr<const ChatTemplate>();
  }
  auto t = ChatTemplate::parse(model_template, model_origin + "'s chat template");
  if (!t.ok()) {
    *said = fmt::format("chat template: {}; the built-in ChatML instead (--chat-template FILE gives another)",
                        t.status().message());
    return std::shared_ptr<const ChatTemplate>();
  }
  *said = fmt::format("chat template: the model's own ({}, {} bytes)", model_origin, model_template.size());
  return *t;
}

Status parse_tool_call_arguments(nlohmann::ordered_json& messages) {
  if (!messages.is_array()) return ok_status();
  for (std::size_t i = 0; i < messages.size(); ++i) {
    auto& m = messages[i];
    if (!m.is_object() || !m.contains("tool_calls") || !m["tool_calls"].is_array()) continue;
    auto& calls = m["tool_calls"];
    for (std::size_t j = 0; j < calls.size(); ++j) {
      auto& call = calls[j];
      if (!call.is_object() || !call.contains("function") || !call["function"].is_object()) continue;
      auto& fn = call["function"];
      if (!fn.contains("arguments") || !fn["arguments"].is_string()) continue;
      auto parsed = parse_json_within<nlohmann::ordered_json>(fn["arguments"].get<std::string>(), JsonLimits{});
      if (parsed.over_limits) {
        return invalid_argument_error("messages[{}].tool_calls[{}].function.arguments {}", i, j, parsed.error);
      }
      if (!parsed.ok() || !parsed.value.is_object()) {
        return invalid_argument_error("messages[{}].tool_calls[{}].function.arguments is not a JSON object", i, j);
      }
      fn["arguments"] = std::move(parsed.value);
    }
  }
  return ok_status();
}

}  // namespace sx::chat
