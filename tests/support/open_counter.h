// Counts the opens of one file, by any process (inotify IN_OPEN): how tests see that the daemon
// read a backing file, and how often.
#pragma once

#include <gtest/gtest.h>
#include <sys/inotify.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <string>

namespace accelfs::testing {

class OpenCounter {
 public:
  OpenCounter() : fd_(inotify_init1(IN_NONBLOCK | IN_CLOEXEC)) {
    EXPECT_GE(fd_, 0) << std::strerror(errno);
  }
  explicit OpenCounter(const std::string& path) : OpenCounter() { Watch(path); }
  ~OpenCounter() { close(fd_); }
  OpenCounter(const OpenCounter&) = delete;
  OpenCounter& operator=(const OpenCounter&) = delete;

  // Counts the opens of `path` from now on (a file written anew: watch it again).
  void Watch(const std::string& path) {
    EXPECT_GE(inotify_add_watch(fd_, path.c_str(), IN_OPEN), 0)
        << path << ": " << std::strerror(errno);
  }

  // The opens since the last call. inotify merges an event into an identical one not yet read,
  // so back-to-back opens with no Take() between them count once.
  int Take() {
    int opens = 0;
    alignas(inotify_event) char buffer[4096];
    for (ssize_t n; (n = read(fd_, buffer, sizeof(buffer))) > 0;) {
      for (ssize_t at = 0; at < n;) {
        const auto* event = reinterpret_cast<const inotify_event*>(buffer + at);
        opens += (event->mask & IN_OPEN) != 0;
        at += static_cast<ssize_t>(sizeof(inotify_event) + event->len);
      }
    }
    return opens;
  }

 private:
  int fd_;
};

}  // namespace accelfs::testing
