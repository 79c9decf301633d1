// Tokenizer::from_hf_json: reads a Hugging Face tokenizer.json (and tokenizer_config.json beside
// it) into TokenizerData. nlohmann exceptions are caught here and turned into Status values that
// name the file and the field.
#include <algorithm>
#include <filesystem>
#include <system_error>

#include <nlohmann/json.hpp>

#include "runtime/base/json_parse.h"
#include "runtime/base/json_depth.h"
#include "runtime/base/mapped_file.h"
#include "runtime/tokenizer/pretokenizer.h"
#include "runtime/base/regular_file.h"
#include "runtime/tokenizer/tokenizer.h"

namespace sx::tokenizer {
namespace {

using nlohmann::json;

Result<json> read_json(const std::string& path) {
  SX_ASSIGN_OR_RETURN(std::unique_ptr<MappedFile> file, MappedFile::open(path));
  const auto bytes = file->bytes();
  if (json_nesting_depth({reinterpret_cast<const char*>(bytes.data()), bytes.size()}) > kMaxJsonDepth) {
    return invalid_argument_error("{}: nests JSON arrays/objects more than {} levels deep", path, kMaxJsonDepth);
  }
  JsonParse parsed = parse_json({reinterpret_cast<const char*>(bytes.data()), bytes.size()});
  if (!parsed.ok()) return invalid_argument_error("{}: invalid JSON: {}", path, parsed.error);
  return std::move(parsed.value);
}

// The two big members of tokenizer.json, read straight into vectors (no DOM for them).
struct BigMembers {
  bool has_vocab = false;
  bool has_merges = false;
  std::vector<std::pair<std::string, std::int64_t>> vocab;  // model.vocab in file order
  std::vector<std::string> merges;                          // model.merges as "left right"
  std::string error;                                        // first content error, with its field
};

// SAX handler: builds a DOM of everything except model.vocab and model.merges, whose contents go
// into BigMembers (the DOM keeps empty placeholders). 3-4x faster than a full DOM for Qwen's
// 7 MB tokenizer.json, most of which is those two members.
class TokenizerJsonSax : public nlohmann::json_sax<json> {
 public:
  explicit TokenizerJsonSax(BigMembers& big) : big_(big) {}

  json root;
  std::string parse_error_text;

  bool null() override { return value(json(nullptr)); }
  bool boolean(bool v) override { return value(json(v)); }
  bool number_integer(number_integer_t v) override {
    if (mode_ == Mode::kVocab) return vocab_id(v);
    return value(json(v));
  }
  bool number_unsigned(number_unsigned_t v) override {
    if (mode_ == Mode::kVocab) return vocab_id(v > static_cast<number_unsigned_t>(INT64_MAX) ? -1 : static_cast<std::int64_t>(v));
    return value(json(v));
  }
  bool number_float(number_float_t v, const string_t&) override { return value(json(v)); }
  bool string(string_t& v) override {
    if (mode_ == Mode::kMerges) {
      big_.merges.push_back(std::move(v));
      return true;
    }
    if (mode_ == Mode::kMergePair) {
      pair_.push_back(std::move(v));
      return true;
    }
    return value(json(std::move(v)));
  }
  bool binary(binary_t&) override { return fail("unexpected binary value"); }
  bool key(string_t& k) override {
    key_ = std::move(k);
    return true;
  }
  bool start_object(std::size_t) override {
    if (mode_ == Mode::kNone && at_model_member("vocab")) {
      big_.has_vocab = true;
      value(json::object());  // placeholder, so the DOM still shows the member
      mode_ = Mode::kVocab;
      return true;
    }
    return open(json::object());
  }
  bool end_object() override {
    if (mode_ == Mode::kVocab) {
      mode_ = Mode::kNone;
      return true;
    }
    return close();
  }
  bool start_array(std::size_t) override {
    if (mode_ == Mode::kNone && at_model_member("merges")) {
      big_.has_merges = true;
      value(json::array());
      mode_ = Mode::kMerges;
      return true;
    }
    if (mode_ == Mode::kMerges) {
      mode_ = Mode::kMergePair;
      pair_.clear();
      return true;
    }
    return open(json::array());
  }
  bool end_array() override {
    if (mode_ == Mode::kMergePair) {
      if (pair_.size() != 2) return merge_error();
      big_.merges.push_back(pair_[0] + " " + pair_[1]);
      mode_ = Mode::kMerges;
      return true;
    }
    if (mode_ == Mode::kMerges) {
      mode_ = Mode::kNone;
      return true;
    }
    return close();
  }
  bool parse_error(std::size_t, const std::string&, const nlohmann::detail::exception& ex) override {
    parse_error_text = ex.what();
    return false;
  }

