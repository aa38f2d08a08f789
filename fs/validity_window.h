// The validity window (--revalidate, docs/DESIGN.md §6.14): the last full check of each file
// against SOURCE at an open, by the file's place, trusted by later opens for a while.
//
// Kept by place (the path below SOURCE), not by inode: the kernel forgets inodes it no longer
// uses (memory pressure, drop_caches), and the next LOOKUP makes a new one; sshfs and s3fs number
// a file anew then too. A file found again at its path, with the attributes its check saw, is the
// file that was checked, for as long as the window lasts.
//
// Thread safety: every method may be called concurrently.
#pragma once

#include <sys/stat.h>

#include <chrono>
#include <cstddef>
#include <optional>
#include <unordered_map>

#include "cache/file_key.h"
#include "cache/mutex.h"

namespace accelfs {

class ValidityWindow {
 public:
  using Clock = std::chrono::steady_clock;

  // A window of `length` (<= 0: none; Find never trusts).
  explicit ValidityWindow(std::chrono::nanoseconds length) : length_(length) {}

  bool enabled() const { return length_.count() > 0; }

  // A full check began at `began` and found `key` (its place: key.place).
  void Note(const FileKey& key, Clock::time_point began);

  // The key of the last check of the file at `place`, when it began less than the window before
  // `now` and `st` (what SOURCE shows of the file now) are the attributes it was made from, and
  // the file still has a link; otherwise nothing (and a check that `st` contradicts is forgotten).
  std::optional<FileKey> Find(const Place& place, const struct stat& st,
                              Clock::time_point now = Clock::now());

  // Whether a check of `place` began less than the window before `now`: a Find could trust it (a
  // lookup with no call into SOURCE, so that an open with nothing to trust makes none).
  bool Holds(const Place& place, Clock::time_point now = Clock::now()) const;

  // Forgets the check of `place` unless `st` are the attributes its key was made from (a LOOKUP
  // or GETATTR that shows a change ends the window at once).
  void ForgetUnless(const Place& place, const struct stat& st);

  size_t size() const;

  // The most checks kept (about 100 bytes each).
  static constexpr size_t kMaxChecks = size_t{1} << 18;

 private:
  struct PlaceHash {
    size_t operator()(const Place& p) const { return p[0] ^ (p[1] * 0x9e3779b97f4a7c15ULL); }
  };
  struct Check {
    FileKey key;
    Clock::time_point began;
  };
  // Drops the checks the window has passed.
  void SweepLocked(Clock::time_point now) ACCELFS_REQUIRES(mu_);

  const std::chrono::nanoseconds length_;
  mutable Mutex mu_;  // a leaf
  std::unordered_map<Place, Check, PlaceHash> checks_ ACCELFS_GUARDED_BY(mu_);
  size_t sweep_at_ ACCELFS_GUARDED_BY(mu_) = 1024;  // size of the next sweep
};

}  // namespace accelfs
