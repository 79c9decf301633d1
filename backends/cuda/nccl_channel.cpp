// The NCCL Channel (nccl_channel.h).
#include "backends/cuda/nccl_channel.h"

#include <cuda_runtime.h>

#include <chrono>
#include <cstdlib>
#include <atomic>
#include <mutex>
#include <set>
#include <thread>

#include <fmt/format.h>

#include "backends/common/host_group.h"
#include "backends/cuda/collective_watch.h"
#include "backends/cuda/cuda_device.h"
#include "backends/cuda/cuda_util.h"
#include "backends/cuda/device_mail.h"
#include "kernels/launch.h"
#include "runtime/base/log.h"

namespace sx::cuda {

namespace {

class NcclRankComm final : public RankComm {
 public:
  NcclRankComm(const NcclApi& api, NcclApi::Comm comm) : api_(api), comm_(comm) {}
  Status async_error() override {
    int e = kNcclSuccess;
    const int r = api_.comm_get_async_error(comm_, &e);
    if (r != kNcclSuccess) return internal_error("ncclCommGetAsyncError: {}", nccl_error(api_, r, comm_));
    if (e != kNcclSuccess && e != kNcclInProgress) return internal_error("{}", nccl_error(api_, e, comm_));
    return ok_status();
  }
  // ncclCommAbort frees the communicator (all of the process's once all are aborted): at most once,
  // never followed by ncclCommDestroy, and never while a call of the rank's thread is inside NCCL
  // on it (freed under it). Abort waits up to kAbortWait for such a call to return; a call still
  // inside (hung on the host: with blocking communicators only the lazy connection set-up waits
  // there) is left to abort when it returns, and the group has failed meanwhile all the same
  // (CollectiveWatch::status), so the other ranks are told at once.
  void abort() override {
    if (aborted_) return;
    std::unique_lock<std::timed_mutex> lock(call_mu_, std::defer_lock);
    if (!lock.try_lock_for(kAbortWait)) {
      abort_pending_ = true;
      return;
    }
    abort_locked();
  }
  bool aborted() const { return aborted_; }
  NcclApi::Comm comm() const { return comm_; }
  // `c(comm)` (an NCCL call on this communicator) unless it was aborted: kNcclAborted then. A
  // failed call's message (nccl_error, read while the communicator is certainly alive) goes to
  // `error`.
  template <typename Call>
  int call(Call c, std::string& error) {
    std::lock_guard<std::timed_mutex> lock(call_mu_);
    if (aborted_) return kNcclAborted;
    const int r = c(comm_);
    if (r != kNcclSuccess && r != kNcclInProgress) error = nccl_error(api_, r, comm_);
    if (abort_pending_) abort_locked();
    return r;
  }
  static constexpr int kNcclAborted = -1;

