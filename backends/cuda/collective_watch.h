// The host-side watch over a group's device collectives (issue 21 item 2; hal/channel.h's
// failure contract for a backend whose collectives run on the device, like NCCL's): every
// collective a rank issues is watched until its completion is observed; one that is still
// running `timeout` after it was issued, or a communicator that reports an asynchronous error,
// or a rank that aborts, fails the whole group: every communicator is aborted once (so collectives
// stuck on the device return) and every later call of every rank gets the error, which names the
// group, the rank, its device, the collective and what the group is known to run over.
//
// Pure host code without CUDA headers: the communicators and completions are injected (NCCL and
// CUDA events in the module; fakes in tests/unit/cuda).
// Threading: every member may be called from any thread; a background thread polls every
// `poll` (none when poll is zero: tests call poll() themselves with their own clock).
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "runtime/base/status.h"

namespace sx::cuda {

// What the watch needs of one rank's communicator.
class RankComm {
 public:
  virtual ~RankComm() = default;
  // OK while healthy; the communicator's asynchronous error otherwise (ncclCommGetAsyncError).
  virtual Status async_error() = 0;
  // Makes the communicator's pending collectives return (ncclCommAbort); called at most once.
  virtual void abort() = 0;
};

struct WatchedGroup {
  std::string name;                       // "tp group of stage 0"; empty: "channel of N ranks"
  std::vector<std::string> device_names;  // one per rank
  std::string transport;                  // what the group runs over, for messages ("NCCL 2.28.3, ...")
  std::chrono::milliseconds timeout{60'000};
  // Called once, after the communicators were aborted, with the group's failure (outside the
  // watch's lock): what else the group waits on (its point-to-point mailbox) fails with it.
  std::function<void(const Status&)> on_fail;
};

class CollectiveWatch {
 public:
  using Clock = std::chrono::steady_clock;
  // `comms[i]` is rank i's (not owned; they must outlive the watch).
  CollectiveWatch(WatchedGroup group, std::vector<RankComm*> comms,
                  std::chrono::milliseconds poll = std::chrono::milliseconds(10));
  ~CollectiveWatch();
  CollectiveWatch(const CollectiveWatch&) = delete;
  CollectiveWatch& operator=(const CollectiveWatch&) = delete;

  // The group's failure, or OK: asked by a rank before it issues a collective.
  Status status() const;
  // After rank `rank` issued collective `what` (e.g. "all_reduce") of `bytes`: watched until
  // done() returns true (done is called from the polling thread, never concurrently). Returns the
  // collective's number on that rank (1, 2, ...).
  std::uint64_t watch(int rank, std::string_view what, std::size_t bytes, std::function<bool()> done,
                      Clock::time_point issued = Clock::now());
  // Rank `rank` failed on its own (hal::Channel::abort): the group fails naming it (the first
  // failure wins).
  void fail(int rank, const Status& why);
  // Drops rank `rank`'s watched collectives without calling their done() again (a channel about to
  // be destroyed, whose done() functions refer to it); waits for a poll in progress. Returns how
  // many were dropped.
  std::size_t forget(int rank);
  // One round of checks at `now`: completions, asynchronous errors, deadlines.
  void poll(Clock::time_point now = Clock::now());
  // Collectives issued and not yet seen complete.
  std::size_t in_flight() const;

 private:
  struct Pending {
    int rank;
    std::uint64_t number;
    std::string what;
    std::size_t bytes;
    std::function<bool()> done;
    Clock::time_point issued;
  };
  std::string group_name() const;
  std::string rank_name(int rank) const;
  // Records the group's failure (the first wins); returns whether this call failed it, in which
  // case the caller aborts the communicators (abort_all) after releasing mu_. Called with mu_ held.
  bool fail_locked(Status why);
  void abort_all();
  // One round of poll()'s checks with mu_ held; true when it failed the group (abort_all next).
  bool check_locked(Clock::time_point now);

  WatchedGroup group_;
  std::vector<RankComm*> comms_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::vector<Pending> pending_;
  std::vector<std::uint64_t> issued_;  // per rank
  Status failed_;
  bool aborted_ = false, stop_ = false;
  std::thread thread_;
};

}  // namespace sx::cuda
