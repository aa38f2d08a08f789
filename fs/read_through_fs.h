// The FUSE-free core of the filesystem: every operation the adapter forwards, on FUSE inode
// numbers and handles, with results as values. Tests drive it directly, without a mount.
//
// Thread safety: every method may be called concurrently from any thread.
#pragma once

#include <sys/stat.h>
#include <sys/statvfs.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "cache/block.h"
#include "cache/block_cache.h"
#include "cache/file_fill.h"
#include "cache/latency_histogram.h"
#include "cache/mutex.h"
#include "cache/prefetch/prefetcher.h"
#include "cache/result.h"
#include "cache/source_file.h"  // FdPath
#include "fs/calls_in_progress.h"
#include "fs/common/caller_access.h"
#include "fs/inode_table.h"
#include "fs/page_pusher.h"
#include "fs/shard_opener.h"
#include "fs/validity_window.h"

namespace accelfs {

struct FsOptions {
  uint32_t block_size = kDefaultBlockSize;
  uint32_t readahead_blocks = 4;  // daemon read-ahead window of a sequential handle, in blocks
  // Fill on open: an open of a large file (one the prefetcher streams) that fits in the cache,
  // where passthrough is possible, is answered only once the whole file is cached, in passthrough
  // mode. The loader then reads the cache's own pages (one copy in RAM, no daemon on its read
  // path) instead of a second copy the daemon writes into the mount's page cache while the file
  // streams in. The price: the file is read only after its last byte arrived. For a shard of a set
  // the next shard's fetch overlaps that read; for the last shard or a lone file nothing does.
  //   kAll     every such file
  //   kShards  a shard of a set that has a next shard; the last one and lone files stream in
  //   kOff     none: opens are answered at once in cached mode and the file streams in
  enum class Fill { kOff, kShards, kAll };
  Fill fill = Fill::kAll;
  // With a pusher fed streamed blocks (EnablePagePush): whether every handle opened in cached mode
  // is pushed into (--push), or, when false (--push auto), only where reads are direct
  // (EnableDirectReads: a cached-mode open there means the kernel maps the inode). Either way a
  // direct handle is pushed into from its first READ that looks like a mapping's fault.
  bool push_every_cached_open = true;
  // The backend may read the store through its page cache (--store-io auto or buffered): a FUSE
  // store's files are then opened twice, O_DIRECT and buffered (OpenBacking).
  bool buffered_reads = false;
  // The validity window (--revalidate): an open within this long of the file's last check against
  // SOURCE (its attributes and sampled pages, at an open), of a file whole in the cache, asks
  // SOURCE only for the permission bits and serves the cache's blocks, pinned while the handle
  // lives. 0: every open checks.
  std::chrono::nanoseconds revalidate{0};
  // Where fill on open records how long each open waited for its file, and, when it fetched from
  // the store, the file's cold load (null: nowhere). Outlive the filesystem.
  LatencyHistogram* open_waits = nullptr;
  LatencyHistogram* cold_loads = nullptr;
};

// --fill-on-open auto: below this many CPUs every large file is filled before its open is
// answered. Measured (docs/BENCHMARKS-HISTORY.md, "Fill on open"): on 2 CPUs the daemon's copy of
// a streamed file into the mount's page cache halved cold loads, while on 16 the overlap streaming
// buys for the last shard was worth more than that copy.
inline constexpr unsigned kFillAllBelowCpus = 8;

struct EntryOut {
  uint64_t ino = 0;
  struct stat attr {};
};

struct OpenOut {
  uint64_t fh = 0;
  int backing_id = 0;       // > 0: open in passthrough mode, reading the store's file directly
  bool keep_cache = false;  // the file is unchanged since its last open: keep the kernel's pages
  bool changed = false;     // the file changed since its last open: drop the kernel's attributes
  bool direct = false;      // reads bypass the kernel's page cache (FOPEN_DIRECT_IO)
};

// One reply piece: `length` bytes at `offset` inside a pinned cache block, or inside `bytes` where
// set (a file's head, read with its identity: SourceFile::head).
struct ReadPiece {
  BlockCache::Ref block;
  uint32_t offset = 0;
  uint32_t length = 0;
  std::shared_ptr<const std::vector<std::byte>> bytes;
  const std::byte* data() const { return bytes ? bytes->data() : block.data(); }
};
// Pieces in file order; empty at end of file. Called exactly once, on any thread.
using ReadDone = std::function<void(Result<std::vector<ReadPiece>>)>;

struct DirEntry {
  std::string name;
  ino_t ino = 0;      // the backing inode number (for d_ino)
  mode_t type = 0;    // S_IFMT bits, 0 when unknown
  uint64_t next = 0;  // offset to resume after this entry
};
// Returns false when the entry did not fit (it is then not consumed).
using DirEmit = std::function<bool(const DirEntry&, const EntryOut* plus)>;

// A file open now, for accelfs-stat.
struct OpenFileInfo {
  std::string name;  // the name the kernel last looked it up by (no directory)
  std::string path;  // where it is now below SOURCE's root; "" when nowhere there (deleted)
  uint64_t size = 0;
  bool passthrough = false;  // open in passthrough mode (else served by the daemon)
  bool direct = false;       // served by the daemon, its reads around the page cache
};

// Direct reads (ReadThroughFs::EnableDirectReads). Where the kernel's read-ahead stays at its
// 128 KiB (a mount by a user who is not root), every read through the page cache is a READ of at
// most that, each copied into new page cache; a handle opened for direct I/O gets a READ of up to
// 1 MiB per read() instead, copied straight into the reader's buffer (cold read() as a user: 1.98
// against 1.64, 1.88 against 1.75 and 1.48 against 1.24 GB/s, in pairs). But a mapping of a direct
// handle first drops every page of the inode the kernel holds (fs/fuse/file.c, fuse_file_mmap),
// so a mapping loader's second load would have to fetch them all again (1.57 against 5.37 GB/s):
// an inode whose pages the kernel may hold is opened in cached mode, never direct.
//
// Whether a READ of a direct handle comes from a mapping: page-cache reads are whole pages at a
// page offset and, with the kernel's read-ahead, at most 2 × 128 KiB (POSIX_FADV_SEQUENTIAL
// doubles a file's window); read() of a direct handle is a READ of what the reader asked for, up
// to 1 MiB, and a reader of small or page-sized pieces counts as a mapping (cached mode: today's
// path).
inline constexpr uint64_t kPageCacheReadMax = 256 * 1024;
bool LooksLikePageCacheRead(uint64_t offset, uint64_t size);

// BackingRegistry (store files registered with the kernel for passthrough): fs/inode_mode.h.

// Drops the attributes the kernel holds of an inode, so that its next permission check asks for
// them again (GETATTR). Implemented by the FUSE adapter; safe inside any request.
class KernelAttributes {
 public:
  virtual ~KernelAttributes() = default;
  virtual void Invalidate(uint64_t ino) = 0;
};

// The daemon acting for itself (and tests): root, whom no check refuses.
inline const Caller kDaemonCaller = Caller::Root();

class ReadThroughFs {
 public:
  // Takes ownership of root_fd (an O_PATH descriptor of SOURCE). REQUIRES: cache and prefetcher
  // (nullptr: no streaming) outlive this.
  ReadThroughFs(int root_fd, BlockCache& cache, FsOptions options,
                Prefetcher* prefetcher = nullptr);
  ~ReadThroughFs();

