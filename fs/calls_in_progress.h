// Calls in progress, and how long the oldest has waited: the daemon's calls into SOURCE's own
// filesystem (lookups, opens, listings, stats, closes). Those run on the threads that serve the
// mount, and a store that stops answering (an NFS server gone) holds each of them there, where
// nothing else would show it; accelfs-stat and the metrics show this instead.
//
// Thread safety: every method may be called concurrently.
#pragma once

#include <chrono>
#include <cstdint>
#include <list>

#include "cache/mutex.h"

namespace accelfs {

class CallsInProgress {
 public:
  using Clock = std::chrono::steady_clock;

  struct Snapshot {
    uint64_t count = 0;
    double oldest_seconds = 0;  // 0 when none
  };

  // One call, from construction to destruction.
  class Scope {
   public:
    explicit Scope(CallsInProgress& calls) : calls_(calls) {
      MutexLock lock(calls_.mu_);
      it_ = calls_.started_.insert(calls_.started_.end(), Clock::now());
    }
    ~Scope() {
      MutexLock lock(calls_.mu_);
      calls_.started_.erase(it_);
    }
    Scope(const Scope&) = delete;
    Scope& operator=(const Scope&) = delete;

   private:
    CallsInProgress& calls_;
    std::list<Clock::time_point>::iterator it_;
  };

  Snapshot Now(Clock::time_point now = Clock::now()) const {
    MutexLock lock(mu_);
    Snapshot s;
    s.count = started_.size();
    // Appended in the order they began (one clock, read under the lock): the front is the oldest.
    if (!started_.empty()) {
      s.oldest_seconds = std::chrono::duration<double>(now - started_.front()).count();
    }
    return s;
  }

 private:
  mutable Mutex mu_;
  std::list<Clock::time_point> started_ ACCELFS_GUARDED_BY(mu_);
};

}  // namespace accelfs
