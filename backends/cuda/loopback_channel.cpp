// The loopback Channel (loopback_channel.h).
#include "backends/cuda/loopback_channel.h"

#include <cuda_runtime.h>

#include <chrono>
#include <condition_variable>
#include <cstring>
#include <mutex>
#include <functional>
#include <string>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "backends/common/host_group.h"
#include "backends/cuda/cuda_device.h"
#include "backends/cuda/cuda_util.h"
#include "backends/cuda/device_mail.h"
#include "runtime/base/log.h"
#include "kernels/launch.h"

namespace sx::cuda {

namespace {

// What the ranks of one group share.
struct LoopbackGroup {
  LoopbackGroup(std::vector<std::string> names, const hal::ChannelOptions& options, int ordinal_)
      : host(names, options), mail(host, std::vector<int>(names.size(), ordinal_), names), ordinal(ordinal_) {}
  ~LoopbackGroup() {
    (void)cudaSetDevice(ordinal);
    for (cudaEvent_t e : arrived) {
      if (e != nullptr) (void)cudaEventDestroy(e);
    }
    if (done != nullptr) (void)cudaEventDestroy(done);
  }
  backends::HostGroup host;
  DeviceMail mail;
  const int ordinal;
  // arrived[r]: recorded by rank r at each collective; done: by rank 0 after the work. Reused from
  // one collective to the next: rank r records `arrived` again only after it saw collective k's
  // `done` published (rank 0 had enqueued its wait on the old recording by then), and rank 0
  // records `done` again only after the meeting of collective k + 1, which every rank reaches
  // after enqueuing its wait on collective k's.
  std::vector<cudaEvent_t> arrived;
  cudaEvent_t done = nullptr;

  // Rank 0, after recording `done` for the collective of meeting `seq`: how its part went.
  void publish_done(std::uint64_t seq, const Status& st) {
    std::lock_guard<std::mutex> lock(mu);
    done_seq = seq + 1;
    done_status = st;
    cv.notify_all();
  }
  // Another rank: waits (up to the group's timeout) until rank 0 published `done` for `seq`
  // (`published`), and returns rank 0's status. A deadline (rank 0 stuck enqueuing) fails the
  // group and is returned with `published` false.
  Status wait_done(std::uint64_t seq, int rank, bool& published) {
    std::unique_lock<std::mutex> lock(mu);
    published = cv.wait_for(lock, timeout, [&] { return done_seq > seq; });
    if (!published) {
      lock.unlock();
      const Status late = deadline_exceeded_error("{}: rank {} waited {} ms for rank 0 to enqueue collective #{}",
                                                  group_name, rank, timeout.count(), seq);
      host.fail(late);
      return late;
    }
    return done_status;
  }
  std::string group_name;
  std::chrono::milliseconds timeout{60'000};
  std::mutex mu;
  std::condition_variable cv;
  std::uint64_t done_seq = 0;  // collectives of meetings below this have their `done` recorded
  Status done_status;
};

// A rank's operands, exchanged at the first meeting.
struct Slot {
  std::byte* a = nullptr;
  std::byte* b = nullptr;
};

class LoopbackChannel final : public hal::Channel {
 public:
  LoopbackChannel(std::shared_ptr<LoopbackGroup> g, int rank, hal::Device& device)
      : g_(std::move(g)), rank_(rank), device_(device) {}
  int rank() const override { return rank_; }
  int size() const override { return g_->host.size(); }

  Status all_reduce(hal::Stream& stream, hal::BufView data, std::int64_t count, hal::DType dtype) override {
    SX_RETURN_IF_ERROR(backends::HostGroup::check_reduce(count, dtype));
    const std::size_t bytes = static_cast<std::size_t>(count) * hal::dtype_info(dtype).block_bytes;
    SX_ASSIGN_OR_RETURN(std::byte * p, device_address(data, bytes, device_));
    if (size() == 1 || count == 0) return ok_status();
    return collective(stream, "all_reduce", {p, nullptr}, [&](cudaStream_t s, const std::vector<Slot>& slots) {
      kernels::RankBuffers b{};
      for (std::size_t r = 0; r < slots.size(); ++r) b.data[r] = slots[r].a;
      return cuda_status(kernels::launch_rank_sum(s, b, size(), count, dtype),
                         fmt::format("all_reduce of {} {} values", count, hal::dtype_name(dtype)));
    });
  }

