// Errors as values. Every failure in accelfs is an errno: that is what the FUSE reply needs and
// what a tool prints, so an Error carries exactly one (see fs/errno_map.h for the one place that
// chooses which errno a request answers).
#pragma once

#include <cassert>
#include <cstring>
#include <string>
#include <utility>
#include <variant>

namespace accelfs {

class Error {
 public:
  explicit constexpr Error(int code) : code_(code) {}
  constexpr int code() const { return code_; }
  std::string Message() const { return std::strerror(code_); }
  constexpr bool operator==(const Error&) const = default;

 private:
  int code_;
};

// A value or an Error. REQUIRES: value() only when ok(), error() only when !ok().
template <typename T>
class [[nodiscard]] Result {
 public:
  Result(T value) : v_(std::move(value)) {}  // NOLINT(google-explicit-constructor)
  Result(Error error) : v_(error) {}         // NOLINT(google-explicit-constructor)

  bool ok() const { return v_.index() == 0; }
  T& value() & {
    assert(ok());
    return std::get<0>(v_);
  }
  const T& value() const& {
    assert(ok());
    return std::get<0>(v_);
  }
  T&& value() && {
    assert(ok());
    return std::get<0>(std::move(v_));
  }
  Error error() const {
    assert(!ok());
    return std::get<1>(v_);
  }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }
  T& operator*() & { return value(); }

 private:
  std::variant<T, Error> v_;
};

// Success or an Error, for operations without a value.
class [[nodiscard]] Status {
 public:
  Status() = default;
  Status(Error error) : code_(error.code()) {}  // NOLINT(google-explicit-constructor)
  static Status Ok() { return Status(); }
  bool ok() const { return code_ == 0; }
  Error error() const {
    assert(!ok());
    return Error(code_);
  }

 private:
  int code_ = 0;
};

}  // namespace accelfs