  static Result<std::unique_ptr<ReadThroughFs>> Create(const std::string& source, BlockCache& cache,
                                                       FsOptions options,
                                                       Prefetcher* prefetcher = nullptr);

  // A new O_PATH descriptor of SOURCE's directory as read now (FollowSource first: a store
  // mounted again under the daemon), or -1 with errno set.
  int OpenRoot();

  // Permissions taken away in SOURCE (a chmod or chown) are seen before the kernel's attributes
  // expire: where `caller`'s request meets a directory or file whose mode, uid or gid differ from
  // what the kernel was last told (Inode::told), the kernel's attributes of it are dropped
  // (EnableAttributeRefresh) and the caller is checked against the attributes SOURCE has now
  // (EACCES): Lookup checks the directory searched, OpenDir the directory, Open the file and its
  // directory. Where nothing changed the kernel's own check stands. Permissions granted are seen
  // once the kernel's attributes expire (the kernel refuses before asking).
  Result<EntryOut> Lookup(uint64_t parent, std::string_view name,
                          const Caller& caller = kDaemonCaller);
  void Forget(uint64_t ino, uint64_t nlookup);
  Result<struct stat> GetAttr(uint64_t ino);
  Result<std::string> ReadLink(uint64_t ino);
  Result<struct statvfs> StatFs(uint64_t ino);
  Status Access(uint64_t ino, int mask);
  Result<std::string> GetXattr(uint64_t ino, const std::string& name);
  Result<std::string> ListXattr(uint64_t ino);  // NUL-separated names

