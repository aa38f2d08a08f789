// The directory every node of a fleet shares (--swarm-dir): who reads a chunk from the store, and
// the chunk's torrent once it was read (cache/backend/swarm_reader.h says how they are used).
//   DIR/FILEID/INDEX.claim    created O_EXCL by the node that reads the chunk from the store; its
//                             mtime, refreshed, says that a node holds the chunk (a lease)
//   DIR/FILEID/INDEX.torrent  the chunk's piece hashes, renamed in whole
//   DIR/.clock-NODE           touched by each node to read the dir's own clock (Age)
// Every call is a system call or two on the shared file system (on NFS, a round trip each).
//
// Whoever may write DIR may put anything there, and the daemon runs as root: no symbolic link in
// it is ever followed (DIR itself is resolved once, at the start), only regular files are read,
// and at most kMaxTorrentBytes of one; files are created O_EXCL under names nobody can guess, and
// renamed into place. Paths outside DIR/FILEID/NAME are refused (EINVAL).
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "cache/file_key.h"
#include "cache/mutex.h"

namespace accelfs {

class SwarmDir {
 public:
  using Clock = std::chrono::steady_clock;

  // The most of a torrent read from the dir (a chunk of 16 pieces takes about 1 KiB).
  static constexpr size_t kMaxTorrentBytes = 1 << 20;
  // How often the dir's clock is read again (Age).
  static constexpr std::chrono::seconds kClockRefresh{10};

  // `who`, written into each claim this node takes, names it for a person reading the dir. DIR is
  // opened now; where it cannot be, every call fails (and the swarm reads from the store).
  SwarmDir(std::string dir, std::chrono::milliseconds stale_claim, std::string who);
  ~SwarmDir();
  SwarmDir(const SwarmDir&) = delete;
  SwarmDir& operator=(const SwarmDir&) = delete;

  // A stable name for the bytes of `key` cut into pieces and chunks of these sizes: the same on
  // every node and in every build.
  static std::string FileId(const FileKey& key, uint32_t piece_bytes, uint32_t chunk_pieces);
  // The paths of chunk `index` of FILEID.
  std::string Claim(const std::string& file_id, uint64_t index) const;
  std::string Torrent(const std::string& file_id, uint64_t index) const;
  // Makes DIR/FILEID when it is not there (before a claim in it is taken).
  void MakeFileDir(const std::string& file_id) const;

  // How long ago a regular file of the dir was last written (its mtime, by the dir's own clock,
  // not this node's: a node whose clock is off takes no live claim for dead nor a dead one for
  // live): a claim last said to be held, a torrent published. Nothing when there is none, or it
  // is not a regular file.
  std::optional<Clock::duration> Age(const std::string& path) const;
  bool Live(const std::optional<Clock::duration>& age) const { return age && *age < stale_; }
  // Moves the claim out of the way when it is stale, or whatever it is, with `force` (a claim
  // whose holder published nothing for too long, or not a regular file); false when it is gone
  // or live again.
  bool RetireStaleClaim(const std::string& claim, bool force = false) const;
  // What the claim says: who took it and a name of that taking, its own to each taking; empty
  // where there is none or it is no regular file.
  std::string ClaimTag(const std::string& claim) const;
  // Moves the claim out of the way, live or not, when it still says `tag` (the taking this node
  // saw: one whose holder is gone, though its claim is not stale yet); false when it is gone or
  // another taking's (another node took it over first).
  bool RetireClaimTagged(const std::string& claim, const std::string& tag) const;
  // Creates the claim (O_EXCL: one node only); false and errno when it cannot (EEXIST: another
  // node's).
  bool TakeClaim(const std::string& claim) const;
  // Whether it is time to say again that this node holds a claim (every quarter of
  // stale_claim); `refreshed`, when it last did, becomes `now` when it is.
  bool RefreshDue(Clock::time_point now, Clock::time_point& refreshed) const;
  // Says this node holds the claim (its mtime, now).
  void Touch(const std::string& claim) const;
  // Removes a claim or torrent of the dir.
  void Remove(const std::string& path) const;

