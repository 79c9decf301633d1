// Buffered point-to-point transfers between the ranks of a group of CUDA devices in this process,
// for the module's channels (loopback_channel.h, nccl_channel.h). hal/channel.h says a send
// completes once its bytes are buffered; ncclSend instead holds the sender's stream until the peer
// receives, so a ring of sends-then-receives (pipeline stages passing activations both ways)
// would deadlock on the GPUs. Here the sender copies its bytes into a parcel on its own GPU
// (stream-ordered allocation) and records an event; the parcel's handle travels through the
// HostGroup's mailbox (order per pair, deadline, abort: host_group.h); the receiver's stream waits
// for that event, copies the parcel (a peer copy between GPUs) and records an event after which
// the sender frees the parcel (checked at its later sends, and at destruction).
//
// Threading: send from the sender's rank thread, recv from the receiver's.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "backends/common/host_group.h"
#include "runtime/base/status.h"

namespace sx::cuda {

class DeviceMail {
 public:
  // Rank i is on CUDA ordinal ordinals[i], named names[i] in errors.
  DeviceMail(backends::HostGroup& host, std::vector<int> ordinals, std::vector<std::string> names)
      : host_(host), ordinals_(std::move(ordinals)), names_(std::move(names)) {}
  ~DeviceMail();
  DeviceMail(const DeviceMail&) = delete;
  DeviceMail& operator=(const DeviceMail&) = delete;

  // Checks that every GPU of the group has stream-ordered memory pools (parcels come from the
  // default pool) and keeps freed pool memory mapped (release threshold: unlimited), so that a
  // step's parcels do not map and unmap memory at every sync. Parcels are activation-sized and not
  // in the memory plan.
  static Status prepare_pools(const std::vector<int>& ordinals, const std::vector<std::string>& names);

  // `bytes` at device address `p` of rank `from`, after the work enqueued on its stream `s`.
  Status send(int from, int to, cudaStream_t s, const std::byte* p, std::size_t bytes);
  // Into `p` of rank `to`, on its stream `s`: the next parcel `from` sent it, which must be
  // `bytes` long (INVALID_ARGUMENT naming both sizes otherwise). A parcel taken is always marked
  // so, whatever fails after, so that the next recv gets the next parcel and the sender frees it.
  Status recv(int from, int to, cudaStream_t s, std::byte* p, std::size_t bytes);

 private:
  struct Parcel {
    void* data = nullptr;
    std::size_t bytes = 0;
    int from = 0;
    cudaEvent_t ready = nullptr;     // recorded by the sender after its copy
    cudaEvent_t consumed = nullptr;  // recorded by the receiver after its copy (when `taken`)
    bool taken = false;
  };
  // Frees the parcels `from` sent whose receiving copy completed, on its stream `s`.
  void reclaim(int from, cudaStream_t s);
  static void release(Parcel& p, cudaStream_t s);

  backends::HostGroup& host_;
  const std::vector<int> ordinals_;
  const std::vector<std::string> names_;
  std::mutex mu_;
  std::map<std::uint64_t, Parcel> parcels_;  // sent and not freed yet, by handle
  std::uint64_t next_ = 0;
};

}  // namespace sx::cuda
