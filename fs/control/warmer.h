// Warming: the daemon side of accelfs-warm. Resolves paths inside SOURCE (never escaping it),
// lists the files in loader order and drives BlockCache::Prefetch for every block of them, keeping
// the backend full. Also per-file residency (accelfs-stat files) and eviction (accelfs-warm
// --evict).
//
// Thread safety: every method may be called from any thread. Jobs run one after another on the
// warmer's own thread; nothing here runs on a FUSE worker.
#pragma once

#include <sys/stat.h>

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "cache/block.h"
#include "cache/block_cache.h"
#include "cache/mutex.h"
#include "cache/result.h"
#include "fs/common/collect_files.h"

namespace accelfs {

enum class WarmState { kQueued, kRunning, kDone, kFailed };
// "queued", "running", "done", "failed": the state as the control protocol writes it.
std::string_view WarmStateName(WarmState state);

struct WarmProgress {
  WarmState state = WarmState::kQueued;
  uint64_t files_total = 0;
  uint64_t files_done = 0;
  uint64_t bytes_total = 0;
  uint64_t bytes_done = 0;         // resident or fetched so far
  uint64_t resident_at_start = 0;  // of bytes_total, already cached when the job started
  double elapsed_s = 0;            // since the job started running
  bool waiting_for_room = false;   // the budget is full of blocks in use; retrying as room appears
  std::string error;               // when failed
  bool finished() const { return state == WarmState::kDone || state == WarmState::kFailed; }
};

class WarmJob {
 public:
  WarmJob() = default;
  ~WarmJob();
  WarmJob(const WarmJob&) = delete;
  WarmJob& operator=(const WarmJob&) = delete;
  WarmProgress Progress() const;
  // Waits up to `timeout` for the job to finish; true when it has.
  bool WaitFinished(std::chrono::milliseconds timeout) const;
  const std::string& key() const { return key_; }

 private:
  friend class Warmer;
  // Written by the job's thread only (IssueFile), which alone reads them after the job is queued.
  struct File {
    std::string path;
    // The file the request found (an O_PATH descriptor, the job's own): each turn reopens it, not
    // the name, and only while the name still leads to it. What the caller's rights were checked
    // on is what is warmed: a link or a FIFO renamed over the name in between is never opened.
    int fd = -1;
    FileKey key;  // only its size until identified
    bool identified = false;
    uint64_t dev = 0;  // where it was found: the inode the daemon may load into the page cache
    uint64_t ino = 0;
    // These two with the job's mu_ held (not annotated: from a nested struct the analysis cannot
    // name the job's mutex).
    uint64_t pending = 0;  // fetches started and not finished
    bool issued = false;   // every block asked for
  };
  // Counts a file of the request into progress_ while the job is built, before it is queued
  // (nobody else has it yet): no lock.
  void CountUnqueued(uint64_t size) ACCELFS_NO_THREAD_SAFETY_ANALYSIS {
    progress_.files_total++;
    progress_.bytes_total += size;
  }

  std::string key_;
  std::vector<File> files_;  // the list set before the job is queued
  mutable Mutex mu_;
  mutable std::condition_variable changed_;
  WarmProgress progress_ ACCELFS_GUARDED_BY(mu_);
  // The first file one of whose reads the store did not answer within the store timeout: the
  // job fails rather than ask the hung store again for ever.
  std::optional<size_t> timed_out_ ACCELFS_GUARDED_BY(mu_);
  std::chrono::steady_clock::time_point started_ ACCELFS_GUARDED_BY(mu_);
};

struct WarmerOptions {
  uint32_t block_size = kDefaultBlockSize;
  uint32_t max_in_flight = 64;  // fetches a job keeps outstanding: the backend depth
  // A job that finds no room (and sees no fetch finish) for this long fails with a message rather
  // than waiting forever: the budget is then full of blocks nobody reads or that open files pin.
  std::chrono::milliseconds no_room_timeout = std::chrono::seconds(60);
  // As FsOptions::buffered_reads: the backend may read the store through its page cache.
  bool buffered_reads = false;
  // Called on the warmer's thread for each file of a job, in the job's order, once all of them
  // are whole in the cache and before the job is done; not once the warmer is stopping. (The
  // daemon loads them into the kernel's page cache where the mount has no passthrough.)
  std::function<void(const FileKey&, uint64_t dev, uint64_t ino)> resident;
};

struct FileResidency {
  std::string path;
  uint64_t size = 0;
  uint64_t resident = 0;
};

class Warmer {
 public:
  // A new O_PATH descriptor of SOURCE's directory as the daemon reads it now (a store mounted
  // again under the daemon is followed, ReadThroughFs::OpenRoot), or -1 with errno set. Called
  // for each request and each file's turn, which close it after.
  using RootOpener = std::function<int()>;
  // REQUIRES: cache outlives this.
  Warmer(RootOpener open_root, BlockCache& cache, WarmerOptions options);
  ~Warmer();  // Stop()
  Warmer(const Warmer&) = delete;
  Warmer& operator=(const Warmer&) = delete;