  // From now on, opens of fully cached files are passed through to the cache store's file when
  // `registry` is enabled and no cached-mode handle of the inode is open. REQUIRES: registry
  // outlives this; called before the first Open.
  void EnablePassthrough(BackingRegistry* registry) { registry_ = registry; }
  // From now on, changed permission attributes are dropped from the kernel (see Lookup).
  // REQUIRES: kernel outlives this; called before the first request.
  void EnableAttributeRefresh(KernelAttributes* kernel) { kernel_attrs_ = kernel; }
  // Opens in cached mode of files whose pages the kernel holds none of are then direct (see
  // kPageCacheReadMax). REQUIRES: the kernel maps direct handles (FUSE_DIRECT_IO_ALLOW_MMAP).
  void EnableDirectReads() { direct_reads_.store(true, std::memory_order_relaxed); }

  // From now on, blocks streamed in for files open in cached mode are pushed into the kernel's
  // page cache (when the pusher is fed them), and LoadIntoPageCache works. REQUIRES: pusher
  // outlives this; called before the first Open.
  void EnablePagePush(PagePusher* pusher) { pusher_ = pusher; }

  // Writes all of `file`, whole in the cache, into the kernel's page cache of its inode, so that
  // on a mount without passthrough the file's next open reads no byte through the daemon (a
  // warmed file). The inode's pages count as `file`'s from then on, so that open keeps them
  // (keep_cache); an open of a changed file drops them, as ever, and no page of the old file is
  // written after it. Returns the bytes written. Errors: ENOENT when the kernel does not hold the
  // inode (it was never looked up through the mount), ESTALE when it was last opened as another
  // version, EBUSY when it is open in passthrough mode, ENODATA when the file is no longer whole
  // in the cache, ENOTSUP without EnablePagePush, else the kernel's refusal or ECANCELED
  // (PagePusher::Load).
  Result<uint64_t> LoadIntoPageCache(const FileKey& file, uint64_t dev, uint64_t ino);

  // Answers through `done`: at once, or (fill on open, see FsOptions) once the file is cached,
  // on the thread that completed its last block. Never blocks on the backend.
  using OpenDone = std::function<void(Result<OpenOut>)>;
  void Open(uint64_t ino, int flags, const Caller& caller, OpenDone done);
  // As the daemon itself (root, whom no check refuses).
  void Open(uint64_t ino, int flags, OpenDone done) {
    Open(ino, flags, kDaemonCaller, std::move(done));
  }
  // Answers through `done`; never blocks on the backend.
  void Read(uint64_t fh, uint64_t offset, size_t size, ReadDone done);
  void Release(uint64_t fh);

  Result<uint64_t> OpenDir(uint64_t ino, const Caller& caller = kDaemonCaller);
  // Emits entries from `offset` on until one does not fit. With `plus`, each emitted entry other
  // than "." and ".." counts one lookup.
  Status ReadDir(uint64_t dh, uint64_t offset, bool plus, const DirEmit& emit);
  void ReleaseDir(uint64_t dh);

