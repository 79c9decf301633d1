// Collectives staged through host-visible buffers (staged_channel.h).
#include "backends/common/staged_channel.h"

#include <functional>
#include <string>

#include <fmt/format.h>

#include "backends/common/host_group.h"

namespace sx::backends {

namespace {

constexpr std::size_t kAlign = 256;
std::size_t round_up(std::size_t n) { return (n + kAlign - 1) / kAlign * kAlign; }

class StagedChannel final : public hal::Channel {
 public:
  StagedChannel(std::shared_ptr<HostGroup> group, int rank, hal::Device& device)
      : group_(std::move(group)), rank_(rank), device_(device) {}
  int rank() const override { return rank_; }
  int size() const override { return group_->size(); }

  Status all_reduce(hal::Stream& s, hal::BufView data, std::int64_t count, hal::DType dtype) override {
    SX_RETURN_IF_ERROR(HostGroup::check_reduce(count, dtype));
    const std::size_t bytes = static_cast<std::size_t>(count) * hal::dtype_info(dtype).block_bytes;
    SX_RETURN_IF_ERROR(check(data, bytes, "all_reduce", "data"));
    if (size() == 1) return ok_status();
    SX_ASSIGN_OR_RETURN(hal::Buffer * st, staging(bytes));
    SX_RETURN_IF_ERROR(s.copy(*st, 0, *data.buffer, data.offset, bytes));
    SX_RETURN_IF_ERROR(host(s, [=, this](std::uint64_t seq) {
      return group_->all_reduce(rank_, seq, st->host().data(), count, dtype);
    }));
    return s.copy(*data.buffer, data.offset, *st, 0, bytes);
  }

  Status all_gather(hal::Stream& s, hal::BufView send, hal::BufView recv, std::size_t bytes) override {
    const std::size_t total = bytes * static_cast<std::size_t>(size());
    SX_RETURN_IF_ERROR(check(send, bytes, "all_gather", "send"));
    SX_RETURN_IF_ERROR(check(recv, total, "all_gather", "recv"));
    if (size() == 1) {  // a group of one gathers its own bytes: recv = send
      if (bytes == 0 || (send.buffer == recv.buffer && send.offset == recv.offset)) return ok_status();
      return s.copy(*recv.buffer, recv.offset, *send.buffer, send.offset, bytes);
    }
    const std::size_t at = round_up(bytes);
    SX_ASSIGN_OR_RETURN(hal::Buffer * st, staging(at + total));
    SX_RETURN_IF_ERROR(s.copy(*st, 0, *send.buffer, send.offset, bytes));
    SX_RETURN_IF_ERROR(host(s, [=, this](std::uint64_t seq) {
      return group_->all_gather(rank_, seq, st->host().data(), st->host().data() + at, bytes);
    }));
    return s.copy(*recv.buffer, recv.offset, *st, at, total);
  }

  Status broadcast(hal::Stream& s, hal::BufView data, std::size_t bytes, int root) override {
    SX_RETURN_IF_ERROR(group_->check_root(root));
    SX_RETURN_IF_ERROR(check(data, bytes, "broadcast", "data"));
    if (size() == 1) return ok_status();
    SX_ASSIGN_OR_RETURN(hal::Buffer * st, staging(bytes));
    if (rank_ == root) SX_RETURN_IF_ERROR(s.copy(*st, 0, *data.buffer, data.offset, bytes));
    SX_RETURN_IF_ERROR(host(s, [=, this](std::uint64_t seq) {
      return group_->broadcast(rank_, seq, st->host().data(), bytes, root);
    }));
    if (rank_ == root) return ok_status();
    return s.copy(*data.buffer, data.offset, *st, 0, bytes);
  }

  Status send(hal::Stream& s, hal::BufView data, std::size_t bytes, int peer) override {
    SX_RETURN_IF_ERROR(group_->check_peer("send", rank_, peer));
    SX_RETURN_IF_ERROR(check(data, bytes, "send", "data"));
    SX_ASSIGN_OR_RETURN(hal::Buffer * st, staging(bytes));
    SX_RETURN_IF_ERROR(s.copy(*st, 0, *data.buffer, data.offset, bytes));
    return s.host_call([=, this] {
      retired_.clear();
      group_->send(rank_, peer, st->host().first(bytes));
      return ok_status();
    });
  }

