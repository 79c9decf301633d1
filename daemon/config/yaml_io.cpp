// YAML -> ServeConfig through the schema table, every problem collected with its line; and back.
// The only place in Sextant that catches exceptions (yaml-cpp's), DESIGN.md §7.1.
#include "daemon/config/yaml_io.h"

#include <algorithm>
#include <cstdint>
#include <map>
#include <optional>
#include <vector>

#include <fmt/ranges.h>
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
    const std::string path = prefix.empty() ? name : fmt::format("{}.{}", prefix, name);
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
        errors_.add(where(source_, key.Mark()), name,
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
        errors_.add(where(source_, k.Mark()), path,
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

// Where text first nests deeper than `max_depth`, or nullopt. A cheap, conservative pre-scan (not
// a YAML parser): flow brackets [ { count outside quoted scalars and comments (in block context
// only where a value starts, so "a[b" in a plain scalar is not one); block nesting is the stack of
// increasing indentation columns, each "- " or "? " opening one more on its line; block scalar
// lines (after "|" or ">") and quoted scalars are skipped.
struct NestingMark {
  int line = 0;    // 1-based
  int column = 0;  // 1-based
};

std::optional<NestingMark> find_deep_nesting(std::string_view text, int max_depth) {
  enum class Quote { kNone, kSingle, kDouble };
  Quote quote = Quote::kNone;
  int flow = 0;                     // open [ and { (flow context when > 0)
  std::vector<int> block;           // columns of the open block nodes
  int block_scalar_parent = -1;     // >= 0: skipping the lines of a block scalar under this indent
  int line_no = 0;
  size_t pos = 0;
  while (pos <= text.size()) {
    size_t end = text.find('\n', pos);
    if (end == std::string_view::npos) end = text.size();
    const std::string_view line = text.substr(pos, end - pos);
    ++line_no;
    pos = end + 1;
    size_t i = 0;
    int indent = 0;
    if (quote == Quote::kNone && flow == 0) {
      while (i < line.size() && line[i] == ' ') ++i;
      const bool blank = i == line.size() || line[i] == '\r';
      indent = static_cast<int>(i);
      if (block_scalar_parent >= 0) {
        if (blank || indent > block_scalar_parent) continue;
        block_scalar_parent = -1;
      }
      if (blank || line[i] == '#') continue;
      while (!block.empty() && block.back() > indent) block.pop_back();
      if (block.empty() || block.back() < indent) {
        block.push_back(indent);
        if (static_cast<int>(block.size()) > max_depth) return NestingMark{line_no, indent + 1};
      }
    }
    bool value_start = true;  // at the start of a node (block context) or of a token (flow)
    for (; i < line.size(); ++i) {
      const char ch = line[i];
      if (quote == Quote::kDouble) {
        if (ch == '\\') {
          ++i;
        } else if (ch == '"') {
          quote = Quote::kNone;
          value_start = false;
        }
        continue;
      }
      if (quote == Quote::kSingle) {
        if (ch == '\'' && i + 1 < line.size() && line[i + 1] == '\'') {
          ++i;
        } else if (ch == '\'') {
          quote = Quote::kNone;
          value_start = false;
        }
        continue;
      }
      const bool after_space = i == 0 || line[i - 1] == ' ' || line[i - 1] == '\t';
      if (ch == '#' && after_space) break;  // a comment: the rest of the line
      if (ch == ' ' || ch == '\t' || ch == '\r') continue;
      const bool next_is_space = i + 1 >= line.size() || line[i + 1] == ' ' || line[i + 1] == '\r';
      if (flow > 0) {
        if (ch == '[' || ch == '{') {
          if (++flow + static_cast<int>(block.size()) > max_depth) {
            return NestingMark{line_no, static_cast<int>(i) + 1};
          }
          value_start = true;
        } else if (ch == ']' || ch == '}') {
          --flow;
          value_start = false;
        } else if (ch == ',' || ch == ':') {
          value_start = true;
        } else if ((ch == '"' || ch == '\'') && value_start) {
          quote = ch == '"' ? Quote::kDouble : Quote::kSingle;
        } else {
          value_start = false;
        }
        continue;
      }
      if (!value_start) {
        // Inside a plain scalar: only ": " (a key ended) starts a value again.
        if (ch == ':' && next_is_space) value_start = true;
        continue;
      }
      if ((ch == '-' || ch == '?') && next_is_space) {
        block.push_back(static_cast<int>(i) + 2);  // "- - x": one more level per indicator
        if (static_cast<int>(block.size()) + flow > max_depth) {
          return NestingMark{line_no, static_cast<int>(i) + 1};
        }
        continue;
      }
      if (ch == '[' || ch == '{') {
        flow = 1;
        if (flow + static_cast<int>(block.size()) > max_depth) {
          return NestingMark{line_no, static_cast<int>(i) + 1};
        }
        continue;
      }
      if (ch == '"' || ch == '\'') {
        quote = ch == '"' ? Quote::kDouble : Quote::kSingle;
        continue;
      }
      if (ch == '|' || ch == '>') {
        size_t j = i + 1;
        while (j < line.size() && (line[j] == '-' || line[j] == '+' || (line[j] >= '0' && line[j] <= '9'))) ++j;
        while (j < line.size() && (line[j] == ' ' || line[j] == '\t' || line[j] == '\r')) ++j;
        if (j == line.size() || line[j] == '#') {
          block_scalar_parent = indent;  // its lines are more indented than this one
          break;
        }
      }
      if (ch == ':' && next_is_space) continue;  // an empty key
      value_start = false;  // a plain scalar begins
    }
  }
  return std::nullopt;
}

}  // namespace

Result<ServeConfig> load_config_string(std::string_view text, std::string_view source_name) {
  if (text.size() > kMaxConfigBytes) {
    return invalid_argument_error("{}: {} bytes, more than the limit of {} bytes for a config", source_name,
                                  text.size(), kMaxConfigBytes);
  }
  if (const std::optional<NestingMark> deep = find_deep_nesting(text, kMaxConfigNesting)) {
    return invalid_argument_error(
        "{}:{}:{}: nested more than {} levels deep (flow brackets [ {{ and block indentation together); a "
        "sextant config needs 4",
        source_name, deep->line, deep->column, kMaxConfigNesting);
  }
  Loader loader(source_name);
  try {
    const std::vector<YAML::Node> documents = YAML::LoadAll(std::string(text));
    if (documents.size() > 1) {
      loader.errors().add(where(source_name, documents[1].Mark()), "",
                          fmt::format("expected one YAML document, found {}", documents.size()));
    } else if (documents.size() == 1) {
      loader.load_root(documents[0]);
    }
#ifdef SX_YAML_HAS_DEPTH_GUARD
  } catch (const YAML::DeepRecursion& e) {  // yaml-cpp's own bound, should the pre-scan miss a case
    loader.errors().add(where(source_name, e.mark), "",
                        fmt::format("nested too deeply for the YAML parser ({} levels)", e.depth()));
#endif
  } catch (const YAML::Exception& e) {
    loader.errors().add(where(source_name, e.mark), "", fmt::format("YAML syntax error: {}", e.msg));
  } catch (const std::exception& e) {  // nothing else should throw; never let it escape
    loader.errors().add(source_name, "", fmt::format("cannot parse: {}", e.what()));
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
