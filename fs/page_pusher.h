// Pushes prefetched blocks into the kernel's page cache ahead of the reader (docs/DESIGN.md §2:
// fuse_lowlevel_notify_store). A loader that mmaps a shard faults its pages in; each fault that
// misses the page cache waits for a READ round trip through the daemon, and the kernel's
// read-around keeps only a few of those in flight. Blocks the stream fetched before anyone asked
// for them are written into the page cache of every inode that has the file open in cached mode, so
// those faults find their pages already there. A pushed block counts as read in the block cache
// (the kernel holds it now), so it may be evicted like any block that was read.
//
// Pushed pages are read without a READ, so the daemon no longer sees where the reader is, and a
// stream runs only a window ahead of its reader. Every `hole_every`-th block is therefore pushed
// without its first page: the reader's fault on that page sends one small READ (answered from the
// cache), which tells the stream where the reader is. After each push the stream is resumed
// (`pushed`), since the push made room that no READ will report.
//
// Only inodes a watcher names are pushed to (ReadThroughFs decides: a direct handle from its first
// READ that looks like a mapping's fault, with WatchFrom; cached-mode handles with --push, or
// where reads are direct): the kernel must know the inode, and a file open in passthrough mode is
// read from the store's file instead. Thread safety: every method may be called from any thread;
// pushes run on the pusher's own thread, so a push that waits for a page lock held by a READ in
// progress never stalls a backend completion.
#pragma once

#include <algorithm>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <span>
#include <thread>
#include <unordered_map>

#include "cache/block.h"
#include "cache/block_cache.h"
#include "cache/mutex.h"
#include "cache/result.h"

namespace accelfs {

// The kernel's page cache of the mount. Implemented by the FUSE adapter.
class KernelCache {
 public:
  virtual ~KernelCache() = default;
  // Stores `data` at `offset` of inode `ino`'s pages. The kernel's errno when it refuses.
  virtual Status Store(uint64_t ino, uint64_t offset, std::span<const std::byte> data) = 0;
};

struct PushStats {
  uint64_t pushed_bytes = 0;
  uint64_t pushed_blocks = 0;
  uint64_t failed_pushes = 0;
};

class PagePusher {
 public:
  struct Options {
    uint32_t block_size = kDefaultBlockSize;
    uint64_t hole_every = 0;                     // 0: push whole blocks only
    std::function<void(const FileKey&)> pushed;  // called after each push, no lock held
    bool streamed = false;  // OnFetched is fed: WatchFrom also pushes what was fetched before it
  };
  // A hole every quarter of the stream's window (`ahead_blocks`): the stream learns where the
  // reader is four times per window, often enough that it never waits a whole window.
  static uint64_t HoleEvery(uint64_t ahead_blocks) {
    return std::max<uint64_t>(1, ahead_blocks / 4);
  }
  // REQUIRES: cache and kernel outlive this.
  PagePusher(BlockCache& cache, KernelCache& kernel, Options options);
  ~PagePusher();  // Stop, and joins the thread

  // Stops pushing: queued pushes are dropped, and a Load in progress ends after the block it is
  // writing (ECANCELED), so that a daemon shutting down never waits for a whole file's load.
  // Idempotent.
  void Stop();
  PagePusher(const PagePusher&) = delete;
  PagePusher& operator=(const PagePusher&) = delete;

  // Inode `ino` has `file` open in cached mode once more (Watch) or once less (Unwatch).
  void Watch(const FileKey& file, uint64_t ino);
  void Unwatch(const FileKey& file, uint64_t ino);
  // Watch, for an inode found to be mapped only after its stream began (a mapping of a direct
  // handle): with `streamed`, the `blocks` blocks of `file` are queued too, from `first` to the
  // end and then from 0, so that those the stream fetched before the watch, and nobody has read
  // yet, are pushed as well (the others are passed over). `epoch`: Epoch() taken when the handle
  // was opened; once any file was forgotten since, nothing is watched and false is returned, so
  // that an old handle of a changed file can never bring back pushes of its old data.
  bool WatchFrom(const FileKey& file, uint64_t ino, uint64_t first, uint64_t blocks,
                 uint64_t epoch);

  // `file` changed: nothing more is pushed for it. When this returns no push of it is under way,
  // so a later open that drops the inode's pages cannot get old data pushed back.
  void Forget(const FileKey& file);

  // A stream fetched `block` of `file`: push it if someone has the file open in cached mode.
  void OnFetched(const FileKey& file, uint64_t block);

  // A whole file into the page cache (a warmed file on a mount without passthrough, whose next
  // open then reads no byte through the daemon): take Epoch() before deciding that the inode's
  // pages are the file's, then Load. Load writes `blocks` (the file's, in order, from offset 0)
  // into inode `ino`'s pages on the calling thread, one block per hold of the push lock, and
  // returns the bytes written. It stops at the kernel's first refusal (its errno), and with
  // ECANCELED once any file has been forgotten since `epoch`: a changed file's open waits in
  // Forget for the block being written, and no later block is written after it.
  uint64_t Epoch() const;
  Result<uint64_t> Load(uint64_t ino, std::span<const BlockCache::Ref> blocks, uint64_t epoch);

  // Waits until every push queued so far is done (tests).
  void Drain();

  PushStats Stats() const;

 private:
  struct Watcher {
    uint64_t ino = 0;
    int opens = 0;
  };
  void Run();
  void WatchLocked(const FileKey& file, uint64_t ino) ACCELFS_REQUIRES(mu_);  // Watch

  BlockCache& cache_;
  KernelCache& kernel_;
  const Options options_;
  // Lock order: push_mu_ (held across one push), then mu_ (a leaf: no push or cache call under it).
  Mutex push_mu_;
  mutable Mutex mu_;
  std::condition_variable wake_;     // a push was queued, or stop
  std::condition_variable drained_;  // the queue emptied and no push runs
  std::unordered_multimap<FileKey, Watcher, FileKeyHash> watchers_ ACCELFS_GUARDED_BY(mu_);
  std::deque<BlockKey> queue_ ACCELFS_GUARDED_BY(mu_);
  bool busy_ ACCELFS_GUARDED_BY(mu_) = false;
  bool stop_ ACCELFS_GUARDED_BY(mu_) = false;
  PushStats stats_ ACCELFS_GUARDED_BY(mu_);
  uint64_t epoch_ ACCELFS_GUARDED_BY(mu_) = 0;  // Forget calls so far
  std::thread thread_;
};

}  // namespace accelfs
