// The block cache: a byte budget of cached blocks, one in-flight fetch per block shared by every
// reader that wants it, and LRU eviction that never frees a block someone is reading from.
//
// Block lifecycle (one Entry per BlockKey in the map):
//
//   absent --Get, room--> kFetching --read ok--> kReady --evicted (unpinned)--> absent
//      |                     |                     '--DropFile while pinned--> zombie --> freed
//      |                     |--read fails/short--> absent (waiters get the error; nothing cached)
//      |                     '--stalls (store timeout)--> kFetching, stalled: waiters and later
//      |                          Gets get ETIMEDOUT at once; the read's end then goes on as above
//      '--Get, no room--> kQueued --room frees--> kFetching
//
//   kStored (adopted from a disk cache dir, not checked yet) --Get or Prefetch--> kFetching, its
//      bytes checked by a verifier thread (BlockStore::Verify) --match--> kReady
//                                                          '--mismatch, unreadable--> fetched
//      anew into a new buffer, as from absent. Evicted, dropped and kept like kReady.
//
// A Ref pins a kReady block: pinned blocks are never evicted or freed, so a reply can be written
// from the block's memory with no lock held.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <list>
#include <memory>
#include <optional>
#include <span>
#include <thread>
#include <unordered_map>
#include <vector>

#include "cache/backend/reader.h"
#include "cache/block_store.h"
#include "cache/cache_stats.h"
#include "cache/file_key.h"
#include "cache/mutex.h"

namespace accelfs {

class BlockCache {
 public:
  struct Options {
    uint64_t budget_bytes = 0;  // every buffer the cache holds counts, in flight or ready
    uint32_t block_size = 0;    // block i starts at byte i * block_size of its file
    // Threads that check stored blocks (AdoptStored) as they are first asked for, and commit
    // fetched blocks where the store's commits wait for a disk (BlockStore::SlowCommits): each
    // reads or syncs one block at a time, so these are the requests that disk has queued.
    unsigned verify_threads = 4;
  };

  class Ref;
  // Receives the block or the error. Runs on the Get caller's thread (hit) or the backend's.
  using Waiter = std::function<void(Result<Ref>)>;

  // REQUIRES: store and reader outlive the cache. On destruction, ready blocks are given back with
  // BlockStore::Retain (a persistent store keeps them), the rest with Release.
  BlockCache(BlockStore& store, StoreReader& reader, Options options);
  ~BlockCache();
  BlockCache(const BlockCache&) = delete;
  BlockCache& operator=(const BlockCache&) = delete;

  // Delivers block `key` (of `expected` bytes, read from `file`) to `waiter`: at once when cached,
  // else after the one fetch for that block completes. When the budget is full of pinned or
  // in-flight blocks, the fetch waits for room instead of exceeding the budget.
  void Get(const BlockKey& key, uint32_t expected, const std::shared_ptr<BackingFile>& file,
           Waiter waiter);

  // Starts fetching `key` when it is absent and room can be made now, evicting only unpinned ready
  // blocks that were read at least once: prefetched data nobody has asked for yet is never thrown
  // away to make room for more prefetch (backpressure instead). The backend serves it after every
  // demand read. When it starts a fetch it calls `done` (if any) once the fetch has finished, with
  // its outcome, on the backend's thread; a stalled fetch (its read outlived the store timeout)
  // counts as finished with ETIMEDOUT. Never waits, never queues.
  enum class PrefetchResult {
    kStarted,  // a fetch was started; `done` will run
    kPresent,  // cached, in flight or queued already
    kNoRoom,   // the budget is full of pinned, in-flight or unread blocks, or demand waits for room
  };
  PrefetchResult Prefetch(const BlockKey& key, uint32_t expected,
                          const std::shared_ptr<BackingFile>& file,
                          std::function<void(Status)> done = nullptr);

  // When `key` is ready and was prefetched but nobody has asked for it yet, marks it read (it may
  // now be evicted like any block that was read) and returns it pinned; otherwise nothing. Used to
  // hand prefetched data to the kernel's page cache, which then serves it instead of the cache.
  std::optional<Ref> ClaimUnread(const BlockKey& key);

  // Bytes of `file` ready in the cache (per-file residency). Walks the file's blocks: for stats.
  uint64_t ResidentBytes(const FileKey& file) const;
  // Every file with a block ready or stored in the cache, each once. Walks the whole cache: for
  // the operator's tools, which find a file's keys by its attributes without reading the store.
  std::vector<FileKey> CachedFiles() const;
  // Whether every block of `file` is ready, stored, or queued or in flight already (a fetch that
  // will make it ready): nothing of it needs asking for.
  bool HoldsOrFetches(const FileKey& file) const;
  // The content identity of `file`, found at `place` in SOURCE (IdentifyFile, cache/file_key.h),
  // its sample read through this cache's store reader. Blocks the caller: never on a reader's
  // thread. ECANCELED once InterruptIdentify was called.
  // The file remembers it (BackingFile::SetIdentity).
  // A file of at most kWholeSample bytes (and one block) is read whole, in the one request its
  // samples would take, and kept as its block 0 (Offer): its first read then asks the store
  // nothing. With `head`, a larger file's first kWholeSample bytes are read in the request of its
  // first page and left in *head (IdentifyFile), for its first READs.
  Result<FileKey> Identify(const std::shared_ptr<BackingFile>& file, const struct stat& st,
                           const Place& place, std::vector<std::byte>* head = nullptr);
  static constexpr uint64_t kWholeSample = 128 << 10;