 private:
  void abort_locked() {
    if (!aborted_.exchange(true)) (void)api_.comm_abort(comm_);
  }
  static constexpr std::chrono::milliseconds kAbortWait{1000};
  const NcclApi& api_;
  NcclApi::Comm comm_;
  std::timed_mutex call_mu_;
  std::atomic<bool> aborted_{false}, abort_pending_{false};
};

// What the ranks of one group share: the communicators (destroyed with the last rank's channel),
// the watch, and the buffered point-to-point transfers (device_mail.h: ncclSend would hold the
// sender's stream until the peer receives).
struct NcclGroup {
  NcclGroup(std::vector<std::string> names, const hal::ChannelOptions& options, std::vector<int> ordinals)
      : host(names, options), mail(host, std::move(ordinals), names) {}
  const NcclApi* api = nullptr;
  std::vector<std::unique_ptr<NcclRankComm>> comms;
  std::unique_ptr<CollectiveWatch> watch;
  backends::HostGroup host;
  DeviceMail mail;
  std::atomic<bool> abandoned{false};  // a channel went with collectives of its own in flight
  ~NcclGroup() {
    // Collectives still in flight (a rank that stopped without abort): destroying would wait for
    // them, so abort instead.
    const bool busy = abandoned || (watch != nullptr && watch->in_flight() > 0);
    watch.reset();  // no more polling of the communicators
    for (auto& c : comms) {
      if (busy) c->abort();
      if (!c->aborted()) (void)api->comm_destroy(c->comm());
    }
  }
};

// The NCCL_* settings in effect, for the log and messages: "NCCL 2.28.9 (NCCL_P2P_DISABLE=1)".
std::string nccl_settings(const NcclApi& api) {
  const std::string set = nccl_environment();
  return fmt::format("NCCL {}{}", nccl_version_string(api.version), set.empty() ? "" : " (" + set + ")");
}

class NcclChannel final : public hal::Channel {
 public:
  NcclChannel(std::shared_ptr<NcclGroup> group, int rank, int size, hal::Device& device, int ordinal,
              std::unique_ptr<hal::Buffer> scratch)
      : g_(std::move(group)), rank_(rank), size_(size), device_(device), ordinal_(ordinal),
        scratch_(std::move(scratch)) {}
  ~NcclChannel() override {
    // Its done() functions refer to this channel; collectives still in flight make the group
    // abort its communicators rather than destroy them (which would wait for them).
    if (g_->watch->forget(rank_) > 0) g_->abandoned = true;
    (void)cudaSetDevice(ordinal_);
    std::lock_guard<std::mutex> lock(events_mu_);
    for (cudaEvent_t e : free_events_) (void)cudaEventDestroy(e);
  }
  int rank() const override { return rank_; }
  int size() const override { return size_; }

  // F16 / BF16 are widened into F32 on the device, summed as F32 and rounded once (hal/channel.h;
  // NCCL's own half sums would round at every step).
  Status all_reduce(hal::Stream& stream, hal::BufView data, std::int64_t count, hal::DType dtype) override {
    SX_RETURN_IF_ERROR(backends::HostGroup::check_reduce(count, dtype));
    const std::size_t bytes = static_cast<std::size_t>(count) * hal::dtype_info(dtype).block_bytes;
    SX_ASSIGN_OR_RETURN(std::byte * p, device_address(data, bytes, device_));
    if (size_ == 1 || count == 0) return ok_status();
    const auto n = static_cast<std::size_t>(count);
    if (dtype == hal::DType::kF32) {
      return issue(stream, "all_reduce", bytes, [&](NcclApi::Comm c, void* s) {
        return g_->api->all_reduce(p, p, n, kNcclFloat32, kNcclSum, c, s);
      });
    }
    SX_ASSIGN_OR_RETURN(void* sv, native_stream(stream));
    const auto s = static_cast<cudaStream_t>(sv);
    SX_RETURN_IF_ERROR(cuda_status(cudaSetDevice(ordinal_), device_.info().name));
    float* wide = nullptr;
    SX_RETURN_IF_ERROR(cuda_status(cudaMallocAsync(reinterpret_cast<void**>(&wide), n * 4, s),
                                   fmt::format("{}: all_reduce: {} bytes to widen into", device_.info().name, n * 4)));
    Status st = cuda_status(kernels::launch_widen(s, p, dtype, wide, count), "all_reduce: widening");
    if (st.ok()) {
      st = issue(stream, "all_reduce", n * 4, [&](NcclApi::Comm c, void* sp) {
        return g_->api->all_reduce(wide, wide, n, kNcclFloat32, kNcclSum, c, sp);
      });
    }
    if (st.ok()) st = cuda_status(kernels::launch_narrow(s, wide, dtype, p, count), "all_reduce: narrowing");
    const Status freed = cuda_status(cudaFreeAsync(wide, s), "all_reduce");
    return st.ok() ? freed : st;
  }
  Status all_gather(hal::Stream& stream, hal::BufView send, hal::BufView recv, std::size_t bytes) override {
    SX_ASSIGN_OR_RETURN(std::byte * s_p, device_address(send, bytes, device_));
    SX_ASSIGN_OR_RETURN(std::byte * r_p, device_address(recv, bytes * static_cast<std::size_t>(size_), device_));
    if (size_ == 1) return copy_on(stream, r_p, s_p, bytes);
    if (bytes == 0) return ok_status();
    return issue(stream, "all_gather", bytes * static_cast<std::size_t>(size_),
                 [&](NcclApi::Comm c, void* s) { return g_->api->all_gather(s_p, r_p, bytes, kNcclUint8, c, s); });
  }
  Status broadcast(hal::Stream& stream, hal::BufView data, std::size_t bytes, int root) override {
    if (root < 0 || root >= size_) return invalid_argument_error("broadcast: root {} of {} ranks", root, size_);
    if (size_ == 1 || bytes == 0) return ok_status();
    SX_ASSIGN_OR_RETURN(std::byte * p, device_address(data, bytes, device_));
    return issue(stream, "broadcast", bytes,
                 [&](NcclApi::Comm c, void* s) { return g_->api->broadcast(p, p, bytes, kNcclUint8, root, c, s); });
  }
  // Buffered (device_mail.h), beside NCCL: a send never holds the stream for its receiver.
  Status send(hal::Stream& stream, hal::BufView data, std::size_t bytes, int peer) override {
    SX_RETURN_IF_ERROR(g_->host.check_peer("send", rank_, peer));
    SX_RETURN_IF_ERROR(g_->watch->status());
    SX_ASSIGN_OR_RETURN(std::byte * p, device_address(data, bytes, device_));
    SX_ASSIGN_OR_RETURN(void* s, native_stream(stream));
    return failing_group(g_->mail.send(rank_, peer, static_cast<cudaStream_t>(s), p, bytes));
  }
  Status recv(hal::Stream& stream, hal::BufView data, std::size_t bytes, int peer) override {
    SX_RETURN_IF_ERROR(g_->host.check_peer("recv", rank_, peer));
    SX_RETURN_IF_ERROR(g_->watch->status());
    SX_ASSIGN_OR_RETURN(std::byte * p, device_address(data, bytes, device_));
    SX_ASSIGN_OR_RETURN(void* s, native_stream(stream));
    return failing_group(g_->mail.recv(peer, rank_, static_cast<cudaStream_t>(s), p, bytes));
  }
  Status barrier(hal::Stream& stream) override {
    if (size_ == 1) return ok_status();
    return all_reduce(stream, {scratch_.get(), 0}, 1, hal::DType::kF32);
  }
  // The watch fails the collectives; the mailbox's waiters (a recv) wake too.
  void abort(const Status& why) override {
    g_->watch->fail(rank_, why);
    g_->host.abort(rank_, why);
  }