  Status recv(hal::Stream& s, hal::BufView data, std::size_t bytes, int peer) override {
    SX_RETURN_IF_ERROR(group_->check_peer("recv", rank_, peer));
    SX_RETURN_IF_ERROR(check(data, bytes, "recv", "data"));
    SX_ASSIGN_OR_RETURN(hal::Buffer * st, staging(bytes));
    SX_RETURN_IF_ERROR(s.host_call([=, this] {
      retired_.clear();
      return group_->recv(peer, rank_, st->host().first(bytes));
    }));
    return s.copy(*data.buffer, data.offset, *st, 0, bytes);
  }

  Status barrier(hal::Stream& s) override {
    if (size() == 1) return ok_status();
    return host(s, [this](std::uint64_t seq) { return group_->barrier(rank_, seq); });
  }

  void abort(const Status& why) override { group_->abort(rank_, why); }

 private:
  // `v` is `bytes` of a device buffer of this rank's device.
  Status check(const hal::BufView& v, std::size_t bytes, const char* op, const char* what) const {
    if (!v) return invalid_argument_error("{}: {} is not set", op, what);
    if (&v.buffer->device() != &device_) {
      return invalid_argument_error("{}: {} belongs to {}; rank {} is {}", op, what, v.buffer->device().info().name,
                                    rank_, device_.info().name);
    }
    if (v.offset > v.buffer->size() || bytes > v.buffer->size() - v.offset) {
      return invalid_argument_error("{}: {}: {} bytes at offset {} overrun a buffer of {} bytes", op, what, bytes,
                                    v.offset, v.buffer->size());
    }
    return ok_status();
  }

  // The staging buffer, at least `bytes` long.
  Result<hal::Buffer*> staging(std::size_t bytes) {
    if (!staging_ || staging_->size() < bytes) {
      SX_ASSIGN_OR_RETURN(auto b, device_.alloc(std::max(round_up(bytes), kAlign), hal::BufferUsage::kReadback));
      if (staging_) retired_.push_back(std::move(staging_));
      staging_ = std::move(b);
    }
    return staging_.get();
  }

  // The collective `body` with its sequence number, in a host call.
  Status host(hal::Stream& s, std::function<Status(std::uint64_t)> body) {
    const std::uint64_t seq = next_seq_++;
    return s.host_call([this, body = std::move(body), seq] {
      retired_.clear();  // the work that used them completed before this call
      return body(seq);
    });
  }

  std::shared_ptr<HostGroup> group_;
  int rank_;
  hal::Device& device_;
  std::unique_ptr<hal::Buffer> staging_;
  std::vector<std::unique_ptr<hal::Buffer>> retired_;
  std::uint64_t next_seq_ = 0;
};

}  // namespace

Result<std::vector<std::unique_ptr<hal::Channel>>> create_staged_channels(std::span<hal::Device* const> devices,
                                                                          const hal::ChannelOptions& options) {
  if (devices.empty()) return invalid_argument_error("channel: a group needs at least one device");
  if (options.timeout.count() <= 0) return invalid_argument_error("channel: the timeout must be positive");
  std::vector<std::string> names;
  for (std::size_t i = 0; i < devices.size(); ++i) {
    for (std::size_t j = 0; j < i; ++j) {
      if (devices[j] == devices[i]) {
        return invalid_argument_error("channel: {} appears twice in the group", devices[i]->info().name);
      }
    }
    names.push_back(devices[i]->info().name);
  }
  auto group = std::make_shared<HostGroup>(std::move(names), options);
  std::vector<std::unique_ptr<hal::Channel>> out;
  for (std::size_t i = 0; i < devices.size(); ++i) {
    out.push_back(std::make_unique<StagedChannel>(group, static_cast<int>(i), *devices[i]));
  }
  return out;
}

}  // namespace sx::backends
