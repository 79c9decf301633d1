// libuv error codes -> sx::Status.
#include "daemon/loop/uv_status.h"

namespace sx::daemon::loop {

namespace {

StatusCode code_for(int rc) {
  switch (rc) {
    case UV_EINVAL:
    case UV_EAI_FAMILY:
    case UV_EAI_NONAME:
      return StatusCode::kInvalidArgument;
    case UV_EACCES:
    case UV_EPERM:
      return StatusCode::kPermissionDenied;
    case UV_ENOMEM:
    case UV_ENOBUFS:
    case UV_EMFILE:
    case UV_ENFILE:
      return StatusCode::kResourceExhausted;
    case UV_ECANCELED:
      return StatusCode::kCancelled;
    case UV_ETIMEDOUT:
      return StatusCode::kDeadlineExceeded;
    case UV_ENOENT:
      return StatusCode::kNotFound;
    case UV_EEXIST:
      return StatusCode::kAlreadyExists;
    case UV_EADDRINUSE:
    case UV_EADDRNOTAVAIL:
    case UV_ECONNREFUSED:
    case UV_ECONNRESET:
    case UV_EPIPE:
    case UV_EOF:
      return StatusCode::kUnavailable;
    default:
      return StatusCode::kInternal;
  }
}

}  // namespace

Status uv_status(int rc, std::string_view what) {
  if (rc >= 0) return ok_status();
  return Status(code_for(rc), fmt::format("{}: {} ({})", what, uv_strerror(rc), uv_err_name(rc)));
}

int handle_fd(const uv_handle_t* handle) {
  uv_os_fd_t fd = -1;
  return uv_fileno(handle, &fd) == 0 ? fd : -1;
}

}  // namespace sx::daemon::loop
