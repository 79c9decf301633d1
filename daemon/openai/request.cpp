// OpenAI request parsing: one checker per field, every error naming the field.
#include "daemon/openai/request.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <map>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "runtime/base/json_depth.h"
#include "runtime/base/json_parse.h"

namespace sx::daemon::openai {

namespace {

// Ordered: tools' schemas and tool-call arguments reach the chat template in the order the client
// wrote their keys, as transformers renders a Python dict.
using json = nlohmann::ordered_json;

struct Parser {
  ApiError* error;
  // The body's tree limits, which JSON held in a string field (tool-call arguments, a schema's
  // text) gets too.
  JsonLimits json_limits{};
  bool failed = false;

  // A string field's JSON within json_limits (a discarded value when it is not JSON), or nullopt
  // after failing with the field's 400 when its tree is over them.
  std::optional<json> parse_string_json(const std::string& text, const std::string& field) {
    auto parsed = parse_json_within<json>(text, json_limits);
    if (parsed.over_limits) {
      fail(field, fmt::format("'{}' {}", field, parsed.error));
      return std::nullopt;
    }
    return parsed.ok() ? std::move(parsed.value) : json(json::value_t::discarded);
  }

  bool fail(std::string param, std::string message) {
    if (!failed) {
      *error = ApiError{};
      error->param = std::move(param);
      error->message = std::move(message);
      failed = true;
    }
    return false;
  }

  static std::string type_name(const json& v) {
    switch (v.type()) {
      case json::value_t::null: return "null";
      case json::value_t::boolean: return "a boolean";
      case json::value_t::number_integer:
      case json::value_t::number_unsigned: return "an integer";
      case json::value_t::number_float: return "a number";
      case json::value_t::string: return "a string";
      case json::value_t::array: return "an array";
      case json::value_t::object: return "an object";
      default: return "a value";
    }
  }

  bool get_bool(const json& v, const std::string& name, bool& out) {
    if (!v.is_boolean()) return fail(name, fmt::format("'{}' must be a boolean, got {}", name, type_name(v)));
    out = v.get<bool>();
    return true;
  }
  bool get_string(const json& v, const std::string& name, std::string& out) {
    if (!v.is_string()) return fail(name, fmt::format("'{}' must be a string, got {}", name, type_name(v)));
    out = v.get<std::string>();
    return true;
  }
  bool get_int(const json& v, const std::string& name, std::int64_t lo, std::int64_t hi, std::int64_t& out) {
    std::int64_t x = 0;
    auto out_of_range = [&](const auto& got) {
      return fail(name, fmt::format("'{}' must be between {} and {}, got {}", name, lo, hi, got));
    };
    if (v.is_number_unsigned()) {  // before is_number_integer(), which is true for unsigned too
      const auto u = v.get<std::uint64_t>();
      // The whole int64 range (the seed) means any 64-bit integer: one at or above 2^63 keeps its
      // bits. Any other range refuses it and shows it as sent, never wrapped or clamped.
      const bool any_64_bits =
          lo == std::numeric_limits<std::int64_t>::min() && hi == std::numeric_limits<std::int64_t>::max();
      if (!any_64_bits && (hi < 0 || u > static_cast<std::uint64_t>(hi))) return out_of_range(u);
      x = static_cast<std::int64_t>(u);
    } else if (v.is_number_integer()) {
      x = v.get<std::int64_t>();
    } else if (v.is_number_float() && std::nearbyint(v.get<double>()) == v.get<double>() &&
               std::fabs(v.get<double>()) < 9e15) {
      x = static_cast<std::int64_t>(v.get<double>());  // 16.0 is accepted as 16
    } else {
      return fail(name, fmt::format("'{}' must be an integer, got {}", name, type_name(v)));
    }
    if (x < lo || x > hi) return out_of_range(x);
    out = x;
    return true;
  }
  bool get_number(const json& v, const std::string& name, double lo, double hi, bool lo_open, float& out) {
    if (!v.is_number()) return fail(name, fmt::format("'{}' must be a number, got {}", name, type_name(v)));
    const double x = v.get<double>();
    // The range is checked on the float the engine gets: 1e-50 is above 0 but rounds to it.
    const float f = static_cast<float>(x);
    if (!std::isfinite(x) || !std::isfinite(f) || f < lo || f > hi || (lo_open && f <= lo)) {
      return fail(name, fmt::format("'{}' must be {} {} and at most {}, got {}", name, lo_open ? "above" : "at least",
                                    lo, hi, x));
    }
    out = f;
    return true;
  }