  // Each takes the paths as `caller` sees them (CollectFiles): what it may not read is missing.

  // Starts warming `paths`, or returns the job already queued or running for the same paths
  // asked with the same rights (*attached true). Errors (with one line): a bad path
  // (CollectFiles), a set larger than the cache budget (ENOSPC), the daemon stopping (ECANCELED).
  Result<std::shared_ptr<WarmJob>> Warm(const std::vector<std::string>& paths, bool* attached,
                                        const Caller& caller = Caller::Root());
  // Drops the files' blocks from the cache. Returns the bytes that were resident; `files` gets
  // how many files there were. Errors as CollectFiles.
  // Evict and Residency read no file data of the store, only its metadata: a file's blocks are
  // those of every cached key with its size, mtime and ctime, so a store that fails or hangs its
  // reads can still be emptied from the cache.
  Result<uint64_t> Evict(const std::vector<std::string>& paths, uint64_t* files,
                         const Caller& caller = Caller::Root());
  // Errors as CollectFiles.
  Result<std::vector<FileResidency>> Residency(const std::vector<std::string>& paths,
                                               const Caller& caller = Caller::Root());

  // Fails queued and running jobs, waits for their fetches to finish and joins the thread. Call
  // after the backend stopped (its stop answers every fetch, also those of a hung store).
  // Idempotent.
  void Stop();

 private:
  void Run();
  void RunJob(WarmJob& job);
  // The file of a job's turn, opened: identified at its first turn (its key, inode and what of it
  // is resident then go into the job), opened again as that key after. No file for an empty one.
  Result<std::shared_ptr<BackingFile>> OpenForTurn(WarmJob& job, WarmJob::File& file);
  // Tells options_.resident of each file of a finished job (loads the page cache of a mount that
  // wants it). False when the daemon is stopping.
  bool TellResident(const WarmJob& job);
  // Asks for every block of `file` not cached yet, waiting for a free slot and for room. False
  // when the job must end (stopping, or no room for too long).
  bool IssueFile(WarmJob& job, size_t index, const std::shared_ptr<WarmJob>& owner);
  // The answer of a fetch of `expected` bytes of file `index` of `owner`: counts it into the job
  // and frees its slot.
  std::function<void(Status)> Fetched(const std::shared_ptr<WarmJob>& owner, size_t index,
                                      uint32_t expected);
  // No room in the cache: waits for a fetch of ours to finish, or kRoomPoll. False when the job
  // must end (stopping, or no room for options_.no_room_timeout: the job failed). `lock` holds
  // mu_.
  bool WaitForRoom(WarmJob& job, MutexLock& lock,
                   std::chrono::steady_clock::time_point* last_progress) ACCELFS_REQUIRES(mu_);
  // After every block was asked for: waits for the job's fetches and asks again for what is not
  // resident, in rounds. False when the job failed (Fail was called).
  bool Verify(WarmJob& job, const std::shared_ptr<WarmJob>& owner);
  // The paths of the job's files not wholly resident; the job's bytes_done set to what is.
  std::vector<std::string> Missing(WarmJob& job);
  // Asks again for every block of each file not wholly resident. False when the job must end.
  bool IssueMissing(WarmJob& job, const std::shared_ptr<WarmJob>& owner);
  void Fail(WarmJob& job, const std::string& error);

  const RootOpener open_root_;
  BlockCache& cache_;
  const WarmerOptions options_;

  // Lock order: mu_, then a job's mu_.
  Mutex mu_;
  std::condition_variable wake_;  // a job was queued, a fetch finished, Stop
  std::deque<std::shared_ptr<WarmJob>> queue_ ACCELFS_GUARDED_BY(mu_);
  std::shared_ptr<WarmJob> running_ ACCELFS_GUARDED_BY(mu_);
  uint64_t outstanding_ ACCELFS_GUARDED_BY(mu_) = 0;  // fetches in flight
  bool stopping_ ACCELFS_GUARDED_BY(mu_) = false;
  std::thread thread_;
};

}  // namespace accelfs