  // The whole torrent; false and errno when it cannot be read (EINVAL: not a regular file, EFBIG:
  // over kMaxTorrentBytes).
  bool Read(const std::string& torrent, std::vector<char>& bytes) const;
  // Writes the torrent whole (a new file of this node's, renamed in); false and errno on failure.
  bool Write(const std::string& torrent, const std::vector<char>& bytes) const;

  // Tests: this node's clock reads `by` off the true time (a node whose clock drifted).
  void SkewNodeClock(std::chrono::nanoseconds by) { skew_ns_ = by.count(); }

 private:
  // The directory of `path` (DIR/FILEID/NAME), opened without following a symbolic link, and NAME
  // into *name; -1 with errno set where `path` is not of that shape or FILEID is no directory.
  int OpenParent(const std::string& path, std::string* name) const;
  // The age of NAME in the directory `parent` (OpenParent's); nothing where it is no regular file.
  std::optional<Clock::duration> AgeAt(int parent, const std::string& name) const;
  // Renames the claim away and asks `retire` (the directory, the name it was renamed to) whether
  // it goes; puts it back where not. False when it is gone or stays.
  bool RetireClaimIf(const std::string& claim,
                     const std::function<bool(int, const std::string&)>& retire) const;
  // The dir's clock now, as far as it was last read (kClockRefresh), in CLOCK_REALTIME terms;
  // this node's own where it cannot be read.
  std::chrono::nanoseconds DirNow() const;
  std::chrono::nanoseconds NodeNow() const;  // CLOCK_REALTIME, skewed by SkewNodeClock

  const std::string dir_;
  const std::chrono::milliseconds stale_;
  const std::string who_;
  const int root_fd_;  // DIR, O_PATH; -1 when it could not be opened
  std::atomic<int64_t> skew_ns_{0};
  mutable Mutex clock_mu_;
  mutable int clock_fd_ ACCELFS_GUARDED_BY(clock_mu_) = -1;  // DIR/.clock-NODE
  mutable bool clock_tried_ ACCELFS_GUARDED_BY(clock_mu_) = false;
  mutable std::chrono::nanoseconds clock_offset_ ACCELFS_GUARDED_BY(clock_mu_){0};  // dir - node
  mutable Clock::time_point clock_read_ ACCELFS_GUARDED_BY(clock_mu_);
};

// The shared dir's own threads. Every call into the dir is made on one of them, never under the
// swarm's lock nor on a reader's or the engine's thread: a dir that stops answering (an NFS
// server gone, a frozen file system) holds up these threads and nothing else, and Stalled() says
// for how long, so that the swarm sends reads to the store meanwhile.
class SwarmDirThreads {
 public:
  using Clock = std::chrono::steady_clock;

  explicit SwarmDirThreads(int threads);
  ~SwarmDirThreads();  // Stop()
  SwarmDirThreads(const SwarmDirThreads&) = delete;
  SwarmDirThreads& operator=(const SwarmDirThreads&) = delete;

  // Runs `job` on one of the threads, in the order posted. `at_stop`: run even once Stop was
  // asked (a claim let go); other jobs still queued then are dropped.
  void Post(std::function<void()> job, bool at_stop = false);
  // How long the oldest call into the dir still in progress has waited; nothing when none is.
  std::optional<Clock::duration> Stalled(Clock::time_point now) const;
  // The calls into the dir a job makes, timed for Stalled() while the scope lives. A job's other
  // work (the engine's) is not the dir's.
  class Call {
   public:
    Call();
    ~Call();
    Call(const Call&) = delete;
    Call& operator=(const Call&) = delete;
  };
  // Runs the at_stop jobs still queued and joins the threads: as long as the dir takes to answer
  // them (a daemon's exit is bounded by its ExitDeadline).
  void Stop();

 private:
  struct Job {
    std::function<void()> run;
    bool at_stop = false;
  };
  void Loop(size_t i);

  Mutex mu_;
  std::condition_variable wake_;
  std::deque<Job> queue_ ACCELFS_GUARDED_BY(mu_);
  bool stop_ ACCELFS_GUARDED_BY(mu_) = false;
  // Per thread: when its dir call began (steady clock, ns), 0 when it is in none.
  std::unique_ptr<std::atomic<int64_t>[]> busy_;
  std::vector<std::thread> threads_;
};

}  // namespace accelfs