  // The text of a message's content: a string, or an array of {"type": "text", "text": ...} parts.
  bool get_content(const json& v, const std::string& name, std::string& out) {
    if (v.is_null()) return true;
    if (v.is_string()) {
      out = v.get<std::string>();
      return true;
    }
    if (!v.is_array()) return fail(name, fmt::format("'{}' must be a string or an array of parts, got {}", name, type_name(v)));
    for (std::size_t i = 0; i < v.size(); ++i) {
      const std::string part = fmt::format("{}[{}]", name, i);
      const json& p = v[i];
      if (!p.is_object()) return fail(part, fmt::format("'{}' must be an object, got {}", part, type_name(p)));
      const auto type = p.find("type");
      if (type == p.end() || !type->is_string()) return fail(part + ".type", fmt::format("'{}.type' must be a string", part));
      if (*type != "text") {
        return fail(part + ".type", fmt::format("'{}.type' is '{}': only text parts are supported",
                                                part, type->get<std::string>()));
      }
      for (const auto& [k, _] : p.items()) {
        if (k != "type" && k != "text") return fail(part + "." + k, fmt::format("unknown field '{}.{}'", part, k));
      }
      const auto text = p.find("text");
      std::string t;
      if (text == p.end()) return fail(part + ".text", fmt::format("'{}.text' is required", part));
      if (!get_string(*text, part + ".text", t)) return false;
      out += t;
    }
    return true;
  }

  bool get_messages(const json& v, std::vector<chat::ChatMessage>& out) {
    if (!v.is_array()) return fail("messages", fmt::format("'messages' must be an array, got {}", type_name(v)));
    if (v.empty()) return fail("messages", "'messages' must contain at least one message");
    for (std::size_t i = 0; i < v.size(); ++i) {
      const std::string name = fmt::format("messages[{}]", i);
      const json& m = v[i];
      if (!m.is_object()) return fail(name, fmt::format("'{}' must be an object, got {}", name, type_name(m)));
      chat::ChatMessage msg;
      bool has_role = false;
      for (const auto& [k, val] : m.items()) {
        const std::string field = name + "." + k;
        if (k == "role") {
          if (!get_string(val, field, msg.role)) return false;
          has_role = true;
        } else if (k == "content") {
          if (!get_content(val, field, msg.content)) return false;
        } else if (k == "reasoning_content") {
          if (!val.is_null()) {
            std::string r;
            if (!get_string(val, field, r)) return false;
            msg.reasoning_content = std::move(r);
          }
        } else if (k == "name" || k == "tool_call_id") {
          if (!val.is_null()) {
            std::string text;
            if (!get_string(val, field, text)) return false;
            (k == "name" ? msg.name : msg.tool_call_id) = std::move(text);
          }
        } else if (k == "tool_calls") {
          if (!val.is_null() && !get_tool_calls(val, field, msg.tool_calls)) return false;
        } else if (k == "function_call") {
          if (!val.is_null()) return fail(field, fmt::format("'{}' is not supported: send 'tool_calls'", field));
        } else if (k == "refusal" || k == "audio") {
          if (!val.is_null()) return fail(field, fmt::format("'{}' is not supported", field));
        } else {
          return fail(field, fmt::format("unknown field '{}'", field));
        }
      }
      if (!has_role) return fail(name + ".role", fmt::format("'{}.role' is required", name));
      if (msg.role == "developer") msg.role = "system";  // OpenAI's newer name for it
      if (msg.role != "system" && msg.role != "user" && msg.role != "assistant" && msg.role != "tool") {
        return fail(name + ".role", fmt::format("'{}.role' must be one of system, developer, user, assistant, tool; "
                                                "got '{}'", name, msg.role));
      }
      if (!msg.tool_calls.empty() && msg.role != "assistant") {
        return fail(name + ".tool_calls", fmt::format("'{}.tool_calls' belongs to an assistant message, not a {} "
                                                      "message", name, msg.role));
      }
      out.push_back(std::move(msg));
    }
    return true;
  }

