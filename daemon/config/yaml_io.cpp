// YAML -> ServeConfig through the schema table, every problem collected with its line; and back.
// The only place in Sextant that catches exceptions (yaml-cpp's), DESIGN.md §7.1.
#include "daemon/config/yaml_io.h"

#include <algorithm>
#include <cstdint>
#include <map>
#include <optional>
#include <sstream>
#include <vector>

#include <fmt/ranges.h>
#include <yaml-cpp/eventhandler.h>
#include <yaml-cpp/mark.h>
#include <yaml-cpp/yaml.h>
#if __has_include(<yaml-cpp/depthguard.h>)
#include <yaml-cpp/depthguard.h>  // YAML::DeepRecursion (yaml-cpp 0.7+)
#define SX_YAML_HAS_DEPTH_GUARD 1
#endif

#include "daemon/config/fields.h"
#include "runtime/base/regular_file.h"

namespace sx::daemon::config {
namespace {

// "file:12:3" (1-based), or just the file when yaml-cpp has no position.
std::string where(std::string_view source, const YAML::Mark& mark) {
  if (mark.is_null() || mark.line < 0) return std::string(source);
  return fmt::format("{}:{}:{}", source, mark.line + 1, mark.column + 1);
}

// Text from the file or from yaml-cpp as it may appear in a message: control bytes (a newline in a
// quoted key, a raw byte in yaml-cpp's "unknown escape character: ...") become \xNN, so that each
// problem stays one line.
std::string printable(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  for (const char ch : text) {
    const auto u = static_cast<unsigned char>(ch);
    if (u < 0x20 || u == 0x7f) {
      out += fmt::format("\\x{:02X}", u);
    } else {
      out += ch;
    }
  }
  return out;
}

// What a node is, for "got ..." in messages.
std::string describe(const YAML::Node& node) {
  switch (node.Type()) {
    case YAML::NodeType::Null: return "null";
    case YAML::NodeType::Sequence: return "a list";
    case YAML::NodeType::Map: return "a map";
    case YAML::NodeType::Scalar: return quote_yaml(node.Scalar());
    default: return "nothing";
  }
}

// A map's keys, checked for being scalars and for duplicates. Calls visit(name, key, value) for
// each first occurrence.
template <class Visit>
void for_each_entry(const YAML::Node& map, std::string_view source, std::string_view prefix, ErrorList& errors,
                    Visit visit) {
  std::map<std::string, int, std::less<>> first_line;
  // Copies: yaml-cpp's iterator hands out a temporary proxy, so `it->first` must not be bound by
  // reference past its statement.
  for (auto it = map.begin(); it != map.end(); ++it) {
    const YAML::Node key = it->first;
    const YAML::Node value = it->second;
    if (!key.IsScalar()) {
      errors.add(where(source, key.Mark()), prefix, fmt::format("expected a setting name, got {}", describe(key)));
      continue;
    }
    const std::string& name = key.Scalar();
    const std::string path = prefix.empty() ? printable(name) : fmt::format("{}.{}", prefix, printable(name));
    auto [seen, inserted] = first_line.emplace(name, key.Mark().line + 1);
    if (!inserted) {
      errors.add(where(source, key.Mark()), path, fmt::format("duplicate key, first set on line {}", seen->second));
      continue;
    }
    visit(name, key, value);
  }
}

class Loader {
 public:
  explicit Loader(std::string_view source) : source_(source), errors_(std::string(source)) {}

  void load_root(const YAML::Node& root) {
    if (root.IsNull()) return;  // empty document: all defaults
    if (!root.IsMap()) {
      errors_.add(where(source_, root.Mark()), "",
                  fmt::format("expected a map of sections ({}) at the top level, got {}",
                              fmt::join(section_names(), ", "), describe(root)));
      return;
    }
    const std::vector<std::string_view> sections = section_names();
    for_each_entry(root, source_, "", errors_,
                   [&](const std::string& name, const YAML::Node& key, const YAML::Node& value) {
      if (std::find(sections.begin(), sections.end(), name) == sections.end()) {
        const std::string_view guess = closest_match(name, sections);
        errors_.add(where(source_, key.Mark()), printable(name),
                    fmt::format("unknown section (expected one of {}{})", fmt::join(sections, ", "),
                                guess.empty() ? "" : fmt::format("; did you mean {}?", guess)));
        return;
      }
      load_section(name, value);
    });
  }

  Result<ServeConfig> finish() {
    if (!errors_.empty()) return errors_.to_status();
    return std::move(config_);
  }