 private:
  enum class Mode { kNone, kVocab, kMerges, kMergePair };

  bool fail(std::string message) {
    if (big_.error.empty()) big_.error = std::move(message);
    return false;
  }
  bool vocab_id(std::int64_t id) {
    big_.vocab.emplace_back(std::move(key_), id);
    return true;
  }
  bool merge_error() {
    return fail(fmt::format("field 'model.merges[{}]': expected \"left right\" or [\"left\", \"right\"]",
                            big_.merges.size()));
  }
  // True when the next value is root["model"][name].
  bool at_model_member(std::string_view name) const {
    return stack_.size() == 2 && key_ == name && stack_[0]->is_object() && stack_[1] == model_;
  }
  // Adds a scalar (or an empty placeholder container) to the current container.
  bool value(json v) {
    if (mode_ == Mode::kVocab) return fail(fmt::format("field 'model.vocab': token '{}' has id {}, expected an integer", key_, v.dump()));
    if (mode_ == Mode::kMerges || mode_ == Mode::kMergePair) return merge_error();
    if (stack_.empty()) {
      root = std::move(v);
      return true;
    }
    insert(std::move(v));
    return true;
  }
  json* insert(json v) {
    json& parent = *stack_.back();
    if (parent.is_object()) {
      json& slot = parent[key_];
      slot = std::move(v);
      return &slot;
    }
    parent.push_back(std::move(v));
    return &parent.back();
  }
  bool open(json container) {
    if (mode_ == Mode::kVocab) return fail(fmt::format("field 'model.vocab': token '{}' has a non-integer id", key_));
    if (mode_ == Mode::kMerges || mode_ == Mode::kMergePair) return merge_error();
    json* p;
    if (stack_.empty()) {
      root = std::move(container);
      p = &root;
    } else {
      const bool is_model = stack_.size() == 1 && stack_[0]->is_object() && key_ == "model";
      p = insert(std::move(container));
      if (is_model) model_ = p;
    }
    stack_.push_back(p);
    return true;
  }
  bool close() {
    stack_.pop_back();
    return true;
  }

