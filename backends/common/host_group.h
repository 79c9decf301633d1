// Collectives between the rank threads of one process over host memory (hal/channel.h), for the
// channels of backends that run them on the host: the CPU's, whose device memory is the host's,
// and the Vulkan backend's, which stages each operand through a host-visible buffer around a
// Stream::host_call. A channel calls these from inside its stream's work (the CPU's queue, a host
// call), with the rank's bytes in host memory and the collective's sequence number (how many
// collectives the rank issued before it: the same on every rank).
//
// Each collective stages every rank's contribution in group-owned host memory (a rank never
// touches another rank's bytes), meets at a barrier, and each rank then computes or copies what it
// needs. all_reduce: rank r sums elements [r*n/N, (r+1)*n/N) of all contributions in rank order
// into a shared result, a second barrier, then every rank copies the whole result; so every
// element is added in the same order on every rank and run (exact, and within channel.h's bound).
// Staging is double-buffered by sequence number, so no trailing barrier is needed. Waiting uses a
// condition variable with the group's deadline; abort() wakes every waiter at once. Errors name
// the group (ChannelOptions::name) and ranks with their devices: "tp group of stage 1: rank 0 on
// cpu:3 waited 100 ms in all_reduce #7 for rank 2 on cpu:5, which never arrived ...".
//
// Threading: each rank's calls from one thread; abort() from any.
#pragma once

#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <mutex>
#include <span>
#include <string>
#include <vector>

#include "runtime/base/status.h"
#include "runtime/hal/channel.h"
#include "runtime/hal/dtype.h"

namespace sx::backends {

class HostGroup {
 public:
  // One rank per device name (rank order).
  HostGroup(std::vector<std::string> device_names, hal::ChannelOptions options);
  int size() const { return n_; }

  // In place over `count` elements of `dtype` (f32, f16 or bf16; checked by check_reduce).
  Status all_reduce(int rank, std::uint64_t seq, std::byte* data, std::int64_t count, hal::DType dtype);
  // recv (size() x bytes) = every rank's `bytes` of send, rank order.
  Status all_gather(int rank, std::uint64_t seq, const std::byte* send, std::byte* recv, std::size_t bytes);
  Status broadcast(int rank, std::uint64_t seq, std::byte* data, std::size_t bytes, int root);
  Status barrier(int rank, std::uint64_t seq);
  // Point to point, in order per (from, to): send buffers the bytes; recv waits for them and
  // fails when the sizes differ.
  void send(int from, int to, std::span<const std::byte> data);
  Status recv(int from, int to, std::span<std::byte> data);
  void abort(int rank, const Status& why);
  // Fails the group with `why` as it is (a failure found outside it, e.g. by an NCCL watch); the
  // first failure wins.
  void fail(const Status& why);

  // The argument checks every channel over a HostGroup makes at enqueue.
  static Status check_reduce(std::int64_t count, hal::DType dtype);
  Status check_root(int root) const;
  Status check_peer(const char* what, int rank, int peer) const;

 private:
  // Waits until every rank has arrived (or the group fails). `what` names the collective.
  Status arrive_and_wait(int rank, const std::string& what);
  Result<std::vector<std::byte>> take(int from, int to);
  std::vector<std::byte>& staging(std::uint64_t seq, int rank) {
    return staging_[seq % 2][static_cast<std::size_t>(rank)];
  }
  std::vector<float>& result(std::uint64_t seq) { return result_[seq % 2]; }
  void fail_locked(Status s);
  // "tp group of stage 1", or "channel of 3 ranks" when the creator gave no name.
  std::string group_name() const;
  // "rank 2 on cpu:5": a rank of this group and its device.
  std::string who(int rank) const;

  const int n_;
  const hal::ChannelOptions options_;
  const std::vector<std::string> names_;  // device of each rank
  std::mutex mu_;
  std::condition_variable cv_;
  std::uint64_t generation_ = 0;
  int arrived_ = 0;
  std::vector<bool> here_;
  bool failed_ = false;
  Status failure_;
  std::vector<std::vector<std::byte>> staging_[2];
  std::vector<float> result_[2];
  std::vector<std::deque<std::vector<std::byte>>> mail_;  // [from * n + to]
};

}  // namespace sx::backends