  ErrorList& errors() { return errors_; }

 private:
  void load_section(const std::string& section, const YAML::Node& value) {
    if (value.IsNull()) return;  // "engine:" with nothing under it: that section's defaults
    if (!value.IsMap()) {
      errors_.add(where(source_, value.Mark()), section,
                  fmt::format("expected a map of {} settings, got {}", section, describe(value)));
      return;
    }
    std::vector<std::string_view> keys;
    for (const Field& f : fields()) {
      if (f.section() == section) keys.push_back(f.key());
    }
    for_each_entry(value, source_, section, errors_,
                   [&](const std::string& name, const YAML::Node& k, const YAML::Node& v) {
      const std::string path = fmt::format("{}.{}", section, name);
      const Field* field = find_field(path);
      if (field == nullptr) {
        const std::string_view guess = closest_match(name, keys);
        errors_.add(where(source_, k.Mark()), printable(path),
                    guess.empty() ? fmt::format("unknown key ({} has: {})", section, fmt::join(keys, ", "))
                                  : fmt::format("unknown key (did you mean {}?)", guess));
        return;
      }
      load_field(*field, k, v);
    });
  }

  void load_field(const Field& field, const YAML::Node& key, const YAML::Node& value) {
    if (value.IsNull()) {
      if (field.is_list || field.nullable) {
        field.clear(config_);
      } else {
        // An empty value's own mark points past the line; the key's is where the reader looks.
        errors_.add(where(source_, key.Mark()), field.path, fmt::format("expected {}, got null", field.expected));
      }
      return;
    }
    if (field.is_list) {
      if (!value.IsSequence()) {
        errors_.add(where(source_, value.Mark()), field.path,
                    fmt::format("expected {}, got {}", field.expected, describe(value)));
        return;
      }
      field.clear(config_);
      std::size_t index = 0;
      for (auto it = value.begin(); it != value.end(); ++it, ++index) {
        const YAML::Node item = *it;
        const std::string path = fmt::format("{}[{}]", field.path, index);
        std::string error = item.IsScalar() ? field.set(config_, item.Scalar())
                                            : fmt::format("expected a single value, got {}", describe(item));
        if (!error.empty()) errors_.add(where(source_, item.Mark()), path, error);
      }
      return;
    }
    if (field.accepts_sequence && value.IsSequence()) {
      YAML::Emitter flow;
      flow << YAML::Flow << value;
      if (std::string error = field.set(config_, flow.c_str()); !error.empty()) {
        errors_.add(where(source_, value.Mark()), field.path, error);
      }
      return;
    }
    if (!value.IsScalar()) {
      errors_.add(where(source_, value.Mark()), field.path,
                  fmt::format("expected {}, got {}", field.expected, describe(value)));
      return;
    }
    if (std::string error = field.set(config_, value.Scalar()); !error.empty()) {
      errors_.add(where(source_, value.Mark()), field.path, error);
    }
  }

  std::string source_;
  ErrorList errors_;
  ServeConfig config_;
};

// What the pre-scan refused, and where (1-based).
struct ScanProblem {
  int line = 0;
  int column = 0;
  std::string message;
};

// A cheap, conservative pre-scan of the text before yaml-cpp sees it (not a YAML parser):
// * nesting deeper than `max_depth` (yaml-cpp recurses): flow brackets [ { outside quoted scalars
//   and comments (in block context only where a node starts, so "a[b" in a plain scalar is not
//   one) plus block nesting, the stack of increasing indentation columns where each "- " or "? "
//   opens one more; block scalar lines (after "|" or ">"), anchors and tags are skipped;
// * a control byte YAML does not allow (below).
class YamlPrescan {
 public:
  explicit YamlPrescan(int max_depth) : max_depth_(max_depth) {}

  std::optional<ScanProblem> run(std::string_view text) {
    if (std::optional<ScanProblem> control = find_control_byte(text)) return control;
    size_t pos = text.starts_with("\xEF\xBB\xBF") ? 3 : 0;  // a byte order mark (yaml-cpp skips one)
    while (pos <= text.size() && !problem_) {
      size_t end = text.find('\n', pos);
      if (end == std::string_view::npos) end = text.size();
      line_ = text.substr(pos, end - pos);
      ++line_no_;
      pos = end + 1;
      scan_line();
    }
    return std::move(problem_);
  }