  BigMembers& big_;
  std::vector<json*> stack_;  // open containers; pointers stay valid while they are open
  json* model_ = nullptr;
  std::string key_;
  Mode mode_ = Mode::kNone;
  std::vector<std::string> pair_;
};

Result<json> read_tokenizer_json(const std::string& path, BigMembers& big) {
  SX_ASSIGN_OR_RETURN(std::unique_ptr<MappedFile> file, MappedFile::open(path));
  const auto bytes = file->bytes();
  if (json_nesting_depth({reinterpret_cast<const char*>(bytes.data()), bytes.size()}) > kMaxJsonDepth) {
    return invalid_argument_error("{}: nests JSON arrays/objects more than {} levels deep", path, kMaxJsonDepth);
  }
  TokenizerJsonSax sax(big);
  bool ok;
  try {
    ok = json::sax_parse(bytes.begin(), bytes.end(), &sax);
  } catch (const json::exception& e) {
    return invalid_argument_error("{}: invalid JSON: {}", path, e.what());
  }
  if (!big.error.empty()) return invalid_argument_error("{}: {}", path, big.error);
  if (!ok) return invalid_argument_error("{}: invalid JSON: {}", path, sax.parse_error_text);
  return std::move(sax.root);
}

// Error helper: "<file>: field '<field>': <message>".
template <typename... Args>
Status field_error(const std::string& file, std::string_view field, fmt::format_string<Args...> f, Args&&... args) {
  return invalid_argument_error("{}: field '{}': {}", file, field, fmt::format(f, std::forward<Args>(args)...));
}

const json* member(const json& obj, const char* key) {
  if (!obj.is_object()) return nullptr;
  auto it = obj.find(key);
  return it == obj.end() ? nullptr : &*it;
}

bool is_null_or_missing(const json* v) { return v == nullptr || v->is_null(); }

Result<bool> get_bool(const std::string& file, const json& obj, const char* key, std::string_view field, bool dflt) {
  const json* v = member(obj, key);
  if (is_null_or_missing(v)) return dflt;
  if (!v->is_boolean()) return field_error(file, field, "expected true or false, got {}", v->dump());
  return v->get<bool>();
}

std::string type_of(const json& obj) {
  const json* t = member(obj, "type");
  return t != nullptr && t->is_string() ? t->get<std::string>() : std::string("<no type>");
}

// normalizer: null, NFC, or a Sequence of NFC.
Result<bool> parse_normalizer(const std::string& file, const json* n) {
  if (is_null_or_missing(n)) return false;
  const std::string type = type_of(*n);
  if (type == "NFC") return true;
  if (type == "Sequence") {
    const json* list = member(*n, "normalizers");
    if (list == nullptr || !list->is_array()) return field_error(file, "normalizer.normalizers", "expected an array");
    bool nfc = false;
    for (const json& item : *list) {
      SX_ASSIGN_OR_RETURN(bool item_nfc, parse_normalizer(file, &item));
      nfc = nfc || item_nfc;
    }
    return nfc;
  }
  return unimplemented_error("{}: normalizer type '{}' is not supported (supported: NFC)", file, type);
}

Status check_byte_level(const std::string& file, const json& bl, std::string_view field) {
  SX_ASSIGN_OR_RETURN(bool prefix, get_bool(file, bl, "add_prefix_space", field, false));
  if (prefix) return unimplemented_error("{}: {}.add_prefix_space = true is not supported", file, field);
  return ok_status();
}

// pre_tokenizer -> the Oniguruma split pattern.
Result<std::string> parse_pre_tokenizer(const std::string& file, const json* p) {
  if (is_null_or_missing(p)) return unimplemented_error("{}: a tokenizer without pre_tokenizer is not supported", file);
  const std::string type = type_of(*p);
  if (type == "ByteLevel") {
    SX_RETURN_IF_ERROR(check_byte_level(file, *p, "pre_tokenizer"));
    SX_ASSIGN_OR_RETURN(bool use_regex, get_bool(file, *p, "use_regex", "pre_tokenizer.use_regex", true));
    if (!use_regex) return unimplemented_error("{}: ByteLevel pre-tokenizer without regex is not supported", file);
    return std::string(kGpt2Pattern);
  }
  if (type != "Sequence") {
    return unimplemented_error("{}: pre_tokenizer type '{}' is not supported (supported: Sequence[Split, ByteLevel], ByteLevel)",
                               file, type);
  }
  const json* list = member(*p, "pretokenizers");
  if (list == nullptr || !list->is_array()) return field_error(file, "pre_tokenizer.pretokenizers", "expected an array");
  std::string pattern;
  bool byte_level = false;
  for (std::size_t i = 0; i < list->size(); ++i) {
    const json& item = (*list)[i];
    const std::string field = fmt::format("pre_tokenizer.pretokenizers[{}]", i);
    const std::string item_type = type_of(item);
    if (item_type == "Split" && pattern.empty() && !byte_level) {
      const json* pat = member(item, "pattern");
      const json* regex = pat != nullptr ? member(*pat, "Regex") : nullptr;
      if (regex == nullptr || !regex->is_string()) {
        return unimplemented_error("{}: {}.pattern must be {{\"Regex\": ...}} (string patterns are not supported)", file, field);
      }
      pattern = regex->get<std::string>();
      const json* behavior = member(item, "behavior");
      if (behavior == nullptr || !behavior->is_string() || behavior->get<std::string>() != "Isolated") {
        return unimplemented_error("{}: {}.behavior must be \"Isolated\"", file, field);
      }
      SX_ASSIGN_OR_RETURN(bool invert, get_bool(file, item, "invert", field + ".invert", false));
      if (invert) return unimplemented_error("{}: {}.invert = true is not supported", file, field);
    } else if (item_type == "ByteLevel" && !pattern.empty() && !byte_level) {
      SX_RETURN_IF_ERROR(check_byte_level(file, item, field));
      SX_ASSIGN_OR_RETURN(bool use_regex, get_bool(file, item, "use_regex", field + ".use_regex", true));
      if (use_regex) return unimplemented_error("{}: {}.use_regex = true after a Split is not supported", file, field);
      byte_level = true;
    } else {
      return unimplemented_error("{}: {} of type '{}' is not supported here (supported: Split then ByteLevel)", file,
                                 field, item_type);
    }
  }
  if (pattern.empty() || !byte_level) {
    return unimplemented_error("{}: pre_tokenizer must be a Split followed by a ByteLevel", file);
  }
  return pattern;
}

// Token text of a config entry: "text", {"content": "text"}, or null/absent (-> "").
Result<std::string> config_token(const std::string& file, const json& cfg, const char* key) {
  const json* v = member(cfg, key);
  if (is_null_or_missing(v)) return std::string();
  if (v->is_string()) return v->get<std::string>();
  const json* content = member(*v, "content");
  if (content != nullptr && content->is_string()) return content->get<std::string>();
  return field_error(file, key, "expected a string or an object with \"content\", got {}", v->dump());
}

Status apply_config(const std::string& file, const json& cfg, TokenizerData& data) {
  if (!cfg.is_object()) return invalid_argument_error("{}: expected a JSON object at the top level", file);
  auto find_id = [&](const std::string& text) -> std::optional<std::int32_t> {
    for (std::size_t i = 0; i < data.tokens.size(); ++i) {
      if (data.tokens[i] == text) return static_cast<std::int32_t>(i);
    }
    return std::nullopt;
  };
  struct Slot {
    const char* key;
    std::optional<std::int32_t>* id;
  };
  for (Slot slot : {Slot{"eos_token", &data.eos_id}, Slot{"bos_token", &data.bos_id}, Slot{"pad_token", &data.pad_id}}) {
    SX_ASSIGN_OR_RETURN(const std::string text, config_token(file, cfg, slot.key));
    if (text.empty()) continue;
    const auto id = find_id(text);
    if (!id) return field_error(file, slot.key, "'{}' is not a token of the tokenizer", text);
    *slot.id = *id;
  }
  SX_ASSIGN_OR_RETURN(data.add_bos, get_bool(file, cfg, "add_bos_token", "add_bos_token", false));
  if (const json* t = member(cfg, "chat_template"); !is_null_or_missing(t)) {
    if (t->is_string()) {
      data.chat_template = t->get<std::string>();
    } else if (t->is_array()) {  // [{"name": ..., "template": ...}]: take "default", else the first
      for (const json& item : *t) {
        const json* name = member(item, "name");
        const json* tmpl = member(item, "template");
        if (tmpl == nullptr || !tmpl->is_string()) return field_error(file, "chat_template", "entry without \"template\"");
        if (data.chat_template.empty() || (name != nullptr && name->is_string() && name->get<std::string>() == "default")) {
          data.chat_template = tmpl->get<std::string>();
        }
      }
    } else {
      return field_error(file, "chat_template", "expected a string or a list of named templates");
    }
  }
  return ok_status();
}

Result<TokenizerData> parse_tokenizer_json(const std::string& file, const json& root, BigMembers& big) {
  if (!root.is_object()) return invalid_argument_error("{}: expected a JSON object at the top level", file);
  TokenizerData data;

  const json* model = member(root, "model");
  if (model == nullptr || !model->is_object()) return field_error(file, "model", "missing or not an object");
  if (const json* t = member(*model, "type"); t != nullptr && (!t->is_string() || t->get<std::string>() != "BPE")) {
    return unimplemented_error("{}: model.type {} is not supported (only BPE)", file, t->dump());
  }
  if (const json* d = member(*model, "dropout"); !is_null_or_missing(d) && !(d->is_number() && d->get<double>() == 0.0)) {
    return unimplemented_error("{}: model.dropout {} is not supported", file, d->dump());
  }
  for (const char* key : {"continuing_subword_prefix", "end_of_word_suffix"}) {
    const json* v = member(*model, key);
    if (!is_null_or_missing(v) && !(v->is_string() && v->get<std::string>().empty())) {
      return unimplemented_error("{}: model.{} {} is not supported", file, key, v->dump());
    }
  }
  SX_ASSIGN_OR_RETURN(bool byte_fallback, get_bool(file, *model, "byte_fallback", "model.byte_fallback", false));
  if (byte_fallback) return unimplemented_error("{}: model.byte_fallback = true is not supported", file);
  SX_ASSIGN_OR_RETURN(data.ignore_merges, get_bool(file, *model, "ignore_merges", "model.ignore_merges", false));

  if (!big.has_vocab) {
    const json* v = member(*model, "vocab");
    return field_error(file, "model.vocab", "{}", v == nullptr ? "missing" : "expected an object of token -> id");
  }
  if (!big.has_merges) {
    const json* m = member(*model, "merges");
    return field_error(file, "model.merges", "{}", m == nullptr ? "missing" : "expected an array");
  }
  const json* added = member(root, "added_tokens");
  if (added != nullptr && !added->is_null() && !added->is_array()) {
    return field_error(file, "added_tokens", "expected an array");
  }

  // Size of the id space.
  std::int64_t max_id = -1;
  for (const auto& [token, id] : big.vocab) {
    if (id < 0 || id > INT32_MAX - 1) {
      return field_error(file, "model.vocab", "token '{}' has id {}, expected an integer in [0, 2^31-1)", token, id);
    }
    max_id = std::max(max_id, id);
  }
  if (added != nullptr && added->is_array()) {
    for (std::size_t i = 0; i < added->size(); ++i) {
      const json* id = member((*added)[i], "id");
      const json* content = member((*added)[i], "content");
      if (id == nullptr || !id->is_number_integer() || id->get<std::int64_t>() < 0 || id->get<std::int64_t>() > INT32_MAX - 1) {
        return field_error(file, fmt::format("added_tokens[{}].id", i), "missing or not a valid id");
      }
      if (content == nullptr || !content->is_string()) {
        return field_error(file, fmt::format("added_tokens[{}].content", i), "missing or not a string");
      }
      max_id = std::max(max_id, id->get<std::int64_t>());
    }
  }
  const auto n = static_cast<std::size_t>(max_id + 1);
  data.tokens.resize(n);
  data.token_types.assign(n, kTokenUnused);  // holes in the id space stay unused

  for (auto& [token, id64] : big.vocab) {
    const auto id = static_cast<std::size_t>(id64);
    if (data.token_types[id] != kTokenUnused) {
      return field_error(file, "model.vocab", "id {} is used by both '{}' and '{}'", id, data.tokens[id], token);
    }
    data.tokens[id] = std::move(token);
    data.token_types[id] = kTokenNormal;
  }
  big.vocab = {};
  if (added != nullptr && added->is_array()) {
    for (std::size_t i = 0; i < added->size(); ++i) {
      const json& t = (*added)[i];
      const std::string field = fmt::format("added_tokens[{}]", i);
      const auto id = static_cast<std::int32_t>(t["id"].get<std::int64_t>());
      std::string content = t["content"].get<std::string>();
      const auto uid = static_cast<std::size_t>(id);
      if (data.token_types[uid] == kTokenNormal && data.tokens[uid] != content) {
        return field_error(file, field, "id {} is '{}' in model.vocab but '{}' here", id, data.tokens[uid], content);
      }
      if (data.token_types[uid] == kTokenControl || data.token_types[uid] == kTokenUserDefined) {
        return field_error(file, field, "id {} is listed twice", id);
      }
      AddedTokenOptions o;
      o.id = id;
      SX_ASSIGN_OR_RETURN(bool special, get_bool(file, t, "special", field + ".special", false));
      SX_ASSIGN_OR_RETURN(o.single_word, get_bool(file, t, "single_word", field + ".single_word", false));
      SX_ASSIGN_OR_RETURN(o.lstrip, get_bool(file, t, "lstrip", field + ".lstrip", false));
      SX_ASSIGN_OR_RETURN(o.rstrip, get_bool(file, t, "rstrip", field + ".rstrip", false));
      SX_ASSIGN_OR_RETURN(o.normalized, get_bool(file, t, "normalized", field + ".normalized", !special));
      data.tokens[uid] = std::move(content);
      data.token_types[uid] = special ? kTokenControl : kTokenUserDefined;
      data.added_token_options.push_back(o);
    }
  }

  data.merges = std::move(big.merges);

  SX_ASSIGN_OR_RETURN(data.normalize_nfc, parse_normalizer(file, member(root, "normalizer")));
  SX_ASSIGN_OR_RETURN(data.pre_regex, parse_pre_tokenizer(file, member(root, "pre_tokenizer")));
  // A known pattern keeps its GGUF name (a GGUF written from this tokenizer names it as llama.cpp does).
  const std::string_view name = pre_tokenizer_name(data.pre_regex);
  data.pre = name.empty() ? "tokenizer.json" : std::string(name);
  if (const json* dec = member(root, "decoder"); !is_null_or_missing(dec) && type_of(*dec) != "ByteLevel") {
    return unimplemented_error("{}: decoder type '{}' is not supported (supported: ByteLevel)", file, type_of(*dec));
  }
  return data;
}

}  // namespace

Result<std::unique_ptr<Tokenizer>> Tokenizer::from_hf_json(const std::string& tokenizer_json_path) {
  BigMembers big;
  SX_ASSIGN_OR_RETURN(json root, read_tokenizer_json(tokenizer_json_path, big));
  Result<TokenizerData> parsed = [&]() -> Result<TokenizerData> {
    try {
      return parse_tokenizer_json(tokenizer_json_path, root, big);
    } catch (const json::exception& e) {  // a type mismatch the checks above did not foresee
      return invalid_argument_error("{}: unexpected JSON content: {}", tokenizer_json_path, e.what());
    }
  }();
  if (!parsed.ok()) return parsed.status();
  TokenizerData data = std::move(parsed).value();
  root = json();  // free the DOM before building the tables

  const std::filesystem::path config_path =
      std::filesystem::path(tokenizer_json_path).parent_path() / "tokenizer_config.json";
  std::error_code ec;
  if (std::filesystem::exists(config_path, ec)) {
    SX_ASSIGN_OR_RETURN(json cfg, read_json(config_path.string()));
    try {
      SX_RETURN_IF_ERROR(apply_config(config_path.string(), cfg, data));
    } catch (const json::exception& e) {
      return invalid_argument_error("{}: unexpected JSON content: {}", config_path.string(), e.what());
    }
  }
  // transformers (4.43 and later) saves the template as chat_template.jinja beside it, which wins.
  const std::filesystem::path jinja_path = std::filesystem::path(tokenizer_json_path).parent_path() / "chat_template.jinja";
  if (std::filesystem::exists(jinja_path, ec)) {
    SX_ASSIGN_OR_RETURN(data.chat_template, read_regular_file(jinja_path.string(), std::uint64_t{1} << 20));
  }
  auto tok = from_data(std::move(data));
  if (!tok.ok()) return tok.status().with_context(tokenizer_json_path);
  return tok;
}

}  // namespace sx::tokenizer
