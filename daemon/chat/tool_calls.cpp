// ToolCallParser (tool_calls.h): a small state machine over the bytes of an answer.
#include "daemon/chat/tool_calls.h"

#include <algorithm>
#include <utility>

#include "runtime/base/json_parse.h"

namespace sx::chat {

namespace {

using nlohmann::ordered_json;

// JSON the model wrote (a call, its arguments, a parameter's value), within the limits every JSON
// the server parses gets (runtime/base/json_parse.h); a discarded value when it is not JSON or is
// over them, so that the text comes back as content.
ordered_json parse_model_json(std::string_view text) {
  auto parsed = parse_json_within<ordered_json>(text, JsonLimits{});
  return parsed.ok() ? std::move(parsed.value) : ordered_json(ordered_json::value_t::discarded);
}

constexpr std::string_view kOpen = "<tool_call>";
constexpr std::string_view kClose = "</tool_call>";
constexpr std::string_view kFunction = "<function=";
constexpr std::string_view kFunctionEnd = "</function>";
constexpr std::string_view kParameter = "<parameter=";
constexpr std::string_view kParameterEnd = "</parameter>";
constexpr std::size_t kMaxName = 256;

bool is_space(char c) { return c == ' ' || c == '\n' || c == '\r' || c == '\t'; }

std::size_t skip_space(std::string_view s, std::size_t i) {
  while (i < s.size() && is_space(s[i])) ++i;
  return i;
}

// The length of the longest end of `s` that begins `tag` (bytes that may be the start of a tag).
std::size_t partial_tag_at_end(std::string_view s, std::string_view tag) {
  for (std::size_t n = std::min(s.size(), tag.size() - 1); n > 0; --n) {
    if (s.substr(s.size() - n) == tag.substr(0, n)) return n;
  }
  return 0;
}

enum class Match { kNeedMore, kNo, kYes };

// Whether `s` from `i` begins with `lit` (kNeedMore: it is a proper beginning of it).
Match literal(std::string_view s, std::size_t& i, std::string_view lit) {
  const std::size_t n = std::min(lit.size(), s.size() - i);
  if (s.substr(i, n) != lit.substr(0, n)) return Match::kNo;
  if (n < lit.size()) return Match::kNeedMore;
  i += lit.size();
  return Match::kYes;
}

// hermes: `{"name": "NAME", "arguments": {` at the start of `s` (after spaces): the name, and how
// many bytes it took.
Match hermes_head(std::string_view s, std::string* name, std::size_t* used) {
  std::size_t i = skip_space(s, 0);
  auto lit = [&](std::string_view l) {
    i = skip_space(s, i);
    if (i == s.size()) return Match::kNeedMore;
    return literal(s, i, l);
  };
  for (std::string_view l : {std::string_view("{"), std::string_view("\"name\""), std::string_view(":")}) {
    if (const Match m = lit(l); m != Match::kYes) return m;
  }
  i = skip_space(s, i);
  if (i == s.size()) return Match::kNeedMore;
  if (s[i] != '"') return Match::kNo;
  const std::size_t start = i;
  ++i;
  bool escape = false;
  for (;; ++i) {
    if (i == s.size()) return i - start > kMaxName ? Match::kNo : Match::kNeedMore;
    if (escape) {
      escape = false;
    } else if (s[i] == '\\') {
      escape = true;
    } else if (s[i] == '"') {
      break;
    } else if (s[i] == '\n') {
      return Match::kNo;
    }
  }
  ++i;
  const ordered_json parsed = parse_model_json(s.substr(start, i - start));
  if (!parsed.is_string()) return Match::kNo;
  for (std::string_view l : {std::string_view(","), std::string_view("\"arguments\""), std::string_view(":"),
                             std::string_view("{")}) {
    if (const Match m = lit(l); m != Match::kYes) return m;
  }
  *name = parsed.get<std::string>();
  *used = i;
  return Match::kYes;
}

// The schema a tool gives parameter `key` (null: none).
const ordered_json* parameter_schema(const ordered_json& tools, const std::string& function, const std::string& key) {
  for (const ordered_json& t : tools) {
    const ordered_json& fn = t["function"];
    if (fn.value("name", "") != function || !fn.contains("parameters")) continue;
    const ordered_json& params = fn["parameters"];
    if (!params.is_object() || !params.contains("properties") || !params["properties"].is_object()) return nullptr;
    const auto p = params["properties"].find(key);
    return p == params["properties"].end() ? nullptr : &*p;
  }
  return nullptr;
}

}  // namespace

ToolSyntax tool_syntax_of(std::string_view template_source) {
  if (template_source.find(kFunction) != std::string_view::npos) return ToolSyntax::kXml;
  if (template_source.find(kOpen) != std::string_view::npos) return ToolSyntax::kHermes;
  return ToolSyntax::kNone;
}

std::string_view tool_syntax_name(ToolSyntax s) {
  switch (s) {
    case ToolSyntax::kHermes: return "hermes JSON";
    case ToolSyntax::kXml: return "XML";
    default: return "none";
  }
}

ToolCallParser::ToolCallParser(ToolSyntax syntax, const ordered_json& tools, std::size_t* counter)
    : syntax_(syntax), tools_(tools.is_array() ? tools : ordered_json::array()), counter_(counter) {}

bool ToolCallParser::known(const std::string& name) const {
  return std::any_of(tools_.begin(), tools_.end(),
                     [&](const ordered_json& t) { return t["function"].value("name", "") == name; });
}

void ToolCallParser::begin(Output& out, std::string name) {
  begun_ = true;
  index_ = (*counter_)++;
  ++calls_;
  out.push_back({ToolCallEvent::Kind::kBegin, index_, std::move(name), {}, true});
}

void ToolCallParser::arguments(Output& out, std::string fragment) {
  if (fragment.empty()) return;
  args_ += fragment;
  if (!out.empty() && out.back().kind == ToolCallEvent::Kind::kArguments) {
    out.back().text += fragment;
  } else {
    out.push_back({ToolCallEvent::Kind::kArguments, index_, {}, std::move(fragment), true});
  }
}

void ToolCallParser::end(Output& out, bool ok) {
  out.push_back({ToolCallEvent::Kind::kEnd, index_, {}, {}, ok});
  if (!ok) {
    ++malformed_;
    out.push_back({ToolCallEvent::Kind::kText, 0, {}, std::move(raw_), true});
  }
  raw_.clear();
  args_.clear();
  begun_ = false;
  depth_ = 0;
  in_string_ = escape_ = args_done_ = outer_closed_ = false;
  params_ = 0;
  state_ = State::kText;
}

void ToolCallParser::give_back(Output& out) {
  ++malformed_;
  out.push_back({ToolCallEvent::Kind::kText, 0, {}, std::move(raw_), true});
  raw_.clear();
  state_ = State::kText;
}

void ToolCallParser::read_whole(Output& out, std::string body) {
  // Any key order, "parameters" for "arguments", arguments as a JSON string: what a model may write
  // that the streaming head does not take, read once the call is whole.
  const ordered_json call = parse_model_json(body);
  if (syntax_ == ToolSyntax::kHermes && call.is_object() && call.contains("name") && call["name"].is_string() &&
      known(call["name"].get<std::string>())) {
    ordered_json args = call.contains("arguments") ? call["arguments"] : call.value("parameters", ordered_json());
    if (args.is_string()) args = parse_model_json(args.get<std::string>());
    if (args.is_null()) args = ordered_json::object();
    if (args.is_object()) {
      begin(out, call["name"].get<std::string>());
      arguments(out, args.dump(-1, ' ', false, ordered_json::error_handler_t::replace));
      raw_.clear();
      end(out, true);
      return;
    }
  }
  give_back(out);
}

std::string ToolCallParser::xml_value(const std::string& key, std::string raw) const {
  if (!raw.empty() && raw.front() == '\n') raw.erase(0, 1);
  if (!raw.empty() && raw.back() == '\n') raw.pop_back();
  // The tool's schema says what the text is. A parameter it calls a string (or does not list) is
  // the text as it is; any other was written by the template with tojson (objects, lists, a
  // string of an anyOf) or Python's str (True, 3.5, None).
  const ordered_json* schema = parameter_schema(tools_, current_name_, key);
  const bool plain_string = schema == nullptr || !schema->is_object() || schema->value("type", ordered_json()) == "string";
  if (!plain_string) {
    if (raw == "True" || raw == "False" || raw == "None") return raw == "True" ? "true" : raw == "False" ? "false" : "null";
    const ordered_json v = parse_model_json(raw);
    if (!v.is_discarded()) return v.dump(-1, ' ', false, ordered_json::error_handler_t::replace);
  }
  return ordered_json(raw).dump(-1, ' ', false, ordered_json::error_handler_t::replace);
}

void ToolCallParser::step(Output& out, bool at_end) {
  for (;;) {
    switch (state_) {
      case State::kText: {
        const std::size_t at = syntax_ == ToolSyntax::kNone ? std::string::npos : buf_.find(kOpen);
        if (at == std::string::npos) {
          const std::size_t keep =
              at_end || syntax_ == ToolSyntax::kNone ? 0 : partial_tag_at_end(buf_, kOpen);
          if (buf_.size() > keep) {
            std::string text = buf_.substr(0, buf_.size() - keep);
            buf_.erase(0, buf_.size() - keep);
            if (!out.empty() && out.back().kind == ToolCallEvent::Kind::kText) {
              out.back().text += text;
            } else {
              out.push_back({ToolCallEvent::Kind::kText, 0, {}, std::move(text), true});
            }
          }
          return;
        }
        if (at > 0) out.push_back({ToolCallEvent::Kind::kText, 0, {}, buf_.substr(0, at), true});
        raw_ = std::string(kOpen);
        buf_.erase(0, at + kOpen.size());
        state_ = syntax_ == ToolSyntax::kHermes ? State::kHead : State::kXmlBody;
        break;
      }
      case State::kHead: {
        std::string name;
        std::size_t used = 0;
        const Match m = hermes_head(buf_, &name, &used);
        if (m == Match::kNeedMore && !at_end) return;
        if (m != Match::kYes || !known(name)) {
          // Not the usual head: a JSON object may still be a call (other key order), read whole at
          // </tool_call>; anything else is text at once (a tag in prose holds nothing back).
          const std::size_t first = skip_space(buf_, 0);
          if (first < buf_.size() && buf_[first] == '{') {
            state_ = State::kFallback;
          } else {
            give_back(out);
          }
          break;
        }
        raw_ += buf_.substr(0, used);
        buf_.erase(0, used);
        current_name_ = name;
        begin(out, std::move(name));
        arguments(out, "{");
        depth_ = 1;
        state_ = State::kArgs;
        break;
      }
      case State::kArgs: {
        std::size_t i = 0;
        for (; i < buf_.size() && depth_ > 0; ++i) {
          const char c = buf_[i];
          if (in_string_) {
            if (escape_) {
              escape_ = false;
            } else if (c == '\\') {
              escape_ = true;
            } else if (c == '"') {
              in_string_ = false;
            }
          } else if (c == '"') {
            in_string_ = true;
          } else if (c == '{' || c == '[') {
            ++depth_;
          } else if (c == '}' || c == ']') {
            --depth_;
          } else if (c == '<') {  // no JSON text outside a string has one: the call broke off
            depth_ = -1;
            break;
          }
        }
        raw_ += buf_.substr(0, i);
        if (depth_ >= 0) arguments(out, buf_.substr(0, i));
        buf_.erase(0, i);
        if (depth_ < 0) {
          end(out, false);
          break;
        }
        if (depth_ > 0) {
          if (at_end) end(out, false);
          return;
        }
        const ordered_json parsed = parse_model_json(args_);
        if (!parsed.is_object()) {
          end(out, false);
          break;
        }
        args_done_ = true;
        state_ = State::kTail;
        break;
      }
      case State::kTail: {
        std::size_t i = skip_space(buf_, 0);
        if (!outer_closed_ && i < buf_.size()) {
          if (buf_[i] != '}') {
            end(out, false);
            break;
          }
          outer_closed_ = true;
          i = skip_space(buf_, i + 1);
        }
        if (i == buf_.size()) {
          raw_ += buf_;
          buf_.clear();
          if (at_end) end(out, outer_closed_);  // a call whose JSON closed stands without </tool_call>
          return;
        }
        const Match m = literal(buf_, i, kClose);
        if (m == Match::kNeedMore && !at_end) {
          raw_ += buf_.substr(0, i);
          buf_.erase(0, i);
          return;
        }
        if (m == Match::kNeedMore && outer_closed_) {  // the answer ended inside </tool_call>: the call stands
          buf_.clear();
          end(out, true);
          break;
        }
        if (m != Match::kYes) {
          end(out, false);
          break;
        }
        buf_.erase(0, i);
        end(out, true);
        break;
      }
      case State::kXmlBody: {
        std::size_t i = skip_space(buf_, 0);
        if (i == buf_.size()) {
          if (!at_end) return;
          if (begun_) {
            end(out, false);
          } else {
            raw_ += buf_;
            buf_.clear();
            give_back(out);
          }
          break;
        }
        if (!begun_) {
          const Match m = literal(buf_, i, kFunction);
          if (m == Match::kNeedMore && !at_end) return;
          const std::size_t gt = m == Match::kYes ? buf_.find('>', i) : std::string::npos;
          if (m == Match::kYes && gt == std::string::npos && buf_.size() - i <= kMaxName && !at_end) return;
          const std::string name = gt == std::string::npos ? std::string() : buf_.substr(i, gt - i);
          if (name.empty() || name.size() > kMaxName || name.find_first_of("<\n") != std::string::npos ||
              !known(name)) {
            give_back(out);  // the rest is text (XML is never read whole)
            break;
          }
          current_name_ = name;
          raw_ += buf_.substr(0, gt + 1);
          buf_.erase(0, gt + 1);
          begin(out, name);
          break;
        }
        std::size_t j = i;
        if (const Match m = literal(buf_, j, kParameter); m != Match::kNo) {
          const std::size_t gt = m == Match::kYes ? buf_.find('>', j) : std::string::npos;
          // The value ends at its </parameter>, or where the next parameter or the function's end
          // begins (models drop a </parameter> now and then).
          std::size_t close = std::string::npos, used = 0;
          if (gt != std::string::npos) {
            for (const auto& [tag, keep] : {std::pair<std::string_view, bool>{kParameterEnd, false},
                                            {"\n<parameter=", true}, {"\n</function>", true}}) {
              const std::size_t at = buf_.find(tag, gt);
              if (at < close) {
                close = at;
                used = keep ? at : at + tag.size();
              }
            }
          }
          if (close == std::string::npos) {
            if (!at_end) return;
            end(out, false);  // what is left is text
            break;
          }
          const std::string key = buf_.substr(j, gt - j);
          const std::string value = xml_value(key, buf_.substr(gt + 1, close - gt - 1));
          arguments(out, (params_++ == 0 ? "{" : ", ") +
                             ordered_json(key).dump(-1, ' ', false, ordered_json::error_handler_t::replace) + ": " +
                             value);
          raw_ += buf_.substr(0, used);
          buf_.erase(0, used);
          break;
        }
        j = i;
        const Match m = literal(buf_, j, kFunctionEnd);
        if (m == Match::kNeedMore && !at_end) return;
        if (m != Match::kYes) {
          end(out, false);
          break;
        }
        arguments(out, params_ == 0 ? "{}" : "}");
        raw_ += buf_.substr(0, j);
        buf_.erase(0, j);
        args_done_ = outer_closed_ = true;
        state_ = State::kTail;
        break;
      }
      case State::kFallback: {
        const std::size_t close = buf_.find(kClose);
        if (close == std::string::npos && !at_end) return;
        const std::string body = buf_.substr(0, close);
        raw_ += close == std::string::npos ? buf_ : buf_.substr(0, close + kClose.size());
        buf_.erase(0, close == std::string::npos ? buf_.size() : close + kClose.size());
        read_whole(out, body);
        break;
      }
    }
  }
}

ToolCallParser::Output ToolCallParser::feed(std::string_view piece) {
  Output out;
  buf_.append(piece);
  step(out, false);
  return out;
}

ToolCallParser::Output ToolCallParser::finish() {
  Output out;
  step(out, true);
  return out;
}

ToolCallParser::Whole ToolCallParser::parse(std::string_view answer, ToolSyntax syntax, const ordered_json& tools) {
  std::size_t counter = 0;
  ToolCallParser p(syntax, tools, &counter);
  Output events = p.feed(answer);
  Output rest = p.finish();
  events.insert(events.end(), std::make_move_iterator(rest.begin()), std::make_move_iterator(rest.end()));
  Whole w;
  std::vector<Call> open;  // by index
  for (ToolCallEvent& e : events) {
    switch (e.kind) {
      case ToolCallEvent::Kind::kText: w.text += e.text; break;
      case ToolCallEvent::Kind::kBegin: open.push_back({std::move(e.name), {}}); break;
      case ToolCallEvent::Kind::kArguments: open.back().arguments += e.text; break;
      case ToolCallEvent::Kind::kEnd:
        if (e.ok) w.calls.push_back(std::move(open.back()));
        open.pop_back();
        break;
    }
  }
  w.malformed = p.malformed();
  return w;
}

}  // namespace sx::chat
