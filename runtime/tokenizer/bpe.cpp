// Byte-level BPE: merge table (open addressing over id pairs), the priority-queue merge loop and a
// sharded word cache.
#include "runtime/tokenizer/bpe.h"

#include <algorithm>
#include <array>
#include <cstring>
#include <mutex>
#include <queue>
#include <unordered_map>

#include "runtime/tokenizer/byte_level.h"
#include "runtime/tokenizer/token_index.h"

namespace sx::tokenizer {
namespace {

struct MergeRule {
  std::int32_t rank;
  std::int32_t new_id;
};

// Open-addressing hash map (linear probing) from an (left id, right id) pair to its merge rule.
// Key and rule share one 16-byte slot, so a probe usually costs one cache miss.
class MergeTable {
 public:
  void reserve(std::size_t n) {
    std::size_t cap = 16;
    while (cap < n * 2) cap <<= 1;
    slots_.assign(cap, Slot{kEmpty, MergeRule{0, 0}});
    mask_ = cap - 1;
  }
  // Later duplicates replace earlier ones (HF builds its merge map the same way).
  void insert(std::int32_t a, std::int32_t b, MergeRule rule) {
    const std::uint64_t key = pack(a, b);
    std::size_t i = hash(key) & mask_;
    while (slots_[i].key != kEmpty && slots_[i].key != key) i = (i + 1) & mask_;
    if (slots_[i].key == kEmpty) ++size_;
    slots_[i] = Slot{key, rule};
  }
  const MergeRule* find(std::int32_t a, std::int32_t b) const {
    const std::uint64_t key = pack(a, b);
    std::size_t i = hash(key) & mask_;
    while (true) {
      const Slot& s = slots_[i];
      if (s.key == key) return &s.rule;
      if (s.key == kEmpty) return nullptr;
      i = (i + 1) & mask_;
    }
  }
  std::size_t size() const { return size_; }

 private:
  static constexpr std::uint64_t kEmpty = ~std::uint64_t{0};
  struct Slot {
    std::uint64_t key;
    MergeRule rule;
  };
  static std::uint64_t pack(std::int32_t a, std::int32_t b) {
    return (std::uint64_t(std::uint32_t(a)) << 32) | std::uint32_t(b);
  }
  static std::size_t hash(std::uint64_t k) {
    k ^= k >> 33;
    k *= 0xff51afd7ed558ccdull;
    k ^= k >> 33;
    return static_cast<std::size_t>(k);
  }
  std::vector<Slot> slots_;
  std::size_t mask_ = 0;
  std::size_t size_ = 0;
};

// Word cache: direct-mapped, one 64-byte line per slot (word bytes and ids inline, no
// allocation), guarded by striped mutexes so that concurrent encode() calls stay safe. Words
// longer than kMaxWordBytes or with more than kMaxIds tokens are not cached (they are rare).
class WordCache {
 public:
  static constexpr std::size_t kMaxWordBytes = 22;
  static constexpr std::size_t kMaxIds = 8;

  explicit WordCache(std::size_t slots) {
    if (slots == 0) return;
    std::size_t cap = 64;
    while (cap < slots) cap <<= 1;
    slots_ = std::make_unique<Slot[]>(cap);
    mask_ = cap - 1;
  }

  bool enabled() const { return mask_ != 0; }

  static std::uint64_t hash(std::string_view word) { return hash_string(word) | 1; }  // never 0 (0 = empty slot)

  bool get(std::string_view word, std::uint64_t h, std::vector<std::int32_t>& out) const {
    const std::size_t i = static_cast<std::size_t>(h >> 7) & mask_;
    const Slot& s = slots_[i];
    std::lock_guard<std::mutex> lock(locks_[i % kLocks]);
    if (s.hash != h || s.word_len != word.size() || std::memcmp(s.word, word.data(), word.size()) != 0) return false;
    out.insert(out.end(), s.ids, s.ids + s.n_ids);
    return true;
  }

  void put(std::string_view word, std::uint64_t h, std::span<const std::int32_t> ids) const {
    if (ids.size() > kMaxIds) return;
    const std::size_t i = static_cast<std::size_t>(h >> 7) & mask_;
    Slot& s = slots_[i];
    std::lock_guard<std::mutex> lock(locks_[i % kLocks]);
    s.hash = h;
    s.word_len = static_cast<std::uint8_t>(word.size());
    s.n_ids = static_cast<std::uint8_t>(ids.size());
    std::memcpy(s.word, word.data(), word.size());
    std::copy(ids.begin(), ids.end(), s.ids);
  }

