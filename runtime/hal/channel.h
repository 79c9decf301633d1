// Channel: collectives over a group of ranks, shaped like NCCL (DESIGN.md §4).
//
// A group of N ranks is created by the backend for N of its devices (Backend::create_channels);
// each rank gets its own Channel and uses it from that rank's thread with that rank's stream.
// Every collective is enqueued on the stream like any other op: it reads and writes device buffers
// of the rank's own device only, in stream order, and completes before anything enqueued after it.
// All ranks must issue the same collectives in the same order with the same sizes.
//
// - all_reduce: in place, data[i] = sum over ranks of data[i] in F32 (F16/BF16 inputs widened, the
//   sum rounded once). Every rank gets the same bits from one call. The sum may be added in any
//   order: it is within N x 2^-23 x (sum over ranks of |data[i]|) of the rank-order sum 0, 1, ...,
//   N-1 (tests/cts checks this bound). The CPU backend adds in rank order exactly, so its results
//   are also the same on every run.
// - all_gather: recv = the `bytes` of send of rank 0, then of rank 1, ... (recv holds N * bytes).
// - broadcast: data on every rank = data of `root`.
// - send / recv: point to point, in order per (sender, receiver) pair; a send completes once the
//   receiver has the data or the transfer is buffered.
// - barrier: returns when every rank has reached it.
//
// Failure: a rank that fails (a device error, an exception in its thread, anything that makes it
// stop issuing collectives) calls abort(why). From then on every pending and later collective of
// every rank of the group returns an error naming the failed rank and its reason, promptly (no
// rank waits out a timeout). A collective that has not completed ChannelOptions::timeout after a
// rank issued it aborts the group with DEADLINE_EXCEEDED naming the group (ChannelOptions::name),
// the rank that waited and the ranks it waited for, each with its device's name, e.g.
//   tp group of stage 1: rank 0 on cpu:3 waited 100 ms in all_reduce #7 for rank 2 on cpu:5, ...
// A failed group stays failed; create a new one to continue. (A backend whose collectives run on
// the device, like NCCL, watches them from a host thread and aborts the communicator.)
// A group of one rank skips every collective (they return OK without doing anything).
//
// Threading: one thread per Channel; abort() may be called from any thread.
// Lifetime: all Channels of a group must be destroyed after the last collective of any rank.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <string>

#include "runtime/base/status.h"
#include "runtime/hal/dtype.h"
#include "runtime/hal/ops.h"

namespace sx::hal {

class Stream;

struct ChannelOptions {
  std::chrono::milliseconds timeout{60'000};  // longest wait for the other ranks of a collective
  // What the group is, for its errors (the engine: "tp group of stage 1", "pipeline group");
  // empty: "channel of N ranks".
  std::string name;
};

class Channel {
 public:
  virtual ~Channel() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;

  virtual Status all_reduce(Stream& stream, BufView data, std::int64_t count, DType dtype) = 0;
  virtual Status all_gather(Stream& stream, BufView send, BufView recv, std::size_t bytes) = 0;
  virtual Status broadcast(Stream& stream, BufView data, std::size_t bytes, int root) = 0;
  virtual Status send(Stream& stream, BufView data, std::size_t bytes, int peer) = 0;
  virtual Status recv(Stream& stream, BufView data, std::size_t bytes, int peer) = 0;
  virtual Status barrier(Stream& stream) = 0;

  // Fails the whole group on behalf of this rank (see above). Idempotent; the first reason wins.
  virtual void abort(const Status& why) = 0;
};

}  // namespace sx::hal