  // Keeps `bytes`, block `key` as read from its store by someone else, when it is absent and room
  // can be made as for a prefetch (never evicting blocks nobody has read); otherwise nothing. A
  // block kept is committed as a fetched one is, and counts as prefetched and unread.
  void Offer(const BlockKey& key, std::span<const std::byte> bytes);
  // Ends every Identify that waits on the store, now and from now on (ECANCELED): the daemon is
  // stopping, and the threads that wait are FUSE workers its loop must join first.
  void InterruptIdentify() { identify_interrupted_.store(true, std::memory_order_relaxed); }

  // When every block of `file` is ready, pins them all into `refs` (in block order) and returns
  // true; otherwise changes nothing. A file passed through to the store's file stays whole while
  // these Refs live. Its blocks count as read (evictable once unpinned), as the kernel reads them
  // from the store. False for an empty file.
  bool PinFile(const FileKey& file, std::vector<Ref>* refs);

  // Forgets every ready block of `file` (a changed file's old identity, accelfs-warm --evict).
  // Pinned blocks are freed when their last Ref goes. Does nothing while the kernel holds the
  // file's store file for a reader (BlockStore::HeldElsewhere).
  void DropFile(const FileKey& file);

  // Takes in the blocks a persistent store kept from an earlier daemon (BlockStore::TakeStored),
  // as blocks already read (evictable, oldest first), while they fit in the budget; the store
  // forgets the rest. Blocks the store wants checked (StoredBlock::check) are checked when first
  // asked for, on the verifier threads; the rest are ready at once. Call once, before the first
  // Get.
  struct Adopted {
    uint64_t blocks = 0;
    uint64_t bytes = 0;
    uint64_t discarded_blocks = 0;  // over the budget, or not a block of their file
    uint64_t to_check = 0;          // of `blocks`, those checked when first asked for
  };
  Adopted AdoptStored();

  // Answers every queued Get with ECANCELED, and stops checking stored blocks (those not checked
  // yet stay stored, their waiters get ECANCELED). Call after the reader has stopped.
  void Shutdown();

  CacheStats Stats() const;
  BlockStore& store() const { return store_; }
  uint32_t block_size() const { return options_.block_size; }
  uint64_t budget_bytes() const { return options_.budget_bytes; }

 private:
  struct Entry;

 public:
  // A pinned, ready block. Movable; unpins on destruction. Valid while the cache lives.
  class Ref {
   public:
    Ref() = default;
    Ref(Ref&& other) noexcept : cache_(other.cache_), entry_(other.entry_) {
      other.entry_ = nullptr;
    }
    Ref& operator=(Ref&& other) noexcept;
    ~Ref() { Reset(); }
    const std::byte* data() const;
    uint32_t size() const;  // bytes of file data in the block
    // Another Ref of the same block, pinned once more (empty for an empty Ref). Valid for a block
    // dropped from the cache while pinned: it lives until its last Ref goes.
    Ref Share() const;
    void Reset();

   private:
    friend class BlockCache;
    Ref(BlockCache* cache, Entry* entry) : cache_(cache), entry_(entry) {}
    BlockCache* cache_ = nullptr;
    Entry* entry_ = nullptr;
  };

 private:
  enum class State { kQueued, kFetching, kReady, kStored };
  struct Entry {
    BlockKey key;
    State state = State::kQueued;
    BlockBuffer buffer;
    uint32_t expected = 0;
    size_t charged = 0;    // budget bytes reserved for the buffer
    int pins = 0;          // Refs alive
    bool zombie = false;   // dropped from the map while pinned
    bool unread = false;   // prefetched and not asked for yet
    bool stalled = false;  // its read outlived the store timeout (still kFetching)
    bool stored = false;   // its bytes are the store's, to be checked, not fetched
    std::function<void(Status)> prefetched;  // Prefetch's `done`, run when the fetch finishes
    std::shared_ptr<BackingFile> file;       // while queued or fetching
    std::vector<Waiter> waiters;
    std::list<Entry*>::iterator lru_pos{};  // valid while kReady and in the map
  };
  struct Fetch {
    Entry* entry;
    std::shared_ptr<BackingFile> file;
    bool demand;
  };

