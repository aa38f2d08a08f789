// The backend: reads of backing files into cache buffers. A request is a plain value; its
// completion is a callback run once, on the reader's own thread.
#pragma once

#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "cache/file_key.h"
#include "cache/result.h"

namespace accelfs {

// An open backing file. `direct_fd` (O_DIRECT) is preferred while `direct` holds; a reader that
// sees the backing filesystem refuse O_DIRECT clears `direct` and uses `buffered_fd` from then on.
// A file of a FUSE store may have no buffered descriptor (-1, OpenBacking): there O_DIRECT has no
// alignment rule, so nothing ever falls back, and each descriptor is an OPEN and a RELEASE the
// store serves (sshfs: an SFTP round trip, and a file on another of its SSH connections).
class BackingFile {
 public:
  BackingFile(int direct_fd, int buffered_fd)
      : direct_fd_(direct_fd), buffered_fd_(buffered_fd), direct_(direct_fd >= 0) {}
  ~BackingFile() {
    if (direct_fd_ >= 0) close(direct_fd_);
    if (buffered_fd_ >= 0) close(buffered_fd_);
  }
  BackingFile(const BackingFile&) = delete;
  BackingFile& operator=(const BackingFile&) = delete;

  // The backing inode, as opened: every open of one file shares it (BoundedReader's share is per
  // file, not per open). 0 and 0 when not known.
  void SetInode(uint64_t dev, uint64_t ino) {
    dev_ = dev;
    ino_ = ino;
  }
  uint64_t dev() const { return dev_; }
  uint64_t ino() const { return ino_; }

  // Reads of it may block whoever submits them, however they are sent: a FUSE store that does not
  // take asynchronous direct I/O (rclone) has the kernel answer an O_DIRECT read inside
  // io_uring_enter, so one hung read held the ring's only thread and every read behind it. Set
  // for network and FUSE filesystems (OpenBacking); the io_uring reader sends such reads
  // straight to its workers (IOSQE_ASYNC).
  void SetMayBlock(bool may_block) { may_block_ = may_block; }
  bool may_block() const { return may_block_; }

  // It is on a FUSE filesystem (OpenBacking, from the mount's type): its store has a queue of its
  // own (fs/daemon/store_limits.h).
  void SetOnFuse(bool fuse) { on_fuse_ = fuse; }
  bool on_fuse() const { return on_fuse_; }

  // Its identity is sampled at its end only (FingerprintSpans): the file's store reads ahead from
  // the offset of any read (an object store's FUSE filesystem: s3fs fetched 50 MB from a 4 KiB
  // read of a file's first page, on each open). Set by OpenBacking from the store's type.
  void SetTailSamples(bool tail) { tail_samples_ = tail; }
  bool tail_samples() const { return tail_samples_; }

  // A read of it alone gets its store all that accelfs sends that store but the slots kept for
  // another file (BoundedReader, from the store's queue and the backend's depth; false until its
  // first read, on stores without a queue of their own, and on stores that read ahead from each
  // read's offset, tail_samples): a second file read beside it would get the store nothing more,
  // and costs some stores more than a descriptor (NextShardLead), so the next shard of a set waits
  // until this one is nearly in. Changes with the depth.
  void SetAloneFillsStore(bool fills) {
    alone_fills_store_.store(fills, std::memory_order_relaxed);
  }
  bool alone_fills_store() const { return alone_fills_store_.load(std::memory_order_relaxed); }

  // Its content identity (cache/file_key.h), once known: BlockCache::Identify sets it. What a
  // swarm names the file's bytes by (SwarmReader); reads before it go to the store. Set once: a
  // later call changes nothing.
  void SetIdentity(const FileKey& key) {
    int none = 0;
    if (!identity_state_.compare_exchange_strong(none, 1, std::memory_order_acquire)) return;
    identity_ = key;
    identity_state_.store(2, std::memory_order_release);
  }
  const FileKey* identity() const {
    return identity_state_.load(std::memory_order_acquire) == 2 ? &identity_ : nullptr;
  }

