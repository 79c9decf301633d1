// Replay driver for the fuzz targets when they are not built with libFuzzer (the ordinary gcc
// build): runs LLVMFuzzerTestOneInput on every seed, then on deterministic pseudo-random mutations
// of them (bit flips, interesting integers, insertions, deletions, truncation, dictionary tokens,
// splices). A broken invariant aborts, so the meson test fails; under -Db_sanitize=address the
// sanitizers see every input too. Each input is passed in a heap block of exactly its size so an
// over-read is caught by AddressSanitizer. A target's LLVMFuzzerInitialize, when it has one, runs
// first, as under libFuzzer.
//
//   replay [--iterations N] [--seed S] [--dict FILE] [--max-len BYTES] [--memory-limit-mb MB]
//          [--save-last FILE] FILE_OR_DIR...
//
// --memory-limit-mb (default 2048, 0 = none) caps the address space (RLIMIT_AS), as libFuzzer's
// -rss_limit_mb caps memory, so an input that makes a parser allocate without bound fails this
// process (std::bad_alloc) instead of starving the machine. Under AddressSanitizer, whose shadow
// memory needs terabytes of address space, the cap is ASan's hard_rss_limit_mb instead (4096 by
// default; ASAN_OPTIONS overrides it). --save-last FILE writes each input to FILE before running
// it, so the input that killed the process (a crash, a hang, a signal) is there afterwards.
//
// Exit status: 0 after all inputs ran; 2 for a usage error (no seeds, unreadable file).
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include <sys/resource.h>

#if defined(__SANITIZE_ADDRESS__)
#define SX_REPLAY_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define SX_REPLAY_ASAN 1
#endif
#endif

#ifdef SX_REPLAY_ASAN
extern "C" const char* __asan_default_options() { return "hard_rss_limit_mb=4096"; }
#endif

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size);
// Optional in a target (libFuzzer declares it weak too): null when the target does not define it.
extern "C" __attribute__((weak)) int LLVMFuzzerInitialize(int* argc, char*** argv);