 private:
  static constexpr std::size_t kLocks = 64;
  struct alignas(64) Slot {
    std::uint64_t hash = 0;
    std::uint8_t word_len = 0;
    std::uint8_t n_ids = 0;
    char word[kMaxWordBytes];
    std::int32_t ids[kMaxIds];
  };
  static_assert(sizeof(Slot) == 64);
  std::unique_ptr<Slot[]> slots_;
  std::size_t mask_ = 0;
  mutable std::array<std::mutex, kLocks> locks_;
};

struct Symbol {
  std::int32_t id;
  std::int32_t prev;
  std::int32_t next;
  bool alive;
};

struct QueueEntry {
  std::int32_t rank;
  std::int32_t pos;
  std::int32_t new_id;
  // std::priority_queue is a max-heap: "greater" means lower priority.
  bool operator<(const QueueEntry& o) const {
    return rank != o.rank ? rank > o.rank : pos > o.pos;
  }
};

}  // namespace

struct BpeModel::Impl {
  std::array<std::int32_t, 256> byte_id{};  // id of the one-byte token, or -1
  MergeTable merges;
  bool ignore_merges = false;
  std::unordered_map<std::string, std::int32_t> word_ids;  // raw bytes -> id (ignore_merges only)
  std::unique_ptr<WordCache> cache;

