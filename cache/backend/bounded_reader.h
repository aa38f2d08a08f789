// A reader in front of the others that keeps one hung or crawling backing file from taking the
// whole backend, and a read that never returns from holding its readers forever.
//
// Why: one shard whose reads hung in the store (an NFS server gone, a stuck S3-FUSE request) took
// every backend slot with its fill and prefetch; a read of another shard then waited 8 s and a
// 100 KiB file 3 s, while the store answered those directly in 0.05 s. And a read blocked in a
// hung kernel filesystem may never complete and cannot be cancelled.
//
// - Share: each backing file (its inode, whichever open reads it) has at most `share` of the inner
//   reader's depth in flight (demand and prefetch together, stalled reads included); its further
//   requests wait here, so they take no slot and no window below. Another file's demand read
//   finds a slot at once. Half, even for a file read alone: with seven eighths for a lone file, a
//   shard that hung after its window had opened held 28 of 32 slots, the adaptive depth then
//   stepped down under it (its reads waited), and another file through accelfs got no slot until
//   the store timeout (StoreQueueTest, max_background 128). A hung read holds its slot until it
//   stalls, so what a file may hold is what the others may lose.
// - Slow start: within its share a file has a window that starts at `initial_window` reads (4, as
//   a TCP sender's initial window: a file's two identity samples and its first reads go out
//   together) and widens by one with each read of it that completes (doubling per round trip). A
//   file none of whose reads completes for `probe_after` (or four times its reads' usual time, if
//   longer) falls back to one read at a time, a probe, and widens again once that one returns. A
//   file that hangs from its first read therefore holds its initial window of the store at most,
//   not its share. A file that went idle keeps its window for `probe_after`: a loader that reads
//   a block, copies it and reads the next leaves its file idle between reads many times a second,
//   and starting each burst from the initial window again cost a round trip or two per burst
//   (cold loads of 32 MiB shards through the NET emulator took 0.29 s against 0.19 s).
// - The store's queue (DESIGN.md §6.11): `limits` tells, per backing filesystem, how many requests
//   its own queue takes (a FUSE store's max_background) and how big one request is. A read bigger
//   than that is sent as pieces of that size, each one request; accelfs keeps at most
//   `store_requests` of them in flight to that store and one file at most `file_requests`, or
//   `lone_file_requests` while no other file of the store has a read in flight or waiting (a lone
//   shard or a single-file model gets most of the store; one that arrives beside it finds the rest
//   free and takes slots as the first file falls back to its `file_requests`), or while it is the
//   store's only file with demand reads in flight or waiting: a shard whose open waits for its fill
//   is not held to its file bound by the next shard streaming in beside it (a prefetch), which
//   takes what it leaves. Held so, the awaited shard arrived only with the next one, and with a
//   cache of half the model (the look-ahead budget stops the chain there) the store sat idle while
//   the loader copied the first of each pair. So one hung or crawling file can never fill the
//   queue that every reader of the store, inside accelfs and out, goes through, nor take
//   accelfs's last slot of it.
// - More depth: a file held back by its share and by nothing else (not its window, nor its
//   store's bounds), whose reads come back, tells the inner reader (NoteHeldBack), which an
//   adaptive one takes as requests waiting for a slot: the share follows the depth, and the depth
//   grows only while requests wait in the inner reader, which the share kept from happening. Not a
//   file none of whose reads came back lately (four usual times, at least a tenth of
//   `probe_after`): one that hung would only get more slots to hang in. A lone file on a store that
//   takes 64 requests stayed at 16 of the 28 its store allows, behind the start depth of 32, for
//   good (NET, one 3 GiB file: 1.1-1.3 GB/s, 1.65-1.8 with it; docs/BENCHMARKS.md). And a
//   store's first read tells the inner reader its lone bound (NoteStoreBound): an adaptive one
//   that has measured nothing yet starts where the share covers it, not ~0.2 s later.
// - O_DIRECT or the page cache (`io`): O_DIRECT by default; kAuto tries both on each store's
//   first reads and sends the rest the way that read faster (IoChoice, logged once per store);
//   never on a `sequential` store.
// - Flight: at most twice the inner reader's depth is sent at a time (stalled reads aside): enough
//   that it sees requests waiting for a slot (what makes an adaptive depth grow), few enough that
//   a request's time since it was sent is its time at the backend, not in a queue below. Waiting
//   requests go oldest first, demand before prefetch.
// - Timeout: a request in flight for `timeout` while its file completed nothing for as long is
//   stalled: its `stalled` callback runs (the cache answers its waiters ETIMEDOUT); `done` still
//   follows if the read ever returns, and the buffer stays the read's until then. A request that
//   waited here that long is answered ETIMEDOUT without being sent. A slow store that moves never
//   trips it: any completion of the file restarts its clock.
// - Lost slots: a stalled request no longer counts against the inner reader's depth
//   (StoreReader::NoteLost), so the backend goes on serving with the rest; they are counted.
// - Stop: answers what waits here ECANCELED and gives what is in flight `stop_grace` to finish,
//   then stalls the rest and returns without waiting for them (abandoned()): shutdown never waits
//   for a hung store. The inner reader must then not be stopped (it would wait), nor anything the
//   abandoned reads write into be freed: the process exits instead (fs/daemon/daemon_serve.cc).
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <thread>
#include <vector>

