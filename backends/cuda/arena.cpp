// Chunked device memory (arena.h).
#include "backends/cuda/arena.h"

#include <algorithm>

namespace sx::cuda {

namespace {
std::size_t round_up(std::size_t v, std::size_t a) { return (v + a - 1) / a * a; }
}  // namespace

std::size_t arena_chunk_bytes(std::size_t bytes, std::size_t chunk_bytes, std::size_t alignment) {
  return std::max(chunk_bytes, round_up(std::max<std::size_t>(bytes, 1), alignment));
}

Arena::~Arena() {
  for (Chunk& c : chunks_) free_(c.base);
}

Result<void*> Arena::allocate(std::size_t bytes) {
  const std::size_t need = round_up(std::max<std::size_t>(bytes, 1), alignment_);
  std::lock_guard<std::mutex> lock(mu_);
  Chunk* chunk = nullptr;
  for (Chunk& c : chunks_) {
    if (c.size - c.top >= need) {
      chunk = &c;
      break;
    }
  }
  if (chunk == nullptr) {
    const std::size_t size = arena_chunk_bytes(need, chunk_bytes_, alignment_);
    Result<void*> p = alloc_(size);
    if (!p.ok()) return p.status();
    chunks_.push_back({static_cast<std::byte*>(*p), size, 0, 0});
    chunk = &chunks_.back();
  }
  std::byte* out = chunk->base + chunk->top;
  chunk->top += need;
  ++chunk->live;
  live_bytes_ += need;
  sizes_.emplace_back(out, need);
  return static_cast<void*>(out);
}

void Arena::release(void* p) {
  std::lock_guard<std::mutex> lock(mu_);
  auto s = std::find_if(sizes_.begin(), sizes_.end(), [&](const auto& e) { return e.first == p; });
  if (s == sizes_.end()) return;  // not ours (a programmer error the caller cannot see)
  live_bytes_ -= s->second;
  *s = sizes_.back();
  sizes_.pop_back();
  auto* b = static_cast<std::byte*>(p);
  for (auto c = chunks_.begin(); c != chunks_.end(); ++c) {
    if (b >= c->base && b < c->base + c->size) {
      if (--c->live == 0) {
        free_(c->base);
        chunks_.erase(c);
      }
      return;
    }
  }
}

std::size_t Arena::reserved_bytes() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::size_t n = 0;
  for (const Chunk& c : chunks_) n += c.size;
  return n;
}

std::size_t Arena::live_bytes() const {
  std::lock_guard<std::mutex> lock(mu_);
  return live_bytes_;
}

std::size_t Arena::chunks() const {
  std::lock_guard<std::mutex> lock(mu_);
  return chunks_.size();
}

}  // namespace sx::cuda
