// Buffered point-to-point transfers between CUDA ranks (device_mail.h).
#include "backends/cuda/device_mail.h"

#include <cstring>
#include <span>

#include <fmt/format.h>

#include "backends/cuda/cuda_util.h"

namespace sx::cuda {

DeviceMail::~DeviceMail() {
  std::lock_guard<std::mutex> lock(mu_);
  for (auto& [handle, p] : parcels_) {
    (void)cudaSetDevice(ordinals_[static_cast<std::size_t>(p.from)]);
    // Whatever still reads or writes it completes first (the channels' streams were synced).
    if (p.taken) (void)cudaEventSynchronize(p.consumed);
    (void)cudaEventSynchronize(p.ready);
    release(p, nullptr);
    (void)cudaStreamSynchronize(nullptr);
  }
}

void DeviceMail::release(Parcel& p, cudaStream_t s) {
  if (p.data != nullptr) (void)cudaFreeAsync(p.data, s);
  if (p.ready != nullptr) (void)cudaEventDestroy(p.ready);
  if (p.consumed != nullptr) (void)cudaEventDestroy(p.consumed);
  p = Parcel{};
}

void DeviceMail::reclaim(int from, cudaStream_t s) {
  std::lock_guard<std::mutex> lock(mu_);
  for (auto it = parcels_.begin(); it != parcels_.end();) {
    Parcel& p = it->second;
    if (p.from == from && p.taken && cudaEventQuery(p.consumed) == cudaSuccess) {
      release(p, s);
      it = parcels_.erase(it);
    } else {
      ++it;
    }
  }
  (void)cudaGetLastError();  // a query's cudaErrorNotReady is not an error of the stream
}

Status DeviceMail::send(int from, int to, cudaStream_t s, const std::byte* src, std::size_t bytes) {
  const std::string& name = names_[static_cast<std::size_t>(from)];
  SX_RETURN_IF_ERROR(cuda_status(cudaSetDevice(ordinals_[static_cast<std::size_t>(from)]), name + ": send"));
  reclaim(from, s);
  Parcel p;
  p.from = from;
  p.bytes = bytes;
  Status st = cuda_status(cudaMallocAsync(&p.data, std::max<std::size_t>(bytes, 1), s),
                          fmt::format("{}: a parcel of {} bytes for rank {}", name, bytes, to));
  if (st.ok() && bytes > 0) {
    st = cuda_status(cudaMemcpyAsync(p.data, src, bytes, cudaMemcpyDeviceToDevice, s), name + ": send");
  }
  if (st.ok()) st = cuda_status(cudaEventCreateWithFlags(&p.ready, cudaEventDisableTiming), name + ": send");
  if (st.ok()) st = cuda_status(cudaEventRecord(p.ready, s), name + ": send");
  if (!st.ok()) {
    release(p, s);
    return st;
  }
  std::uint64_t handle = 0;
  {
    std::lock_guard<std::mutex> lock(mu_);
    handle = next_++;
    parcels_.emplace(handle, p);
  }
  std::byte token[sizeof handle];
  std::memcpy(token, &handle, sizeof handle);
  host_.send(from, to, token);
  return ok_status();
}

Status DeviceMail::recv(int from, int to, cudaStream_t s, std::byte* dst, std::size_t bytes) {
  const std::string& name = names_[static_cast<std::size_t>(to)];
  std::uint64_t handle = 0;
  std::byte token[sizeof handle];
  SX_RETURN_IF_ERROR(host_.recv(from, to, token));
  std::memcpy(&handle, token, sizeof handle);
  Parcel* p = nullptr;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = parcels_.find(handle);
    if (it == parcels_.end()) return internal_error("{}: recv: parcel {} from rank {} is gone", name, handle, from);
    p = &it->second;  // the sender frees it only once taken and consumed
  }
  // A parcel of another size is consumed unread (so that the sender frees it) and refused.
  const std::size_t sent = p->bytes;  // p may be freed by the sender once taken
  const bool mismatch = sent != bytes;
  const int dev = ordinals_[static_cast<std::size_t>(to)];
  SX_RETURN_IF_ERROR(cuda_status(cudaSetDevice(dev), name + ": recv"));
  cudaEvent_t consumed = nullptr;
  SX_RETURN_IF_ERROR(cuda_status(cudaEventCreateWithFlags(&consumed, cudaEventDisableTiming), name + ": recv"));
  Status st = cuda_status(cudaStreamWaitEvent(s, p->ready, 0), name + ": recv");
  if (st.ok() && bytes > 0 && !mismatch) {
    st = cuda_status(cudaMemcpyPeerAsync(dst, dev, p->data, ordinals_[static_cast<std::size_t>(from)], bytes, s),
                     fmt::format("{}: recv of {} bytes from {}", name, bytes, names_[static_cast<std::size_t>(from)]));
  }
  // Recorded even after a failed copy, so that the parcel is freed.
  const Status rec = cuda_status(cudaEventRecord(consumed, s), name + ": recv");
  {
    std::lock_guard<std::mutex> lock(mu_);
    p->consumed = consumed;
    p->taken = true;
  }
  if (mismatch) {
    return invalid_argument_error("recv: rank {} ({}) expected {} bytes from rank {} ({}), which sent {}", to, name,
                                  bytes, from, names_[static_cast<std::size_t>(from)], sent);
  }
  return st.ok() ? rec : st;
}

}  // namespace sx::cuda
