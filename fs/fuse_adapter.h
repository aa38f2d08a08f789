// The FUSE session. fuse_adapter.cc is the only file that includes fuse_lowlevel.h: its callbacks
// convert arguments, call ReadThroughFs, and reply.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "cache/result.h"
#include "fs/read_through_fs.h"

namespace accelfs {

struct SessionOptions {
  std::string source;  // shown as the mount's fsname
  std::string mountpoint;
  std::vector<std::string> fuse_options;  // passed to libfuse as -o
  double attr_timeout = 3600;
  double entry_timeout = 3600;
  // Readahead READs are background requests; the kernel's default of 12 caps a cold read's
  // parallelism (docs/DESIGN.md section 2).
  unsigned max_background = 64;
  // Threads serving requests: more start while all are busy, up to max_threads, and those beyond
  // max_idle_threads end when idle. A LOOKUP, OPEN or READDIR waits in the store's own call
  // (fstatat, open, getdents), and a store that stops answering (an NFS server gone, a stuck
  // S3-FUSE request) holds each such thread: with 16 in all, 16 waiting calls stopped every
  // read of every file. Each caller waiting holds one, so the cap is what a node's loaders could
  // have waiting at once, many times over; reads go on with the threads left.
  unsigned max_threads = 1024;
  unsigned max_idle_threads = 16;
  // Offer FUSE passthrough to the kernel (fully cached files then never reach the daemon). Only
  // useful when the cache's store keeps files (FileBlockStore).
  bool passthrough = false;
};

class FuseSession {
 public:
  // Creates the session and installs SIGINT/SIGTERM/SIGHUP handlers that end the loop.
  static Result<std::unique_ptr<FuseSession>> Create(ReadThroughFs& fs, SessionOptions options);
  ~FuseSession();  // unmounts if mounted

  Status Mount();
  // Serves requests on a thread pool until unmounted or signalled. Its error: what ended the loop,
  // when not an unmount.
  Status Loop();
  void Unmount();
  // Whether the loop was asked to end: a signal, or the kernel ending the mount. Any thread.
  bool Exiting() const;
  // Blocks until the kernel has processed the INIT reply (true: the mount answers requests and its
  // read_ahead_kb may be tuned) or Unmount was called (false). Unlike a stat of the mount, this
  // never leaves a thread of the daemon waiting on its own mount, which a SIGKILL could not end.
  bool WaitInitialized();
  // Whether the kernel agreed to passthrough (known once INIT is done).
  bool passthrough() const;
  // Whether the kernel's INIT offered passthrough at all (Linux 6.9+), asked for or not.
  bool kernel_offers_passthrough() const;
  // Whether shared mappings of handles opened with direct I/O work (FUSE_DIRECT_IO_ALLOW_MMAP,
  // Linux 6.6+; known once INIT is done): only then may ReadThroughFs open handles direct.
  bool direct_io_mmap() const;
  // The mount's page cache, for pushing data ahead of readers. Valid while the session lives.
  KernelCache& kernel_cache();

  struct Impl;

 private:
  explicit FuseSession(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace accelfs
