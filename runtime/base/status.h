// Status and Result<T>: errors as values (DESIGN.md §7.1).
//
// A Status is a canonical code plus a human message that names the file, field or request at
// fault. Result<T> holds either a value or a non-OK Status. Both are [[nodiscard]]. Propagate with
// SX_RETURN_IF_ERROR / SX_ASSIGN_OR_RETURN. Exceptions never cross a module boundary; device and
// input errors never abort.
//
// Threading: plain values, safe to move between threads.
#pragma once

#include <cstdlib>
#include <string>
#include <string_view>
#include <utility>
#include <variant>

#include <fmt/format.h>

namespace sx {

enum class StatusCode : int {
  kOk = 0,
  kCancelled,
  kInvalidArgument,
  kDeadlineExceeded,
  kNotFound,
  kAlreadyExists,
  kPermissionDenied,
  kResourceExhausted,
  kFailedPrecondition,
  kAborted,
  kOutOfRange,
  kUnimplemented,
  kInternal,
  kUnavailable,
  kDataLoss,
};

std::string_view status_code_name(StatusCode code);

class [[nodiscard]] Status {
 public:
  Status() = default;
  Status(StatusCode code, std::string message) : code_(code), message_(std::move(message)) {}

  static Status ok_status() { return Status(); }

  bool ok() const { return code_ == StatusCode::kOk; }
  StatusCode code() const { return code_; }
  const std::string& message() const { return message_; }

  // "INVALID_ARGUMENT: message" (or "OK").
  std::string to_string() const;

  // Returns a copy whose message is prefixed with `context: `.
  Status with_context(std::string_view context) const;

  // Explicitly drops a status (for best-effort cleanup paths).
  void ignore() const {}

 private:
  StatusCode code_ = StatusCode::kOk;
  std::string message_;
};

inline Status ok_status() { return Status(); }

template <typename... Args>
Status make_status(StatusCode code, fmt::format_string<Args...> f, Args&&... args) {
  return Status(code, fmt::format(f, std::forward<Args>(args)...));
}

#define SX_DEFINE_STATUS_HELPER(fn, code)                                      \
  template <typename... Args>                                                  \
  Status fn(fmt::format_string<Args...> f, Args&&... args) {                   \
    return Status(StatusCode::code, fmt::format(f, std::forward<Args>(args)...)); \
  }
SX_DEFINE_STATUS_HELPER(invalid_argument_error, kInvalidArgument)
SX_DEFINE_STATUS_HELPER(not_found_error, kNotFound)
SX_DEFINE_STATUS_HELPER(out_of_range_error, kOutOfRange)
SX_DEFINE_STATUS_HELPER(data_loss_error, kDataLoss)
SX_DEFINE_STATUS_HELPER(unavailable_error, kUnavailable)
SX_DEFINE_STATUS_HELPER(unimplemented_error, kUnimplemented)
SX_DEFINE_STATUS_HELPER(internal_error, kInternal)
SX_DEFINE_STATUS_HELPER(resource_exhausted_error, kResourceExhausted)
SX_DEFINE_STATUS_HELPER(failed_precondition_error, kFailedPrecondition)
SX_DEFINE_STATUS_HELPER(aborted_error, kAborted)
SX_DEFINE_STATUS_HELPER(deadline_exceeded_error, kDeadlineExceeded)
SX_DEFINE_STATUS_HELPER(cancelled_error, kCancelled)
SX_DEFINE_STATUS_HELPER(permission_denied_error, kPermissionDenied)
#undef SX_DEFINE_STATUS_HELPER

// Aborts with a message: for programmer errors only (broken invariants), never for input.
[[noreturn]] void fatal(std::string_view where, std::string_view message);

template <typename T>
class [[nodiscard]] Result {
 public:
  Result(T value) : v_(std::move(value)) {}  // NOLINT: implicit by design
  Result(Status status) : v_(std::move(status)) {  // NOLINT
    if (std::get<Status>(v_).ok()) fatal("Result", "constructed from an OK status without a value");
  }

  bool ok() const { return v_.index() == 0; }
  const Status& status() const {
    static const Status kOk;
    return ok() ? kOk : std::get<Status>(v_);
  }

  T& value() & { check(); return std::get<0>(v_); }
  const T& value() const& { check(); return std::get<0>(v_); }
  T&& value() && { check(); return std::get<0>(std::move(v_)); }

  T& operator*() & { return value(); }
  const T& operator*() const& { return value(); }
  T&& operator*() && { return std::move(*this).value(); }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }

 private:
  void check() const {
    if (!ok()) fatal("Result::value", std::get<Status>(v_).to_string());
  }
  std::variant<T, Status> v_;
};

}  // namespace sx

#define SX_CONCAT_INNER(a, b) a##b
#define SX_CONCAT(a, b) SX_CONCAT_INNER(a, b)

#define SX_RETURN_IF_ERROR(expr)               \
  do {                                         \
    ::sx::Status sx_status_ = (expr);          \
    if (!sx_status_.ok()) return sx_status_;   \
  } while (0)

#define SX_ASSIGN_OR_RETURN_IMPL(tmp, lhs, expr) \
  auto tmp = (expr);                             \
  if (!tmp.ok()) return tmp.status();            \
  lhs = std::move(tmp).value()

#define SX_ASSIGN_OR_RETURN(lhs, expr) \
  SX_ASSIGN_OR_RETURN_IMPL(SX_CONCAT(sx_result_, __LINE__), lhs, expr)