  size_t inode_count() const { return inodes_.size(); }
  size_t open_files() const { return open_files_.load(std::memory_order_relaxed); }
  size_t passthrough_files() const { return passthrough_files_.load(std::memory_order_relaxed); }
  // Opens waiting for their file to be cached (fill on open).
  size_t filling_opens() const { return filling_opens_.load(std::memory_order_relaxed); }
  // Opens answered within the validity window, without a check against SOURCE (FsOptions).
  uint64_t trusted_opens() const { return trusted_opens_.load(std::memory_order_relaxed); }
  // Bytes of the file heads held now (a cold open's first bytes, for its first READs: Open). At
  // most kMaxHeadBytes, so that files held open unread (by anyone who may open them) cost the
  // daemon a bounded amount of memory beside its cache; past it an open keeps none.
  static constexpr uint64_t kMaxHeadBytes = 64 << 20;
  uint64_t head_bytes() const { return head_bytes_->load(std::memory_order_relaxed); }
  // One entry per open file handle.
  std::vector<OpenFileInfo> OpenFiles();
  // The calls into SOURCE's filesystem in progress now (lookups, opens, listings, stats, closes):
  // each holds a thread serving the mount while it waits.
  CallsInProgress::Snapshot store_calls() const { return store_calls_.Now(); }

 private:
  struct Handle;
  struct DirHandle;
  // An open waiting for its whole file (fill on open); FsOptions::Fill is the mode.
  struct OpenWait;

  Result<std::shared_ptr<Inode>> Find(uint64_t ino) const;
  // LOOKUP without a permission check (READDIRPLUS: OpenDir checked the directory).
  Result<EntryOut> LookupEntry(uint64_t parent, std::string_view name);
  // Remembers the attributes given to the kernel for `node` (Inode::told).
  static void NoteTold(Inode& node, const struct stat& st);
  // Where `fresh` (SOURCE's attributes of inode `id`, `node`, now) differ from what the kernel
  // was told: drops the kernel's, and EACCES unless `caller` may access them for `mask`.
  Status CheckFresh(uint64_t id, Inode& node, const struct stat& fresh, const Caller& caller,
                    int mask);
  // The answer to `error`, an error of SOURCE's filesystem on `node`. A store whose client has died
  // answers ENOTCONN (and some EIO, ENODEV or ESTALE) for good; once it is mounted again at
  // SOURCE (the old mount lazily unmounted) the root follows the path (FollowSource), and an
  // inode found through the old mount answers ESTALE: the kernel walks the path again, from the
  // new mount, and the cache serves the files found there (identity by content).
  Error StoreError(const Inode& node, Error error);
  // Where SOURCE now leads to another directory on a filesystem of its type, the root inode takes
  // it (InodeTable::ReplaceRoot). Not to the bare mountpoint a dead store leaves: another type.
  void FollowSource();
  // The permission checks of an open (CheckFresh) of the file `node`, whose attributes SOURCE shows
  // as `st`, and of its directory.
  Status CheckOpenable(uint64_t ino, Inode& node, const struct stat& st, const Caller& caller);
  // An open of inode `ino` within the validity window of its last check (FsOptions::revalidate),
  // of a file whole in the cache: a handle with no store file, every block pinned, after a check
  // of the permission bits only. nullptr where the window has passed, the file was never checked,
  // a block is missing, or SOURCE shows other attributes (the full check then runs).
  std::unique_ptr<Handle> OpenTrusted(uint64_t ino, const std::shared_ptr<Inode>& inode,
                                      const Caller& caller, Status* refused);
  // The blocks of a READ (`slices` of `identity`, read from `file`): `done` once each answered.
  void GetSlices(const FileKey& identity, const std::shared_ptr<BackingFile>& file,
                 const std::vector<BlockSlice>& slices, ReadDone done);
  // The head of a file just opened (SourceFile::head) as a handle keeps it, counted in
  // head_bytes_; null when empty or when the heads kept now take kMaxHeadBytes.
  std::shared_ptr<const std::vector<std::byte>> KeepHead(std::vector<std::byte> head);
  // A READ within a handle's head (Handle::head): one piece of it.
  static std::vector<ReadPiece> HeadPieces(
      const std::shared_ptr<const std::vector<std::byte>>& head, uint64_t offset,
      const std::vector<BlockSlice>& slices);
  // A READ of a handle opened within the window: served from its pinned blocks.
  static void ReadPinned(const Handle& handle, const std::vector<BlockSlice>& slices,
                         const ReadDone& done);
  // Whether an open of a file of `size` bytes (`safetensors`: by its name) may wait for the whole
  // file (FsOptions::fill), as far as the mount and the size tell: WantsFill's first question.
  bool MayFill(uint64_t size, bool safetensors) const;
  // Whether an open of `handle`'s file should wait for the whole file (FsOptions::fill).
  bool WantsFill(const Handle& handle);
  // The budget bytes all of `file` takes in the cache (WholeFileBudget).
  uint64_t FillBudget(const FileKey& file) const;
  // Fetches all of the fill's file (a FileFill, cache/file_fill.h); FillDone answers the open.
  // Answers the open of `handle` once its whole file is cached (fill on open), starting the next
  // shard of its set beside it.
  void StartFill(std::unique_ptr<Handle> handle, OpenDone done);
  void RunFill(const std::shared_ptr<OpenWait>& fill);
  void FillDone(const std::shared_ptr<OpenWait>& fill, const FileFill::Outcome& outcome);
  // Gives the handle its mode (Inode::kernel_mode: passthrough when the file is whole in the
  // cache and no handle of the inode is open in cached mode), starts its streams, registers the
  // handle and answers. `next_started`: the next shard of its set was already asked for (by a
  // fill). `may_wait`: the thread may wait a little for the RELEASE of a changed file's old
  // handles.
  void FinishOpen(std::unique_ptr<Handle> handle, bool next_started, const OpenDone& done,
                  bool may_wait);
  // What the inode's mode transitions do to the cache, the prefetcher and the pusher
  // (InodeMode::Effects), for one handle or one load.
  class ModeEffects;
  // The streams an open starts: the file's own (served by the daemon), and the next shard's after
  // it, unless a fill started that already (`next_started`).
  struct StreamStart {
    FileKey identity;
    std::shared_ptr<BackingFile> file;
    bool safetensors = false;
    bool served = false;  // its READs reach the daemon: not passed through, not whole pinned
  };
  void StartStreams(const StreamStart& open, const std::shared_ptr<Inode>& dir,
                    const std::string& name, bool next_started);
  // The directory the kernel first found `inode` in, and the name there.
  static std::pair<std::shared_ptr<Inode>, std::string> PlaceOf(Inode& inode);