namespace {

using Bytes = std::vector<std::uint8_t>;

struct Rng {  // splitmix64: deterministic across platforms and standard libraries
  std::uint64_t s;
  std::uint64_t next() {
    std::uint64_t z = (s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }
  std::size_t below(std::size_t n) { return n == 0 ? 0 : static_cast<std::size_t>(next() % n); }
};

bool read_file(const std::filesystem::path& p, Bytes& out) {
  std::ifstream in(p, std::ios::binary);
  if (!in) return false;
  out.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  return true;
}

// libFuzzer dictionary: lines `name="value"` or `"value"`, with \\, \" and \xNN escapes.
std::vector<Bytes> read_dict(const std::string& path) {
  std::vector<Bytes> out;
  std::ifstream in(path);
  std::string line;
  while (std::getline(in, line)) {
    const std::size_t q = line.find('"');
    const std::size_t e = line.rfind('"');
    if (line.empty() || line[0] == '#' || q == std::string::npos || e <= q) continue;
    Bytes tok;
    for (std::size_t i = q + 1; i < e; ++i) {
      if (line[i] == '\\' && i + 1 < e) {
        if (line[i + 1] == 'x' && i + 3 < e) {
          tok.push_back(static_cast<std::uint8_t>(std::strtoul(line.substr(i + 2, 2).c_str(), nullptr, 16)));
          i += 3;
        } else {
          tok.push_back(static_cast<std::uint8_t>(line[++i]));
        }
      } else {
        tok.push_back(static_cast<std::uint8_t>(line[i]));
      }
    }
    if (!tok.empty()) out.push_back(std::move(tok));
  }
  return out;
}

std::string save_last_path;  // --save-last

void run_one(const Bytes& input) {
  if (!save_last_path.empty()) {
    std::ofstream out(save_last_path, std::ios::binary | std::ios::trunc);
    out.write(reinterpret_cast<const char*>(input.data()), static_cast<std::streamsize>(input.size()));
  }
  // Exactly-sized heap copy: reading one byte past the end is an ASan error, as under libFuzzer.
  std::unique_ptr<std::uint8_t[]> buf(new std::uint8_t[std::max<std::size_t>(input.size(), 1)]);
  if (!input.empty()) std::memcpy(buf.get(), input.data(), input.size());
  LLVMFuzzerTestOneInput(input.empty() ? nullptr : buf.get(), input.size());
}

void put_le(Bytes& b, std::size_t at, std::uint64_t v, std::size_t width) {
  for (std::size_t i = 0; i < width && at + i < b.size(); ++i) b[at + i] = static_cast<std::uint8_t>(v >> (8 * i));
}

std::uint64_t get_le(const Bytes& b, std::size_t at, std::size_t width) {
  std::uint64_t v = 0;
  for (std::size_t i = 0; i < width && at + i < b.size(); ++i) v |= std::uint64_t{b[at + i]} << (8 * i);
  return v;
}

void mutate(Bytes& b, Rng& rng, const std::vector<Bytes>& seeds, const std::vector<Bytes>& dict, std::size_t max_len) {
  static const std::uint64_t kInteresting[] = {0,          1,          2,          7,          8,
                                               16,         31,         32,         33,         64,
                                               127,        128,        255,        256,        4096,
                                               0x7fff,     0x8000,     0xffff,     0x10000,    0x7fffffff,
                                               0x80000000, 0xffffffff, 0x100000000, 0x7fffffffffffffffull,
                                               0x8000000000000000ull, ~0ull,    ~0ull - 1,  100000001};
  static const char* const kJsonBits[] = {"{", "}", "[", "]", ",", ":", "\"", "-1", "0", "1e400", "null", "true",
                                          "1.5", "\"\"", "\\u0000", "\\ud800", "[[[[[[[[", "18446744073709551616"};
  const std::size_t n_ops = 1 + rng.below(4);
  for (std::size_t op = 0; op < n_ops; ++op) {
    const std::size_t pos = rng.below(b.size() + 1);
    const std::size_t kind = rng.below(12);
    switch (kind) {
      case 0:  // flip one bit
        if (!b.empty()) b[rng.below(b.size())] ^= static_cast<std::uint8_t>(1u << rng.below(8));
        break;
      case 1:  // random byte
        if (!b.empty()) b[rng.below(b.size())] = static_cast<std::uint8_t>(rng.next());
        break;
      case 2: {  // interesting integer, little-endian, 1/2/4/8 bytes
        const std::size_t width = std::size_t{1} << rng.below(4);
        put_le(b, pos, kInteresting[rng.below(std::size(kInteresting))], width);
        break;
      }
      case 3: {  // add a small delta to an integer (lengths and counts)
        const std::size_t width = rng.below(2) ? 8 : 4;
        const std::size_t at = b.empty() ? 0 : rng.below(b.size());
        const std::int64_t delta = static_cast<std::int64_t>(rng.below(33)) - 16;
        put_le(b, at, get_le(b, at, width) + static_cast<std::uint64_t>(delta), width);
        break;
      }
      case 4: {  // erase a range
        if (b.empty()) break;
        const std::size_t at = rng.below(b.size());
        const std::size_t len = 1 + rng.below(std::min<std::size_t>(b.size() - at, 64));
        b.erase(b.begin() + static_cast<std::ptrdiff_t>(at), b.begin() + static_cast<std::ptrdiff_t>(at + len));
        break;
      }
      case 5: {  // insert random bytes
        const std::size_t len = 1 + rng.below(16);
        Bytes ins(len);
        for (auto& c : ins) c = static_cast<std::uint8_t>(rng.next());
        b.insert(b.begin() + static_cast<std::ptrdiff_t>(pos), ins.begin(), ins.end());
        break;
      }
      case 6: {  // duplicate a range
        if (b.empty()) break;
        const std::size_t at = rng.below(b.size());
        const std::size_t len = 1 + rng.below(std::min<std::size_t>(b.size() - at, 128));
        const Bytes chunk(b.begin() + static_cast<std::ptrdiff_t>(at), b.begin() + static_cast<std::ptrdiff_t>(at + len));
        b.insert(b.begin() + static_cast<std::ptrdiff_t>(pos), chunk.begin(), chunk.end());
        break;
      }
      case 7:  // truncate
        b.resize(rng.below(b.size() + 1));
        break;
      case 8:    // dictionary token, inserted or overwriting
      case 9: {  // JSON punctuation / edge values
        Bytes tok;
        if (kind == 8 && !dict.empty()) {
          tok = dict[rng.below(dict.size())];
        } else {
          const char* s = kJsonBits[rng.below(std::size(kJsonBits))];
          tok.assign(s, s + std::strlen(s));
        }
        if (rng.below(2) != 0 || pos + tok.size() > b.size()) {
          b.insert(b.begin() + static_cast<std::ptrdiff_t>(pos), tok.begin(), tok.end());
        } else {
          std::copy(tok.begin(), tok.end(), b.begin() + static_cast<std::ptrdiff_t>(pos));
        }
        break;
      }
      case 10: {  // splice: our prefix + another seed's suffix
        const Bytes& other = seeds[rng.below(seeds.size())];
        const std::size_t from = rng.below(other.size() + 1);
        b.resize(pos);
        b.insert(b.end(), other.begin() + static_cast<std::ptrdiff_t>(from), other.end());
        break;
      }
      default:  // a dictionary token inserted, else a bit flip
        if (!dict.empty()) {
          const Bytes& tok = dict[rng.below(dict.size())];
          b.insert(b.begin() + static_cast<std::ptrdiff_t>(pos), tok.begin(), tok.end());
        } else if (!b.empty()) {
          b[rng.below(b.size())] ^= 0x80;
        }
        break;
    }
    if (b.size() > max_len) b.resize(max_len);
  }
}

int usage() {
  std::fprintf(stderr, "usage: replay [--iterations N] [--seed S] [--dict FILE] [--max-len BYTES] [--memory-limit-mb MB] "
               "[--save-last FILE] FILE_OR_DIR...\n");
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  std::size_t iterations = 4000;
  std::uint64_t seed = 0x5e7a47;
  std::size_t max_len = 1 << 16;
  std::uint64_t memory_limit_mb = 2048;
  std::string dict_path;
  std::vector<std::filesystem::path> paths;
  for (int i = 1; i < argc; ++i) {
    const std::string_view a = argv[i];
    auto value = [&]() -> const char* { return i + 1 < argc ? argv[++i] : nullptr; };
    if (a == "--iterations" || a == "--seed" || a == "--dict" || a == "--max-len" || a == "--save-last" ||
        a == "--memory-limit-mb") {
      const char* v = value();
      if (v == nullptr) return usage();
      if (a == "--iterations") iterations = std::strtoull(v, nullptr, 10);
      if (a == "--seed") seed = std::strtoull(v, nullptr, 10);
      if (a == "--max-len") max_len = std::strtoull(v, nullptr, 10);
      if (a == "--dict") dict_path = v;
      if (a == "--save-last") save_last_path = v;
      if (a == "--memory-limit-mb") memory_limit_mb = std::strtoull(v, nullptr, 10);
    } else if (!a.empty() && a[0] == '-') {
      return usage();
    } else {
      paths.emplace_back(a);
    }
  }
  std::vector<std::filesystem::path> files;
  for (const auto& p : paths) {
    std::error_code ec;
    if (std::filesystem::is_directory(p, ec)) {
      std::vector<std::filesystem::path> in_dir;
      for (const auto& e : std::filesystem::directory_iterator(p)) {
        if (e.is_regular_file()) in_dir.push_back(e.path());
      }
      std::sort(in_dir.begin(), in_dir.end());  // deterministic order
      files.insert(files.end(), in_dir.begin(), in_dir.end());
    } else {
      files.push_back(p);
    }
  }
  std::vector<Bytes> seeds;
  for (const auto& f : files) {
    Bytes b;
    if (!read_file(f, b)) {
      std::fprintf(stderr, "replay: cannot read %s\n", f.c_str());
      return 2;
    }
    seeds.push_back(std::move(b));
  }
  if (seeds.empty()) {
    std::fprintf(stderr, "replay: no seed inputs\n");
    return usage();
  }
  const std::vector<Bytes> dict = dict_path.empty() ? std::vector<Bytes>{} : read_dict(dict_path);

#ifndef SX_REPLAY_ASAN
  rlimit limit{};
  if (memory_limit_mb != 0 && getrlimit(RLIMIT_AS, &limit) == 0) {  // only ever lowered
    limit.rlim_cur = std::min<rlim_t>(limit.rlim_cur, memory_limit_mb << 20);
    if (setrlimit(RLIMIT_AS, &limit) != 0) std::perror("replay: setrlimit(RLIMIT_AS)");
  }
#else
  (void)memory_limit_mb;
#endif
  if (LLVMFuzzerInitialize != nullptr) LLVMFuzzerInitialize(&argc, &argv);
  run_one({});
  for (const Bytes& s : seeds) run_one(s);
  Rng rng{seed};
  for (std::size_t i = 0; i < iterations; ++i) {
    Bytes b = seeds[rng.below(seeds.size())];
    mutate(b, rng, seeds, dict, max_len);
    run_one(b);
  }
  std::printf("replay: %zu seeds, %zu dictionary tokens, %zu inputs run, no finding\n", seeds.size(), dict.size(),
              1 + seeds.size() + iterations);
  return 0;
}