  // Evicts unpinned ready blocks (oldest first) until `capacity` more bytes fit in the budget, and
  // returns whether they do. Without `partial` nothing is evicted unless that makes the room; with
  // `keep_unread` prefetched blocks nobody has read yet are not evicted either.
  // Victims' buffers are appended to `freed` for release after the lock.
  bool MakeRoom(size_t capacity, std::vector<std::pair<BlockKey, BlockBuffer>>* freed,
                bool partial = false, bool keep_unread = false) ACCELFS_REQUIRES(mu_);
  // Moves queued entries to kFetching, oldest first, while room can be made. When nothing is in
  // flight the head is admitted even over budget: the budget is then full of blocks pinned by reads
  // that wait for it, and only admitting it lets them finish and unpin.
  void AdmitQueued(std::vector<Fetch>* fetches,
                   std::vector<std::pair<BlockKey, BlockBuffer>>* freed) ACCELFS_REQUIRES(mu_);
  // Reserves budget for `entry` and marks it kFetching.
  void BeginFetch(Entry* entry, bool demand, std::vector<Fetch>* fetches) ACCELFS_REQUIRES(mu_);
  // Allocates the buffers (outside the lock) and submits the reads.
  void StartFetches(std::vector<Fetch>& fetches);
  // A fetch's read ended: commits the block (on the workers where commits are slow), then
  // publishes it.
  void Complete(Entry* entry, Result<size_t> read);
  // Commits a block read in full and publishes it, or fetches it again when the store could not
  // keep it.
  void CommitAndPublish(Entry* entry);
  // Makes a fetched (committed) or checked block ready and answers its waiters, or, when `read`
  // failed or came short, forgets it and answers them the error.
  void Publish(Entry* entry, Result<size_t> read);
  // Starts the worker threads (once).
  void StartWorkers();
  // Hands a kStored entry to the verifiers: kFetching, `file` to fetch it from should its bytes
  // be bad.
  void BeginVerify(Entry* entry, const std::shared_ptr<BackingFile>& file) ACCELFS_REQUIRES(mu_);
  // A worker thread: commits blocks for a store whose commits are slow, and checks stored blocks,
  // until StopWorkers.
  void WorkLoop();
  // The stored bytes of `entry` failed their check (`why`): fetches the block anew.
  void Refetch(Entry* entry, const Error& why);
  // Fetches `entry` (kFetching) again into a new buffer, releasing the one it has.
  void FetchAgain(Entry* entry);
  // Joins the workers; blocks still queued for a commit are committed and published, those queued
  // for a check go back to kStored, their waiters get ECANCELED.
  void StopWorkers();
  // The read of `entry` stalled: answers its waiters ETIMEDOUT (and its Prefetch `done`), and
  // every later Get until the read ends.
  void Stall(Entry* entry);
  // Adds `n` pins to a ready entry (counting its bytes as pinned on the first).
  void PinLocked(Entry* entry, int n) ACCELFS_REQUIRES(mu_);
  void Unpin(Entry* entry);
  void ReleaseAll(std::vector<std::pair<BlockKey, BlockBuffer>>& freed);

  BlockStore& store_;
  StoreReader& reader_;
  const Options options_;

  // Lock order: mu_ is taken before the store's lock, and only BlockStore::HeldElsewhere (two
  // fcntl calls under the store's leaf lock) is called under it: no callback, no I/O and no
  // Release runs while it is held.
  mutable Mutex mu_;
  std::unordered_map<BlockKey, std::unique_ptr<Entry>, BlockKeyHash> map_ ACCELFS_GUARDED_BY(mu_);
  std::list<Entry*> lru_ ACCELFS_GUARDED_BY(mu_);     // ready blocks, newest first
  std::list<Entry*> queued_ ACCELFS_GUARDED_BY(mu_);  // waiting for room, oldest first
  std::vector<std::unique_ptr<Entry>> zombies_ ACCELFS_GUARDED_BY(mu_);
  uint64_t used_ ACCELFS_GUARDED_BY(mu_) = 0;
  uint64_t fetching_ ACCELFS_GUARDED_BY(mu_) = 0;
  uint64_t fetching_bytes_ ACCELFS_GUARDED_BY(mu_) = 0;
  uint64_t pinned_bytes_ ACCELFS_GUARDED_BY(mu_) = 0;
  CacheStats stats_ ACCELFS_GUARDED_BY(mu_);                 // counters only
  const bool slow_commits_;                                  // BlockStore::SlowCommits
  std::deque<Entry*> commit_queue_ ACCELFS_GUARDED_BY(mu_);  // blocks read, to commit
  std::deque<Entry*> verify_queue_ ACCELFS_GUARDED_BY(mu_);  // stored blocks to check
  bool workers_stop_ ACCELFS_GUARDED_BY(mu_) = false;
  std::condition_variable work_cv_;  // a queue or workers_stop_ changed
  std::atomic<bool> identify_interrupted_{false};
  // Started for slow commits, or by AdoptStored when it keeps blocks to check.
  std::vector<std::thread> workers_;
};

}  // namespace accelfs
