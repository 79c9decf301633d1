// The CPU Channel beyond the conformance suite (tests/cts: gather, broadcast, point-to-point,
// barrier, an aborting or a missing rank): sums in exact rank order, the same bits on every rank and
// run, F16 / BF16 rounded once, and a buffer of another rank refused.
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

TEST(CpuChannel, ABufferOfAnotherRankIsRejected) {
  Group g(2, false);
  auto other = *g.devices[1]->alloc(64);
  const Status st = g.channels[0]->all_reduce(*g.streams[0], {other.get(), 0}, 16, hal::DType::kF32);
  ASSERT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("belongs to cpu:1"), std::string::npos) << st.to_string();
}

}  // namespace
}  // namespace sx::cpu