 private:
  // YAML allows no control character but tab, LF and CR anywhere in a stream (YAML 1.2, 5.1; as text
  // "\x01" in a double-quoted scalar they are fine). yaml-cpp does not refuse them and loops on
  // some ("\0,"), so they are refused here.
  static std::optional<ScanProblem> find_control_byte(std::string_view text) {
    int line = 1;
    size_t line_start = 0;
    for (size_t i = 0; i < text.size(); ++i) {
      const auto u = static_cast<unsigned char>(text[i]);
      if (u == '\n') {
        ++line;
        line_start = i + 1;
      } else if ((u < 0x20 && u != '\t' && u != '\r') || u == 0x7f) {
        return ScanProblem{line, static_cast<int>(i - line_start) + 1,
                           fmt::format("YAML syntax error: control character 0x{:02X} (YAML allows none but tab, "
                                       "line feed and carriage return; write it as \\x{:02X} in a double-quoted string)",
                                       u, u)};
      }
    }
    return std::nullopt;
  }

  enum class Quote { kNone, kSingle, kDouble };
  // Block context: at the start of a node, inside a plain scalar, or after a complete quoted
  // scalar or flow collection (where only ':', a comment or the end of the line may follow).
  enum class State { kNodeStart, kPlain, kAfterNode };

  void fail(size_t i, std::string message) {
    problem_ = ScanProblem{line_no_, static_cast<int>(i) + 1, std::move(message)};
  }
  bool too_deep(size_t i) {
    if (static_cast<int>(block_.size()) + flow_ <= max_depth_) return false;
    fail(i, fmt::format("nested more than {} levels deep (flow brackets [ {{ and block indentation together); a "
                        "sextant config needs 4",
                        max_depth_));
    return true;
  }
  bool space_at(size_t i) const { return i >= line_.size() || line_[i] == ' ' || line_[i] == '\t' || line_[i] == '\r'; }

  void scan_line() {
    size_t i = 0;
    if (quote_ == Quote::kNone && flow_ == 0) {
      while (i < line_.size() && line_[i] == ' ') ++i;
      const bool blank = i == line_.size() || line_[i] == '\r';
      const int indent = static_cast<int>(i);
      if (block_scalar_parent_ >= 0) {
        if (blank || indent > block_scalar_parent_) return;
        block_scalar_parent_ = -1;
      }
      if (blank || line_[i] == '#') return;
      if (state_ == State::kPlain && indent > line_indent_) {
        // A more indented line after a plain scalar continues it ("a: b\n  ,c" is "b ,c").
      } else {
        state_ = State::kNodeStart;
        line_indent_ = indent;
        while (!block_.empty() && block_.back() > indent) block_.pop_back();
        if (block_.empty() || block_.back() < indent) {
          block_.push_back(indent);
          if (too_deep(i)) return;
        }
        // "---" / "..." (document markers) start a line and are not content.
        if (i == 0 && line_.size() >= 3 && (line_.starts_with("---") || line_.starts_with("...")) && space_at(3)) i = 3;
      }
    }
    for (; i < line_.size() && !problem_; ++i) {
      const char ch = line_[i];
      if (quote_ != Quote::kNone) {
        scan_quoted(i);
        continue;
      }
      if (ch == '#' && (i == 0 || line_[i - 1] == ' ' || line_[i - 1] == '\t')) return;  // a comment
      if (ch == ' ' || ch == '\t' || ch == '\r') continue;
      if (flow_ > 0) {
        scan_flow(i);
      } else if (!scan_block(i)) {
        return;  // the rest of the line is a block scalar header's
      }
    }
  }

  void scan_quoted(size_t& i) {
    const char ch = line_[i];
    if (quote_ == Quote::kDouble) {
      if (ch == '\\') {
        ++i;
      } else if (ch == '"') {
        close_quote();
      }
    } else if (ch == '\'') {
      if (i + 1 < line_.size() && line_[i + 1] == '\'') {
        ++i;
      } else {
        close_quote();
      }
    }
  }
  void close_quote() {
    quote_ = Quote::kNone;
    flow_value_start_ = false;
    if (flow_ == 0) state_ = State::kAfterNode;
  }

  void scan_flow(size_t i) {
    const char ch = line_[i];
    if (ch == '[' || ch == '{') {
      ++flow_;
      flow_value_start_ = true;
      too_deep(i);
    } else if (ch == ']' || ch == '}') {
      if (--flow_ == 0) state_ = State::kAfterNode;
      flow_value_start_ = false;
    } else if (ch == ',' || ch == ':') {
      flow_value_start_ = true;
    } else if ((ch == '"' || ch == '\'') && flow_value_start_) {
      quote_ = ch == '"' ? Quote::kDouble : Quote::kSingle;
    } else {
      flow_value_start_ = false;
    }
  }