  Status all_gather(hal::Stream& stream, hal::BufView send, hal::BufView recv, std::size_t bytes) override {
    const std::size_t n = static_cast<std::size_t>(size());
    SX_ASSIGN_OR_RETURN(std::byte * s_p, device_address(send, bytes, device_));
    SX_ASSIGN_OR_RETURN(std::byte * r_p, device_address(recv, bytes * n, device_));
    if (bytes == 0) return ok_status();
    if (n == 1) return copy_alone(stream, r_p, s_p, bytes);
    return collective(stream, "all_gather", {s_p, r_p}, [&](cudaStream_t s, const std::vector<Slot>& slots) {
      for (std::size_t to = 0; to < n; ++to) {
        for (std::size_t from = 0; from < n; ++from) {
          std::byte* dst = slots[to].b + from * bytes;
          if (dst == slots[from].a) continue;  // in place
          SX_RETURN_IF_ERROR(cuda_status(cudaMemcpyAsync(dst, slots[from].a, bytes, cudaMemcpyDeviceToDevice, s),
                                         "all_gather"));
        }
      }
      return ok_status();
    });
  }

  Status broadcast(hal::Stream& stream, hal::BufView data, std::size_t bytes, int root) override {
    SX_RETURN_IF_ERROR(g_->host.check_root(root));
    SX_ASSIGN_OR_RETURN(std::byte * p, device_address(data, bytes, device_));
    if (size() == 1 || bytes == 0) return ok_status();
    return collective(stream, "broadcast", {p, nullptr}, [&](cudaStream_t s, const std::vector<Slot>& slots) {
      const std::byte* src = slots[static_cast<std::size_t>(root)].a;
      for (const Slot& to : slots) {
        if (to.a == src) continue;
        SX_RETURN_IF_ERROR(cuda_status(cudaMemcpyAsync(to.a, src, bytes, cudaMemcpyDeviceToDevice, s), "broadcast"));
      }
      return ok_status();
    });
  }

  Status send(hal::Stream& stream, hal::BufView data, std::size_t bytes, int peer) override {
    SX_RETURN_IF_ERROR(g_->host.check_peer("send", rank_, peer));
    SX_ASSIGN_OR_RETURN(std::byte * p, device_address(data, bytes, device_));
    SX_ASSIGN_OR_RETURN(void* s, native_stream(stream));
    return g_->mail.send(rank_, peer, static_cast<cudaStream_t>(s), p, bytes);
  }

  Status recv(hal::Stream& stream, hal::BufView data, std::size_t bytes, int peer) override {
    SX_RETURN_IF_ERROR(g_->host.check_peer("recv", rank_, peer));
    SX_ASSIGN_OR_RETURN(std::byte * p, device_address(data, bytes, device_));
    SX_ASSIGN_OR_RETURN(void* s, native_stream(stream));
    return g_->mail.recv(peer, rank_, static_cast<cudaStream_t>(s), p, bytes);
  }

  Status barrier(hal::Stream& stream) override {
    if (size() == 1) return ok_status();
    return collective(stream, "barrier", {}, [](cudaStream_t, const std::vector<Slot>&) { return ok_status(); });
  }

  void abort(const Status& why) override { g_->host.abort(rank_, why); }

 private:
  using Work = std::function<Status(cudaStream_t, const std::vector<Slot>&)>;

  // The protocol of loopback_channel.h around `work`, which rank 0 enqueues on its stream.
  Status collective(hal::Stream& stream, const char* what, Slot mine, const Work& work) {
    const std::string where = fmt::format("{}: {}", device_.info().name, what);
    const std::uint64_t seq = seq_++;
    Status st = ok_status();
    cudaStream_t s = nullptr;
    if (Result<void*> sv = native_stream(stream); sv.ok()) {
      s = static_cast<cudaStream_t>(*sv);
    } else {
      st = sv.status();
    }
    if (st.ok()) st = cuda_status(cudaSetDevice(g_->ordinal), where);
    if (st.ok()) st = cuda_status(cudaEventRecord(g_->arrived[static_cast<std::size_t>(rank_)], s), where);
    if (!st.ok()) {
      g_->host.abort(rank_, st);  // the others would wait out the deadline otherwise
      return st;
    }
    const std::size_t n = static_cast<std::size_t>(size());
    std::vector<Slot> slots(n);
    SX_RETURN_IF_ERROR(g_->host.all_gather(rank_, seq, reinterpret_cast<const std::byte*>(&mine),
                                           reinterpret_cast<std::byte*>(slots.data()), sizeof(Slot)));
    // Past the meeting every rank's event is recorded and rank 0 enqueues the work. Whatever
    // happens to the group from here, each other rank's stream waits for `done` before it goes
    // on (rank 0's stream may be writing into its buffers), so rank 0 always records it and says
    // so, failed or not.
    if (rank_ == 0) {
      for (std::size_t r = 1; r < n && st.ok(); ++r) {
        st = cuda_status(cudaStreamWaitEvent(s, g_->arrived[r], 0), where);
      }
      if (st.ok()) st = work(s, slots);
      const Status rec = cuda_status(cudaEventRecord(g_->done, s), where);
      if (st.ok()) st = rec;
      g_->publish_done(seq, st);
      if (!st.ok()) g_->host.abort(rank_, st);
      return st;
    }
    bool published = false;
    const Status rank0 = g_->wait_done(seq, rank_, published);
    if (!published) return rank0;
    const Status waited = cuda_status(cudaStreamWaitEvent(s, g_->done, 0), where);
    if (!rank0.ok()) return rank0;
    return waited;
  }