 private:
  NcclRankComm& comm() const { return *g_->comms[static_cast<std::size_t>(rank_)]; }
  // A point-to-point failure (a deadline in the mailbox, a CUDA error) fails the collectives too.
  Status failing_group(Status st) {
    if (!st.ok()) g_->watch->fail(rank_, st);
    return st;
  }

  // Enqueues `call(comm, stream)` on the rank's CUDA stream (after its deferred ops), then an
  // event the watch polls until the collective completed.
  template <typename Call>
  Status issue(hal::Stream& stream, const char* what, std::size_t bytes, Call call) {
    SX_RETURN_IF_ERROR(g_->watch->status());
    SX_ASSIGN_OR_RETURN(void* s, native_stream(stream));
    if (checked_.insert(&stream).second) {
      // A collective aborted on the device ends without a CUDA error: the stream's sync reports
      // the group's failure instead.
      add_sync_check(stream, [g = g_] { return g->watch->status(); });
    }
    SX_RETURN_IF_ERROR(cuda_status(cudaSetDevice(ordinal_), fmt::format("{}: {}", device_.info().name, what)));
    SX_ASSIGN_OR_RETURN(cudaEvent_t ev, take_event());
    // Watched from before the call: a call that blocks on the host waiting for a peer (NCCL
    // connects lazily) is under the deadline too, and the abort unblocks it.
    auto recorded = std::make_shared<std::atomic<bool>>(false);
    g_->watch->watch(rank_, what, bytes, [this, ev, recorded] {
      if (!recorded->load()) return false;
      (void)cudaSetDevice(ordinal_);
      if (cudaEventQuery(ev) == cudaErrorNotReady) return false;
      std::lock_guard<std::mutex> lock(events_mu_);
      free_events_.push_back(ev);  // done (or failed: the stream's sync reports that)
      return true;
    });
    std::string error;
    const int r = comm().call([&](NcclApi::Comm c) { return call(c, s); }, error);
    if (r == NcclRankComm::kNcclAborted) return g_->watch->status();
    if (r != kNcclSuccess && r != kNcclInProgress) {
      g_->watch->fail(rank_, internal_error("{}: {} of {} bytes: {}", device_.info().name, what, bytes, error));
      return g_->watch->status();
    }
    if (Status st = cuda_status(cudaEventRecord(ev, static_cast<cudaStream_t>(s)), what); !st.ok()) {
      g_->watch->fail(rank_, st);  // the peers would wait out the deadline otherwise
      return g_->watch->status();
    }
    recorded->store(true);
    return ok_status();
  }
  Result<cudaEvent_t> take_event() {
    {
      std::lock_guard<std::mutex> lock(events_mu_);
      if (!free_events_.empty()) {
        cudaEvent_t e = free_events_.back();
        free_events_.pop_back();
        return e;
      }
    }
    cudaEvent_t e = nullptr;
    SX_RETURN_IF_ERROR(cuda_status(cudaEventCreateWithFlags(&e, cudaEventDisableTiming), "an event for a collective"));
    return e;
  }
  Status copy_on(hal::Stream& stream, std::byte* dst, const std::byte* src, std::size_t bytes) {
    if (bytes == 0 || dst == src) return ok_status();
    SX_ASSIGN_OR_RETURN(void* s, native_stream(stream));
    return cuda_status(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, static_cast<cudaStream_t>(s)),
                       "all_gather");
  }