  // False when the rest of the line is to be skipped.
  bool scan_block(size_t& i) {
    const char ch = line_[i];
    if (state_ == State::kPlain) {
      if (ch == ':' && space_at(i + 1)) state_ = State::kNodeStart;  // "key with spaces: value"
      return true;
    }
    if (state_ == State::kAfterNode) {
      if (ch == ':') state_ = State::kNodeStart;  // '"key": value', '[a]: b'
      return true;
    }
    // At the start of a node.
    if ((ch == '-' || ch == '?') && space_at(i + 1)) {
      block_.push_back(static_cast<int>(i) + 2);  // "- - x": one more level per indicator
      too_deep(i);
      return true;
    }
    if (ch == ':' && space_at(i + 1)) return true;  // an empty key
    if (ch == '&' || ch == '!') {  // an anchor or a tag: the node follows
      // Their names end at a space or a flow indicator ("&x,": the ',' follows the anchor); a
      // verbatim tag "!<...>" at its '>'.
      if (ch == '!' && i + 1 < line_.size() && line_[i + 1] == '<') {
        while (i + 1 < line_.size() && line_[i] != '>') ++i;
        return true;
      }
      auto flow_indicator = [](char c) { return c == ',' || c == '[' || c == ']' || c == '{' || c == '}'; };
      while (i + 1 < line_.size() && !space_at(i + 1) && !flow_indicator(line_[i + 1])) ++i;
      return true;
    }
    if (ch == '[' || ch == '{') {
      flow_ = 1;
      flow_value_start_ = true;
      too_deep(i);
      return true;
    }
    if (ch == '"' || ch == '\'') {
      quote_ = ch == '"' ? Quote::kDouble : Quote::kSingle;
      return true;
    }
    if (ch == '|' || ch == '>') {
      size_t j = i + 1;
      while (j < line_.size() && (line_[j] == '-' || line_[j] == '+' || (line_[j] >= '0' && line_[j] <= '9'))) ++j;
      while (j < line_.size() && (line_[j] == ' ' || line_[j] == '\t' || line_[j] == '\r')) ++j;
      if (j == line_.size() || line_[j] == '#') {
        block_scalar_parent_ = line_indent_;  // its lines are more indented than this one
        state_ = State::kAfterNode;
        return false;
      }
    }
    state_ = State::kPlain;
    return true;
  }

  const int max_depth_;
  std::string_view line_;
  int line_no_ = 0;
  Quote quote_ = Quote::kNone;
  int flow_ = 0;                  // open [ and { (flow context when > 0)
  bool flow_value_start_ = true;  // in flow context: at the start of a token
  State state_ = State::kNodeStart;
  int line_indent_ = 0;           // indentation of the line that started the current block node
  std::vector<int> block_;        // columns of the open block nodes
  int block_scalar_parent_ = -1;  // >= 0: skipping the lines of a block scalar under this indent
  std::optional<ScanProblem> problem_;
};

// The documents of a stream, counted without building them. yaml-cpp 0.7's LoadAll loops forever
// on some input ("," at the top level, "[a],", "\"x\":\"1\n? "): the parser returns an empty
// document without consuming the token it stopped at, again and again, while LoadAll keeps
// appending them until memory runs out (jbeder/yaml-cpp#1040). A document that starts where the
// previous one started made no progress: the count stops there and reports where.
struct DocumentCount {
  int documents = 0;
  YAML::Mark second_root = YAML::Mark::null_mark();  // the second document's root node
  bool stuck = false;
  YAML::Mark stuck_at = YAML::Mark::null_mark();
};

class RootMarks final : public YAML::EventHandler {
 public:
  YAML::Mark start = YAML::Mark::null_mark();  // the document's first token
  YAML::Mark root = YAML::Mark::null_mark();   // its root node

  void OnDocumentStart(const YAML::Mark& mark) override {
    start = mark;
    root = YAML::Mark::null_mark();
    depth_ = 0;
  }
  void OnDocumentEnd() override {}
  void OnNull(const YAML::Mark& mark, YAML::anchor_t) override { node(mark); }
  void OnAlias(const YAML::Mark& mark, YAML::anchor_t) override { node(mark); }
  void OnScalar(const YAML::Mark& mark, const std::string&, YAML::anchor_t, const std::string&) override {
    node(mark);
  }
  void OnSequenceStart(const YAML::Mark& mark, const std::string&, YAML::anchor_t,
                       YAML::EmitterStyle::value) override {
    node(mark);
  }
  void OnSequenceEnd() override {}
  void OnMapStart(const YAML::Mark& mark, const std::string&, YAML::anchor_t, YAML::EmitterStyle::value) override {
    node(mark);
  }
  void OnMapEnd() override {}

