// Errors as values, the one error style of accelfs: a function that can fail returns Result<T> or
// Status. Every failure is an errno, which is what a FUSE reply needs (fs/errno_map.h is the one
// place that chooses which errno a request answers), and may carry one line for a person (a bad
// option, a refused cache dir), which a tool or the daemon prints as it is.
#pragma once

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <utility>
#include <variant>

namespace accelfs {

class Error {
 public:
  explicit Error(int code) : code_(code) {}
  // `message`: the one line a person reads (what failed and why), for errors that end at a
  // command line or a log rather than in a FUSE reply.
  Error(int code, std::string message) : code_(code), message_(std::move(message)) {}
  int code() const { return code_; }
  // The message given, else strerror(code()).
  std::string Message() const { return message_.empty() ? std::strerror(code_) : message_; }
  // Errors are the same when their errno is: the message is for people, the errno for code.
  bool operator==(const Error& other) const { return code_ == other.code_; }

 private:
  int code_;
  std::string message_;
};

// value() of an error or error() of a value is a bug: it ends the process with one line, in every
// build (an assert would be compiled out of the builds users run).
[[noreturn]] inline void BadResultAccess(const char* what) {
  std::fprintf(stderr, "accelfs: internal error: %s\n", what);
  std::abort();
}

// A value or an Error. REQUIRES: value() only when ok(), error() only when !ok().
template <typename T>
class [[nodiscard]] Result {
 public:
  Result(T value) : v_(std::move(value)) {}  // NOLINT(google-explicit-constructor)
  Result(Error error) : v_(error) {}         // NOLINT(google-explicit-constructor)

  bool ok() const { return v_.index() == 0; }
  T& value() & {
    if (!ok()) BadResultAccess("value() of an error");
    return std::get<0>(v_);
  }
  const T& value() const& {
    if (!ok()) BadResultAccess("value() of an error");
    return std::get<0>(v_);
  }
  T&& value() && {
    if (!ok()) BadResultAccess("value() of an error");
    return std::get<0>(std::move(v_));
  }
  const Error& error() const {
    if (ok()) BadResultAccess("error() of a value");
    return std::get<1>(v_);
  }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }
  T& operator*() & { return value(); }
  const T& operator*() const& { return value(); }

 private:
  std::variant<T, Error> v_;
};

// Success or an Error, for operations without a value.
class [[nodiscard]] Status {
 public:
  Status() = default;
  Status(Error error) : error_(std::move(error)) {}  // NOLINT(google-explicit-constructor)
  static Status Ok() { return Status(); }
  bool ok() const { return error_.code() == 0; }
  const Error& error() const {
    if (ok()) BadResultAccess("error() of a success");
    return error_;
  }

 private:
  Error error_{0};
};

}  // namespace accelfs
