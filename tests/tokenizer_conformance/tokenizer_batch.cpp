// Batch encoder for the tokenizer conformance test (conformance.py) and a small benchmark.
//
//   tokenizer_batch --tokenizer DIR/tokenizer.json [--gguf-style] < hex_lines
//     For every input line (the text, hex-encoded so raw bytes survive; empty line = empty text)
//     prints one line: ids(parse_special) TAB ids(no parse_special) TAB hex(decode(ids))
//     TAB hex(stream-decoded text), ids space-separated.
//     --gguf-style builds the tokenizer the way a GGUF converter would describe it (tokens in id
//     order, token types 1/3/4, merges, pre = "qwen2" or "qwen35") instead of from_hf_json.
//   tokenizer_batch --tokenizer PATH --bench TEXT_FILE
//     Prints load time and encode throughput (cold and warm word cache).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <ctime>
#include <fstream>
#include <iostream>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "runtime/tokenizer/pretokenizer.h"
#include "runtime/tokenizer/tokenizer.h"

namespace {

using sx::tokenizer::StreamDecoder;
using sx::tokenizer::Tokenizer;
using sx::tokenizer::TokenizerData;
using Clock = std::chrono::steady_clock;

double cpu_seconds() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + static_cast<double>(ts.tv_nsec) * 1e-9;
}