  // An assistant message's tool_calls: [{"id", "type": "function", "function": {"name", "arguments"}}],
  // arguments a JSON string (OpenAI's wire format) or an object.
  bool get_tool_calls(const json& v, const std::string& name, std::vector<chat::ToolCall>& out) {
    if (!v.is_array()) return fail(name, fmt::format("'{}' must be an array, got {}", name, type_name(v)));
    for (std::size_t j = 0; j < v.size(); ++j) {
      const std::string at = fmt::format("{}[{}]", name, j);
      const json& c = v[j];
      if (!c.is_object()) return fail(at, fmt::format("'{}' must be an object, got {}", at, type_name(c)));
      chat::ToolCall call;
      const json* fn = nullptr;
      for (const auto& [k, val] : c.items()) {
        if (k == "id") {
          if (!val.is_null() && !get_string(val, at + ".id", call.id)) return false;
        } else if (k == "type") {
          if (val != "function") return fail(at + ".type", fmt::format("'{}.type' must be \"function\"", at));
        } else if (k == "function") {
          if (!val.is_object()) return fail(at + ".function", fmt::format("'{}.function' must be an object", at));
          fn = &val;
        } else if (k != "index") {
          return fail(at + "." + k, fmt::format("unknown field '{}.{}'", at, k));
        }
      }
      if (fn == nullptr) return fail(at + ".function", fmt::format("'{}.function' is required", at));
      bool has_name = false;
      for (const auto& [k, val] : fn->items()) {
        const std::string field = at + ".function." + k;
        if (k == "name") {
          if (!get_string(val, field, call.name)) return false;
          has_name = true;
        } else if (k == "arguments") {
          if (val.is_string()) {
            call.arguments = val.get<std::string>();
          } else if (val.is_object()) {
            call.arguments = val.dump(-1, ' ', false, json::error_handler_t::replace);
          } else {
            return fail(field, fmt::format("'{}' must be a string holding a JSON object, got {}", field, type_name(val)));
          }
          const std::optional<json> parsed = parse_string_json(call.arguments, field);
          if (!parsed) return false;
          if (!parsed->is_object()) {
            return fail(field, fmt::format("'{}' must hold a JSON object; got '{}'", field,
                                           call.arguments.substr(0, 80)));
          }
        } else {
          return fail(field, fmt::format("unknown field '{}'", field));
        }
      }
      if (!has_name) return fail(at + ".function.name", fmt::format("'{}.function.name' is required", at));
      if (call.arguments.empty()) call.arguments = "{}";
      out.push_back(std::move(call));
    }
    return true;
  }

  // tools: [{"type": "function", "function": {"name", "description", "parameters", "strict"}}],
  // kept as sent (the template lists them) after each is checked.
  bool get_tools(const json& v, json& out) {
    if (!v.is_array()) return fail("tools", fmt::format("'tools' must be an array, got {}", type_name(v)));
    for (std::size_t i = 0; i < v.size(); ++i) {
      const std::string at = fmt::format("tools[{}]", i);
      const json& t = v[i];
      if (!t.is_object()) return fail(at, fmt::format("'{}' must be an object, got {}", at, type_name(t)));
      const auto type = t.find("type");
      if (type == t.end() || *type != "function") {
        return fail(at + ".type", fmt::format("'{}.type' must be \"function\"", at));
      }
      const auto fn = t.find("function");
      if (fn == t.end() || !fn->is_object()) return fail(at + ".function", fmt::format("'{}.function' must be an object", at));
      for (const auto& [k, _] : t.items()) {
        if (k != "type" && k != "function") return fail(at + "." + k, fmt::format("unknown field '{}.{}'", at, k));
      }
      std::string fname;
      const auto nm = fn->find("name");
      if (nm == fn->end()) return fail(at + ".function.name", fmt::format("'{}.function.name' is required", at));
      if (!get_string(*nm, at + ".function.name", fname)) return false;
      if (fname.empty() || fname.find_first_of("<>\n\"") != std::string::npos) {
        return fail(at + ".function.name", fmt::format("'{}.function.name' must be a name without <, >, \" or line "
                                                       "breaks; got '{}'", at, fname));
      }
      for (std::size_t j = 0; j < i; ++j) {
        if (v[j]["function"]["name"] == fname) {
          return fail(at + ".function.name", fmt::format("'{}.function.name' '{}' is also tools[{}]'s", at, fname, j));
        }
      }
      for (const auto& [k, val] : fn->items()) {
        const std::string field = at + ".function." + k;
        if (k == "description") {
          std::string ignored;
          if (!val.is_null() && !get_string(val, field, ignored)) return false;
        } else if (k == "parameters") {
          if (!val.is_object()) return fail(field, fmt::format("'{}' must be a JSON schema object, got {}", field, type_name(val)));
        } else if (k == "strict") {
          bool ignored = false;
          if (!val.is_null() && !get_bool(val, field, ignored)) return false;
        } else if (k != "name") {
          return fail(field, fmt::format("unknown field '{}'", field));
        }
      }
    }
    out = v;
    return true;
  }

