// The host-side watch over device collectives (collective_watch.h).
#include "backends/cuda/collective_watch.h"

#include <algorithm>

#include <fmt/format.h>

namespace sx::cuda {

CollectiveWatch::CollectiveWatch(WatchedGroup group, std::vector<RankComm*> comms, std::chrono::milliseconds poll)
    : group_(std::move(group)), comms_(std::move(comms)), issued_(comms_.size(), 0) {
  if (poll.count() > 0) {
    thread_ = std::thread([this, poll] {
      std::unique_lock<std::mutex> lock(mu_);
      while (!stop_) {
        cv_.wait_for(lock, poll, [this] { return stop_; });
        if (stop_) break;
        lock.unlock();
        this->poll();
        lock.lock();
      }
    });
  }
}

CollectiveWatch::~CollectiveWatch() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

std::string CollectiveWatch::group_name() const {
  return group_.name.empty() ? fmt::format("channel of {} ranks", comms_.size()) : group_.name;
}

std::string CollectiveWatch::rank_name(int rank) const {
  const auto i = static_cast<std::size_t>(rank);
  if (rank < 0 || i >= group_.device_names.size()) return fmt::format("rank {}", rank);
  return fmt::format("rank {} on {}", rank, group_.device_names[i]);
}

Status CollectiveWatch::status() const {
  std::lock_guard<std::mutex> lock(mu_);
  return failed_;
}

std::uint64_t CollectiveWatch::watch(int rank, std::string_view what, std::size_t bytes, std::function<bool()> done,
                                     Clock::time_point issued) {
  std::lock_guard<std::mutex> lock(mu_);
  const std::uint64_t n = ++issued_.at(static_cast<std::size_t>(rank));
  pending_.push_back({rank, n, std::string(what), bytes, std::move(done), issued});
  return n;
}

void CollectiveWatch::fail(int rank, const Status& why) {
  bool abort = false;
  {
    std::lock_guard<std::mutex> lock(mu_);
    abort = fail_locked(aborted_error("{}: {} failed: {}", group_name(), rank_name(rank), why.to_string()));
  }
  if (abort) abort_all();
}

bool CollectiveWatch::fail_locked(Status why) {
  if (!failed_.ok()) return false;
  failed_ = std::move(why);
  pending_.clear();  // aborted: nothing more completes that matters
  if (aborted_) return false;
  aborted_ = true;
  return true;
}

// Outside mu_: an abort may take a while, and ranks keep asking status() meanwhile.
void CollectiveWatch::abort_all() {
  for (RankComm* c : comms_) c->abort();
  if (group_.on_fail) group_.on_fail(status());
}

std::size_t CollectiveWatch::forget(int rank) {
  std::lock_guard<std::mutex> lock(mu_);
  const std::size_t before = pending_.size();
  pending_.erase(std::remove_if(pending_.begin(), pending_.end(), [&](const Pending& p) { return p.rank == rank; }),
                 pending_.end());
  return before - pending_.size();
}

void CollectiveWatch::poll(Clock::time_point now) {
  bool abort = false;
  {
    std::lock_guard<std::mutex> lock(mu_);
    abort = check_locked(now);
  }
  if (abort) abort_all();
}

bool CollectiveWatch::check_locked(Clock::time_point now) {
  if (!failed_.ok()) return false;
  // Completions first: a collective seen done is never late.
  pending_.erase(std::remove_if(pending_.begin(), pending_.end(), [](Pending& p) { return p.done(); }),
                 pending_.end());
  for (std::size_t r = 0; r < comms_.size(); ++r) {
    if (Status e = comms_[r]->async_error(); !e.ok()) {
      return fail_locked(Status(e.code(), fmt::format("{}: the communicator of {} reported: {} (over {}); the group "
                                                      "was aborted",
                                                      group_name(), rank_name(static_cast<int>(r)), e.message(),
                                                      group_.transport)));
    }
  }
  for (const Pending& p : pending_) {
    const auto waited = std::chrono::duration_cast<std::chrono::milliseconds>(now - p.issued);
    if (waited < group_.timeout) continue;
    // The ranks that have issued fewer collectives than this one are the ones it waits for.
    std::string behind;
    for (std::size_t r = 0; r < issued_.size(); ++r) {
      if (issued_[r] < p.number) behind += fmt::format("{}{}", behind.empty() ? "" : ", ", rank_name(static_cast<int>(r)));
    }
    return fail_locked(deadline_exceeded_error(
        "{}: {} issued {} #{} ({} bytes) {} ms ago and it has not completed (timeout {} ms){}; over {}; the group "
        "was aborted. Check the links between the devices (nvidia-smi topo -m) and try NCCL_P2P_DISABLE=1 or "
        "NCCL_P2P_LEVEL=PHB",
        group_name(), rank_name(p.rank), p.what, p.number, p.bytes, waited.count(), group_.timeout.count(),
        behind.empty() ? "" : fmt::format("; not yet issued by {}", behind), group_.transport));
  }
  return false;
}

std::size_t CollectiveWatch::in_flight() const {
  std::lock_guard<std::mutex> lock(mu_);
  return pending_.size();
}

}  // namespace sx::cuda