  std::shared_ptr<NcclGroup> g_;
  int rank_, size_;
  hal::Device& device_;
  int ordinal_;
  std::unique_ptr<hal::Buffer> scratch_;  // barrier's 4 bytes
  std::mutex events_mu_;
  std::vector<cudaEvent_t> free_events_;
  std::set<const hal::Stream*> checked_;  // streams whose sync reports the group's failure
};

// Peer access and P2P performance rank of every pair, for the log (what NCCL will find).
std::string p2p_facts(const std::vector<int>& ordinals) {
  std::string out;
  for (std::size_t i = 0; i < ordinals.size(); ++i) {
    for (std::size_t j = i + 1; j < ordinals.size(); ++j) {
      int access = 0, rank = -1;
      (void)cudaDeviceCanAccessPeer(&access, ordinals[i], ordinals[j]);
      (void)cudaDeviceGetP2PAttribute(&rank, cudaDevP2PAttrPerformanceRank, ordinals[i], ordinals[j]);
      (void)cudaGetLastError();
      out += fmt::format("{}GPU {}-{}: {}", out.empty() ? "" : "; ", ordinals[i], ordinals[j],
                         access != 0 ? fmt::format("peer access, performance rank {}", rank) : "no peer access");
    }
  }
  return out;
}

// All-reduces of a few sizes on every rank at once, sums checked, time limited: the group proves
// its devices can talk before the model is loaded.
Status self_test(const NcclApi& api, NcclGroup& g, const std::vector<int>& ordinals,
                 const std::vector<std::string>& names, std::chrono::milliseconds limit, const std::string& settings) {
  const std::size_t n = ordinals.size();
  std::vector<cudaStream_t> streams(n, nullptr);
  std::vector<float*> bufs(n, nullptr);
  constexpr std::size_t kMaxFloats = std::size_t{16} << 20;  // 64 MiB
  Status st = ok_status();
  auto cleanup = [&] {
    for (std::size_t r = 0; r < n; ++r) {
      (void)cudaSetDevice(ordinals[r]);
      if (bufs[r] != nullptr) (void)cudaFree(bufs[r]);
      if (streams[r] != nullptr) (void)cudaStreamDestroy(streams[r]);
    }
  };
  for (std::size_t r = 0; r < n && st.ok(); ++r) {
    st = cuda_status(cudaSetDevice(ordinals[r]), names[r]);
    if (st.ok()) st = cuda_status(cudaStreamCreateWithFlags(&streams[r], cudaStreamNonBlocking), names[r]);
    if (st.ok()) st = cuda_status(cudaMalloc(reinterpret_cast<void**>(&bufs[r]), kMaxFloats * 4), names[r] + ": self-test");
  }
  std::string report;
  for (const std::size_t floats : {std::size_t{1024}, std::size_t{256} << 10, kMaxFloats}) {
    if (!st.ok()) break;
    for (std::size_t r = 0; r < n && st.ok(); ++r) {
      const std::vector<float> fill(floats, static_cast<float>(r + 1));
      st = cuda_status(cudaSetDevice(ordinals[r]), names[r]);
      if (st.ok()) st = cuda_status(cudaMemcpy(bufs[r], fill.data(), floats * 4, cudaMemcpyHostToDevice), names[r]);
    }
    if (!st.ok()) break;
    const auto t0 = std::chrono::steady_clock::now();
    int res = api.group_start();
    if (res == kNcclSuccess) {
      for (std::size_t r = 0; r < n && res == kNcclSuccess; ++r) {
        res = api.all_reduce(bufs[r], bufs[r], floats, kNcclFloat32, kNcclSum, g.comms[r]->comm(), streams[r]);
      }
      const int end = api.group_end();
      if (res == kNcclSuccess) res = end;
    }
    if (res != kNcclSuccess && res != kNcclInProgress) {
      st = unavailable_error("NCCL self-test: all_reduce of {} bytes on {}: {}", floats * 4, fmt::join(names, ", "),
                             nccl_error(api, res, nullptr));
      break;
    }
    // Wait with a limit: a hang here is the seed's "NCCL hangs on PCIe/SYS" night.
    for (std::size_t r = 0; r < n && st.ok(); ++r) {
      (void)cudaSetDevice(ordinals[r]);
      while (true) {
        const cudaError_t q = cudaStreamQuery(streams[r]);
        if (q == cudaSuccess) break;
        if (q != cudaErrorNotReady) {
          st = cuda_status(q, names[r] + ": NCCL self-test");
          break;
        }
        if (std::chrono::steady_clock::now() - t0 > limit) {
          for (const auto& c : g.comms) c->abort();
          st = deadline_exceeded_error(
              "NCCL self-test: an all_reduce of {} bytes over {} did not finish within {} ms ({} waited first); "
              "over {}. The devices cannot talk as NCCL set them up: check nvidia-smi topo -m, try "
              "NCCL_P2P_DISABLE=1 or NCCL_P2P_LEVEL=PHB, or place the group on GPUs with better links",
              floats * 4, fmt::join(names, ", "), limit.count(), names[r], settings);
          break;
        }
        std::this_thread::sleep_for(std::chrono::microseconds(50));
      }
    }
    if (!st.ok()) break;
    const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    const float want = static_cast<float>(n * (n + 1) / 2);
    for (std::size_t r = 0; r < n && st.ok(); ++r) {
      std::vector<float> got(floats);
      (void)cudaSetDevice(ordinals[r]);
      st = cuda_status(cudaMemcpy(got.data(), bufs[r], floats * 4, cudaMemcpyDeviceToHost), names[r]);
      for (std::size_t i = 0; st.ok() && i < floats; ++i) {
        if (got[i] != want) {
          st = internal_error("NCCL self-test: after an all_reduce of {} bytes, {} holds {} at element {}, not {} "
                              "(over {})",
                              floats * 4, names[r], got[i], i, want, settings);
        }
      }
    }
    const double bus = static_cast<double>(floats * 4) * 2.0 * static_cast<double>(n - 1) / static_cast<double>(n) / secs;
    report += fmt::format("{}{} KiB in {:.3f} ms ({:.1f} GB/s bus)", report.empty() ? "" : ", ", floats * 4 / 1024,
                          secs * 1e3, bus / 1e9);
  }
  cleanup();
  if (st.ok()) log_info("NCCL self-test of {}: all_reduce {}", fmt::join(names, ", "), report);
  return st;
}

}  // namespace