int hex_value(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

bool from_hex(const std::string& hex, std::string& out) {
  out.clear();
  if (hex.size() % 2 != 0) return false;
  for (std::size_t i = 0; i < hex.size(); i += 2) {
    const int hi = hex_value(hex[i]);
    const int lo = hex_value(hex[i + 1]);
    if (hi < 0 || lo < 0) return false;
    out.push_back(static_cast<char>(hi * 16 + lo));
  }
  return true;
}

void append_hex(std::string& out, std::string_view bytes) {
  static const char* kDigits = "0123456789abcdef";
  for (unsigned char b : bytes) {
    out.push_back(kDigits[b >> 4]);
    out.push_back(kDigits[b & 15]);
  }
}

void append_ids(std::string& out, const std::vector<std::int32_t>& ids) {
  for (std::size_t i = 0; i < ids.size(); ++i) {
    if (i) out.push_back(' ');
    out += std::to_string(ids[i]);
  }
}

// What a GGUF converter (llama.cpp convert_hf_to_gguf.py) writes for a Qwen2 tokenizer: the
// vocabulary in id order, added tokens with type CONTROL (special) or USER_DEFINED, the merges,
// and tokenizer.ggml.pre ("qwen2", "qwen35": its regex's name). No regex, no normaliser, no per-token
// HF flags.
sx::Result<std::unique_ptr<Tokenizer>> load_gguf_style(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return sx::not_found_error("{}: cannot open", path);
  std::stringstream ss;
  ss << in.rdbuf();
  nlohmann::json root;
  try {
    root = nlohmann::json::parse(ss.str());
  } catch (const nlohmann::json::exception& e) {
    return sx::invalid_argument_error("{}: {}", path, e.what());
  }
  TokenizerData d;
  std::size_t n = 0;
  for (auto& [tok, id] : root["model"]["vocab"].items()) n = std::max(n, id.get<std::size_t>() + 1);
  for (auto& t : root["added_tokens"]) n = std::max(n, t["id"].get<std::size_t>() + 1);
  d.tokens.resize(n);
  d.token_types.assign(n, sx::tokenizer::kTokenNormal);
  for (auto& [tok, id] : root["model"]["vocab"].items()) d.tokens[id.get<std::size_t>()] = tok;
  for (auto& t : root["added_tokens"]) {
    const auto id = t["id"].get<std::size_t>();
    d.tokens[id] = t["content"].get<std::string>();
    d.token_types[id] = t["special"].get<bool>() ? sx::tokenizer::kTokenControl : sx::tokenizer::kTokenUserDefined;
  }
  for (auto& m : root["model"]["merges"]) {
    d.merges.push_back(m.is_string() ? m.get<std::string>()
                                     : m[0].get<std::string>() + " " + m[1].get<std::string>());
  }
  // The pre-tokenizer by its GGUF name ("qwen2", "qwen35"), as a converter writes it.
  const nlohmann::json& pre = root["pre_tokenizer"];
  const nlohmann::json& split = pre.contains("pretokenizers") ? pre["pretokenizers"][0] : pre;
  const std::string pattern = split.contains("pattern") ? split["pattern"]["Regex"].get<std::string>() : "";
  d.pre = std::string(sx::tokenizer::pre_tokenizer_name(pattern));
  if (d.pre.empty()) return sx::unimplemented_error("{}: its pre-tokenizer regex has no GGUF name", path);
  return Tokenizer::from_data(std::move(d));
}

int run_batch(const Tokenizer& tok) {
  std::ios::sync_with_stdio(false);
  std::string line, text, out;
  while (std::getline(std::cin, line)) {
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (!from_hex(line, text)) {
      std::fprintf(stderr, "tokenizer_batch: bad hex line\n");
      return 2;
    }
    out.clear();
    const auto ids = tok.encode(text, /*parse_special=*/true);
    const auto ids_plain = tok.encode(text, /*parse_special=*/false);
    append_ids(out, ids);
    out.push_back('\t');
    append_ids(out, ids_plain);
    out.push_back('\t');
    append_hex(out, tok.decode(ids));
    out.push_back('\t');
    StreamDecoder stream(tok);
    std::string streamed;
    for (std::int32_t id : ids) streamed += stream.push(id);
    streamed += stream.flush();
    append_hex(out, streamed);
    out.push_back('\n');
    std::cout << out;
  }
  std::cout.flush();
  return 0;
}

int run_bench(const std::string& tokenizer_path, bool gguf_style, const std::string& text_path) {
  std::ifstream in(text_path, std::ios::binary);
  if (!in) {
    std::fprintf(stderr, "tokenizer_batch: cannot open %s\n", text_path.c_str());
    return 2;
  }
  std::stringstream ss;
  ss << in.rdbuf();
  const std::string text = ss.str();

  // Wall and CPU time: on a shared machine the CPU time is the steadier number.
  double best_load_ms = 1e9, best_load_cpu_ms = 1e9;
  std::unique_ptr<Tokenizer> tok;
  for (int i = 0; i < 3; ++i) {
    const auto t0 = Clock::now();
    const double c0 = cpu_seconds();
    auto t = gguf_style ? load_gguf_style(tokenizer_path) : Tokenizer::from_hf_json(tokenizer_path);
    const double c1 = cpu_seconds();
    const auto t1 = Clock::now();
    if (!t.ok()) {
      std::fprintf(stderr, "tokenizer_batch: %s\n", t.status().to_string().c_str());
      return 1;
    }
    best_load_ms = std::min(best_load_ms, std::chrono::duration<double, std::milli>(t1 - t0).count());
    best_load_cpu_ms = std::min(best_load_cpu_ms, (c1 - c0) * 1e3);
    tok = std::move(t).value();
  }
  const double mb = static_cast<double>(text.size()) / 1e6;
  auto t0 = Clock::now();
  double c0 = cpu_seconds();
  std::vector<std::int32_t> ids = tok->encode(text);
  const double cold_s = std::chrono::duration<double>(Clock::now() - t0).count();
  const double cold_cpu = cpu_seconds() - c0;
  int reps = 0;
  t0 = Clock::now();
  c0 = cpu_seconds();
  double warm_s = 0;
  while (warm_s < 2.0) {
    ids = tok->encode(text);
    ++reps;
    warm_s = std::chrono::duration<double>(Clock::now() - t0).count();
  }
  const double warm_cpu = cpu_seconds() - c0;
  std::printf("load (%s): %.0f ms wall, %.0f ms cpu (best of 3)\n", gguf_style ? "gguf-style data" : "tokenizer.json",
              best_load_ms, best_load_cpu_ms);
  std::printf("encode: %.2f MB, %zu tokens (%.2f bytes/token)\n", mb, ids.size(),
              static_cast<double>(text.size()) / static_cast<double>(ids.size()));
  std::printf("encode speed: first pass %.1f MB/s wall (%.1f MB/s cpu), repeated %.1f MB/s wall (%.1f MB/s cpu, %d reps)\n",
              mb / cold_s, mb / cold_cpu, mb * reps / warm_s, mb * reps / warm_cpu, reps);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  std::string tokenizer_path, bench_path;
  bool gguf_style = false;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--tokenizer" && i + 1 < argc) {
      tokenizer_path = argv[++i];
    } else if (a == "--bench" && i + 1 < argc) {
      bench_path = argv[++i];
    } else if (a == "--gguf-style") {
      gguf_style = true;
    } else {
      std::fprintf(stderr, "usage: %s --tokenizer tokenizer.json [--gguf-style] [--bench text_file]\n", argv[0]);
      return 2;
    }
  }
  if (tokenizer_path.empty()) {
    std::fprintf(stderr, "tokenizer_batch: --tokenizer is required\n");
    return 2;
  }
  if (!bench_path.empty()) return run_bench(tokenizer_path, gguf_style, bench_path);
  auto tok = gguf_style ? load_gguf_style(tokenizer_path) : Tokenizer::from_hf_json(tokenizer_path);
  if (!tok.ok()) {
    std::fprintf(stderr, "tokenizer_batch: %s\n", tok.status().to_string().c_str());
    return 1;
  }
  return run_batch(**tok);
}