  // A group of one: recv = send.
  Status copy_alone(hal::Stream& stream, std::byte* dst, const std::byte* src, std::size_t bytes) {
    if (dst == src) return ok_status();
    SX_ASSIGN_OR_RETURN(void* s, native_stream(stream));
    return cuda_status(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, static_cast<cudaStream_t>(s)),
                       "all_gather");
  }

  std::shared_ptr<LoopbackGroup> g_;
  int rank_;
  hal::Device& device_;
  std::uint64_t seq_ = 0;  // the HostGroup's sequence: one meeting per collective
};

}  // namespace

Result<std::vector<std::unique_ptr<hal::Channel>>> create_loopback_channels(std::span<hal::Device* const> devices,
                                                                             const hal::ChannelOptions& options) {
  if (devices.empty()) return invalid_argument_error("channel: a group needs at least one device");
  if (options.timeout.count() <= 0) return invalid_argument_error("channel: the timeout must be positive");
  if (devices.size() > static_cast<std::size_t>(kernels::kMaxLoopbackRanks)) {
    return invalid_argument_error("SEXTANT_CUDA_CHANNEL=loopback: {} ranks; the loopback channel takes at most {}",
                                  devices.size(), kernels::kMaxLoopbackRanks);
  }
  std::vector<std::string> names;
  const int ordinal = cuda_ordinal(*devices[0]);
  for (std::size_t i = 0; i < devices.size(); ++i) {
    for (std::size_t j = 0; j < i; ++j) {
      if (devices[j] == devices[i]) {
        return invalid_argument_error("channel: {} appears twice in the group", devices[i]->info().name);
      }
    }
    if (cuda_ordinal(*devices[i]) != ordinal) {
      return invalid_argument_error("SEXTANT_CUDA_CHANNEL=loopback: {} is on another GPU than {}; the loopback channel "
                                    "joins devices of one GPU (SEXTANT_CUDA_DEVICES=0x6), use nccl or staged",
                                    devices[i]->info().name, devices[0]->info().name);
    }
    names.push_back(devices[i]->info().name);
  }
  SX_RETURN_IF_ERROR(cuda_status(cudaSetDevice(ordinal), names[0]));
  SX_RETURN_IF_ERROR(DeviceMail::prepare_pools({ordinal}, {names[0]}));
  auto g = std::make_shared<LoopbackGroup>(names, options, ordinal);
  g->arrived.assign(devices.size(), nullptr);
  for (cudaEvent_t& e : g->arrived) {
    SX_RETURN_IF_ERROR(cuda_status(cudaEventCreateWithFlags(&e, cudaEventDisableTiming), "loopback channel: an event"));
  }
  SX_RETURN_IF_ERROR(cuda_status(cudaEventCreateWithFlags(&g->done, cudaEventDisableTiming), "loopback channel: an event"));
  const std::string group_name = options.name.empty() ? fmt::format("channel of {} ranks", devices.size()) : options.name;
  g->group_name = group_name;
  g->timeout = options.timeout;
  log_info("{}: loopback collectives on GPU {} between {}", group_name, ordinal, fmt::join(names, ", "));
  std::vector<std::unique_ptr<hal::Channel>> out;
  for (std::size_t i = 0; i < devices.size(); ++i) {
    out.push_back(std::make_unique<LoopbackChannel>(g, static_cast<int>(i), *devices[i]));
  }
  return out;
}

}  // namespace sx::cuda
