// Status / StatusOr: the one error convention of ctrun's core. Fallible functions return these
// instead of throwing; only main.cc catches exceptions (from CLI11, spdlog and other third-party
// code). A Status is OK or carries a one-line message for the user.
#pragma once

#include <cerrno>
#include <cstring>
#include <optional>
#include <string>
#include <utility>
#include <variant>

namespace ctrun {

// [[nodiscard]]: a Status or StatusOr returned by any call must be looked at. Where ignoring one is
// correct, the call says so with an explicit (void) cast and a comment giving the reason.
class [[nodiscard]] Status {
 public:
  Status() = default;  // OK
  static Status Ok() { return Status(); }
  static Status Error(std::string message) { return Status(std::move(message)); }
  // "what: strerror(err)"; errno captured by the caller before any other call.
  static Status Errno(const std::string& what, int err) {
    return Status(what + ": " + std::strerror(err));
  }

  bool ok() const { return !message_.has_value(); }
  explicit operator bool() const { return ok(); }
  const std::string& message() const {
    static const std::string kEmpty;
    return message_ ? *message_ : kEmpty;
  }

 private:
  explicit Status(std::string m) : message_(std::move(m)) {}
  std::optional<std::string> message_;
};

template <typename T>
class [[nodiscard]] StatusOr {
 public:
  StatusOr(T value) : v_(std::move(value)) {}              // NOLINT: implicit by design
  StatusOr(Status status) : v_(std::move(status)) {}       // NOLINT: must not be OK
  bool ok() const { return std::holds_alternative<T>(v_); }
  explicit operator bool() const { return ok(); }
  Status status() const { return ok() ? Status::Ok() : std::get<Status>(v_); }
  const std::string& message() const { return std::get<Status>(v_).message(); }
  T& value() & { return std::get<T>(v_); }
  const T& value() const& { return std::get<T>(v_); }
  T&& value() && { return std::get<T>(std::move(v_)); }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }
  T& operator*() & { return value(); }
  const T& operator*() const& { return value(); }

 private:
  std::variant<T, Status> v_;
};

}  // namespace ctrun