  // tool_choice: "none", "auto", "required", or {"type": "function", "function": {"name": NAME}}.
  bool get_tool_choice(const json& v, GenerateRequest& r) {
    if (v.is_string()) {
      const std::string s = v.get<std::string>();
      if (s == "none") r.tool_choice = ToolChoice::kNone;
      else if (s == "auto") r.tool_choice = ToolChoice::kAuto;
      else if (s == "required") r.tool_choice = ToolChoice::kRequired;
      else return fail("tool_choice", fmt::format("'tool_choice' must be \"none\", \"auto\", \"required\" or "
                                                  "{{\"type\": \"function\", \"function\": {{\"name\": ...}}}}; got '{}'", s));
      return true;
    }
    const auto fn = v.is_object() ? v.find("function") : v.end();
    if (!v.is_object() || v.value("type", json()) != "function" || fn == v.end() || !fn->is_object() ||
        !fn->contains("name") || !(*fn)["name"].is_string()) {
      return fail("tool_choice", "'tool_choice' must be \"none\", \"auto\", \"required\" or {\"type\": "
                                 "\"function\", \"function\": {\"name\": ...}}");
    }
    r.tool_choice = ToolChoice::kNamed;
    r.tool_choice_name = (*fn)["name"].get<std::string>();
    return true;
  }

  static std::string dump(const json& v) { return v.dump(-1, ' ', false, json::error_handler_t::replace); }

  // OpenAI's response_format: {"type": "text" | "json_object"} or {"type": "json_schema",
  // "json_schema": {"name", "schema", "strict", "description"}}.
  bool get_response_format(const json& v, chat::OutputFormat& out) {
    const std::string rf = "response_format";
    if (!v.is_object()) return fail(rf, fmt::format("'response_format' must be an object, got {}", type_name(v)));
    const auto type = v.find("type");
    if (type == v.end() || !type->is_string()) return fail(rf + ".type", "'response_format.type' must be a string");
    const std::string t = type->get<std::string>();
    auto only = [&](std::initializer_list<std::string_view> keys) {
      for (const auto& [k, _] : v.items()) {
        if (std::find(keys.begin(), keys.end(), k) == keys.end()) {
          return fail(rf + "." + k, fmt::format("unknown field 'response_format.{}'", k));
        }
      }
      return true;
    };
    if (t == "text") {
      out.kind = chat::OutputFormat::Kind::kText;
      return only({"type"});
    }
    if (t == "json_object") {
      out = {chat::OutputFormat::Kind::kJsonObject, "", {}, rf};
      return only({"type"});
    }
    if (t != "json_schema") {
      return fail(rf + ".type", fmt::format("'response_format.type' must be \"text\", \"json_object\" or "
                                            "\"json_schema\"; got '{}'", t));
    }
    if (!only({"type", "json_schema"})) return false;
    const auto js = v.find("json_schema");
    if (js == v.end() || !js->is_object()) {
      return fail(rf + ".json_schema", "'response_format.json_schema' must be an object with a 'schema'");
    }
    for (const auto& [k, val] : js->items()) {
      const std::string field = rf + ".json_schema." + k;
      if (k == "name" || k == "description") {
        std::string ignored;
        if (!get_string(val, field, ignored)) return false;
      } else if (k == "strict") {
        bool ignored = false;
        if (!val.is_null() && !get_bool(val, field, ignored)) return false;
      } else if (k != "schema") {
        return fail(field, fmt::format("unknown field '{}'", field));
      }
    }
    const auto schema = js->find("schema");
    if (schema == js->end() || !(schema->is_object() || schema->is_boolean())) {
      return fail(rf + ".json_schema.schema", "'response_format.json_schema.schema' must be a JSON schema (an object)");
    }
    out = {chat::OutputFormat::Kind::kJsonSchema, dump(*schema), {}, rf + ".json_schema.schema"};
    return true;
  }

