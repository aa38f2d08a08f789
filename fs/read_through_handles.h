// The handles of ReadThroughFs, shared by the files that implement it: read_through_fs.cc (reads,
// forget, the pusher and the inode table's upkeep), read_through_open.cc (open and release),
// read_through_attrs.cc (names and attributes), fill_on_open.cc (opens that wait for their whole
// file) and read_through_dirs.cc (directory handles). Not for other users.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <unordered_map>
#include <utility>
#include <vector>

#include "cache/readahead.h"
#include "fs/read_through_fs.h"

namespace accelfs {

struct ReadThroughFs::Handle {
  std::shared_ptr<Inode> inode;
  uint64_t ino = 0;  // the FUSE inode number
  std::shared_ptr<BackingFile> file;
  FileKey identity;
  bool safetensors = false;  // named *.safetensors where opened: streamed whatever its size
  int backing_id = 0;        // passthrough mode when > 0
  bool direct = false;       // cached mode, reads around the page cache
  // In the pusher's watchers (PagePusher::Watch): a cached-mode handle from its open, a direct one
  // from its first READ that looks like a mapping's fault (kRefused when a file changed since the
  // open: PagePusher::WatchFrom). Set before any Get of a READ, read in Release, which the kernel
  // sends only after every READ of the handle is answered.
  enum Watch : int { kNotWatched, kWatched, kRefused };
  std::atomic<int> watch{kNotWatched};
  uint64_t push_epoch = 0;              // PagePusher::Epoch() at the open
  std::vector<BlockCache::Ref> pinned;  // passthrough: every block, so none is evicted
  Mutex mu;
  ReadaheadState readahead ACCELFS_GUARDED_BY(mu);
  // The file's first bytes, read with its identity at the open (SourceFile::head), kept until a
  // READ goes past them: its first READs are answered from them while their block comes.
  std::shared_ptr<const std::vector<std::byte>> head ACCELFS_GUARDED_BY(mu);
  // Sets `head` while the open owns the handle alone (before it is in handles_): no lock.
  void SetHeadUnpublished(std::shared_ptr<const std::vector<std::byte>> bytes)
      ACCELFS_NO_THREAD_SAFETY_ANALYSIS {
    head = std::move(bytes);
  }
};

// An open waiting for its whole file to be cached (FsOptions::fill, --fill-on-open).
struct ReadThroughFs::OpenWait {
  std::unique_ptr<Handle> handle;
  OpenDone done;
  std::chrono::steady_clock::time_point started;
  // Starts the next shard of the set (empty: none), once: when at most NextShardLead of this
  // file's blocks are still to come, or at the end of the fill.
  std::function<void()> next;
  std::atomic<bool> next_started{false};
  void StartNext() {
    if (next && !next_started.exchange(true, std::memory_order_acq_rel)) next();
  }
};

struct ReadThroughFs::DirHandle {
  std::vector<DirEntry> entries;  // snapshot taken at opendir; offsets index into it
  uint64_t ino = 0;
};

// Removes handle `id` from `handles` and returns it (destroyed by the caller, after the lock);
// nullptr for an id that is not there. `handles`: ReadThroughFs::handles_ or dir_handles_, with
// handles_mu_ held (the caller's: the analysis cannot tie a parameter to the mutex guarding it).
template <typename T>
std::unique_ptr<T> TakeHandle(std::unordered_map<uint64_t, std::unique_ptr<T>>& handles,
                              uint64_t id) {
  auto it = handles.find(id);
  if (it == handles.end()) return nullptr;
  std::unique_ptr<T> handle = std::move(it->second);
  handles.erase(it);
  return handle;
}

}  // namespace accelfs