  int direct_fd() const { return direct_fd_; }
  int buffered_fd() const { return buffered_fd_; }
  // A descriptor of it, either (for fstatfs, fadvise).
  int any_fd() const { return direct_fd_ >= 0 ? direct_fd_ : buffered_fd_; }
  bool direct() const { return direct_.load(std::memory_order_relaxed); }
  // Whether a read may go through the page cache: there is a buffered descriptor.
  bool can_buffer() const { return buffered_fd_ >= 0; }
  // After the store refused an O_DIRECT read: buffered from then on, where it can (true).
  bool DisableDirect() {
    if (!can_buffer()) return false;
    direct_.store(false, std::memory_order_relaxed);
    return true;
  }

 private:
  const int direct_fd_;
  const int buffered_fd_;
  std::atomic<bool> direct_;
  uint64_t dev_ = 0;  // set once, before the file is shared
  uint64_t ino_ = 0;
  bool may_block_ = false;     // set once, before the file is shared
  bool tail_samples_ = false;  // set once, before the file is shared
  bool on_fuse_ = false;       // set once, before the file is shared
  std::atomic<bool> alone_fills_store_{false};
  std::atomic<int> identity_state_{0};  // 0: none, 1: being set, 2: identity_ holds it
  FileKey identity_;
};

struct ReadRequest {
  std::shared_ptr<BackingFile> file;
  uint64_t offset = 0;  // REQUIRES: a multiple of 4096
  std::byte* buffer = nullptr;
  size_t capacity = 0;  // bytes writable at buffer; REQUIRES: a multiple of 4096, >= expected
  size_t expected = 0;  // bytes the caller needs; fewer means the file ended early
  // A reader is waiting for these bytes (a demand miss), as opposed to prefetch: demand requests
  // are served before every queued prefetch request.
  bool demand = true;
  // Read through the page cache even where the file takes O_DIRECT: its store was found to read
  // faster so (cache/backend/io_choice.h; BoundedReader sets it).
  bool buffered = false;
  // The same bytes as `buffer` through a read-only mapping, or nullptr. A reader that can reads
  // one byte of each page there once the read has filled the buffer, before answering. On a VM
  // that shadows page tables, the first read of a page through a read-only user mapping costs a
  // trap to the hypervisor (about 1 us per 4 KiB measured here), paid once per page by whichever
  // process reads it first; the kernel's own writes into `buffer`, and reads through a mapping
  // whose pages were faulted in for writing (as a populated buffer's are), do not pay it for later
  // readers. A loader that maps the cached file (passthrough,
  // PROT_READ, as safetensors does) then finds it paid, off its path. Elsewhere it costs a cache
  // miss per page. The view's pages are unmapped again before the answer.
  const std::byte* view = nullptr;
  // Called exactly once with the bytes read (< expected only at end of file) or the error.
  std::function<void(Result<size_t>)> done;
  // Called at most once, before `done`, when the read has been in flight past the backend
  // timeout (BoundedReader): whoever waits for it may be answered now. `done` still follows if the
  // read ever returns, and `buffer` stays the read's until then.
  std::function<void()> stalled;
};

// Whether a read of `r` starts with O_DIRECT: where its file takes it, unless the read asks for
// the page cache (ReadRequest::buffered) and the file has a buffered descriptor. The readers
// (PreadBlock, UringReader) share it.
inline bool StartsDirect(const ReadRequest& r) {
  return r.file->direct() && !(r.buffered && r.file->can_buffer());
}
// Whether an O_DIRECT read of `r` that has `done` bytes goes on with O_DIRECT: not from an
// unaligned offset, unless the file has no buffered descriptor (FUSE: no alignment rule there).
inline bool ContinuesDirect(const ReadRequest& r, size_t done) {
  return done % 4096 == 0 || !r.file->can_buffer();
}

// Thread safety: Submit may be called from any thread. Callbacks run on the reader's threads and
// must not block on other reads.
class BackendReader {
 public:
  virtual ~BackendReader() = default;
  virtual void Submit(ReadRequest request) = 0;
  // Finishes every submitted request (callbacks run), then refuses new ones with ECANCELED.
  virtual void Stop() = 0;
  // Reads it lets in flight now (adaptive readers change it as they measure the backend).
  virtual unsigned CurrentDepth() const = 0;
  // `delta` reads in flight have stalled (+) or, stalled, came back after all (-): a stalled read
  // may never return (one blocked in a hung kernel filesystem cannot be cancelled), so it should
  // no longer count against the depth; the reader lets as many more in flight.
  virtual void NoteLost(int delta) { static_cast<void>(delta); }
  // Requests wait above this reader for its depth: a reader in front holds a file to a share of
  // CurrentDepth() (BoundedReader), so a larger depth would let them go, though none waits here.
  // An adaptive reader takes the interval as one in which requests waited for a slot.
  virtual void NoteHeldBack() {}
  // A store whose own queue lets one file have `requests` in flight (a FUSE store's lone-file
  // bound) is read now. An adaptive reader that has measured nothing yet starts from twice that
  // (within its maximum) where its start depth is less, so that the file's share of it (half)
  // covers the bound from the first read instead of from the first measured interval.
  virtual void NoteStoreBound(unsigned requests) { static_cast<void>(requests); }
};

// Requests waiting for a reader, demand first, each kind in submission order. Not thread-safe: the
// readers guard it with their own mutex.
class RequestQueue {
 public:
  void Push(ReadRequest request) {
    (request.demand ? demand_ : prefetch_).push_back(std::move(request));
  }
  bool empty() const { return demand_.empty() && prefetch_.empty(); }
  bool has_demand() const { return !demand_.empty(); }
  size_t size() const { return demand_.size() + prefetch_.size(); }
  // REQUIRES: !empty().
  ReadRequest Pop() {
    std::deque<ReadRequest>& from = demand_.empty() ? prefetch_ : demand_;
    ReadRequest request = std::move(from.front());
    from.pop_front();
    return request;
  }