#include "cache/backend/admission_policy.h"
#include "cache/backend/io_choice.h"
#include "cache/backend/reader.h"
#include "cache/backend/stall_watch.h"
#include "cache/mutex.h"

namespace accelfs {

struct BoundedReaderOptions {
  // Of the inner reader's current depth, per backing file (at least one slot). Half: a lone file
  // still gets 16 of the default 32 (2.6 GB/s of 4 MiB reads at 25 ms each, above the NET
  // emulator's 2 GB/s), and everything else keeps the other half while one file crawls.
  double share = 0.5;
  std::chrono::milliseconds timeout{60'000};  // 0: never
  std::chrono::milliseconds stop_grace{2'000};
  // Slow start (see above): a file's window when it starts or starts again after idle, and the
  // quiet time after which it falls back to a probe.
  unsigned initial_window = 4;
  std::chrono::milliseconds probe_after{1'000};
  StoreLimitsFn limits;  // none: every store unbounded
  // How reads of a file that takes O_DIRECT are sent: learned per store, or always one way.
  using Io = StoreIo;
  Io io = Io::kDirect;
  IoChoice::Options io_choice;
};

struct BoundedReaderStats {
  uint64_t stuck = 0;      // requests in flight past the timeout now (slots lost)
  uint64_t timed_out = 0;  // requests stalled or answered ETIMEDOUT, since start
  uint64_t waiting = 0;    // requests held back now because their file has its share
  uint64_t abandoned = 0;  // requests still in flight when Stop gave up on them
  uint64_t probing = 0;    // files held to one read now because their reads stopped completing
  uint64_t pieces = 0;     // reads split into a store's request size, since start
  uint64_t buffered_stores = 0;  // stores read through the page cache (IoChoice's choice)
};

class BoundedReader final : public StoreReader {
 public:
  BoundedReader(std::unique_ptr<StoreReader> inner, BoundedReaderOptions options);
  // REQUIRES: Stop() was called, or nothing was submitted. When reads were abandoned, the inner
  // reader is leaked (stopping it would wait for them).
  ~BoundedReader() override;

  void Submit(ReadRequest request) override;
  void Stop() override;
  unsigned CurrentDepth() const override { return inner_->CurrentDepth(); }
  void NoteLost(int delta) override { inner_->NoteLost(delta); }

  // After Stop: whether reads were still in flight when it returned.
  bool abandoned() const;
  BoundedReaderStats Stats() const;

 private:
  using Clock = std::chrono::steady_clock;
  using Admitted = AdmissionPolicy::Admitted;

  // Registers each admitted request with the watchdog, its answer routed to Completed. The
  // caller submits what it returns after unlocking.
  std::vector<ReadRequest> Register(std::vector<Admitted> admitted) ACCELFS_REQUIRES(mu_);
  // The admission policy's AdmitWaiting, registered: what to submit once mu_ is released, and
  // whether a file waits that only the share holds (NoteHeldBack then).
  std::vector<ReadRequest> AdmitWaiting(bool* held_back) ACCELFS_REQUIRES(mu_);
  void Completed(uint64_t id, Result<size_t> result) ACCELFS_EXCLUDES(mu_);
  // Without mu_: Share reads only the options, fixed at construction.
  unsigned Share() const ACCELFS_NO_THREAD_SAFETY_ANALYSIS {
    return admission_.Share(inner_->CurrentDepth());
  }
  // The limits of `file`'s filesystem, asked of options_.limits the first time.
  StoreLimits LimitsOf(const BackingFile& file) ACCELFS_EXCLUDES(mu_);
  // The watcher thread: slow start's probes, then the timeout.
  void Watch();
  // Stalls every in-flight request for which `pick` holds, and answers ETIMEDOUT every waiting
  // one for which `expired` does. Both run with mu_ held.
  void StallWhere(
      const std::function<bool(const StallWatch::InFlight&)>& pick,
      const std::function<bool(Clock::time_point, const AdmissionPolicy::PerFile&)>& expired)
      ACCELFS_EXCLUDES(mu_);
  // Runs the stall callbacks of `stalling`, then answers those that came back meanwhile.
  void RunStalled(std::vector<std::pair<uint64_t, std::function<void()>>> stalling)
      ACCELFS_EXCLUDES(mu_);
  // Without mu_: the watchdog's timeout, fixed at construction.
  bool TimesOut() const ACCELFS_NO_THREAD_SAFETY_ANALYSIS { return watch_.times_out(); }
  Clock::time_point Deadline() const ACCELFS_NO_THREAD_SAFETY_ANALYSIS { return watch_.Deadline(); }

  std::unique_ptr<StoreReader> inner_;  // released, not destroyed, when reads were abandoned
  const BoundedReaderOptions options_;

  mutable Mutex mu_;  // a leaf: no callback and no Submit below runs under it
  std::condition_variable cv_;
  // Neither has a lock of its own: each of their methods runs with mu_ held, which the analysis
  // checks here (a call of one is a read or write of the member).
  AdmissionPolicy admission_ ACCELFS_GUARDED_BY(mu_);
  StallWatch watch_ ACCELFS_GUARDED_BY(mu_);
  bool stopping_ ACCELFS_GUARDED_BY(mu_) = false;
  bool abandoned_ ACCELFS_GUARDED_BY(mu_) = false;
  std::thread watcher_;
};

}  // namespace accelfs
