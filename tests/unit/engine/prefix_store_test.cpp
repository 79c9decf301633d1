// PrefixStore (the prefix cache's persistent tier): entries read back after the store is opened
// again, never another salt's, and a torn, damaged or foreign file ignored and removed; the
// directory stays within its bound, least recently used first.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <numeric>
#include <unistd.h>
#include <vector>

#include "runtime/engine/prefix_store.h"

namespace sx::engine {
namespace {

namespace fs = std::filesystem;

struct Dir {
  std::string path = (fs::temp_directory_path() / ("sx_store_" + std::to_string(::getpid()))).string();
  Dir() { fs::remove_all(path); }
  ~Dir() { fs::remove_all(path); }
};

std::vector<std::byte> payload(std::size_t n, int seed) {
  std::vector<std::byte> v(n);
  for (std::size_t i = 0; i < n; ++i) v[i] = static_cast<std::byte>((i * 7 + static_cast<std::size_t>(seed)) & 0xff);
  return v;
}

std::unique_ptr<PrefixStore> open_store(const Dir& d, std::uint64_t salt, std::uint64_t max = 1 << 20) {
  auto s = PrefixStore::open({d.path, max, salt});
  EXPECT_TRUE(s.ok()) << s.status().to_string();
  return std::move(*s);
}

TEST(PrefixStore, EntriesSurviveReopeningAndOnlyTheirSaltReadsThem) {
  Dir d;
  const std::vector<std::int32_t> tokens = {1, 2, 3, 4};
  {
    auto s = open_store(d, 7);
    s->put_block(11, tokens, payload(1000, 1));
    s->put_snapshot(11, payload(3000, 2));
    s->put_block(11, tokens, payload(1000, 9));  // already there: not written again
    s->flush();
    EXPECT_EQ(s->stats().written, 2u);
  }
  auto s = open_store(d, 7);
  EXPECT_TRUE(s->has_block(11));
  EXPECT_TRUE(s->has_snapshot(11));
  EXPECT_EQ(s->get_block(11, tokens, 1000), payload(1000, 1));
  EXPECT_EQ(s->get_snapshot(11, 3000), payload(3000, 2));
  // Other tokens under the hash, another size: refused (and the file removed).
  EXPECT_FALSE(s->get_block(11, std::vector<std::int32_t>{1, 2, 3, 5}, 1000));
  EXPECT_FALSE(s->has_block(11));
  EXPECT_FALSE(s->get_snapshot(11, 2999));
  EXPECT_EQ(s->stats().rejected, 2u);
  auto other = open_store(d, 8);
  EXPECT_FALSE(other->has_block(11));
  EXPECT_FALSE(other->get_snapshot(11, 3000));
}

TEST(PrefixStore, TornDamagedAndForeignFilesAreIgnoredAndRemoved) {
  Dir d;
  const std::vector<std::int32_t> tokens = {5, 6};
  std::string name;
  {
    auto s = open_store(d, 3);
    for (std::uint64_t h = 1; h <= 3; ++h) s->put_block(h, tokens, payload(512, static_cast<int>(h)));
    s->flush();
  }
  std::vector<fs::path> files;
  for (const auto& e : fs::directory_iterator(d.path)) files.push_back(e.path());
  std::sort(files.begin(), files.end());
  ASSERT_EQ(files.size(), 3u);
  fs::resize_file(files[0], fs::file_size(files[0]) - 10);  // torn
  {
    std::fstream f(files[1], std::ios::in | std::ios::out | std::ios::binary);  // one payload byte flipped
    f.seekp(-5, std::ios::end);
    f.put('\x55');
  }
  {
    std::fstream f(files[2], std::ios::in | std::ios::out | std::ios::binary);  // another salt in its header
    f.seekp(16);
    f.put('\x01');
  }
  std::ofstream(fs::path(d.path) / "0000000000000003-0000000000000009.blk.tmp") << "half a write";
  auto s = open_store(d, 3);
  for (std::uint64_t h = 1; h <= 3; ++h) EXPECT_FALSE(s->get_block(h, tokens, 512)) << h;
  EXPECT_EQ(s->stats().rejected, 3u);
  EXPECT_TRUE(fs::is_empty(d.path));
}

TEST(PrefixStore, TheDirectoryStaysWithinItsBoundLeastRecentlyUsedFirst) {
  Dir d;
  const std::vector<std::int32_t> tokens = {1};
  auto s = open_store(d, 1, 10000);  // room for 4 entries of 2,000 bytes and their headers
  for (std::uint64_t h = 1; h <= 4; ++h) s->put_block(h, tokens, payload(2000, static_cast<int>(h)));
  s->flush();
  EXPECT_TRUE(s->get_block(1, tokens, 2000));  // used again: the oldest is now 2
  for (std::uint64_t h = 5; h <= 6; ++h) s->put_block(h, tokens, payload(2000, static_cast<int>(h)));
  s->flush();
  EXPECT_TRUE(s->has_block(1));
  EXPECT_FALSE(s->has_block(2));
  EXPECT_FALSE(s->has_block(3));
  EXPECT_TRUE(s->has_block(6));
  EXPECT_LE(s->stats().bytes, 10000u);
  EXPECT_EQ(s->stats().evicted, 2u);
  std::uint64_t on_disk = 0;
  for (const auto& e : fs::directory_iterator(d.path)) on_disk += fs::file_size(e.path());
  EXPECT_EQ(on_disk, s->stats().bytes);
}

TEST(PrefixStore, ADirectoryThatCannotBeMadeIsNamed) {
  auto s = PrefixStore::open({"/proc/sx-no/such", 1 << 20, 1});
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.status().message().find("engine.prefix_cache_dir /proc/sx-no/such"), std::string::npos);
}

}  // namespace
}  // namespace sx::engine
