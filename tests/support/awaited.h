// A callback's result, awaited: hand Callback() to an asynchronous API, then Wait() for the value.
// Counts calls, so a test can also assert that a completion ran exactly once.
#pragma once

#include <chrono>
#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>

namespace accelfs::testing {

template <typename T>
class Awaited {
 public:
  Awaited() : state_(std::make_shared<State>()) {}

  // The callback to pass on. Copies share this Awaited's state; it may outlive the Awaited.
  std::function<void(T)> Callback() const {
    return [state = state_](T value) {
      std::lock_guard lock(state->mu);
      ++state->calls;
      if (!state->value) state->value.emplace(std::move(value));
      state->cv.notify_all();
    };
  }

  // Blocks until the callback ran (true) or `timeout` passed (false).
  bool Wait(std::chrono::milliseconds timeout = std::chrono::seconds(10)) const {
    std::unique_lock lock(state_->mu);
    return state_->cv.wait_for(lock, timeout, [&] { return state_->value.has_value(); });
  }

  bool ready() const {
    std::lock_guard lock(state_->mu);
    return state_->value.has_value();
  }

  int calls() const {
    std::lock_guard lock(state_->mu);
    return state_->calls;
  }

  // REQUIRES: ready(). The first value the callback received.
  T& value() {
    std::lock_guard lock(state_->mu);
    return *state_->value;
  }

  // Drops the value (e.g. to unpin a cache block) while keeping the call count.
  void Reset() {
    std::optional<T> old;
    {
      std::lock_guard lock(state_->mu);
      old.swap(state_->value);
    }
  }

 private:
  struct State {
    std::mutex mu;
    std::condition_variable cv;
    std::optional<T> value;  // GUARDED_BY(mu)
    int calls = 0;           // GUARDED_BY(mu)
  };
  std::shared_ptr<State> state_;
};

}  // namespace accelfs::testing