  // vLLM's structured_outputs: one of json (a schema, as an object or its text), regex, choice,
  // grammar (EBNF), json_object (true).
  bool get_structured_outputs(const json& v, chat::OutputFormat& out) {
    const std::string so = "structured_outputs";
    if (!v.is_object()) return fail(so, fmt::format("'structured_outputs' must be an object, got {}", type_name(v)));
    int given = 0;
    for (const auto& [k, val] : v.items()) {
      const std::string field = so + "." + k;
      if (val.is_null()) continue;
      if (k == "json") {
        if (val.is_string()) {
          const std::optional<json> parsed = parse_string_json(val.get<std::string>(), field);
          if (!parsed) return false;
          if (!parsed->is_object()) return fail(field, "'structured_outputs.json' must be a JSON schema (an object or its text)");
          out = {chat::OutputFormat::Kind::kJsonSchema, dump(*parsed), {}, field};
        } else if (val.is_object()) {
          out = {chat::OutputFormat::Kind::kJsonSchema, dump(val), {}, field};
        } else {
          return fail(field, "'structured_outputs.json' must be a JSON schema (an object or its text)");
        }
      } else if (k == "regex" || k == "grammar") {
        std::string text;
        if (!get_string(val, field, text)) return false;
        if (text.empty()) return fail(field, fmt::format("'{}' must not be empty", field));
        out = {k == "regex" ? chat::OutputFormat::Kind::kRegex : chat::OutputFormat::Kind::kGrammar, text, {}, field};
      } else if (k == "choice") {
        if (!val.is_array() || val.empty()) return fail(field, "'structured_outputs.choice' must be a non-empty array of strings");
        out = {chat::OutputFormat::Kind::kChoice, "", {}, field};
        for (std::size_t i = 0; i < val.size(); ++i) {
          std::string c;
          if (!get_string(val[i], fmt::format("{}[{}]", field, i), c)) return false;
          out.choices.push_back(std::move(c));
        }
      } else if (k == "json_object") {
        bool on = false;
        if (!get_bool(val, field, on)) return false;
        if (!on) continue;
        out = {chat::OutputFormat::Kind::kJsonObject, "", {}, field};
      } else if (k == "structural_tag") {
        return fail(field, "'structured_outputs.structural_tag' is not supported");
      } else {
        return fail(field, fmt::format("unknown field '{}'", field));
      }
      ++given;
    }
    if (given != 1) {
      return fail(so, fmt::format("'structured_outputs' must give exactly one of json, regex, choice, grammar, "
                                  "json_object; it gives {}", given));
    }
    return true;
  }

  bool get_stop(const json& v, std::int64_t max_stop, std::vector<std::string>& out) {
    if (v.is_null()) return true;
    if (v.is_string()) {
      out.push_back(v.get<std::string>());
    } else if (v.is_array()) {
      for (std::size_t i = 0; i < v.size(); ++i) {
        std::string s;
        if (!get_string(v[i], fmt::format("stop[{}]", i), s)) return false;
        out.push_back(std::move(s));
      }
    } else {
      return fail("stop", fmt::format("'stop' must be a string or an array of strings, got {}", type_name(v)));
    }
    if (static_cast<std::int64_t>(out.size()) > max_stop) {
      return fail("stop", fmt::format("'stop' has {} strings; at most {} are allowed", out.size(), max_stop));
    }
    for (std::size_t i = 0; i < out.size(); ++i) {
      if (out[i].empty()) return fail(fmt::format("stop[{}]", i), "stop strings must not be empty");
    }
    return true;
  }

