// The CPU Channel: collectives between rank threads (sums in rank order, same bits on every rank
// and run), gather/broadcast/point-to-point, and failure: an aborting rank or a missing rank fails
// the group promptly with an error naming the rank.
#include <gtest/gtest.h>

#include <chrono>
#include <cstring>
#include <functional>
#include <random>
#include <thread>
#include <vector>

#include "backends/cpu/cpu_device.h"
#include "runtime/base/half.h"

namespace sx::cpu {
namespace {

struct Group {
  std::unique_ptr<hal::Backend> backend = make_cpu_backend();
  std::vector<std::unique_ptr<hal::Device>> devices;
  std::vector<std::unique_ptr<hal::Stream>> streams;
  std::vector<std::unique_ptr<hal::Channel>> channels;

  Group(int n, bool strict, std::chrono::milliseconds timeout = std::chrono::milliseconds(20'000)) {
    std::vector<hal::Device*> raw;
    for (int i = 0; i < n; ++i) {
      hal::DeviceOptions o;
      o.set("threads", 1);
      o.set("strict", strict);
      devices.push_back(*backend->create_device(i, o));
      streams.push_back(*devices.back()->create_stream());
      raw.push_back(devices.back().get());
    }
    hal::ChannelOptions co;
    co.timeout = timeout;
    channels = *backend->create_channels(raw, co);
  }

  // Runs fn(rank) on one thread per rank; returns each rank's status.
  std::vector<Status> run(const std::function<Status(int)>& fn) {
    std::vector<Status> out(devices.size());
    std::vector<std::thread> threads;
    for (std::size_t r = 0; r < devices.size(); ++r) {
      threads.emplace_back([&, r] { out[r] = fn(static_cast<int>(r)); });
    }
    for (auto& t : threads) t.join();
    return out;
  }
};

std::vector<float> rank_values(int rank, std::int64_t count) {
  std::mt19937 gen(static_cast<unsigned>(1000 + rank));
  std::uniform_real_distribution<float> dist(-1000.0f, 1000.0f);
  std::vector<float> v(static_cast<std::size_t>(count));
  for (float& x : v) x = dist(gen) * (gen() % 7 == 0 ? 1e-4f : 1.0f);  // magnitudes that round
  return v;
}

class AllReduce : public ::testing::TestWithParam<std::tuple<int, bool>> {};

TEST_P(AllReduce, SumsInRankOrderWithTheSameBitsEverywhere) {
  const auto [n, strict] = GetParam();
  const std::int64_t count = 1003;  // not a multiple of the rank count
  std::vector<float> expected(static_cast<std::size_t>(count));
  for (std::int64_t i = 0; i < count; ++i) {
    float sum = rank_values(0, count)[static_cast<std::size_t>(i)];
    for (int r = 1; r < n; ++r) sum += rank_values(r, count)[static_cast<std::size_t>(i)];
    expected[static_cast<std::size_t>(i)] = sum;
  }
  for (int run = 0; run < 3; ++run) {
    Group g(n, strict);
    std::vector<std::vector<float>> got(static_cast<std::size_t>(n));
    auto st = g.run([&](int r) -> Status {
      hal::Stream& s = *g.streams[static_cast<std::size_t>(r)];
      SX_ASSIGN_OR_RETURN(auto buf, g.devices[static_cast<std::size_t>(r)]->alloc(count * sizeof(float)));
      const std::vector<float> mine = rank_values(r, count);
      SX_RETURN_IF_ERROR(hal::upload_span<float>(s, *buf, 0, mine));
      SX_RETURN_IF_ERROR(g.channels[static_cast<std::size_t>(r)]->all_reduce(s, {buf.get(), 0}, count, hal::DType::kF32));
      auto& out = got[static_cast<std::size_t>(r)];
      out.resize(static_cast<std::size_t>(count));
      SX_RETURN_IF_ERROR(hal::download_span<float>(s, std::span<float>(out), *buf, 0));
      return s.sync();
    });
    for (int r = 0; r < n; ++r) {
      ASSERT_TRUE(st[static_cast<std::size_t>(r)].ok()) << st[static_cast<std::size_t>(r)].to_string();
      ASSERT_EQ(0, std::memcmp(got[static_cast<std::size_t>(r)].data(), expected.data(), count * sizeof(float)))
          << "rank " << r << " run " << run;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Ranks, AllReduce,
                         ::testing::Combine(::testing::Values(1, 2, 3, 6, 8), ::testing::Bool()));

TEST(CpuChannel, AllReduceHalfFormatsRoundTheF32SumOnce) {
  for (hal::DType t : {hal::DType::kF16, hal::DType::kBF16}) {
    const int n = 3;
    const std::int64_t count = 64;
    Group g(n, false);
    auto enc = [&](float f) { return t == hal::DType::kF16 ? f32_to_f16(f) : f32_to_bf16(f); };
    auto dec = [&](std::uint16_t h) { return t == hal::DType::kF16 ? f16_to_f32(h) : bf16_to_f32(h); };
    std::vector<std::vector<std::uint16_t>> got(n);
    auto input = [&](int r, std::int64_t i) { return enc(static_cast<float>(i) * 0.37f - static_cast<float>(r) * 1.9f); };
    auto st = g.run([&](int r) -> Status {
      hal::Stream& s = *g.streams[static_cast<std::size_t>(r)];
      std::vector<std::uint16_t> mine(count);
      for (std::int64_t i = 0; i < count; ++i) mine[static_cast<std::size_t>(i)] = input(r, i);
      SX_ASSIGN_OR_RETURN(auto buf, g.devices[static_cast<std::size_t>(r)]->alloc(count * 2));
      SX_RETURN_IF_ERROR(hal::upload_span<std::uint16_t>(s, *buf, 0, mine));
      SX_RETURN_IF_ERROR(g.channels[static_cast<std::size_t>(r)]->all_reduce(s, {buf.get(), 0}, count, t));
      got[static_cast<std::size_t>(r)].resize(count);
      SX_RETURN_IF_ERROR(hal::download_span<std::uint16_t>(s, std::span<std::uint16_t>(got[static_cast<std::size_t>(r)]), *buf, 0));
      return s.sync();
    });
    for (int r = 0; r < n; ++r) {
      ASSERT_TRUE(st[static_cast<std::size_t>(r)].ok());
      for (std::int64_t i = 0; i < count; ++i) {
        const float sum = dec(input(0, i)) + dec(input(1, i)) + dec(input(2, i));
        EXPECT_EQ(got[static_cast<std::size_t>(r)][static_cast<std::size_t>(i)], enc(sum)) << hal::dtype_name(t) << " " << i;
      }
    }
  }
}

TEST(CpuChannel, AllGatherBroadcastSendRecvAndBarrier) {
  const int n = 4;
  Group g(n, true);
  std::vector<std::vector<std::int32_t>> gathered(n), bcast(n), received(n);
  auto st = g.run([&](int r) -> Status {
    hal::Stream& s = *g.streams[static_cast<std::size_t>(r)];
    hal::Device& d = *g.devices[static_cast<std::size_t>(r)];
    hal::Channel& c = *g.channels[static_cast<std::size_t>(r)];
    const std::vector<std::int32_t> mine = {r * 10, r * 10 + 1, r * 10 + 2};
    SX_ASSIGN_OR_RETURN(auto send, d.alloc(12));
    SX_ASSIGN_OR_RETURN(auto recv, d.alloc(12 * n));
    SX_ASSIGN_OR_RETURN(auto b, d.alloc(12));
    SX_ASSIGN_OR_RETURN(auto p2p, d.alloc(12));
    SX_RETURN_IF_ERROR(hal::upload_span<std::int32_t>(s, *send, 0, mine));
    SX_RETURN_IF_ERROR(hal::upload_span<std::int32_t>(s, *b, 0, mine));
    SX_RETURN_IF_ERROR(c.all_gather(s, {send.get(), 0}, {recv.get(), 0}, 12));
    SX_RETURN_IF_ERROR(c.broadcast(s, {b.get(), 0}, 12, 2));
    // A ring: each rank sends its values to the next and receives from the previous.
    SX_RETURN_IF_ERROR(c.send(s, {send.get(), 0}, 12, (r + 1) % n));
    SX_RETURN_IF_ERROR(c.recv(s, {p2p.get(), 0}, 12, (r + n - 1) % n));
    SX_RETURN_IF_ERROR(c.barrier(s));
    gathered[static_cast<std::size_t>(r)].resize(3 * n);
    bcast[static_cast<std::size_t>(r)].resize(3);
    received[static_cast<std::size_t>(r)].resize(3);
    SX_RETURN_IF_ERROR(hal::download_span<std::int32_t>(s, std::span<std::int32_t>(gathered[static_cast<std::size_t>(r)]), *recv, 0));
    SX_RETURN_IF_ERROR(hal::download_span<std::int32_t>(s, std::span<std::int32_t>(bcast[static_cast<std::size_t>(r)]), *b, 0));
    SX_RETURN_IF_ERROR(hal::download_span<std::int32_t>(s, std::span<std::int32_t>(received[static_cast<std::size_t>(r)]), *p2p, 0));
    return s.sync();
  });
  for (int r = 0; r < n; ++r) {
    ASSERT_TRUE(st[static_cast<std::size_t>(r)].ok()) << st[static_cast<std::size_t>(r)].to_string();
    for (int j = 0; j < n; ++j) {
      for (int k = 0; k < 3; ++k) EXPECT_EQ(gathered[static_cast<std::size_t>(r)][static_cast<std::size_t>(3 * j + k)], j * 10 + k);
    }
    EXPECT_EQ(bcast[static_cast<std::size_t>(r)], (std::vector<std::int32_t>{20, 21, 22}));
    const int from = (r + n - 1) % n;
    EXPECT_EQ(received[static_cast<std::size_t>(r)], (std::vector<std::int32_t>{from * 10, from * 10 + 1, from * 10 + 2}));
  }
}

TEST(CpuChannel, AnAbortingRankReleasesItsPeersAtOnceAndIsNamed) {
  const int n = 4;
  Group g(n, false, std::chrono::milliseconds(30'000));
  const auto start = std::chrono::steady_clock::now();
  auto st = g.run([&](int r) -> Status {
    hal::Stream& s = *g.streams[static_cast<std::size_t>(r)];
    SX_ASSIGN_OR_RETURN(auto buf, g.devices[static_cast<std::size_t>(r)]->alloc(64));
    hal::Channel& c = *g.channels[static_cast<std::size_t>(r)];
    SX_RETURN_IF_ERROR(c.all_reduce(s, {buf.get(), 0}, 16, hal::DType::kF32));
    if (r == 2) {
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
      const Status why = internal_error("disk on fire");
      c.abort(why);
      return why;
    }
    return c.all_reduce(s, {buf.get(), 0}, 16, hal::DType::kF32);
  });
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_LT(seconds, 1.0);
  for (int r : {0, 1, 3}) {
    ASSERT_FALSE(st[static_cast<std::size_t>(r)].ok());
    EXPECT_NE(st[static_cast<std::size_t>(r)].message().find("rank 2 of 4 failed: disk on fire"), std::string::npos)
        << st[static_cast<std::size_t>(r)].to_string();
  }
}

TEST(CpuChannel, AMissingRankTimesOutNamingIt) {
  const int n = 3;
  Group g(n, false, std::chrono::milliseconds(200));
  auto st = g.run([&](int r) -> Status {
    hal::Stream& s = *g.streams[static_cast<std::size_t>(r)];
    if (r == 1) return ok_status();  // never joins the barrier
    return g.channels[static_cast<std::size_t>(r)]->barrier(s);
  });
  for (int r : {0, 2}) {
    ASSERT_EQ(st[static_cast<std::size_t>(r)].code(), StatusCode::kDeadlineExceeded);
    EXPECT_NE(st[static_cast<std::size_t>(r)].message().find("rank(s) 1,"), std::string::npos) << st[static_cast<std::size_t>(r)].to_string();
  }
}

TEST(CpuChannel, ABufferOfAnotherRankIsRejected) {
  Group g(2, false);
  auto other = *g.devices[1]->alloc(64);
  const Status st = g.channels[0]->all_reduce(*g.streams[0], {other.get(), 0}, 16, hal::DType::kF32);
  ASSERT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("belongs to cpu:1"), std::string::npos) << st.to_string();
}

}  // namespace
}  // namespace sx::cpu
