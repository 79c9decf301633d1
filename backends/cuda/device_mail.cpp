// Buffered point-to-point transfers between CUDA ranks (device_mail.h).
#include "backends/cuda/device_mail.h"

#include <cstring>
#include <span>

#include <fmt/format.h>

#include "backends/cuda/cuda_util.h"

namespace sx::cuda {

Status DeviceMail::prepare_pools(const std::vector<int>& ordinals, const std::vector<std::string>& names) {
  for (std::size_t i = 0; i < ordinals.size(); ++i) {
    int pools = 0;
    SX_RETURN_IF_ERROR(cuda_status(cudaDeviceGetAttribute(&pools, cudaDevAttrMemoryPoolsSupported, ordinals[i]),
                                   names[i]));
    if (pools == 0) {
      return unimplemented_error("{}: no stream-ordered memory pools (the channel's send/recv buffers need them); use "
                                 "SEXTANT_CUDA_CHANNEL=staged",
                                 names[i]);
    }
    cudaMemPool_t pool = nullptr;
    SX_RETURN_IF_ERROR(cuda_status(cudaDeviceGetDefaultMemPool(&pool, ordinals[i]), names[i]));
    std::uint64_t keep = UINT64_MAX;
    SX_RETURN_IF_ERROR(cuda_status(cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &keep), names[i]));
  }
  return ok_status();
}

DeviceMail::~DeviceMail() {
  std::lock_guard<std::mutex> lock(mu_);
  for (auto& [handle, p] : parcels_) {
    (void)cudaSetDevice(ordinals_[static_cast<std::size_t>(p.from)]);
    // Whatever still reads or writes it completes first (the channels' streams were synced).
    if (p.taken && p.consumed != nullptr) (void)cudaEventSynchronize(p.consumed);
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
    if (p.from == from && p.taken && p.consumed != nullptr && cudaEventQuery(p.consumed) == cudaSuccess) {
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
  cudaEvent_t consumed = nullptr;
  Status st = cuda_status(cudaSetDevice(dev), name + ": recv");
  if (st.ok()) st = cuda_status(cudaEventCreateWithFlags(&consumed, cudaEventDisableTiming), name + ": recv");
  if (st.ok()) st = cuda_status(cudaStreamWaitEvent(s, p->ready, 0), name + ": recv");
  if (st.ok() && bytes > 0 && !mismatch) {
    st = cuda_status(cudaMemcpyPeerAsync(dst, dev, p->data, ordinals_[static_cast<std::size_t>(from)], bytes, s),
                     fmt::format("{}: recv of {} bytes from {}", name, bytes, names_[static_cast<std::size_t>(from)]));
  }
  // Recorded even after a failed copy, so that the parcel is freed; without an event (a broken
  // context) the parcel waits for the destructor.
  const Status rec = consumed != nullptr ? cuda_status(cudaEventRecord(consumed, s), name + ": recv") : st;
  {
    std::lock_guard<std::mutex> lock(mu_);
    p->consumed = rec.ok() ? consumed : nullptr;
    p->taken = true;
  }
  if (!rec.ok() && consumed != nullptr) (void)cudaEventDestroy(consumed);
  if (mismatch) {
    return invalid_argument_error("recv: rank {} ({}) expected {} bytes from rank {} ({}), which sent {}", to, name,
                                  bytes, from, names_[static_cast<std::size_t>(from)], sent);
  }
  return st.ok() ? rec : st;
}

}  // namespace sx::cuda