  // A completion prompt: a string, token ids, or an array holding one of those.
  bool get_prompt(const json& v, GenerateRequest& r) {
    const json* p = &v;
    if (v.is_array() && v.size() == 1 && (v[0].is_string() || v[0].is_array())) p = &v[0];
    if (p->is_string()) {
      r.prompt_text = p->get<std::string>();
      return true;
    }
    if (p->is_array() && !p->empty() && ((*p)[0].is_string() || (p == &v && (*p)[0].is_array()))) {
      return fail("prompt", "'prompt' holds several prompts: send one prompt per request (use n for several completions)");
    }
    if (!p->is_array() || p->empty()) {
      return fail("prompt", fmt::format("'prompt' must be a string or a non-empty array of token ids, got {}",
                                        p->is_array() ? "an empty array" : type_name(*p)));
    }
    for (std::size_t i = 0; i < p->size(); ++i) {
      std::int64_t id = 0;
      if (!get_int((*p)[i], fmt::format("prompt[{}]", i), 0, std::numeric_limits<std::int32_t>::max(), id)) return false;
      r.prompt_ids.push_back(static_cast<std::int32_t>(id));
    }
    r.prompt_is_ids = true;
    return true;
  }
};

bool known_field(Endpoint endpoint, std::string_view key) {
  static constexpr std::string_view kCommon[] = {
      "model", "max_tokens", "temperature", "top_p", "top_k", "min_p", "presence_penalty", "frequency_penalty",
      "repetition_penalty", "seed", "stop", "n", "stream", "stream_options", "user", "ignore_eos", "logprobs",
      "logit_bias", "response_format", "structured_outputs", "tools", "tool_choice", "functions", "function_call", "parallel_tool_calls",
      "store", "metadata", "service_tier"};
  static constexpr std::string_view kChat[] = {"messages", "max_completion_tokens", "top_logprobs",
                                               "chat_template_kwargs", "sextant_test_script"};
  static constexpr std::string_view kCompletion[] = {"prompt", "echo", "best_of", "suffix"};
  for (std::string_view k : kCommon) {
    if (k == key) return true;
  }
  if (endpoint == Endpoint::kChat) {
    for (std::string_view k : kChat) {
      if (k == key) return true;
    }
  } else {
    for (std::string_view k : kCompletion) {
      if (k == key) return true;
    }
  }
  return false;
}

}  // namespace

ApiError model_not_found(std::string_view asked, std::string_view served) {
  ApiError e;
  e.status = 404;
  e.code = "model_not_found";
  e.param = "model";
  e.message = fmt::format("The model '{}' does not exist; this server serves '{}'.", asked, served);
  return e;
}

ApiError chat_prompt_error(const Status& status) {
  ApiError e;
  if (status.code() == StatusCode::kFailedPrecondition) {
    e.code = "no_chat_template";
  } else {
    e.param = "messages";
  }
  e.message = std::string(status.message());
  return e;
}

std::optional<json> parse_body_object(std::string_view body, const ParseLimits& limits, ApiError* error) {
  Parser ps{error};
  const JsonShape shape = json_shape(body);
  if (shape.depth > limits.max_json_depth) {
    ps.fail("", fmt::format("the request body nests JSON {} levels deep; at most {} are accepted", shape.depth,
                            limits.max_json_depth));
    return std::nullopt;
  }
  if (shape.values > limits.max_json_values) {
    ps.fail("", fmt::format("the request body holds {} JSON values; at most {} are accepted", shape.values,
                            limits.max_json_values));
    return std::nullopt;
  }
  json doc = json::parse(body, nullptr, /*allow_exceptions=*/false);
  if (doc.is_discarded()) {
    ps.fail("", "the request body is not valid JSON");
    return std::nullopt;
  }
  if (!doc.is_object()) {
    ps.fail("", fmt::format("the request body must be a JSON object, got {}", Parser::type_name(doc)));
    return std::nullopt;
  }
  return doc;
}

bool parse_chat_messages(const json& v, std::vector<chat::ChatMessage>& out, ApiError* error) {
  Parser ps{error};
  return ps.get_messages(v, out);
}

bool parse_chat_tools(const json& v, json& out, ApiError* error) {
  Parser ps{error};
  return ps.get_tools(v, out);
}

std::optional<GenerateRequest> parse_request(Endpoint endpoint, std::string_view body, const ParseLimits& limits,
                                             ApiError* error) {
  Parser ps{error, JsonLimits{limits.max_json_depth, limits.max_json_values}};
  std::optional<json> parsed = parse_body_object(body, limits, error);
  if (!parsed) return std::nullopt;
  json doc = std::move(*parsed);
  GenerateRequest r;
  r.endpoint = endpoint;
  const bool chat = endpoint == Endpoint::kChat;
  bool has_model = false, has_input = false, logprobs_flag = false;
  std::optional<std::int64_t> top_logprobs, max_completion_tokens;
  bool tool_choice_given = false;
  const json* stream_options = nullptr;
  std::int64_t v = 0;
  for (const auto& [key, val] : doc.items()) {
    bool ok = true;
    // null = not given, for the fields this endpoint knows (an unknown field is an error either way).
    if (val.is_null() && key != "messages" && key != "prompt" && key != "model" && known_field(endpoint, key)) continue;
    if (key == "model") {
      ok = ps.get_string(val, key, r.model);
      has_model = true;
    } else if (chat && key == "messages") {
      ok = ps.get_messages(val, r.messages);
      has_input = true;
    } else if (chat && key == "chat_template_kwargs") {
      if (!val.is_object()) {
        ok = ps.fail(key, fmt::format("'chat_template_kwargs' must be an object, got {}", Parser::type_name(val)));
      } else {
        r.chat_template_kwargs = val;
      }
    } else if (!chat && key == "prompt") {
      ok = ps.get_prompt(val, r);
      has_input = true;
    } else if (key == "max_tokens" || (chat && key == "max_completion_tokens")) {
      ok = ps.get_int(val, key, 1, std::numeric_limits<std::int32_t>::max(), v);
      if (ok && key == "max_tokens") r.max_tokens = v;
      if (ok && key == "max_completion_tokens") max_completion_tokens = v;
    } else if (key == "temperature") {
      ok = ps.get_number(val, key, 0.0, 2.0, false, r.sampling.temperature);
    } else if (key == "top_p") {
      ok = ps.get_number(val, key, 0.0, 1.0, true, r.sampling.top_p);
    } else if (key == "top_k") {
      ok = ps.get_int(val, key, -1, std::numeric_limits<std::int32_t>::max(), v);
      if (ok) r.sampling.top_k = static_cast<std::int32_t>(v);
    } else if (key == "min_p") {
      ok = ps.get_number(val, key, 0.0, 1.0, false, r.sampling.min_p);
    } else if (key == "presence_penalty") {
      ok = ps.get_number(val, key, -2.0, 2.0, false, r.sampling.presence_penalty);
    } else if (key == "frequency_penalty") {
      ok = ps.get_number(val, key, -2.0, 2.0, false, r.sampling.frequency_penalty);
    } else if (key == "repetition_penalty") {
      ok = ps.get_number(val, key, 0.0, 10.0, true, r.sampling.repetition_penalty);
    } else if (key == "seed") {
      ok = ps.get_int(val, key, std::numeric_limits<std::int64_t>::min(), std::numeric_limits<std::int64_t>::max(), v);
      if (ok) r.sampling.seed = static_cast<std::uint64_t>(v);
    } else if (key == "stop") {
      ok = ps.get_stop(val, limits.max_stop_strings, r.stop);
    } else if (key == "n") {
      ok = ps.get_int(val, key, 1, limits.max_n, r.n);
    } else if (key == "stream") {
      ok = ps.get_bool(val, key, r.stream);
    } else if (key == "stream_options") {
      stream_options = &val;
    } else if (key == "user") {
      ok = ps.get_string(val, key, r.user);
    } else if (key == "ignore_eos") {
      ok = ps.get_bool(val, key, r.ignore_eos);
    } else if (chat && key == "logprobs") {
      ok = ps.get_bool(val, key, logprobs_flag);
    } else if (chat && key == "top_logprobs") {
      ok = ps.get_int(val, key, 0, 20, v);
      if (ok) top_logprobs = v;
    } else if (!chat && key == "logprobs") {
      ok = ps.get_int(val, key, 0, 5, v);
      if (ok) r.top_logprobs = static_cast<std::int32_t>(v);
    } else if (!chat && key == "echo") {
      ok = ps.get_bool(val, key, r.echo);
    } else if (!chat && key == "best_of") {
      ok = ps.get_int(val, key, 1, 1, v);
    } else if (key == "logit_bias") {
      if (!val.is_object() || !val.empty()) ok = ps.fail(key, "'logit_bias' is not supported");
    } else if (key == "response_format") {
      chat::OutputFormat f;
      ok = ps.get_response_format(val, f);
      if (ok && f.kind != chat::OutputFormat::Kind::kText) {
        if (r.output_format.kind != chat::OutputFormat::Kind::kText) {
          ok = ps.fail(key, "give either 'response_format' or 'structured_outputs', not both");
        } else {
          r.output_format = std::move(f);
        }
      }
    } else if (key == "structured_outputs") {
      chat::OutputFormat f;
      ok = ps.get_structured_outputs(val, f);
      if (ok && r.output_format.kind != chat::OutputFormat::Kind::kText) {
        ok = ps.fail(key, "give either 'response_format' or 'structured_outputs', not both");
      } else if (ok) {
        r.output_format = std::move(f);
      }
    } else if (chat && key == "tools") {
      ok = ps.get_tools(val, r.tools);
    } else if (chat && key == "tool_choice") {
      ok = ps.get_tool_choice(val, r);
      tool_choice_given = true;
    } else if (chat && key == "parallel_tool_calls") {
      ok = ps.get_bool(val, key, r.parallel_tool_calls);
    } else if (chat && key == "sextant_test_script" && limits.test_hooks) {
      ok = ps.get_string(val, key, r.test_script);
    } else if (key == "tools" || key == "tool_choice" || key == "functions" || key == "function_call" ||
               key == "parallel_tool_calls" || (!chat && key == "suffix")) {
      ok = ps.fail(key, fmt::format("'{}' is not supported", key));
    } else if (key == "store" || key == "metadata" || key == "service_tier") {
      // OpenAI platform features with no meaning for a local server: accepted and ignored.
    } else {
      ok = ps.fail(key, fmt::format("unknown field '{}'", key));
    }
    if (!ok) return std::nullopt;
  }
  if (!has_model) {
    ps.fail("model", "'model' is required");
    return std::nullopt;
  }
  if (!has_input || (chat && r.messages.empty())) {
    ps.fail(chat ? "messages" : "prompt", fmt::format("'{}' is required", chat ? "messages" : "prompt"));
    return std::nullopt;
  }
  if (stream_options != nullptr && !stream_options->is_null()) {
    if (!r.stream) {
      ps.fail("stream_options", "'stream_options' is only allowed with \"stream\": true");
      return std::nullopt;
    }
    if (!stream_options->is_object()) {
      ps.fail("stream_options", "'stream_options' must be an object");
      return std::nullopt;
    }
    for (const auto& [k, val] : stream_options->items()) {
      if (k == "include_usage") {
        if (!val.is_null() && !ps.get_bool(val, "stream_options.include_usage", r.include_usage)) return std::nullopt;
      } else if (k == "continuous_usage_stats") {
        ps.fail("stream_options." + k, "'stream_options.continuous_usage_stats' is not supported");
        return std::nullopt;
      } else {
        ps.fail("stream_options." + k, fmt::format("unknown field 'stream_options.{}'", k));
        return std::nullopt;
      }
    }
  }
  if (max_completion_tokens) r.max_tokens = max_completion_tokens;  // the newer name wins, as in vLLM
  if (chat) {
    // OpenAI's defaults: "auto" with tools, "none" without; a choice that needs tools needs them.
    const bool has_tools = r.tools.is_array() && !r.tools.empty();
    if (!tool_choice_given) r.tool_choice = has_tools ? ToolChoice::kAuto : ToolChoice::kNone;
    if (!has_tools && (r.tool_choice == ToolChoice::kRequired || r.tool_choice == ToolChoice::kNamed)) {
      ps.fail("tool_choice", "'tool_choice' asks for a tool call but 'tools' lists none");
      return std::nullopt;
    }
    if ((r.tool_choice == ToolChoice::kRequired || r.tool_choice == ToolChoice::kNamed) &&
        r.output_format.kind != chat::OutputFormat::Kind::kText) {
      ps.fail("tool_choice", "'tool_choice' required or named holds the answer to a tool call: it cannot be combined "
                             "with 'response_format' or 'structured_outputs'");
      return std::nullopt;
    }
    if (r.tool_choice == ToolChoice::kNamed) {
      bool found = false;
      for (const json& t : r.tools) found = found || t["function"]["name"] == r.tool_choice_name;
      if (!found) {
        ps.fail("tool_choice", fmt::format("'tool_choice' names the function '{}', which 'tools' does not list",
                                           r.tool_choice_name));
        return std::nullopt;
      }
    }
  }
  if (chat) {
    if (top_logprobs && !logprobs_flag) {
      ps.fail("top_logprobs", "'top_logprobs' requires \"logprobs\": true");
      return std::nullopt;
    }
    if (logprobs_flag) r.top_logprobs = static_cast<std::int32_t>(top_logprobs.value_or(0));
  }
  if (Status s = r.sampling.validate(); !s.ok()) {
    ps.fail("", s.message());
    return std::nullopt;
  }
  return r;
}

}  // namespace sx::daemon::openai
