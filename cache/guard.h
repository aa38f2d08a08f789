// Thread entry points and C callbacks never let an exception out: one that leaves a thread's
// function calls std::terminate, and one that unwinds through libfuse's or the kernel's C frames
// is undefined, and either would take the whole mount down (every open of it ENOTCONN, every
// mapping of a cached-mode file SIGBUS) for one bad request or one failed allocation.
#pragma once

#include <chrono>
#include <exception>
#include <new>
#include <string_view>
#include <thread>

#include <spdlog/spdlog.h>

namespace accelfs {

// What an exception says, for the one log line it gets.
inline const char* ExceptionText(const std::exception_ptr& e) {
  try {
    std::rethrow_exception(e);
  } catch (const std::bad_alloc&) {
    return "out of memory";
  } catch (const std::exception& x) {
    return x.what();
  } catch (...) {
    return "an unknown exception";
  }
}

// Runs `body` on a long-lived thread (`what` names it in the log). When it throws, logs one line
// and runs it again after a pause, so that a thread the data path depends on outlives one failed
// allocation instead of leaving every request it would have served waiting forever. `body` must
// be restartable: its state lives in members, not in locals it cannot lose.
template <typename Body>
void RunGuarded(std::string_view what, Body&& body) noexcept {
  for (;;) {
    try {
      body();
      return;
    } catch (...) {
      try {
        spdlog::error("{} thread: {}; going on", what, ExceptionText(std::current_exception()));
      } catch (...) {
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
  }
}

// Runs `body` once (a connection, a job); when it throws, logs one line and returns false.
template <typename Body>
bool RunOnce(std::string_view what, Body&& body) noexcept {
  try {
    body();
    return true;
  } catch (...) {
    try {
      spdlog::error("{}: {}", what, ExceptionText(std::current_exception()));
    } catch (...) {
    }
    return false;
  }
}

}  // namespace accelfs
