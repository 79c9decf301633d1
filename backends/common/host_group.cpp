// Collectives over host memory between rank threads (host_group.h).
#include "backends/common/host_group.h"

#include <chrono>
#include <cstring>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "runtime/base/half.h"

namespace sx::backends {

namespace {

using Clock = std::chrono::steady_clock;

std::string label(const char* what, std::uint64_t seq) { return fmt::format("{} #{}", what, seq); }

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

}  // namespace

HostGroup::HostGroup(std::vector<std::string> device_names, hal::ChannelOptions options)
    : n_(static_cast<int>(device_names.size())),
      options_(std::move(options)),
      names_(std::move(device_names)),
      here_(names_.size(), false),
      mail_(names_.size() * names_.size()) {
  for (auto& s : staging_) s.resize(names_.size());
}

std::string HostGroup::group_name() const {
  return options_.name.empty() ? fmt::format("channel of {} ranks", n_) : options_.name;
}

std::string HostGroup::who(int rank) const {
  return fmt::format("rank {} on {}", rank, names_[static_cast<std::size_t>(rank)]);
}

Status HostGroup::arrive_and_wait(int rank, const std::string& what) {
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

void HostGroup::abort(int rank, const Status& why) {
  std::lock_guard<std::mutex> lock(mu_);
  if (failed_) return;
  fail_locked(Status(why.ok() ? StatusCode::kAborted : why.code(),
                     fmt::format("{}: {} failed: {}", group_name(), who(rank),
                                 why.ok() ? "aborted" : why.message())));
}

void HostGroup::fail(const Status& why) {
  std::lock_guard<std::mutex> lock(mu_);
  if (!failed_) fail_locked(why.ok() ? aborted_error("{}: failed", group_name()) : why);
}

void HostGroup::send(int from, int to, std::span<const std::byte> data) {
  std::lock_guard<std::mutex> lock(mu_);
  mail_[static_cast<std::size_t>(from * n_ + to)].emplace_back(data.begin(), data.end());
  cv_.notify_all();
}

Result<std::vector<std::byte>> HostGroup::take(int from, int to) {
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

Status HostGroup::recv(int from, int to, std::span<std::byte> data) {
  SX_ASSIGN_OR_RETURN(std::vector<std::byte> got, take(from, to));
  if (got.size() != data.size()) {
    return invalid_argument_error("recv: rank {} expected {} bytes from rank {}, which sent {}", to, data.size(), from,
                                  got.size());
  }
  if (!got.empty()) std::memcpy(data.data(), got.data(), got.size());
  return ok_status();
}

void HostGroup::fail_locked(Status s) {
  failed_ = true;
  failure_ = std::move(s);
  cv_.notify_all();
}

Status HostGroup::check_reduce(std::int64_t count, hal::DType dtype) {
  if (dtype != hal::DType::kF32 && dtype != hal::DType::kF16 && dtype != hal::DType::kBF16) {
    return invalid_argument_error("all_reduce: {} is not supported (f32, f16, bf16)", hal::dtype_name(dtype));
  }
  if (count < 0) return invalid_argument_error("all_reduce: negative count {}", count);
  return ok_status();
}

Status HostGroup::check_root(int root) const {
  if (root < 0 || root >= n_) {
    return invalid_argument_error("broadcast: root {} is not a rank of this group of {}", root, n_);
  }
  return ok_status();
}

Status HostGroup::check_peer(const char* what, int rank, int peer) const {
  if (peer < 0 || peer >= n_ || peer == rank) {
    return invalid_argument_error("{}: peer {} is not another rank of this group of {}", what, peer, n_);
  }
  return ok_status();
}

Status HostGroup::all_reduce(int rank, std::uint64_t seq, std::byte* p, std::int64_t count, hal::DType dtype) {
  auto& mine = staging(seq, rank);
  mine.resize(static_cast<std::size_t>(count) * sizeof(float));
  auto* staged = reinterpret_cast<float*>(mine.data());
  for (std::int64_t i = 0; i < count; ++i) staged[i] = load_elem(p, dtype, i);
  std::vector<float>& sum_of = result(seq);
  if (rank == 0) sum_of.resize(static_cast<std::size_t>(count));
  SX_RETURN_IF_ERROR(arrive_and_wait(rank, label("all_reduce", seq)));
  const std::int64_t lo = count * rank / n_, hi = count * (rank + 1) / n_;
  for (std::int64_t i = lo; i < hi; ++i) {
    float sum = reinterpret_cast<const float*>(staging(seq, 0).data())[i];
    for (int r = 1; r < n_; ++r) sum += reinterpret_cast<const float*>(staging(seq, r).data())[i];
    sum_of[static_cast<std::size_t>(i)] = sum;
  }
  SX_RETURN_IF_ERROR(arrive_and_wait(rank, label("all_reduce", seq)));
  for (std::int64_t i = 0; i < count; ++i) store_elem(p, dtype, i, sum_of[static_cast<std::size_t>(i)]);
  return ok_status();
}

Status HostGroup::all_gather(int rank, std::uint64_t seq, const std::byte* s, std::byte* d, std::size_t bytes) {
  staging(seq, rank).assign(s, s + bytes);
  SX_RETURN_IF_ERROR(arrive_and_wait(rank, label("all_gather", seq)));
  for (int r = 0; r < n_; ++r) {
    if (bytes > 0) std::memcpy(d + static_cast<std::size_t>(r) * bytes, staging(seq, r).data(), bytes);
  }
  return ok_status();
}

Status HostGroup::broadcast(int rank, std::uint64_t seq, std::byte* p, std::size_t bytes, int root) {
  if (rank == root) staging(seq, root).assign(p, p + bytes);
  SX_RETURN_IF_ERROR(arrive_and_wait(rank, label("broadcast", seq)));
  if (rank != root && bytes > 0) std::memcpy(p, staging(seq, root).data(), bytes);
  return ok_status();
}

Status HostGroup::barrier(int rank, std::uint64_t seq) { return arrive_and_wait(rank, label("barrier", seq)); }

}  // namespace sx::backends