 private:
  std::deque<ReadRequest> demand_;
  std::deque<ReadRequest> prefetch_;
};

// A RequestQueue served by a reader's own threads, with its lock. Submit queues a request, or
// answers it ECANCELED once stopping; StopAndJoin sets `stopping`, wakes every thread and joins
// them. Each thread waits on `cv` under `mu` for what it needs and returns once `stopping` and
// nothing is queued, so everything submitted before the stop is served.
struct ServedQueue {
  void Submit(ReadRequest request);
  void StopAndJoin();

  std::mutex mu;
  std::condition_variable cv;
  RequestQueue queue;     // GUARDED_BY(mu)
  bool stopping = false;  // GUARDED_BY(mu)
  std::vector<std::thread> threads;
};

// Opens `path` (relative to `dir_fd`, or AT_FDCWD) for the readers: a buffered descriptor, and an
// O_DIRECT one where the filesystem takes it (-1 otherwise). O_DIRECT keeps a third copy of the
// data out of the backing filesystem's page cache; where it is refused the buffered descriptor
// serves, followed by POSIX_FADV_DONTNEED. `flags` are added to both opens (e.g. O_NOFOLLOW);
// `st` receives the opened file's attributes.
// fstat(), but asking the store (statx AT_STATX_FORCE_SYNC): 0, or -1 and errno. `mount`, where
// given, receives the file's mount's unique id (STATX_MNT_ID_UNIQUE, Linux 6.8: never reused, so a
// store mounted again is another mount), or 0 where the kernel gives none.
int FreshStat(int fd, struct stat* st, uint64_t* mount = nullptr);

// Opens `path` (relative to `dir_fd`) with O_DIRECT and takes its attributes from the store
// (FreshStat). A buffered descriptor is opened too where O_DIRECT is refused or has alignment
// rules (every filesystem but FUSE), and, with `buffered_reads` (the daemon may read the store
// through its page cache: `--store-io auto|buffered`), everywhere. `flags`: O_NOFOLLOW applies to
// the path, the rest are added to the opens.
// Only a regular file is ever opened: the path is resolved O_PATH, its type checked, and that
// inode reopened (O_NONBLOCK, then cleared), so a FIFO, socket or device renamed over the name at
// any moment is refused (NotRegularFileError) without blocking or running a device's open.
Result<std::shared_ptr<BackingFile>> OpenBacking(int dir_fd, const char* path, int flags,
                                                 struct stat* st, bool buffered_reads = false);

// The error for a file that is not regular (its S_IFMT `mode`): EISDIR, ELOOP for a symlink, else
// ENXIO (a FIFO, socket or device).
int NotRegularFileError(mode_t mode);

// Shared by the readers: read into request.buffer with pread until `expected` bytes or EOF.
// Handles O_DIRECT refusal (EINVAL) by falling back to the buffered descriptor, where there is one.
Result<size_t> PreadBlock(const ReadRequest& request);

// After a buffered read, the backing filesystem's page cache copy is not needed: we hold the data.
void DropBackingPageCache(const ReadRequest& request, size_t bytes);

}  // namespace accelfs
