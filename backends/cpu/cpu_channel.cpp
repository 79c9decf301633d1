// CPU collectives over shared host memory (see cpu_channel.h).
#include "backends/cpu/cpu_channel.h"

#include <chrono>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <mutex>
#include <string>

#include <fmt/ranges.h>

#include "backends/cpu/cpu_device.h"
#include "runtime/base/half.h"

namespace sx::cpu {

namespace {

using Clock = std::chrono::steady_clock;

// State shared by the ranks of one group.
class Group {
 public:
  Group(std::vector<std::string> device_names, hal::ChannelOptions options)
      : n_(static_cast<int>(device_names.size())),
        options_(std::move(options)),
        names_(std::move(device_names)),
        here_(names_.size(), false),
        mail_(names_.size() * names_.size()) {
    for (auto& s : staging_) s.resize(names_.size());
  }
  int size() const { return n_; }

  // Waits until every rank has arrived (or the group fails). `what` names the collective.
  Status arrive_and_wait(int rank, const std::string& what) {
    std::unique_lock<std::mutex> lock(mu_);
    if (failed_) return failure_;
    here_[static_cast<std::size_t>(rank)] = true;
    if (++arrived_ == n_) {
      arrived_ = 0;
      std::fill(here_.begin(), here_.end(), false);
      ++generation_;
      cv_.notify_all();
      return ok_status();
    }
    const std::uint64_t mine = generation_;
    const auto deadline = Clock::now() + options_.timeout;
    while (!failed_ && generation_ == mine) {
      if (cv_.wait_until(lock, deadline) == std::cv_status::timeout && !failed_ && generation_ == mine) {
        std::vector<std::string> missing;
        for (int r = 0; r < n_; ++r) {
          if (!here_[static_cast<std::size_t>(r)]) missing.push_back(who(r));
        }
        fail_locked(deadline_exceeded_error(
            "{}: {} waited {} ms in {} for {}, which never arrived (hung, or not issuing the same collectives)",
            group_name(), who(rank), options_.timeout.count(), what, fmt::join(missing, ", ")));
      }
    }
    if (generation_ != mine) return ok_status();
    return failure_;
  }

  void abort(int rank, const Status& why) {
    std::lock_guard<std::mutex> lock(mu_);
    if (failed_) return;
    fail_locked(Status(why.ok() ? StatusCode::kAborted : why.code(),
                       fmt::format("{}: {} failed: {}", group_name(), who(rank),
                                   why.ok() ? "aborted" : why.message())));
  }

  void post(int from, int to, std::vector<std::byte> data) {
    std::lock_guard<std::mutex> lock(mu_);
    mail_[static_cast<std::size_t>(from * n_ + to)].push_back(std::move(data));
    cv_.notify_all();
  }

  Result<std::vector<std::byte>> take(int from, int to) {
    std::unique_lock<std::mutex> lock(mu_);
    auto& box = mail_[static_cast<std::size_t>(from * n_ + to)];
    const auto deadline = Clock::now() + options_.timeout;
    while (!failed_ && box.empty()) {
      if (cv_.wait_until(lock, deadline) == std::cv_status::timeout && !failed_ && box.empty()) {
        fail_locked(deadline_exceeded_error("{}: {} waited {} ms to receive from {}, which never sent",
                                            group_name(), who(to), options_.timeout.count(), who(from)));
      }
    }
    if (failed_) return failure_;
    std::vector<std::byte> data = std::move(box.front());
    box.pop_front();
    return data;
  }

  // Double-buffered staging: [sequence % 2][rank], and the all_reduce result.
  std::vector<std::byte>& staging(std::uint64_t seq, int rank) {
    return staging_[seq % 2][static_cast<std::size_t>(rank)];
  }
  std::vector<float>& result(std::uint64_t seq) { return result_[seq % 2]; }

 private:
  void fail_locked(Status s) {
    failed_ = true;
    failure_ = std::move(s);
    cv_.notify_all();
  }