 private:
  void node(const YAML::Mark& mark) {
    if (depth_++ == 0) root = mark;
  }
  int depth_ = 0;
};

// Throws what yaml-cpp throws for a syntax error (the caller catches it).
DocumentCount count_documents(const std::string& text) {
  std::istringstream in(text);
  YAML::Parser parser(in);
  RootMarks marks;
  DocumentCount count;
  YAML::Mark previous = YAML::Mark::null_mark();
  while (parser.HandleNextDocument(marks)) {
    if (count.documents > 0 && marks.start.pos == previous.pos) {
      count.stuck = true;
      count.stuck_at = marks.start;
      return count;
    }
    previous = marks.start;
    if (++count.documents == 2) count.second_root = marks.root;
  }
  return count;
}

}  // namespace

Result<ServeConfig> load_config_string(std::string_view text, std::string_view source_name) {
  if (text.size() > kMaxConfigBytes) {
    return invalid_argument_error("{}: {} bytes, more than the limit of {} bytes for a config", source_name,
                                  text.size(), kMaxConfigBytes);
  }
  if (const std::optional<ScanProblem> problem = YamlPrescan(kMaxConfigNesting).run(text)) {
    return invalid_argument_error("{}:{}:{}: {}", source_name, problem->line, problem->column, problem->message);
  }
  Loader loader(source_name);
  try {
    const std::string owned(text);
    const DocumentCount count = count_documents(owned);
    if (count.stuck) {
      const char at = count.stuck_at.pos >= 0 && static_cast<size_t>(count.stuck_at.pos) < owned.size()
                          ? owned[static_cast<size_t>(count.stuck_at.pos)]
                          : ' ';
      loader.errors().add(where(source_name, count.stuck_at), "",
                          fmt::format("YAML syntax error: unexpected '{}'", printable(std::string_view(&at, 1))));
    } else if (count.documents > 1) {
      loader.errors().add(where(source_name, count.second_root), "",
                          fmt::format("expected one YAML document, found {}", count.documents));
    } else if (count.documents == 1) {
      loader.load_root(YAML::Load(owned));
    }
#ifdef SX_YAML_HAS_DEPTH_GUARD
  } catch (const YAML::DeepRecursion& e) {  // yaml-cpp's own bound, should the pre-scan miss a case
    loader.errors().add(where(source_name, e.mark), "",
                        fmt::format("nested too deeply for the YAML parser ({} levels)", e.depth()));
#endif
  } catch (const YAML::Exception& e) {
    loader.errors().add(where(source_name, e.mark), "", fmt::format("YAML syntax error: {}", printable(e.msg)));
  } catch (const std::exception& e) {  // nothing else should throw; never let it escape
    loader.errors().add(source_name, "", fmt::format("cannot parse: {}", printable(e.what())));
  }
  return loader.finish();
}

Result<ServeConfig> load_config_file(const std::string& path) {
  // A FIFO, a device or a directory is refused before anything blocks on it or reads it, and so is
  // a file over kMaxConfigBytes (from its size, before reading).
  SX_ASSIGN_OR_RETURN(std::string text,
                      read_regular_file(path, kMaxConfigBytes, fmt::format("cannot read config file '{}'", path)));
  return load_config_string(text, path);
}

std::string to_yaml(const ServeConfig& config, PrintOptions options) {
  std::string out = "# sextant serve configuration";
  out += options.redact_secrets ? " (API keys redacted)\n" : "\n";
  std::string_view section;
  for (const Field& f : fields()) {
    if (f.section() != section) {
      section = f.section();
      out += fmt::format("{}:\n", section);
    }
    out += fmt::format("  {}: {}", f.key(), f.print(config, options.redact_secrets));
    if (f.path == "model.served_model_name" && config.model.served_model_name.empty() &&
        !config.model.path.empty()) {
      out += fmt::format("  # empty: the file stem of model.path ({})",
                         quote_yaml(effective_served_model_name(config.model)));
    }
    out += '\n';
  }
  return out;
}

}  // namespace sx::daemon::config
