// CPU collectives over shared host memory (see cpu_channel.h).
#include "backends/cpu/cpu_channel.h"

#include <functional>
#include <string>

#include "backends/common/host_group.h"
#include "backends/cpu/cpu_device.h"

namespace sx::cpu {

namespace {

std::size_t elem_bytes(hal::DType t) { return hal::dtype_info(t).block_bytes; }

class CpuChannel final : public hal::Channel {
 public:
  CpuChannel(std::shared_ptr<backends::HostGroup> group, int rank, CpuDevice& device)
      : group_(std::move(group)), rank_(rank), device_(device) {}
  int rank() const override { return rank_; }
  int size() const override { return group_->size(); }

  Status all_reduce(hal::Stream& stream, hal::BufView data, std::int64_t count, hal::DType dtype) override {
    SX_RETURN_IF_ERROR(backends::HostGroup::check_reduce(count, dtype));
    const std::size_t bytes = static_cast<std::size_t>(count) * elem_bytes(dtype);
    return submit(stream, "all_reduce", {{data, bytes}}, [=, this](std::uint64_t seq) -> Status {
      SX_ASSIGN_OR_RETURN(std::byte * p, resolve_view(device_, data, bytes, "all_reduce", "data"));
      return group_->all_reduce(rank_, seq, p, count, dtype);
    });
  }

  Status all_gather(hal::Stream& stream, hal::BufView send, hal::BufView recv, std::size_t bytes) override {
    const std::size_t total = bytes * static_cast<std::size_t>(group_->size());
    if (group_->size() == 1) {  // a group of one gathers its own bytes: recv = send
      SX_RETURN_IF_ERROR(resolve_view(device_, send, bytes, "all_gather", "send").status());
      SX_RETURN_IF_ERROR(resolve_view(device_, recv, total, "all_gather", "recv").status());
      if (bytes == 0 || (send.buffer == recv.buffer && send.offset == recv.offset)) return ok_status();
      return stream.copy(*recv.buffer, recv.offset, *send.buffer, send.offset, bytes);
    }
    return submit(stream, "all_gather", {{send, bytes}, {recv, total}}, [=, this](std::uint64_t seq) -> Status {
      SX_ASSIGN_OR_RETURN(std::byte * s, resolve_view(device_, send, bytes, "all_gather", "send"));
      SX_ASSIGN_OR_RETURN(std::byte * d, resolve_view(device_, recv, total, "all_gather", "recv"));
      return group_->all_gather(rank_, seq, s, d, bytes);
    });
  }

  Status broadcast(hal::Stream& stream, hal::BufView data, std::size_t bytes, int root) override {
    SX_RETURN_IF_ERROR(group_->check_root(root));
    return submit(stream, "broadcast", {{data, bytes}}, [=, this](std::uint64_t seq) -> Status {
      SX_ASSIGN_OR_RETURN(std::byte * p, resolve_view(device_, data, bytes, "broadcast", "data"));
      return group_->broadcast(rank_, seq, p, bytes, root);
    });
  }

  Status send(hal::Stream& stream, hal::BufView data, std::size_t bytes, int peer) override {
    SX_RETURN_IF_ERROR(group_->check_peer("send", rank_, peer));
    return submit_p2p(stream, "send", data, bytes, [=, this]() -> Status {
      SX_ASSIGN_OR_RETURN(std::byte * p, resolve_view(device_, data, bytes, "send", "data"));
      group_->send(rank_, peer, {p, bytes});
      return ok_status();
    });
  }

  Status recv(hal::Stream& stream, hal::BufView data, std::size_t bytes, int peer) override {
    SX_RETURN_IF_ERROR(group_->check_peer("recv", rank_, peer));
    return submit_p2p(stream, "recv", data, bytes, [=, this]() -> Status {
      SX_ASSIGN_OR_RETURN(std::byte * p, resolve_view(device_, data, bytes, "recv", "data"));
      return group_->recv(peer, rank_, {p, bytes});
    });
  }

  Status barrier(hal::Stream& stream) override {
    return submit(stream, "barrier", {}, [this](std::uint64_t seq) -> Status { return group_->barrier(rank_, seq); });
  }

  void abort(const Status& why) override { group_->abort(rank_, why); }

 private:
  struct Operand {
    hal::BufView view;
    std::size_t bytes;
  };

  Result<CpuStream*> cpu_stream(hal::Stream& stream, const char* what) const {
    auto* s = dynamic_cast<CpuStream*>(&stream);
    if (s == nullptr || &s->device() != &device_) {
      return invalid_argument_error("{}: rank {} must use a stream of its own device {}", what, rank_,
                                    device_.info().name);
    }
    return s;
  }

  // Checks the operands now (so the caller's error names them), then enqueues the collective with
  // its sequence number. A group of one does nothing.
  Status submit(hal::Stream& stream, const char* what, std::initializer_list<Operand> operands,
                std::function<Status(std::uint64_t)> body) {
    SX_ASSIGN_OR_RETURN(CpuStream * s, cpu_stream(stream, what));
    for (const Operand& o : operands) SX_RETURN_IF_ERROR(resolve_view(device_, o.view, o.bytes, what, "operand").status());
    if (group_->size() == 1) return ok_status();
    const std::uint64_t seq = next_seq_++;
    return s->host_call([body = std::move(body), seq]() { return body(seq); });
  }

  Status submit_p2p(hal::Stream& stream, const char* what, hal::BufView data, std::size_t bytes,
                    std::function<Status()> body) {
    SX_ASSIGN_OR_RETURN(CpuStream * s, cpu_stream(stream, what));
    SX_RETURN_IF_ERROR(resolve_view(device_, data, bytes, what, "data").status());
    return s->host_call(std::move(body));
  }

  std::shared_ptr<backends::HostGroup> group_;
  int rank_;
  CpuDevice& device_;
  std::uint64_t next_seq_ = 0;
};

}  // namespace

Result<std::vector<std::unique_ptr<hal::Channel>>> create_cpu_channels(std::span<hal::Device* const> devices,
                                                                       const hal::ChannelOptions& options) {
  if (devices.empty()) return invalid_argument_error("channel: a group needs at least one device");
  if (options.timeout.count() <= 0) return invalid_argument_error("channel: the timeout must be positive");
  std::vector<CpuDevice*> cpu;
  for (std::size_t i = 0; i < devices.size(); ++i) {
    auto* d = dynamic_cast<CpuDevice*>(devices[i]);
    if (d == nullptr) return invalid_argument_error("channel: device {} of the group is not a CPU device", i);
    for (CpuDevice* seen : cpu) {
      if (seen == d) return invalid_argument_error("channel: {} appears twice in the group", d->info().name);
    }
    cpu.push_back(d);
  }
  std::vector<std::string> names;
  for (const CpuDevice* d : cpu) names.push_back(d->info().name);
  auto group = std::make_shared<backends::HostGroup>(std::move(names), options);
  std::vector<std::unique_ptr<hal::Channel>> out;
  for (std::size_t i = 0; i < cpu.size(); ++i) {
    out.push_back(std::make_unique<CpuChannel>(group, static_cast<int>(i), *cpu[i]));
  }
  return out;
}

}  // namespace sx::cpu
