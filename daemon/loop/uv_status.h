// libuv error codes -> sx::Status, and the close-callback ownership helper every wrapper in
// daemon/loop and daemon/http uses (DESIGN.md §7.1, §7.6).
//
// Lifetime rule: the memory of a libuv handle is freed only in its close callback. A "box" is a
// heap object that embeds the handle next to whatever the callbacks need; while the handle is open
// the box is owned by a std::unique_ptr, and close_and_free() hands that ownership to the close
// callback, which destroys the box. Callbacks therefore may destroy the wrapper that owns a box
// while they run: the box (and the std::function being executed) lives until the close callback.
//
// Threading: loop thread only (libuv handles are not thread-safe; uv_async_send is the exception).
#pragma once

#include <memory>
#include <string_view>

#include <uv.h>

#include "runtime/base/status.h"

namespace sx::daemon::loop {

// Converts a negative libuv return code into a Status ("what: <uv message> (UV_NAME)"); 0 and
// positive values are OK.
Status uv_status(int rc, std::string_view what);

// The descriptor of an open handle (a listener to hand to another process), -1 when it has none.
int handle_fd(const uv_handle_t* handle);

// Takes ownership of `box`, whose member `handle` must be an initialised, not yet closing libuv
// handle, and closes it; the box is destroyed in the close callback. handle->data is overwritten.
template <typename Box, typename Handle>
void close_and_free(std::unique_ptr<Box> box, Handle Box::*handle) {
  Box* raw = box.release();
  auto* h = reinterpret_cast<uv_handle_t*>(&(raw->*handle));
  h->data = raw;
  uv_close(h, [](uv_handle_t* closed) {
    std::unique_ptr<Box> owned(static_cast<Box*>(closed->data));
  });
}

}  // namespace sx::daemon::loop