  BlockCache& cache_;
  const FsOptions options_;
  InodeTable inodes_;
  std::string source_;          // SOURCE's path (Create); empty: the root never follows it
  int64_t source_fs_type_ = 0;  // its statfs f_type then
  Mutex follow_mu_;             // one FollowSource at a time
  Prefetcher* const prefetcher_;
  std::unique_ptr<ShardOpener> shard_opener_;  // with a prefetcher
  BackingRegistry* registry_ = nullptr;
  KernelAttributes* kernel_attrs_ = nullptr;
  std::atomic<bool> direct_reads_{false};
  PagePusher* pusher_ = nullptr;
  std::atomic<size_t> open_files_{0};
  CallsInProgress store_calls_;
  std::atomic<size_t> passthrough_files_{0};
  std::atomic<size_t> filling_opens_{0};
  std::atomic<uint64_t> trusted_opens_{0};
  // Bytes of the heads that handles and READs in flight hold now (KeepHead).
  std::shared_ptr<std::atomic<uint64_t>> head_bytes_ = std::make_shared<std::atomic<uint64_t>>(0);
  ValidityWindow window_;  // the last check of each file, by place (FsOptions::revalidate)
  // Held while a fill round makes its Gets (FileFill::Options::issue_order), so that rounds are
  // queued whole. Taken before the cache's locks, never after them (the cache calls back outside
  // its lock), and never again inside: a round is ended, and the next begun, only after it is
  // released.
  Mutex fill_order_mu_;
  // Handles the kernel has not released yet, owned here so that none outlives the filesystem: the
  // kernel sends RELEASE asynchronously, and one still queued when the session ends (a close just
  // before SIGTERM) never arrives. Lock order: handles_mu_ is a leaf.
  Mutex handles_mu_;
  std::unordered_map<uint64_t, std::unique_ptr<Handle>> handles_ ACCELFS_GUARDED_BY(handles_mu_);
  std::unordered_map<uint64_t, std::unique_ptr<DirHandle>> dir_handles_
      ACCELFS_GUARDED_BY(handles_mu_);
};

}  // namespace accelfs