  // "tp group of stage 1", or "channel of 3 ranks" when the creator gave no name.
  std::string group_name() const {
    return options_.name.empty() ? fmt::format("channel of {} ranks", n_) : options_.name;
  }
  // "rank 2 on cpu:5": a rank of this group and its device.
  std::string who(int rank) const { return fmt::format("rank {} on {}", rank, names_[static_cast<std::size_t>(rank)]); }

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

std::size_t elem_bytes(hal::DType t) { return hal::dtype_info(t).block_bytes; }

float load_elem(const std::byte* p, hal::DType t, std::int64_t i) {
  switch (t) {
    case hal::DType::kF16: {
      std::uint16_t h;
      std::memcpy(&h, p + i * 2, 2);
      return f16_to_f32(h);
    }
    case hal::DType::kBF16: {
      std::uint16_t h;
      std::memcpy(&h, p + i * 2, 2);
      return bf16_to_f32(h);
    }
    default: {
      float f;
      std::memcpy(&f, p + i * 4, 4);
      return f;
    }
  }
}

void store_elem(std::byte* p, hal::DType t, std::int64_t i, float v) {
  switch (t) {
    case hal::DType::kF16: {
      const std::uint16_t h = f32_to_f16(v);
      std::memcpy(p + i * 2, &h, 2);
      break;
    }
    case hal::DType::kBF16: {
      const std::uint16_t h = f32_to_bf16(v);
      std::memcpy(p + i * 2, &h, 2);
      break;
    }
    default:
      std::memcpy(p + i * 4, &v, 4);
  }
}

class CpuChannel final : public hal::Channel {
 public:
  CpuChannel(std::shared_ptr<Group> group, int rank, CpuDevice& device)
      : group_(std::move(group)), rank_(rank), device_(device) {}
  int rank() const override { return rank_; }
  int size() const override { return group_->size(); }

  Status all_reduce(hal::Stream& stream, hal::BufView data, std::int64_t count, hal::DType dtype) override {
    if (dtype != hal::DType::kF32 && dtype != hal::DType::kF16 && dtype != hal::DType::kBF16) {
      return invalid_argument_error("all_reduce: {} is not supported (f32, f16, bf16)", hal::dtype_name(dtype));
    }
    if (count < 0) return invalid_argument_error("all_reduce: negative count {}", count);
    const std::size_t bytes = static_cast<std::size_t>(count) * elem_bytes(dtype);
    return submit(stream, "all_reduce", {{data, bytes}}, [=, this](std::uint64_t seq) -> Status {
      SX_ASSIGN_OR_RETURN(std::byte * p, resolve_view(device_, data, bytes, "all_reduce", "data"));
      Group& g = *group_;
      const int n = g.size();
      auto& mine = g.staging(seq, rank_);
      mine.resize(static_cast<std::size_t>(count) * sizeof(float));
      auto* staged = reinterpret_cast<float*>(mine.data());
      for (std::int64_t i = 0; i < count; ++i) staged[i] = load_elem(p, dtype, i);
      std::vector<float>& result = g.result(seq);
      if (rank_ == 0) result.resize(static_cast<std::size_t>(count));
      SX_RETURN_IF_ERROR(g.arrive_and_wait(rank_, label("all_reduce", seq)));
      const std::int64_t lo = count * rank_ / n, hi = count * (rank_ + 1) / n;
      for (std::int64_t i = lo; i < hi; ++i) {
        float sum = reinterpret_cast<const float*>(g.staging(seq, 0).data())[i];
        for (int r = 1; r < n; ++r) sum += reinterpret_cast<const float*>(g.staging(seq, r).data())[i];
        result[static_cast<std::size_t>(i)] = sum;
      }
      SX_RETURN_IF_ERROR(g.arrive_and_wait(rank_, label("all_reduce", seq)));
      for (std::int64_t i = 0; i < count; ++i) store_elem(p, dtype, i, result[static_cast<std::size_t>(i)]);
      return ok_status();
    });
  }

