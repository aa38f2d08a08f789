// A bound on the daemon's exit, whatever the store does. A thread that waits inside a call into
// SOURCE's own filesystem (a lookup on an NFS server gone, an open on a stopped S3-FUSE process)
// can be neither woken nor joined, and every orderly way out joins some thread: libfuse's loop
// joins the threads serving the mount, the control server its connections, the filesystem its
// shard opener. So once the daemon is asked to stop (SIGTERM, SIGINT, SIGHUP, an unmount), the
// orderly exit gets `grace`; past it this detaches the mount, answers the requests still waiting
// on it (their callers get ENOTCONN instead of waiting for the store), lets go of the cache dir,
// logs one line and ends the process without destructors. A thread asleep in the store's kernel
// on a request that the store's daemon took and never answers cannot be ended by anyone: the
// process stays (a zombie, with that thread) until the store answers, but the mount, the callers
// and the cache dir are free at once, and a new daemon can serve. Nothing of the daemon's is
// touched on that path but descriptors, each replaced by /dev/null, never freed for reuse, so it
// is safe beside whatever the other threads are doing. A --cache-dir
// keeps what was committed: blocks are committed one by one, as after a kill -9.
//
// What is detached and aborted is this daemon's own mount, known from the start: by the time of
// the deadline the mountpoint may hold a new daemon's mount (an unmount, then a restart, while
// this one waited on its store), and a FUSE connection's number is its anonymous device's minor,
// which the kernel hands to the next mount anywhere as soon as this one's is gone. So the mount's
// device is noted and its fusectl abort file opened once it is mounted (the open file aborts its
// own connection or, once that is gone, nothing); the mount at the mountpoint is detached only if
// it is still that device (docs/DESIGN.md, "History kept out of the code").
//
// Thread safety: Watch, Arm and the destructor are called from one thread (the daemon's main
// thread); `stopping` runs on this class's own thread.
#pragma once

#include <chrono>
#include <condition_variable>
#include <functional>
#include <optional>
#include <string>
#include <thread>
#include <utility>

#include "cache/mutex.h"

namespace accelfs {

class ExitDeadline {
 public:
  struct Options {
    std::string mountpoint;  // canonical path of the mount, fuse.accelfs
    std::string cache_dir;   // canonical path of the --cache-dir, or empty
    // Longer than an orderly exit ever takes with a store that answers: that waits at most the
    // backend's stop grace (2 s, BoundedReaderOptions::stop_grace) for reads in flight, and the
    // rest of it takes milliseconds. Short enough that a stop is "within seconds".
    std::chrono::milliseconds grace{5'000};
    int exit_code = 0;  // the daemon was asked to stop, and did
  };

  // Notes the fuse.accelfs mount on `options.mountpoint`, if any (the daemon's own: constructed
  // once it is mounted), and starts the thread, which waits for Watch or Arm.
  explicit ExitDeadline(Options options);
  ~ExitDeadline();  // ends the watch; an exit that got here was orderly
  ExitDeadline(const ExitDeadline&) = delete;
  ExitDeadline& operator=(const ExitDeadline&) = delete;

  // Starts the watch: `stopping` is asked every kPoll until it says the daemon was asked to stop
  // (the FUSE session's exit flag: a signal, or the kernel ending the mount), and the grace
  // starts then. REQUIRES: what `stopping` reads lives until Arm or the destructor returns.
  void Watch(std::function<bool()> stopping);
  // Starts the grace now, unless it has started already; `stopping` is not called again.
  void Arm();

  static constexpr std::chrono::milliseconds kPoll{100};

 private:
  void Run();
  void StartGrace() ACCELFS_REQUIRES(mu_);
  // The way out past the deadline. Never returns.
  [[noreturn]] void Expire() const;

  const Options options_;
  // The daemon's own mount at construction (its device), and its fusectl abort file (-1 where
  // there was none, or fusectl was not mounted: opened at the deadline if the mountpoint still
  // holds that device, else the exit alone ends the connection).
  std::optional<std::pair<unsigned, unsigned>> own_device_;
  int abort_fd_ = -1;
  int waiting_fd_ = -1;  // its connection's "waiting" file: read empty once that mount is gone
  Mutex mu_;
  std::condition_variable wake_;
  std::function<bool()> stopping_ ACCELFS_GUARDED_BY(mu_);
  bool armed_ ACCELFS_GUARDED_BY(mu_) = false;
  bool done_ ACCELFS_GUARDED_BY(mu_) = false;
  std::chrono::steady_clock::time_point deadline_ ACCELFS_GUARDED_BY(mu_);  // once armed_
  std::thread thread_;  // last: it starts once the fields above are ready
};

}  // namespace accelfs
