// The loopback Channel (loopback_channel.h).
#include "backends/cuda/loopback_channel.h"

#include <cuda_runtime.h>

#include <cstring>
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
  // one collective to the next: a rank records again only after the meeting that ended the
  // previous collective, by when every wait on the old recording has been enqueued.
  std::vector<cudaEvent_t> arrived;
  cudaEvent_t done = nullptr;
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
    SX_ASSIGN_OR_RETURN(void* sv, native_stream(stream));
    const auto s = static_cast<cudaStream_t>(sv);
    const std::string where = fmt::format("{}: {}", device_.info().name, what);
    Status st = cuda_status(cudaSetDevice(g_->ordinal), where);
    if (st.ok()) st = cuda_status(cudaEventRecord(g_->arrived[static_cast<std::size_t>(rank_)], s), where);
    if (!st.ok()) {
      g_->host.abort(rank_, st);  // the others would wait out the deadline otherwise
      return st;
    }
    const std::size_t n = static_cast<std::size_t>(size());
    std::vector<Slot> slots(n);
    SX_RETURN_IF_ERROR(g_->host.all_gather(rank_, seq_++, reinterpret_cast<const std::byte*>(&mine),
                                           reinterpret_cast<std::byte*>(slots.data()), sizeof(Slot)));
    if (rank_ == 0) {
      for (std::size_t r = 1; r < n && st.ok(); ++r) {
        st = cuda_status(cudaStreamWaitEvent(s, g_->arrived[r], 0), where);
      }
      if (st.ok()) st = work(s, slots);
      if (st.ok()) st = cuda_status(cudaEventRecord(g_->done, s), where);
      if (!st.ok()) {
        g_->host.abort(rank_, st);
        return st;
      }
    }
    SX_RETURN_IF_ERROR(g_->host.barrier(rank_, seq_++));
    if (rank_ != 0) return cuda_status(cudaStreamWaitEvent(s, g_->done, 0), where);
    return ok_status();
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
  std::uint64_t seq_ = 0;  // the HostGroup's sequence: two meetings per collective
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
  int pools = 0;
  SX_RETURN_IF_ERROR(cuda_status(cudaSetDevice(ordinal), names[0]));
  SX_RETURN_IF_ERROR(cuda_status(cudaDeviceGetAttribute(&pools, cudaDevAttrMemoryPoolsSupported, ordinal), names[0]));
  if (pools == 0) {
    return unimplemented_error("SEXTANT_CUDA_CHANNEL=loopback: {} has no stream-ordered memory pools (send/recv "
                               "buffers need them); use SEXTANT_CUDA_CHANNEL=staged",
                               names[0]);
  }
  auto g = std::make_shared<LoopbackGroup>(names, options, ordinal);
  g->arrived.assign(devices.size(), nullptr);
  for (cudaEvent_t& e : g->arrived) {
    SX_RETURN_IF_ERROR(cuda_status(cudaEventCreateWithFlags(&e, cudaEventDisableTiming), "loopback channel: an event"));
  }
  SX_RETURN_IF_ERROR(cuda_status(cudaEventCreateWithFlags(&g->done, cudaEventDisableTiming), "loopback channel: an event"));
  const std::string group_name = options.name.empty() ? fmt::format("channel of {} ranks", devices.size()) : options.name;
  log_info("{}: loopback collectives on GPU {} between {}", group_name, ordinal, fmt::join(names, ", "));
  std::vector<std::unique_ptr<hal::Channel>> out;
  for (std::size_t i = 0; i < devices.size(); ++i) {
    out.push_back(std::make_unique<LoopbackChannel>(g, static_cast<int>(i), *devices[i]));
  }
  return out;
}

}  // namespace sx::cuda
