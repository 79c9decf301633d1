// The HAL conformance suite (DESIGN.md §7.11, issue 17 item 6): what runtime/hal/device.h and
// channel.h promise, asked of every backend by name. Each case runs on every target below; a
// target whose backend is not compiled in, or reports UNAVAILABLE or too few devices, is skipped
// with the reason printed. A new backend adds its name to targets.h and nothing else.
//
// Device / Buffer / Stream / Event: identity and memory accounting; uploads, downloads and copies
// at odd offsets and sizes that touch nothing outside their range (guard bytes on both sides, in
// device and host memory); fill and update (copied at the call); staging and readback buffers
// through device memory, refused as op operands; stream order; events ordering two streams; an unrecorded event;
// latched errors. Channel (backends with collectives): all_reduce equal to the rank-order sum
// within the header's tolerance on every rank, all_gather, broadcast, send / recv in a ring,
// barrier; an aborting rank fails its peers promptly naming itself; a missing rank times out and
// is named with its device and the group's name. Host calls run in stream order and latch errors.
#include <gtest/gtest.h>

#include <cctype>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <numeric>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "runtime/base/half.h"
#include "runtime/hal/registry.h"
#include "tests/cts/targets.h"

namespace sx::hal {
namespace {

using testing::Target;

class Cts : public ::testing::TestWithParam<Target> {
 protected:
  // The backend, or a skip naming why it cannot be tested here.
  Backend* backend_or_skip(int devices_needed = 1) {
    return testing::usable_backend(GetParam(), devices_needed, skip_reason_);
  }
  DeviceOptions options() const { return GetParam().device_options(); }
  std::unique_ptr<Device> device(Backend& b, int index = 0) {
    auto d = b.create_device(index, options());
    EXPECT_TRUE(d.ok()) << d.status().to_string();
    return d.ok() ? std::move(*d) : nullptr;
  }
  std::string skip_reason_;
};

#define CTS_BACKEND(var, n)                                                  \
  Backend* var = backend_or_skip(n);                                         \
  if (var == nullptr) {                                                      \
    std::printf("skipped on %s: %s\n", GetParam().label, skip_reason_.c_str()); \
    GTEST_SKIP() << skip_reason_;                                            \
  }

std::vector<std::byte> pattern(std::size_t n, unsigned seed) {
  std::vector<std::byte> v(n);
  std::mt19937 gen(seed);
  for (auto& b : v) b = static_cast<std::byte>(gen() & 0xFF);
  return v;
}

TEST_P(Cts, DeviceInfoNamesItselfAndCountsItsMemory) {
  CTS_BACKEND(b, 1);
  auto d = device(*b);
  ASSERT_NE(d, nullptr);
  const DeviceInfo& info = d->info();
  EXPECT_EQ(info.backend, b->name());
  EXPECT_EQ(info.name.rfind(fmt::format("{}:{}", b->name(), info.index), 0), 0u) << info.name;
  EXPECT_GT(info.memory_bytes, 0u);
  EXPECT_LE(info.free_bytes, info.memory_bytes);
  const std::uint64_t before = d->memory().used_bytes;
  {
    auto buf = d->alloc(1 << 20);
    ASSERT_TRUE(buf.ok()) << buf.status().to_string();
    EXPECT_EQ((*buf)->size(), std::size_t{1} << 20);
    EXPECT_EQ(&(*buf)->device(), d.get());
    EXPECT_GE(d->memory().used_bytes, before + (1 << 20));
  }
  EXPECT_EQ(d->memory().used_bytes, before);
}

// Every transfer touches exactly its range: the bytes around it, in the buffer and in the host
// destination, keep their values.
TEST_P(Cts, TransfersAtOddOffsetsTouchOnlyTheirRange) {
  CTS_BACKEND(b, 1);
  auto d = device(*b);
  ASSERT_NE(d, nullptr);
  auto s = *d->create_stream();
  constexpr std::size_t kSize = 1000;
  auto x = *d->alloc(kSize);
  auto y = *d->alloc(kSize);
  const std::vector<std::byte> base_x = pattern(kSize, 1), base_y = pattern(kSize, 2), part = pattern(37, 3);
  ASSERT_TRUE(s->upload(*x, 0, base_x).ok());
  ASSERT_TRUE(s->upload(*y, 0, base_y).ok());
  ASSERT_TRUE(s->upload(*x, 13, part).ok());       // x[13, 50) = part
  ASSERT_TRUE(s->copy(*y, 129, *x, 7, 61).ok());   // y[129, 190) = x[7, 68)
  ASSERT_TRUE(s->copy(*x, 501, *x, 900, 99).ok());  // within one buffer, not overlapping
  std::vector<std::byte> host_x(kSize + 64, std::byte{0xA5}), host_y(kSize + 64, std::byte{0x5A});
  ASSERT_TRUE(s->download(std::span<std::byte>(host_x).subspan(32, kSize), *x, 0).ok());
  ASSERT_TRUE(s->download(std::span<std::byte>(host_y).subspan(32, kSize), *y, 0).ok());
  std::vector<std::byte> mid(5, std::byte{0x11});
  ASSERT_TRUE(s->download(std::span<std::byte>(mid).subspan(1, 3), *x, 998 - 1).ok());
  ASSERT_TRUE(s->sync().ok());

  std::vector<std::byte> want_x = base_x, want_y = base_y;
  std::copy(part.begin(), part.end(), want_x.begin() + 13);
  std::copy(want_x.begin() + 7, want_x.begin() + 68, want_y.begin() + 129);
  std::copy(want_x.begin() + 900, want_x.begin() + 999, want_x.begin() + 501);
  for (std::size_t i = 0; i < 32; ++i) {
    EXPECT_EQ(host_x[i], std::byte{0xA5});
    EXPECT_EQ(host_x[32 + kSize + i], std::byte{0xA5});
    EXPECT_EQ(host_y[i], std::byte{0x5A});
    EXPECT_EQ(host_y[32 + kSize + i], std::byte{0x5A});
  }
  EXPECT_TRUE(std::equal(want_x.begin(), want_x.end(), host_x.begin() + 32));
  EXPECT_TRUE(std::equal(want_y.begin(), want_y.end(), host_y.begin() + 32));
  EXPECT_EQ(mid[0], std::byte{0x11});
  EXPECT_EQ(mid[4], std::byte{0x11});
  EXPECT_TRUE(std::equal(mid.begin() + 1, mid.begin() + 4, want_x.begin() + 997));
}

// fill() and update() touch exactly their range; update() copied its source at the call (the
// source is overwritten before sync); fill() works on buffers larger than any host chunk.
TEST_P(Cts, FillAndUpdateTouchOnlyTheirRangeAndUpdateCopiesAtTheCall) {
  CTS_BACKEND(b, 1);
  auto d = device(*b);
  ASSERT_NE(d, nullptr);
  auto s = *d->create_stream();
  constexpr std::size_t kSize = 3 << 20;
  auto x = *d->alloc(kSize);
  const std::vector<std::byte> base = pattern(kSize, 4);
  ASSERT_TRUE(s->upload(*x, 0, base).ok());
  ASSERT_TRUE(s->fill(*x, 3, (2 << 20) + 5, 0).ok());  // x[3, 2 MiB + 8) = 0
  ASSERT_TRUE(s->fill(*x, kSize - 11, 7, 0xC3).ok());  // x[kSize - 11, kSize - 4) = 0xC3
  std::vector<std::byte> src = pattern(Stream::kMaxUpdateBytes, 5);
  const std::vector<std::byte> sent = src;
  ASSERT_TRUE(s->update(*x, (2 << 20) + 100, src).ok());
  std::fill(src.begin(), src.end(), std::byte{0xEE});  // too late to change what update sends
  std::vector<std::byte> out(kSize);
  ASSERT_TRUE(s->download(out, *x, 0).ok());
  ASSERT_TRUE(s->sync().ok());
  std::vector<std::byte> want = base;
  std::fill(want.begin() + 3, want.begin() + (2 << 20) + 8, std::byte{0});
  std::fill(want.end() - 11, want.end() - 4, std::byte{0xC3});
  std::copy(sent.begin(), sent.end(), want.begin() + (2 << 20) + 100);
  EXPECT_TRUE(out == want);
  // An update larger than kMaxUpdateBytes is refused (and latches).
  std::vector<std::byte> big(Stream::kMaxUpdateBytes + 1);
  EXPECT_EQ(s->update(*x, 0, big).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(s->sync().code(), StatusCode::kInvalidArgument);
}

// Upload and readback buffers are host-visible: the host writes one, a stream copies it to a
// device buffer and back into the other, and the host reads the result there after sync().
// Device buffers show the host nothing, and ops refuse the host-visible ones as operands.
TEST_P(Cts, StagingAndReadbackBuffersCarryDataThroughDeviceMemory) {
  CTS_BACKEND(b, 1);
  auto d = device(*b);
  ASSERT_NE(d, nullptr);
  auto s = *d->create_stream();
  constexpr std::size_t kSize = 4096;
  auto up = *d->alloc(kSize, BufferUsage::kUpload);
  auto dev = *d->alloc(kSize);
  auto back = *d->alloc(kSize, BufferUsage::kReadback);
  EXPECT_EQ(up->usage(), BufferUsage::kUpload);
  EXPECT_EQ(dev->usage(), BufferUsage::kDevice);
  EXPECT_EQ(back->usage(), BufferUsage::kReadback);
  EXPECT_TRUE(dev->host().empty());
  ASSERT_EQ(up->host().size(), kSize);
  ASSERT_EQ(back->host().size(), kSize);
  for (int round = 0; round < 3; ++round) {  // the same staging reused, as a step does
    const std::vector<std::byte> data = pattern(kSize, 10 + round);
    std::copy(data.begin(), data.end(), up->host().begin());
    ASSERT_TRUE(s->copy(*dev, 0, *up, 0, kSize).ok());
    ASSERT_TRUE(s->copy(*back, 0, *dev, 0, kSize).ok());
    ASSERT_TRUE(s->sync().ok());
    EXPECT_TRUE(std::equal(data.begin(), data.end(), back->host().begin())) << "round " << round;
  }
  const Status refused = s->run(AddArgs{{up.get(), 0}, {dev.get(), 0}, {dev.get(), 0}, 16});
  Status synced = s->sync();
  EXPECT_EQ(refused.ok() ? synced.code() : refused.code(), StatusCode::kInvalidArgument);
  EXPECT_NE((refused.ok() ? synced : refused).message().find("upload"), std::string::npos)
      << (refused.ok() ? synced : refused).to_string();
}

// Work on one stream runs in the order it was enqueued: an op sees the upload before it, a
// download sees the op before it and not the upload after it.
TEST_P(Cts, AStreamRunsInOrder) {
  CTS_BACKEND(b, 1);
  auto d = device(*b);
  ASSERT_NE(d, nullptr);
  auto s = *d->create_stream();
  auto a = *d->alloc(64 * sizeof(float));
  std::vector<float> x(64), first(64), second(64);
  std::iota(x.begin(), x.end(), 1.0f);
  std::vector<float> y(64, 1000.0f);
  ASSERT_TRUE(upload_span<float>(*s, *a, 0, x).ok());
  ASSERT_TRUE(s->run(AddArgs{{a.get(), 0}, {a.get(), 0}, {a.get(), 0}, 64}).ok());  // a = 2x
  ASSERT_TRUE(download_span<float>(*s, std::span<float>(first), *a, 0).ok());
  ASSERT_TRUE(upload_span<float>(*s, *a, 0, y).ok());
  ASSERT_TRUE(download_span<float>(*s, std::span<float>(second), *a, 0).ok());
  ASSERT_TRUE(s->sync().ok());
  for (std::size_t i = 0; i < 64; ++i) {
    EXPECT_EQ(first[i], 2.0f * x[i]);
    EXPECT_EQ(second[i], 1000.0f);
  }
}

// An event recorded on one stream orders another stream's later work after it (the first stream
// synced first: a backend may run a stream's work only at its sync, as the strict CPU does).
TEST_P(Cts, AnEventOrdersTwoStreams) {
  CTS_BACKEND(b, 1);
  auto d = device(*b);
  ASSERT_NE(d, nullptr);
  auto s1 = *d->create_stream();
  auto s2 = *d->create_stream();
  auto e = *d->create_event();
  auto a = *d->alloc(32 * sizeof(float));
  auto c = *d->alloc(32 * sizeof(float));
  std::vector<float> x(32, 3.0f), out(32, 0.0f);
  ASSERT_TRUE(upload_span<float>(*s1, *a, 0, x).ok());
  ASSERT_TRUE(s1->run(AddArgs{{a.get(), 0}, {a.get(), 0}, {a.get(), 0}, 32}).ok());
  ASSERT_TRUE(s1->record(*e).ok());
  ASSERT_TRUE(s2->wait(*e).ok());
  ASSERT_TRUE(s2->copy(*c, 0, *a, 0, 32 * sizeof(float)).ok());
  ASSERT_TRUE(download_span<float>(*s2, std::span<float>(out), *c, 0).ok());
  ASSERT_TRUE(s1->sync().ok());
  ASSERT_TRUE(s2->sync().ok());
  for (float v : out) EXPECT_EQ(v, 6.0f);
  // Waiting on an event never recorded is an error, not a hang.
  auto never = *d->create_event();
  auto s3 = *d->create_stream();
  EXPECT_EQ(s3->wait(*never).code(), StatusCode::kFailedPrecondition);
}

// A host call runs after the work enqueued before it (it reads the op's result through a readback
// buffer) and before the work enqueued after it (a copy takes what it wrote into an upload buffer);
// the error it returns latches.
TEST_P(Cts, AHostCallRunsBetweenTheWorkAroundIt) {
  CTS_BACKEND(b, 1);
  auto d = device(*b);
  ASSERT_NE(d, nullptr);
  auto s = *d->create_stream();
  constexpr std::size_t kN = 64, kBytes = kN * sizeof(float);
  auto a = *d->alloc(kBytes);
  auto up = *d->alloc(kBytes, BufferUsage::kUpload);
  auto back = *d->alloc(kBytes, BufferUsage::kReadback);
  std::vector<float> x(kN), seen(kN), after(kN);
  std::iota(x.begin(), x.end(), 1.0f);
  int calls = 0;
  ASSERT_TRUE(upload_span<float>(*s, *a, 0, x).ok());
  ASSERT_TRUE(s->run(AddArgs{{a.get(), 0}, {a.get(), 0}, {a.get(), 0}, kN}).ok());  // a = 2x
  ASSERT_TRUE(s->copy(*back, 0, *a, 0, kBytes).ok());
  ASSERT_TRUE(s->host_call([&]() -> Status {
                 ++calls;
                 std::memcpy(seen.data(), back->host().data(), kBytes);
                 for (std::size_t i = 0; i < kN; ++i) {
                   const float v = 3.0f * x[i];
                   std::memcpy(up->host().data() + i * sizeof(float), &v, sizeof v);
                 }
                 return ok_status();
               }).ok());
  ASSERT_TRUE(s->copy(*a, 0, *up, 0, kBytes).ok());
  ASSERT_TRUE(download_span<float>(*s, std::span<float>(after), *a, 0).ok());
  ASSERT_TRUE(s->sync().ok());
  EXPECT_EQ(calls, 1);
  for (std::size_t i = 0; i < kN; ++i) {
    EXPECT_EQ(seen[i], 2.0f * x[i]) << i;
    EXPECT_EQ(after[i], 3.0f * x[i]) << i;
  }
  const Status first = s->host_call([] { return data_loss_error("the host side of the call failed"); });
  const Status synced = s->sync();
  const Status err = first.ok() ? synced : first;
  EXPECT_EQ(err.code(), StatusCode::kDataLoss) << err.to_string();
  EXPECT_NE(err.message().find("the host side of the call failed"), std::string::npos) << err.to_string();
  EXPECT_EQ(s->host_call([&] { ++calls; return ok_status(); }).code(), StatusCode::kDataLoss);
  EXPECT_EQ(s->sync().code(), StatusCode::kDataLoss);
  EXPECT_EQ(calls, 1);  // nothing runs after a latched error
}

// The first error latches: sync() and every later call return it, whatever they are.
TEST_P(Cts, TheFirstErrorLatches) {
  CTS_BACKEND(b, 1);
  auto d = device(*b);
  ASSERT_NE(d, nullptr);
  auto s = *d->create_stream();
  auto a = *d->alloc(64);
  const std::vector<std::byte> bytes(65);
  const Status first = s->upload(*a, 0, bytes);  // one byte too many: now or at sync
  const Status synced = s->sync();
  const Status err = first.ok() ? synced : first;
  ASSERT_FALSE(err.ok());
  EXPECT_EQ(synced.code(), err.code()) << synced.to_string();
  EXPECT_EQ(s->upload(*a, 0, std::span<const std::byte>(bytes).first(8)).code(), err.code());
  EXPECT_EQ(s->run(AddArgs{{a.get(), 0}, {a.get(), 0}, {a.get(), 0}, 4}).code(), err.code());
  EXPECT_EQ(s->sync().code(), err.code());
  // Another stream of the device is not affected.
  auto fresh = *d->create_stream();
  EXPECT_TRUE(fresh->upload(*a, 0, std::span<const std::byte>(bytes).first(8)).ok());
  EXPECT_TRUE(fresh->sync().ok());
}

// A group of `n` devices of the target with its channels, and one thread per rank.
struct Group {
  std::vector<std::unique_ptr<Device>> devices;
  std::vector<std::unique_ptr<Stream>> streams;
  std::vector<std::unique_ptr<Channel>> channels;

  std::vector<Status> run(const std::function<Status(int)>& fn) {
    std::vector<Status> out(devices.size());
    std::vector<std::thread> threads;
    for (std::size_t r = 0; r < devices.size(); ++r) threads.emplace_back([&, r] { out[r] = fn(static_cast<int>(r)); });
    for (auto& t : threads) t.join();
    return out;
  }
};

class CtsChannel : public Cts {
 protected:
  static constexpr const char* kGroupName = "cts group";
  // The group, or empty with skip_reason_ set (no collectives: a backend may serve groups of one).
  Group group(Backend& b, int n, std::chrono::milliseconds timeout) {
    Group g;
    auto made = b.create_devices(n, options());
    EXPECT_TRUE(made.ok()) << made.status().to_string();
    if (!made.ok()) return g;
    std::vector<Device*> raw;
    for (auto& d : *made) {
      raw.push_back(d.get());
      g.streams.push_back(*d->create_stream());
      g.devices.push_back(std::move(d));
    }
    ChannelOptions co;
    co.timeout = timeout;
    co.name = kGroupName;
    auto ch = b.create_channels(raw, co);
    if (!ch.ok()) {
      skip_reason_ = ch.status().to_string();
      g = Group{};
      return g;
    }
    g.channels = std::move(*ch);
    return g;
  }
};

#define CTS_GROUP(g, b, n, timeout)                                               \
  Group g = group(*(b), n, timeout);                                              \
  if (g.channels.empty()) {                                                       \
    std::printf("skipped on %s: %s\n", GetParam().label, skip_reason_.c_str());  \
    GTEST_SKIP() << skip_reason_;                                                 \
  }

// all_reduce on every rank is within channel.h's bound of the rank-order F32 sum (N x 2^-23 x the
// sum of magnitudes), with the same bits on every rank.
TEST_P(CtsChannel, CollectivesGiveEveryRankTheSameResult) {
  const int n = 3;
  CTS_BACKEND(b, n);
  CTS_GROUP(g, b, n, std::chrono::milliseconds(20'000));
  constexpr std::int64_t kCount = 1000;
  std::vector<std::vector<float>> inputs(n), reduced(n);
  std::vector<std::vector<std::int32_t>> gathered(n), bcast(n), received(n);
  for (int r = 0; r < n; ++r) {
    std::mt19937 gen(static_cast<unsigned>(77 + r));
    std::uniform_real_distribution<float> dist(-100.0f, 100.0f);
    for (std::int64_t i = 0; i < kCount; ++i) inputs[static_cast<std::size_t>(r)].push_back(dist(gen));
  }
  auto st = g.run([&](int r) -> Status {
    const auto ur = static_cast<std::size_t>(r);
    Stream& s = *g.streams[ur];
    Device& d = *g.devices[ur];
    Channel& c = *g.channels[ur];
    SX_ASSIGN_OR_RETURN(auto data, d.alloc(kCount * sizeof(float)));
    SX_ASSIGN_OR_RETURN(auto send, d.alloc(12));
    SX_ASSIGN_OR_RETURN(auto recv, d.alloc(12 * n));
    SX_ASSIGN_OR_RETURN(auto bc, d.alloc(12));
    SX_ASSIGN_OR_RETURN(auto p2p, d.alloc(12));
    const std::vector<std::int32_t> mine = {r * 10, r * 10 + 1, r * 10 + 2};
    SX_RETURN_IF_ERROR(upload_span<float>(s, *data, 0, inputs[ur]));
    SX_RETURN_IF_ERROR(upload_span<std::int32_t>(s, *send, 0, mine));
    SX_RETURN_IF_ERROR(upload_span<std::int32_t>(s, *bc, 0, mine));
    SX_RETURN_IF_ERROR(c.all_reduce(s, {data.get(), 0}, kCount, DType::kF32));
    SX_RETURN_IF_ERROR(c.all_gather(s, {send.get(), 0}, {recv.get(), 0}, 12));
    SX_RETURN_IF_ERROR(c.broadcast(s, {bc.get(), 0}, 12, 1));
    SX_RETURN_IF_ERROR(c.send(s, {send.get(), 0}, 12, (r + 1) % n));
    SX_RETURN_IF_ERROR(c.recv(s, {p2p.get(), 0}, 12, (r + n - 1) % n));
    SX_RETURN_IF_ERROR(c.barrier(s));
    reduced[ur].resize(kCount);
    gathered[ur].resize(3 * n);
    bcast[ur].resize(3);
    received[ur].resize(3);
    SX_RETURN_IF_ERROR(download_span<float>(s, std::span<float>(reduced[ur]), *data, 0));
    SX_RETURN_IF_ERROR(download_span<std::int32_t>(s, std::span<std::int32_t>(gathered[ur]), *recv, 0));
    SX_RETURN_IF_ERROR(download_span<std::int32_t>(s, std::span<std::int32_t>(bcast[ur]), *bc, 0));
    SX_RETURN_IF_ERROR(download_span<std::int32_t>(s, std::span<std::int32_t>(received[ur]), *p2p, 0));
    return s.sync();
  });
  for (int r = 0; r < n; ++r) {
    const auto ur = static_cast<std::size_t>(r);
    ASSERT_TRUE(st[ur].ok()) << "rank " << r << ": " << st[ur].to_string();
    for (std::int64_t i = 0; i < kCount; ++i) {
      const auto ui = static_cast<std::size_t>(i);
      float sum = inputs[0][ui];
      double magnitude = std::fabs(inputs[0][ui]);
      for (int k = 1; k < n; ++k) {
        sum += inputs[static_cast<std::size_t>(k)][ui];
        magnitude += std::fabs(inputs[static_cast<std::size_t>(k)][ui]);
      }
      EXPECT_LE(std::fabs(double(reduced[ur][ui]) - sum), n * std::ldexp(1.0, -23) * magnitude)
          << "rank " << r << " element " << i;
      EXPECT_EQ(std::memcmp(&reduced[ur][ui], &reduced[0][ui], sizeof(float)), 0) << "rank " << r << " element " << i;
    }
    for (int j = 0; j < n; ++j) {
      for (int k = 0; k < 3; ++k) EXPECT_EQ(gathered[ur][static_cast<std::size_t>(3 * j + k)], j * 10 + k);
    }
    EXPECT_EQ(bcast[ur], (std::vector<std::int32_t>{10, 11, 12}));
    const int from = (r + n - 1) % n;
    EXPECT_EQ(received[ur], (std::vector<std::int32_t>{from * 10, from * 10 + 1, from * 10 + 2}));
  }
}

// F16 and BF16 all_reduce (channel.h: widened, summed in F32, rounded once): every rank gets the
// same bits, within channel.h's bound of the rank-order F32 sum plus half a unit of the format's
// last place (the one rounding).
TEST_P(CtsChannel, HalfPrecisionAllReduceRoundsTheF32SumOnce) {
  const int n = 3;
  CTS_BACKEND(b, n);
  CTS_GROUP(g, b, n, std::chrono::milliseconds(20'000));
  constexpr std::int64_t kCount = 777;
  for (const DType t : {DType::kF16, DType::kBF16}) {
    SCOPED_TRACE(dtype_name(t));
    auto to_half = [t](float f) { return t == DType::kF16 ? f32_to_f16(f) : f32_to_bf16(f); };
    auto from_half = [t](std::uint16_t h) { return t == DType::kF16 ? f16_to_f32(h) : bf16_to_f32(h); };
    std::vector<std::vector<std::uint16_t>> inputs(n), reduced(n);
    for (int r = 0; r < n; ++r) {
      std::mt19937 gen(static_cast<unsigned>(91 + r));
      std::uniform_real_distribution<float> dist(-50.0f, 50.0f);
      for (std::int64_t i = 0; i < kCount; ++i) inputs[static_cast<std::size_t>(r)].push_back(to_half(dist(gen)));
    }
    auto st = g.run([&](int r) -> Status {
      const auto ur = static_cast<std::size_t>(r);
      Stream& s = *g.streams[ur];
      SX_ASSIGN_OR_RETURN(auto data, g.devices[ur]->alloc(kCount * 2));
      SX_RETURN_IF_ERROR(upload_span<std::uint16_t>(s, *data, 0, inputs[ur]));
      SX_RETURN_IF_ERROR(g.channels[ur]->all_reduce(s, {data.get(), 0}, kCount, t));
      reduced[ur].resize(kCount);
      SX_RETURN_IF_ERROR(download_span<std::uint16_t>(s, std::span<std::uint16_t>(reduced[ur]), *data, 0));
      return s.sync();
    });
    const double last_place = t == DType::kF16 ? std::ldexp(1.0, -10) : std::ldexp(1.0, -7);
    for (int r = 0; r < n; ++r) {
      const auto ur = static_cast<std::size_t>(r);
      ASSERT_TRUE(st[ur].ok()) << "rank " << r << ": " << st[ur].to_string();
      for (std::int64_t i = 0; i < kCount; ++i) {
        const auto ui = static_cast<std::size_t>(i);
        float sum = from_half(inputs[0][ui]);
        double magnitude = std::fabs(sum);
        for (int k = 1; k < n; ++k) {
          sum += from_half(inputs[static_cast<std::size_t>(k)][ui]);
          magnitude += std::fabs(from_half(inputs[static_cast<std::size_t>(k)][ui]));
        }
        const double bound = n * std::ldexp(1.0, -23) * magnitude + std::fabs(sum) * last_place / 2 + 1e-6;
        EXPECT_LE(std::fabs(double(from_half(reduced[ur][ui])) - sum), bound) << "rank " << r << " element " << i;
        EXPECT_EQ(reduced[ur][ui], reduced[0][ui]) << "rank " << r << " element " << i;
      }
    }
  }
}

// A group of one rank: every collective leaves the data as it is (all_gather copies send into
// recv). Through the backend's channel as it is chosen (SEXTANT_CUDA_CHANNEL=nccl: a communicator
// of one rank and its self-test).
TEST_P(CtsChannel, AGroupOfOneKeepsItsData) {
  CTS_BACKEND(b, 1);
  CTS_GROUP(g, b, 1, std::chrono::milliseconds(20'000));
  auto st = g.run([&](int) -> Status {
    Stream& s = *g.streams[0];
    Channel& c = *g.channels[0];
    EXPECT_EQ(c.rank(), 0);
    EXPECT_EQ(c.size(), 1);
    const std::vector<float> values = {1.5f, -2.0f, 3.25f, 1e6f};
    SX_ASSIGN_OR_RETURN(auto data, g.devices[0]->alloc(16));
    SX_ASSIGN_OR_RETURN(auto recv, g.devices[0]->alloc(16));
    SX_RETURN_IF_ERROR(upload_span<float>(s, *data, 0, values));
    SX_RETURN_IF_ERROR(s.fill(*recv, 0, 16, 0));
    SX_RETURN_IF_ERROR(c.all_reduce(s, {data.get(), 0}, 4, DType::kF32));
    SX_RETURN_IF_ERROR(c.broadcast(s, {data.get(), 0}, 16, 0));
    SX_RETURN_IF_ERROR(c.all_gather(s, {data.get(), 0}, {recv.get(), 0}, 16));
    SX_RETURN_IF_ERROR(c.barrier(s));
    std::vector<float> a(4), r(4);
    SX_RETURN_IF_ERROR(download_span<float>(s, std::span<float>(a), *data, 0));
    SX_RETURN_IF_ERROR(download_span<float>(s, std::span<float>(r), *recv, 0));
    SX_RETURN_IF_ERROR(s.sync());
    EXPECT_EQ(a, values);
    EXPECT_EQ(r, values);
    return ok_status();
  });
  EXPECT_TRUE(st[0].ok()) << st[0].to_string();
}

TEST_P(CtsChannel, AnAbortingRankFailsItsPeersPromptlyNamingItself) {
  const int n = 3;
  CTS_BACKEND(b, n);
  CTS_GROUP(g, b, n, std::chrono::milliseconds(30'000));
  const auto start = std::chrono::steady_clock::now();
  auto st = g.run([&](int r) -> Status {
    const auto ur = static_cast<std::size_t>(r);
    SX_ASSIGN_OR_RETURN(auto buf, g.devices[ur]->alloc(64));
    Stream& s = *g.streams[ur];
    if (r == 2) {
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
      const Status why = internal_error("disk on fire");
      g.channels[ur]->abort(why);
      return why;
    }
    SX_RETURN_IF_ERROR(g.channels[ur]->all_reduce(s, {buf.get(), 0}, 16, DType::kF32));
    return s.sync();
  });
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(), 5.0);
  for (int r : {0, 1}) {
    const Status& s = st[static_cast<std::size_t>(r)];
    ASSERT_FALSE(s.ok()) << "rank " << r;
    EXPECT_NE(s.message().find("rank 2"), std::string::npos) << s.to_string();
    EXPECT_NE(s.message().find("disk on fire"), std::string::npos) << s.to_string();
  }
}

// `n` appears in `text` as a number of its own (not a digit of another).
bool names_number(std::string_view text, int n) {
  const std::string d = std::to_string(n);
  for (std::size_t at = text.find(d); at != std::string_view::npos; at = text.find(d, at + 1)) {
    const bool left = at == 0 || !std::isdigit(static_cast<unsigned char>(text[at - 1]));
    const std::size_t end = at + d.size();
    const bool right = end == text.size() || !std::isdigit(static_cast<unsigned char>(text[end]));
    if (left && right) return true;
  }
  return false;
}

TEST_P(CtsChannel, AMissingRankTimesOutAndIsNamed) {
  const int n = 3;
  CTS_BACKEND(b, n);
  CTS_GROUP(g, b, n, std::chrono::milliseconds(300));
  auto st = g.run([&](int r) -> Status {
    const auto ur = static_cast<std::size_t>(r);
    if (r == 1) return ok_status();  // never joins
    SX_RETURN_IF_ERROR(g.channels[ur]->barrier(*g.streams[ur]));
    return g.streams[ur]->sync();
  });
  for (int r : {0, 2}) {
    const Status& s = st[static_cast<std::size_t>(r)];
    ASSERT_EQ(s.code(), StatusCode::kDeadlineExceeded) << s.to_string();
    EXPECT_TRUE(names_number(s.message(), 1)) << s.to_string();
    // The group by the name its creator gave, and the missing rank's device.
    EXPECT_NE(s.message().find(kGroupName), std::string::npos) << s.to_string();
    EXPECT_NE(s.message().find(g.devices[1]->info().name), std::string::npos) << s.to_string();
    if (r == 0) std::printf("%s: %s\n", GetParam().label, s.to_string().c_str());
  }
}

INSTANTIATE_TEST_SUITE_P(Backends, Cts, ::testing::ValuesIn(testing::targets()), testing::target_name);
INSTANTIATE_TEST_SUITE_P(Backends, CtsChannel, ::testing::ValuesIn(testing::targets()), testing::target_name);

}  // namespace
}  // namespace sx::hal