  void merge_word(std::string_view word, std::vector<std::int32_t>& out) const;
  void merge_short_word(std::string_view word, std::vector<std::int32_t>& out) const;
};

BpeModel::BpeModel() = default;
BpeModel::~BpeModel() = default;

std::size_t BpeModel::merge_count() const { return impl_->merges.size(); }

Result<std::unique_ptr<BpeModel>> BpeModel::create(
    std::span<const std::string> tokens, std::span<const std::string> token_bytes,
    std::span<const std::uint8_t> in_model,
    const TokenIndex& index,
    std::span<const std::string> merges, Options options) {
  auto impl = std::make_unique<Impl>();
  impl->ignore_merges = options.ignore_merges;
  auto find_model_token = [&](std::string_view text) -> std::int32_t {
    const std::int32_t id = index.find(text);
    return id >= 0 && in_model[static_cast<std::size_t>(id)] ? id : -1;
  };
  for (int b = 0; b < 256; ++b) {
    impl->byte_id[b] = find_model_token(byte_level::encode(std::string(1, static_cast<char>(b))));
  }

  impl->merges.reserve(merges.size());
  std::string joined;
  for (std::size_t rank = 0; rank < merges.size(); ++rank) {
    const std::string& m = merges[rank];
    const std::size_t space = m.size() > 1 ? m.find(' ', 1) : std::string::npos;
    if (space == std::string::npos || space + 1 >= m.size()) {
      return invalid_argument_error("merge #{} '{}' is not of the form 'left right'", rank, m);
    }
    const std::string_view left(m.data(), space);
    const std::string_view right(m.data() + space + 1, m.size() - space - 1);
    const std::int32_t a = find_model_token(left);
    if (a < 0) return invalid_argument_error("merge #{} '{}': piece '{}' is not in the vocabulary", rank, m, left);
    const std::int32_t b = find_model_token(right);
    if (b < 0) return invalid_argument_error("merge #{} '{}': piece '{}' is not in the vocabulary", rank, m, right);
    joined.assign(left);
    joined.append(right);
    const std::int32_t merged = find_model_token(joined);
    if (merged < 0) {
      return invalid_argument_error("merge #{} '{}': merged token '{}' is not in the vocabulary", rank, m, joined);
    }
    impl->merges.insert(a, b, MergeRule{static_cast<std::int32_t>(rank), merged});
  }

  if (options.ignore_merges) {
    for (std::size_t id = 0; id < tokens.size(); ++id) {
      if (in_model[id]) impl->word_ids.emplace(token_bytes[id], static_cast<std::int32_t>(id));
    }
  }
  impl->cache = std::make_unique<WordCache>(options.cache_words);

  std::unique_ptr<BpeModel> model(new BpeModel());
  model->impl_ = std::move(impl);
  return model;
}

// Words up to kShortWord bytes: arrays on the stack, the lowest-rank pair found by a linear scan
// (the first one on ties, i.e. the leftmost), merged pairs removed by shifting. Same result as the
// priority-queue version, without allocations.
constexpr std::size_t kShortWord = 64;

void BpeModel::Impl::merge_short_word(std::string_view word, std::vector<std::int32_t>& out) const {
  constexpr std::int32_t kNone = INT32_MAX;
  std::int32_t ids[kShortWord];
  std::int32_t ranks[kShortWord];    // ranks[i]: rank of the pair (ids[i], ids[i + 1])
  std::int32_t merged[kShortWord];   // merged[i]: the id that pair becomes
  std::size_t n = 0;
  for (unsigned char b : word) {
    const std::int32_t id = byte_id[b];
    if (id >= 0) ids[n++] = id;  // no unk token: the byte is dropped, as HF does
  }
  auto rate = [&](std::size_t i) {
    const MergeRule* r = merges.find(ids[i], ids[i + 1]);
    ranks[i] = r != nullptr ? r->rank : kNone;
    merged[i] = r != nullptr ? r->new_id : -1;
  };
  for (std::size_t i = 0; i + 1 < n; ++i) rate(i);
  while (n > 1) {
    std::size_t best = 0;
    for (std::size_t i = 1; i + 1 < n; ++i) {
      if (ranks[i] < ranks[best]) best = i;
    }
    if (ranks[best] == kNone) break;
    ids[best] = merged[best];
    for (std::size_t i = best + 1; i + 1 < n; ++i) {
      ids[i] = ids[i + 1];
      ranks[i] = ranks[i + 1];
      merged[i] = merged[i + 1];
    }
    --n;
    if (best > 0) rate(best - 1);
    if (best + 1 < n) rate(best);
  }
  out.insert(out.end(), ids, ids + n);
}

void BpeModel::Impl::merge_word(std::string_view word, std::vector<std::int32_t>& out) const {
  if (word.size() <= kShortWord) {
    merge_short_word(word, out);
    return;
  }
  std::vector<Symbol> syms;
  syms.reserve(word.size());
  for (unsigned char b : word) {
    const std::int32_t id = byte_id[b];
    if (id < 0) continue;  // no unk token: the byte is dropped, as HF does
    const auto n = static_cast<std::int32_t>(syms.size());
    syms.push_back(Symbol{id, n - 1, n + 1, true});
  }
  if (syms.empty()) return;
  syms.back().next = -1;

  std::priority_queue<QueueEntry> queue;
  for (std::size_t i = 0; i + 1 < syms.size(); ++i) {
    if (const MergeRule* r = merges.find(syms[i].id, syms[i + 1].id)) {
      queue.push(QueueEntry{r->rank, static_cast<std::int32_t>(i), r->new_id});
    }
  }
  while (!queue.empty()) {
    const QueueEntry top = queue.top();
    queue.pop();
    Symbol& s = syms[static_cast<std::size_t>(top.pos)];
    if (!s.alive || s.next < 0) continue;
    Symbol& right = syms[static_cast<std::size_t>(s.next)];
    const MergeRule* r = merges.find(s.id, right.id);
    if (r == nullptr || r->new_id != top.new_id) continue;  // stale entry
    s.id = r->new_id;
    right.alive = false;
    s.next = right.next;
    if (s.next >= 0) syms[static_cast<std::size_t>(s.next)].prev = top.pos;
    if (s.prev >= 0) {
      const Symbol& left = syms[static_cast<std::size_t>(s.prev)];
      if (const MergeRule* lr = merges.find(left.id, s.id)) queue.push(QueueEntry{lr->rank, s.prev, lr->new_id});
    }
    if (s.next >= 0) {
      const Symbol& nx = syms[static_cast<std::size_t>(s.next)];
      if (const MergeRule* nr = merges.find(s.id, nx.id)) queue.push(QueueEntry{nr->rank, top.pos, nr->new_id});
    }
  }
  for (std::int32_t i = 0; i >= 0; i = syms[static_cast<std::size_t>(i)].next) {
    out.push_back(syms[static_cast<std::size_t>(i)].id);
  }
}

void BpeModel::encode_word(std::string_view word, std::vector<std::int32_t>& out) const {
  const Impl& m = *impl_;
  if (word.empty()) return;
  if (word.size() == 1) {
    const std::int32_t id = m.byte_id[static_cast<unsigned char>(word[0])];
    if (id >= 0) out.push_back(id);
    return;
  }
  if (m.ignore_merges) {
    auto it = m.word_ids.find(std::string(word));
    if (it != m.word_ids.end()) {
      out.push_back(it->second);
      return;
    }
  }
  const bool use_cache = m.cache->enabled() && word.size() <= WordCache::kMaxWordBytes;
  std::uint64_t h = 0;
  if (use_cache) {
    h = WordCache::hash(word);
    if (m.cache->get(word, h, out)) return;
  }
  const std::size_t before = out.size();
  m.merge_word(word, out);
  if (use_cache) m.cache->put(word, h, std::span<const std::int32_t>(out.data() + before, out.size() - before));
}

}  // namespace sx::tokenizer
