// What a backing store's own request queue takes, for the backend's bound on it
// (cache/backend/bounded_reader.h, DESIGN.md §6.11).
//
// A FUSE store (sshfs, s3fs, rclone, zfs-fuse, a FUSE mount of an object store) serves every
// reader on the node through one kernel connection. Once the connection's background requests
// (read-ahead, and every O_DIRECT or asynchronous read) reach its `max_background` (libfuse's
// default 12), the kernel holds back every new one, of every process: readers that stay under it
// keep the store usable for everyone. The kernel shows the limit in
// /sys/fs/fuse/connections/DEV/max_background (fusectl, mounted here if it is not); one O_DIRECT
// read becomes a request per `max_read` bytes (in the mount's options where the store set it),
// and per 1 MiB at most (FUSE's 256-page cap; libfuse 3 takes it).
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "cache/backend/bounded_reader.h"

namespace accelfs {

// A FUSE store's queue as the kernel shows it.
struct FuseQueue {
  unsigned max_background = 12;  // libfuse's default, where fusectl cannot be read
  uint64_t max_read = 0;         // from the mount's options; 0 when not set there
  // The store reads each file best front to back, one request at a time: rclone (fuse.rclone),
  // whose chunked reader starts a new range at each out-of-order read. A 96 MiB file, cold, at
  // 1 Gbit/s: 14.3 s with 3 requests of the file in flight, 0.89 s with one (0.87 s read directly).
  bool sequential = false;
};

// The limits for a store with `queue`: pieces of at most max_read (and 1 MiB), at most half its
// queue for accelfs (the rest stays for readers outside it), at most a quarter for one file, or
// seven eighths of accelfs's half while it is the only file read (one where the store is
// `sequential`).
StoreLimits LimitsForQueue(const FuseQueue& queue);

// `file`'s store's queue, or nothing when the file is not on a FUSE filesystem. Mounts fusectl on
// /sys/fs/fuse/connections when it is not mounted (as root; else the default limit is assumed).
std::optional<FuseQueue> FuseQueueOf(const BackingFile& file,
                                     const std::string& connections = "/sys/fs/fuse/connections",
                                     const std::string& mountinfo = "/proc/self/mountinfo");

// The StoreLimitsFn the daemon gives the backend: LimitsForQueue of FUSE stores (logged once per
// store), no limits for others.
StoreLimits StoreLimitsOf(const BackingFile& file);

}  // namespace accelfs
