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
//
// fusectl's files belong to the user who mounted the store (mode 0600): a daemon run by another
// user (a mount by a user who is not root over a store root mounted) cannot read the limit. There
// the store's answers tell it, where they are slow enough to (LearnQueue): reads sent at once
// beyond the connection's queue wait in the kernel until one before them is answered, so they
// come back one answer after the first ones; reads the queue takes all come back together.
// Measured on NET (max_background 64, 5 ms answers): assuming libfuse's 12 there held a user's
// cold loads to 0.26-0.45 GB/s of a 1.95 GB/s ceiling.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "cache/backend/bounded_reader.h"

namespace accelfs {

// A FUSE store's queue as the kernel shows it.
struct FuseQueue {
  // fusectl's, or learned from the store's answers, or libfuse's default where neither says.
  enum class From { kFusectl, kAnswers, kDefault };
  unsigned max_background = 12;
  uint64_t max_read = 0;  // from the mount's options; 0 when not set there
  // The store reads each file best front to back, one request at a time: rclone (fuse.rclone),
  // whose chunked reader starts a new range at each out-of-order read. A 96 MiB file, cold, at
  // 1 Gbit/s: 14.3 s with 3 requests of the file in flight, 0.89 s with one (0.87 s read directly).
  bool sequential = false;
  From from = From::kFusectl;
};

// How LearnQueue sends its reads. First `singles` reads one at a time: the quickest is the store's
// answer time. A store that answers quicker than `min_answer` is not probed further: there a read
// held back by the queue comes too soon after the others to be told from them (the rig's sshfs,
// s3fs and zfs-fuse answer a cached page in well under a millisecond, and a round's first answer
// waits on the kernel's workers starting: 64 reads through a queue of 12 came back within 1.5x of
// their first answer). Then rounds of reads sent at once. A read the queue holds back is sent to
// the store only once one before it was answered, so it comes a whole store answer (at least the
// answer time less the kernel's own part of it) after the round's first: the reads that came
// within `spread` of an answer time after the first were in the store together, and the queue
// takes at least that many. A round is tried up to `tries` times, until all its reads came so; a
// bigger one only after that. A loaded machine delays some reads (a worker or the store's thread
// waits for a CPU, 4 ms at a time): that makes a count smaller, and the next try may show more.
// (Only this thread's own wait for a CPU, from before the first answer until after a held one,
// could make a count larger.)
struct QueueProbe {
  // Each must be answered within `give_up`, or nothing more is sent: a store that hangs or crawls
  // before the rounds is sent none of them (one that starts to during a round holds that round's
  // reads, up to 64, until it answers).
  unsigned singles = 3;
  std::chrono::microseconds min_answer{2000};
  std::vector<unsigned> rounds{16, 32, 64};  // each more than libfuse's 12
  double spread = 0.5;
  unsigned tries = 3;
  std::chrono::milliseconds give_up{1000};
};

// One round: `count` reads sent at once, each one's answer time since the send, in the order they
// came (TimeReadsAtOnce of one file); nothing when any failed or they were not back in time.
using TimeRound =
    std::function<std::optional<std::vector<std::chrono::microseconds>>(unsigned count)>;

// The most reads a store's queue was seen to take at once: the largest first wave of `probe`'s
// rounds, the rounds tried in order while each came back whole. 0 where the store answers
// quicker than `min_answer`, or where a single read failed or took longer than `give_up`; what
// the rounds before showed where a round's read failed or took too long. Never more than the
// queue where the store's answer time is its own, not the machine's.
unsigned LearnQueue(const TimeRound& round, const QueueProbe& probe = {});

// The limits for a store with `queue`: pieces of at most max_read (and 1 MiB), at most half its
// queue for accelfs (the rest stays for readers outside it), at most a quarter for one file, or
// seven eighths of accelfs's half while it is the only file read (one where the store is
// `sequential`).
StoreLimits LimitsForQueue(const FuseQueue& queue);

// `file`'s store's queue, or nothing when the file is not on a FUSE filesystem. Mounts fusectl on
// /sys/fs/fuse/connections when it is not mounted (as root). Where its max_background cannot be
// read, learns it from reads of `file`'s last page (a page its identity's samples read already),
// else assumes libfuse's 12; not on a store that reads files front to back (rclone: one request
// per file whatever its queue, and a jump to the last page costs it a new range).
std::optional<FuseQueue> FuseQueueOf(const BackingFile& file,
                                     const std::string& connections = "/sys/fs/fuse/connections",
                                     const std::string& mountinfo = "/proc/self/mountinfo");

// The StoreLimitsFn the daemon gives the backend: LimitsForQueue of FUSE stores (logged once per
// store), no limits for others.
StoreLimits StoreLimitsOf(const BackingFile& file);

}  // namespace accelfs
