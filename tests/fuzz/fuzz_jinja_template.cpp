// Fuzz target: the Jinja chat templates (daemon/chat/chat_template.h). Input: one mode byte, then
// the text. Mode bit 0 clear: the text is a template source, parsed (any template may be given with
// --chat-template; only parsed here, since a template's own loops can run as long as it says).
// Bit 0 set: the text is JSON, rendered by one of the Qwen templates of tests/data/chat-templates
// (mode >> 1 picks it): an object is the whole context, an array the messages (with a tools list and
// add_generation_prompt); the data is what a request controls. Invariants: parse and render return
// OK or INVALID_ARGUMENT (never another code, a crash or an exception); a render gives the same
// result twice; parse_tool_call_arguments either fails naming a message or leaves no string
// arguments; JSON nested deeper than a request may be (32) is not rendered.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <string_view>
#include <vector>

#include "daemon/chat/chat_template.h"
#include "runtime/base/json_depth.h"
#include "tests/fuzz/fuzz_check.h"

namespace {

const std::vector<std::shared_ptr<const sx::chat::ChatTemplate>>& templates() {
  static const auto all = [] {
    std::vector<std::filesystem::path> paths;
    for (const auto& d : std::filesystem::recursive_directory_iterator(SX_CHAT_TEMPLATE_DIR)) {
      if (d.path().extension() == ".jinja") paths.push_back(d.path());
    }
    std::sort(paths.begin(), paths.end());
    std::vector<std::shared_ptr<const sx::chat::ChatTemplate>> out;
    for (const auto& p : paths) {
      std::ifstream in(p, std::ios::binary);
      const std::string src((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
      auto t = sx::chat::ChatTemplate::parse(src, p.string());
      FUZZ_CHECK(t.ok());
      out.push_back(*t);
    }
    FUZZ_CHECK(!out.empty());
    return out;
  }();
  return all;
}

bool ok_or_invalid(const sx::Status& s) { return s.ok() || s.code() == sx::StatusCode::kInvalidArgument; }

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size < 1) return 0;
  const std::uint8_t mode = data[0];
  const std::string_view text(reinterpret_cast<const char*>(data + 1), size - 1);
  if ((mode & 1) == 0) {
    auto t = sx::chat::ChatTemplate::parse(text, "fuzz");
    FUZZ_CHECK(ok_or_invalid(t.status()));
    return 0;
  }
  const auto& all = templates();
  const auto& tmpl = all[(mode >> 1) % all.size()];
  if (sx::json_shape(text).depth > 32) return 0;
  auto parsed = nlohmann::ordered_json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (parsed.is_discarded()) return 0;
  nlohmann::ordered_json context;
  if (parsed.is_object()) {
    context = std::move(parsed);
  } else {
    context = nlohmann::ordered_json::object();
    context["messages"] = std::move(parsed);
    context["tools"] = nlohmann::ordered_json::array(
        {{{"type", "function"}, {"function", {{"name", "f"}, {"parameters", {{"type", "object"}}}}}}});
    context["add_generation_prompt"] = true;
  }
  if (context.contains("messages")) {
    const sx::Status s = sx::chat::parse_tool_call_arguments(context["messages"]);
    FUZZ_CHECK(ok_or_invalid(s));
    if (s.ok() && context["messages"].is_array()) {
      for (const auto& m : context["messages"]) {
        if (!m.is_object() || !m.contains("tool_calls") || !m["tool_calls"].is_array()) continue;
        for (const auto& c : m["tool_calls"]) {
          if (c.is_object() && c.contains("function") && c["function"].is_object() &&
              c["function"].contains("arguments")) {
            FUZZ_CHECK(!c["function"]["arguments"].is_string());
          }
        }
      }
    }
  }
  auto first = tmpl->render(context);
  FUZZ_CHECK(ok_or_invalid(first.status()));
  auto second = tmpl->render(context);
  FUZZ_CHECK(first.ok() == second.ok());
  if (first.ok()) FUZZ_CHECK(*first == *second);
  return 0;
}
