// AsyncQueue<T>: the bridge from any thread into the loop thread (DESIGN.md §3 step 6, §7.5).
//
// A mutex-protected deque plus a uv_async_t. push() may be called from any thread; it appends the
// item and calls uv_async_send(). libuv coalesces sends, so the async callback ALWAYS drains the
// whole queue: every item pushed before the callback starts is delivered by that callback, and a
// push that races with a running callback triggers another one. Items are delivered in push order
// (per producer, and globally in the order pushes took the lock).
//
// Lifetime: the loop-side owner holds the AsyncQueue (create() returns a unique_ptr). close() (or
// the destructor) stops delivery at once, destroys undelivered items on the calling (loop) thread
// and closes the uv_async_t; its memory is freed in the close callback. Producers on other threads
// should hold a Sender: it keeps the mutex and deque alive, so pushing after close() is safe and
// simply returns false. Pushing through the AsyncQueue object itself requires the object to be
// alive.
//
// Threading: create(), close(), the destructor and the handler run on the loop thread; push() and
// Sender::push() are thread-safe. The handler may call close() (remaining items of that drain are
// dropped) or push() (the item is delivered by a later callback).
//
// Errors: create() returns uv_async_init failures; push() returns false once closed.
#pragma once

#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <utility>

#include <uv.h>

#include "daemon/loop/uv_status.h"
#include "runtime/base/status.h"

namespace sx::daemon::loop {

template <typename T>
class AsyncQueue {
  struct Box;
  struct Shared {
    std::mutex mu;
    std::deque<T> items;
    bool closed = false;
    uv_async_t* async = nullptr;  // valid while !closed (guarded by mu)

    bool push(T item) {
      std::lock_guard<std::mutex> lock(mu);
      if (closed) return false;
      items.push_back(std::move(item));
      // Under the lock: close() cannot free the handle between the check and the send.
      uv_async_send(async);
      return true;
    }
  };

 public:
  using Handler = std::function<void(T item)>;
  class Key {  // only create() can construct an AsyncQueue
    friend class AsyncQueue;
    Key() = default;
  };

  // A copyable, thread-safe handle for producers; outlives the queue safely.
  class Sender {
   public:
    Sender() = default;
    bool push(T item) const { return shared_ && shared_->push(std::move(item)); }

   private:
    friend class AsyncQueue;
    explicit Sender(std::shared_ptr<Shared> shared) : shared_(std::move(shared)) {}
    std::shared_ptr<Shared> shared_;
  };

  static Result<std::unique_ptr<AsyncQueue>> create(uv_loop_t* loop, Handler handler) {
    auto box = std::make_unique<Box>();
    box->shared = std::make_shared<Shared>();
    box->handler = std::move(handler);
    SX_RETURN_IF_ERROR(uv_status(uv_async_init(loop, &box->handle, &AsyncQueue::on_async),
                                 "uv_async_init"));
    box->handle.data = box.get();
    box->shared->async = &box->handle;
    return std::make_unique<AsyncQueue>(Key{}, std::move(box));
  }

  AsyncQueue(Key, std::unique_ptr<Box> box) : box_(std::move(box)), shared_(box_->shared) {}
  AsyncQueue(const AsyncQueue&) = delete;
  AsyncQueue& operator=(const AsyncQueue&) = delete;
  ~AsyncQueue() { close(); }

  // Thread-safe. False once the queue is closed (the item is destroyed).
  bool push(T item) { return shared_->push(std::move(item)); }
  Sender sender() const { return Sender(shared_); }

  // Loop thread. Idempotent.
  void close() {
    if (!box_) return;
    std::deque<T> dropped;
    {
      std::lock_guard<std::mutex> lock(shared_->mu);
      shared_->closed = true;
      shared_->async = nullptr;
      dropped.swap(shared_->items);
    }
    box_->closing = true;
    close_and_free(std::move(box_), &Box::handle);
  }

  // Lets the loop exit while this queue is its only handle (uv_unref); loop thread.
  void unref() {
    if (box_) uv_unref(reinterpret_cast<uv_handle_t*>(&box_->handle));
  }

  bool closed() const { return box_ == nullptr; }

 private:
  struct Box {
    uv_async_t handle;
    std::shared_ptr<Shared> shared;
    Handler handler;
    bool closing = false;
  };

  static void on_async(uv_async_t* handle) {
    auto* box = static_cast<Box*>(handle->data);
    std::deque<T> batch;
    {
      std::lock_guard<std::mutex> lock(box->shared->mu);
      batch.swap(box->shared->items);
    }
    // The box outlives this callback even if the handler closes the queue (freed in the close
    // callback), so `box` stays valid; `closing` stops delivery at once.
    for (T& item : batch) {
      if (box->closing) break;
      if (box->handler) box->handler(std::move(item));
    }
  }

  std::unique_ptr<Box> box_;        // null once closed
  std::shared_ptr<Shared> shared_;  // also held by Senders
};

}  // namespace sx::daemon::loop
