// A fetch of a whole file into the cache: rounds of a demand Get of every block, answered once
// through a completion callback. Fill on open (fs/fill_on_open.cc) waits on one before it answers
// an OPEN.
//
// Threads: the callbacks run on the thread whose answer ended a round or came when few were left
// (a reader's, or Start's caller's where the cache answered at once), never under the cache's
// lock; the thread that ends a round also makes the next round's Gets.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>

#include "cache/backend/reader.h"
#include "cache/block_cache.h"
#include "cache/file_key.h"
#include "cache/mutex.h"

namespace accelfs {

class FileFill : public std::enable_shared_from_this<FileFill> {
 public:
  struct Outcome {
    int rounds = 0;         // rounds made (1 or more; 1 for an empty file)
    uint64_t fetched = 0;   // answers that brought their block, over all rounds
    uint64_t failed = 0;    // answers that brought an error, over all rounds
    uint64_t resident = 0;  // bytes of the file ready in the cache at the end (ResidentBytes)
  };

  struct Options {
    // The most rounds. A round after the first fetches again what others' reads evicted during
    // the one before; it is made only when no fetch failed, the file is not all resident, and all
    // of it (WholeFileBudget) fits beside what is pinned now.
    int rounds = 1;
    // `on_remaining` is called once: when at most `remaining` answers of a round are still to
    // come, or at the end (before `done`) when that never happened. May be empty.
    uint64_t remaining = 0;
    std::function<void()> on_remaining;
    // Held while a round's Gets are made, so that the rounds of the fills sharing it are queued
    // whole (the backend serves demand first come, first served: the file started first is cached
    // first). Null: none. Must outlive the fill.
    Mutex* issue_order = nullptr;
    // Called once, when the last round ended. Required.
    std::function<void(const Outcome&)> done;
  };

  // Fetches every block of `file` (read from `backing`) into `cache` as `options` say. No block is
  // kept pinned: each Ref is given back as it arrives, so a fill that does not fit after all (the
  // budget pinned by others) holds no room those others wait for.
  // REQUIRES: `cache` outlives the fill (until `done` has returned).
  static void Start(BlockCache& cache, const FileKey& file, std::shared_ptr<BackingFile> backing,
                    Options options);

  // Use Start.
  FileFill(BlockCache& cache, const FileKey& file, std::shared_ptr<BackingFile> backing,
           Options options);

 private:
  void RunRound();
  void Answered(bool ok);
  void RoundDone();
  void Remaining();

  BlockCache& cache_;
  const FileKey file_;
  std::shared_ptr<BackingFile> backing_;  // released before `done`
  Options options_;
  const uint64_t blocks_;
  int rounds_ = 0;                 // only the thread ending a round touches it
  std::atomic<uint64_t> left_{0};  // answers outstanding in this round, plus one
  std::atomic<uint64_t> fetched_{0};
  std::atomic<uint64_t> failed_{0};  // a fetch failed: no further round
  std::atomic<bool> remaining_called_{false};
};

}  // namespace accelfs