Result<std::vector<std::unique_ptr<hal::Channel>>> create_nccl_channels(const NcclApi& api,
                                                                         std::span<hal::Device* const> devices,
                                                                         const hal::ChannelOptions& options) {
  const std::size_t n = devices.size();
  std::vector<int> ordinals;
  std::vector<std::string> names;
  for (hal::Device* d : devices) {
    ordinals.push_back(cuda_ordinal(*d));
    names.push_back(d->info().name);
  }
  const std::string settings = nccl_settings(api);
  SX_RETURN_IF_ERROR(DeviceMail::prepare_pools(ordinals, names));
  const std::string group_name = options.name.empty() ? fmt::format("channel of {} ranks", n) : options.name;
  log_info("{}: {} over {}; {}", group_name, settings, fmt::join(names, ", "), p2p_facts(ordinals));
  // NCCL's own memory, measured on each GPU around the set-up (the memory plan reserved
  // nccl_reserve_bytes for it).
  std::vector<std::size_t> free_before(n, 0);
  for (std::size_t r = 0; r < n; ++r) {
    std::size_t total = 0;
    if (cudaSetDevice(ordinals[r]) != cudaSuccess || cudaMemGetInfo(&free_before[r], &total) != cudaSuccess) {
      (void)cudaGetLastError();
    }
  }
  std::vector<NcclApi::Comm> comms(n, nullptr);
  if (const int r = api.comm_init_all(comms.data(), static_cast<int>(n), ordinals.data()); r != kNcclSuccess) {
    return unavailable_error("{}: ncclCommInitAll over {}: {} ({})", group_name, fmt::join(names, ", "),
                             nccl_error(api, r, nullptr), settings);
  }
  auto group = std::make_shared<NcclGroup>(names, options, ordinals);
  group->api = &api;
  std::vector<RankComm*> raw;
  for (NcclApi::Comm c : comms) {
    group->comms.push_back(std::make_unique<NcclRankComm>(api, c));
    raw.push_back(group->comms.back().get());
  }
  // The self-test first (its first size includes NCCL's connection set-up: a budget of its own),
  // then the watch. A failed test aborts the communicators (some may still be running).
  if (Status st = self_test(api, *group, ordinals, names, std::max(options.timeout, std::chrono::milliseconds(30'000)),
                            settings);
      !st.ok()) {
    for (auto& c : group->comms) c->abort();
    return st;
  }
  std::string took;
  for (std::size_t r = 0; r < n; ++r) {
    std::size_t now = 0, total = 0;
    if (cudaSetDevice(ordinals[r]) != cudaSuccess || cudaMemGetInfo(&now, &total) != cudaSuccess) {
      (void)cudaGetLastError();
      continue;
    }
    took += fmt::format("{}{} {} MiB", took.empty() ? "" : ", ", names[r],
                        (static_cast<long long>(free_before[r]) - static_cast<long long>(now)) / (1 << 20));
  }
  log_info("{}: NCCL took {} (the memory plan reserved {} MiB per GPU)", group_name, took,
           nccl_reserve_bytes(static_cast<int>(n), "nccl", std::getenv("NCCL_BUFFSIZE")) >> 20);
  // A failed group also fails its point-to-point mailbox (a rank waiting in recv is told at once).
  backends::HostGroup* host = &group->host;
  group->watch = std::make_unique<CollectiveWatch>(
      WatchedGroup{group_name, names, settings, options.timeout, [host](const Status& why) { host->fail(why); }}, raw);
  std::vector<std::unique_ptr<hal::Channel>> out;
  for (std::size_t r = 0; r < n; ++r) {
    SX_ASSIGN_OR_RETURN(std::unique_ptr<hal::Buffer> scratch, devices[r]->alloc(4, hal::BufferUsage::kDevice));
    out.push_back(std::make_unique<NcclChannel>(group, static_cast<int>(r), static_cast<int>(n), *devices[r],
                                                ordinals[r], std::move(scratch)));
  }
  return out;
}

}  // namespace sx::cuda
