// tokenizer.json / tokenizer_config.json from TokenizerData.
#include "runtime/tokenizer/hf_json_writer.h"

#include <nlohmann/json.hpp>

#include "runtime/tokenizer/pretokenizer.h"

namespace sx::tokenizer {

namespace {

using nlohmann::ordered_json;

std::int32_t type_at(const TokenizerData& d, std::size_t id) {
  return d.token_types.empty() ? kTokenNormal : d.token_types[id];
}

}  // namespace

Result<std::string> tokenizer_json_from_data(const TokenizerData& d) {
  std::string pattern = d.pre_regex;
  if (pattern.empty()) {
    pattern = std::string(pre_tokenizer_pattern(d.pre));
    if (pattern.empty()) {
      return unimplemented_error("tokenizer: pre-tokenizer '{}' cannot be written to tokenizer.json (supported: {})",
                                 d.pre, known_pre_tokenizers());
    }
  }
  ordered_json root;
  root["version"] = "1.0";
  root["truncation"] = nullptr;
  root["padding"] = nullptr;
  ordered_json added = ordered_json::array();
  for (std::size_t id = 0; id < d.tokens.size(); ++id) {
    const std::int32_t t = type_at(d, id);
    if (t != kTokenControl && t != kTokenUserDefined) continue;
    AddedTokenOptions o;
    o.normalized = t != kTokenControl;  // from_hf_json's default
    for (const AddedTokenOptions& a : d.added_token_options) {
      if (a.id == static_cast<std::int32_t>(id)) o = a;
    }
    added.push_back({{"id", id},
                     {"content", d.tokens[id]},
                     {"single_word", o.single_word},
                     {"lstrip", o.lstrip},
                     {"rstrip", o.rstrip},
                     {"normalized", o.normalized},
                     {"special", t == kTokenControl}});
  }
  root["added_tokens"] = std::move(added);
  root["normalizer"] = d.normalize_nfc ? ordered_json{{"type", "NFC"}} : ordered_json(nullptr);
  root["pre_tokenizer"] = {
      {"type", "Sequence"},
      {"pretokenizers",
       {{{"type", "Split"}, {"pattern", {{"Regex", pattern}}}, {"behavior", "Isolated"}, {"invert", false}},
        {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", false}, {"use_regex", false}}}}};
  root["post_processor"] = nullptr;
  root["decoder"] = {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", false}, {"use_regex", false}};
  ordered_json vocab = ordered_json::object();
  for (std::size_t id = 0; id < d.tokens.size(); ++id) {
    const std::int32_t t = type_at(d, id);
    if (t == kTokenNormal || t == kTokenByte || t == kTokenUnknown) vocab[d.tokens[id]] = id;
  }
  root["model"] = {{"type", "BPE"},
                   {"dropout", nullptr},
                   {"unk_token", nullptr},
                   {"continuing_subword_prefix", ""},
                   {"end_of_word_suffix", ""},
                   {"fuse_unk", false},
                   {"byte_fallback", false},
                   {"ignore_merges", d.ignore_merges},
                   {"vocab", std::move(vocab)},
                   {"merges", d.merges}};
  return root.dump(2);
}

std::string tokenizer_config_json_from_data(const TokenizerData& d) {
  ordered_json cfg;
  auto token = [&](const std::optional<std::int32_t>& id) -> ordered_json {
    if (!id || *id < 0 || static_cast<std::size_t>(*id) >= d.tokens.size()) return nullptr;
    return d.tokens[static_cast<std::size_t>(*id)];
  };
  cfg["add_bos_token"] = d.add_bos;
  cfg["bos_token"] = token(d.bos_id);
  cfg["eos_token"] = token(d.eos_id);
  cfg["pad_token"] = token(d.pad_id);
  if (!d.chat_template.empty()) cfg["chat_template"] = d.chat_template;
  cfg["tokenizer_class"] = "Qwen2Tokenizer";
  return cfg.dump(2);
}

}  // namespace sx::tokenizer