  Status all_gather(hal::Stream& stream, hal::BufView send, hal::BufView recv, std::size_t bytes) override {
    const std::size_t total = bytes * static_cast<std::size_t>(group_->size());
    return submit(stream, "all_gather", {{send, bytes}, {recv, total}}, [=, this](std::uint64_t seq) -> Status {
      SX_ASSIGN_OR_RETURN(std::byte * s, resolve_view(device_, send, bytes, "all_gather", "send"));
      SX_ASSIGN_OR_RETURN(std::byte * d, resolve_view(device_, recv, total, "all_gather", "recv"));
      Group& g = *group_;
      g.staging(seq, rank_).assign(s, s + bytes);
      SX_RETURN_IF_ERROR(g.arrive_and_wait(rank_, label("all_gather", seq)));
      for (int r = 0; r < g.size(); ++r) {
        if (bytes > 0) std::memcpy(d + static_cast<std::size_t>(r) * bytes, g.staging(seq, r).data(), bytes);
      }
      return ok_status();
    });
  }

  Status broadcast(hal::Stream& stream, hal::BufView data, std::size_t bytes, int root) override {
    if (root < 0 || root >= group_->size()) {
      return invalid_argument_error("broadcast: root {} is not a rank of this group of {}", root, group_->size());
    }
    return submit(stream, "broadcast", {{data, bytes}}, [=, this](std::uint64_t seq) -> Status {
      SX_ASSIGN_OR_RETURN(std::byte * p, resolve_view(device_, data, bytes, "broadcast", "data"));
      Group& g = *group_;
      if (rank_ == root) g.staging(seq, root).assign(p, p + bytes);
      SX_RETURN_IF_ERROR(g.arrive_and_wait(rank_, label("broadcast", seq)));
      if (rank_ != root && bytes > 0) std::memcpy(p, g.staging(seq, root).data(), bytes);
      return ok_status();
    });
  }

  Status send(hal::Stream& stream, hal::BufView data, std::size_t bytes, int peer) override {
    SX_RETURN_IF_ERROR(check_peer("send", peer));
    return submit_p2p(stream, "send", data, bytes, [=, this]() -> Status {
      SX_ASSIGN_OR_RETURN(std::byte * p, resolve_view(device_, data, bytes, "send", "data"));
      group_->post(rank_, peer, std::vector<std::byte>(p, p + bytes));
      return ok_status();
    });
  }

  Status recv(hal::Stream& stream, hal::BufView data, std::size_t bytes, int peer) override {
    SX_RETURN_IF_ERROR(check_peer("recv", peer));
    return submit_p2p(stream, "recv", data, bytes, [=, this]() -> Status {
      SX_ASSIGN_OR_RETURN(std::byte * p, resolve_view(device_, data, bytes, "recv", "data"));
      SX_ASSIGN_OR_RETURN(std::vector<std::byte> got, group_->take(peer, rank_));
      if (got.size() != bytes) {
        return invalid_argument_error("recv: rank {} expected {} bytes from rank {}, which sent {}", rank_, bytes,
                                      peer, got.size());
      }
      if (bytes > 0) std::memcpy(p, got.data(), bytes);
      return ok_status();
    });
  }

  Status barrier(hal::Stream& stream) override {
    return submit(stream, "barrier", {}, [this](std::uint64_t seq) -> Status {
      return group_->arrive_and_wait(rank_, label("barrier", seq));
    });
  }

  void abort(const Status& why) override { group_->abort(rank_, why); }

 private:
  struct Operand {
    hal::BufView view;
    std::size_t bytes;
  };

  static std::string label(const char* what, std::uint64_t seq) { return fmt::format("{} #{}", what, seq); }

  Status check_peer(const char* what, int peer) const {
    if (peer < 0 || peer >= group_->size() || peer == rank_) {
      return invalid_argument_error("{}: peer {} is not another rank of this group of {}", what, peer, group_->size());
    }
    return ok_status();
  }

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

  std::shared_ptr<Group> group_;
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
  auto group = std::make_shared<Group>(std::move(names), options);
  std::vector<std::unique_ptr<hal::Channel>> out;
  for (std::size_t i = 0; i < cpu.size(); ++i) {
    out.push_back(std::make_unique<CpuChannel>(group, static_cast<int>(i), *cpu[i]));
  }
  return out;
}

}  // namespace sx::cpu
