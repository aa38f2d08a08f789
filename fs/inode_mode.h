// The kernel's mode of one inode (docs/DESIGN.md §6.2, §6.9). The kernel keeps an inode either in
// cached mode or in passthrough mode, never both, and binds one backing file to it: every handle
// open in passthrough mode names the same backing id, registered at the first such open and closed
// at the RELEASE of the last. A direct handle (FOPEN_DIRECT_IO) counts as a cached-mode open here.
// Beside the mode, the inode remembers which version of its file (identity) the kernel's pages
// belong to, so that an open keeps them (keep_cache) or drops them (changed), and whether the
// kernel may hold any at all (direct reads only where it holds none).
//
// InodeMode owns that state and its transitions: Open, Release, ClaimPagesFor (a load into the
// page cache), NoteKernelPages (a mapping's fault on a direct handle), MayFill. It is free of FUSE:
// backing files are registered through a BackingRegistry, and what an open does to the cache, the
// prefetcher and the pusher is done through Effects, called with the lock held so that each step
// is atomic with the transition it belongs to.
//
// Lock order: open_mu_, then mu_, then whatever Effects take (the cache's, the pusher's locks).
//   open_mu_ serializes the inode's opens (Open holds it throughout): the backing file is
//            registered (an ioctl, BackingRegistry::Open) with open_mu_ held but not mu_, and no
//            other open may see the inode half registered. Nothing else takes it.
//   mu_      guards the counts, the identities and the backing id. Held while Effects run; never
//            while a BackingRegistry is called or a caller's reply is sent.
// No method may be called from inside an Effects call.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>

#include "cache/file_key.h"
#include "cache/mutex.h"
#include "cache/result.h"

namespace accelfs {

// Registers store files with the kernel for FUSE passthrough. Implemented by the FUSE adapter.
class BackingRegistry {
 public:
  virtual ~BackingRegistry() = default;
  // Whether the kernel agreed to passthrough for this mount.
  virtual bool Enabled() const = 0;
  // A backing id for the open file `fd`.
  virtual Result<int> Open(int fd) = 0;
  virtual void Close(int backing_id) = 0;
};

class InodeMode {
 public:
  // How long an open of a changed file waits for the RELEASE of the passthrough handles of its old
  // contents: the kernel sends RELEASE after close() returns, in the background, within
  // milliseconds.
  static constexpr std::chrono::seconds kReleaseWait{1};

  // What the filesystem does beside a transition, for one handle (or one load). Each is called
  // with mu_ held (REQUIRES: calls back into no InodeMode). The defaults do nothing (PinWhole pins
  // nothing, BackingFd has none).
  class Effects {
   public:
    virtual ~Effects() = default;
    // An open is admitted. `changed`: the kernel's pages were of `old`, which this open's reply
    // drops; none of `old` may be served or pushed after it.
    virtual void Admitted(bool /*changed*/, const FileKey& /*old*/) {}
    // Pins every block of the file, all cached, for as long as the handle (or load) lives; false,
    // pinning nothing, when one is missing or the file is empty.
    virtual bool PinWhole() { return false; }
    // The descriptor of the cache's file to register as the inode's backing file (-1: none).
    virtual int BackingFd() { return -1; }
    // The handle reads through the inode's page cache: push into it (Watch), or stop (Unwatch).
    virtual void Watch() {}
    virtual void Unwatch() {}
  };

  struct OpenRequest {
    FileKey identity;           // of the file this open found
    bool passthrough = false;   // the kernel agreed to passthrough (BackingRegistry::Enabled)
    bool direct_reads = false;  // a cached-mode open of an inode without pages may be direct
    bool watch_cached = false;  // a handle reading through the page cache is pushed into (Watch)
    // The thread may wait (kReleaseWait) for the RELEASE of a changed file's old passthrough
    // handles: not the backend's thread that ended a fill.
    bool may_wait = true;
  };
  // The mode an open was given. backing_id > 0: passthrough, counted until its Release.
  struct Opened {
    int backing_id = 0;
    bool keep_cache = false;  // the kernel's pages are of this identity: keep them
    bool changed = false;     // they are of another: the reply drops them (and the attributes)
    bool direct = false;      // cached mode, reads around the page cache (FOPEN_DIRECT_IO)
    bool watched = false;     // Effects::Watch was called for the handle
  };

  // Gives an open of `request.identity` its mode, and counts it. Passthrough where the kernel
  // agreed to it, no handle of the inode is open in cached mode and Effects::PinWhole pins the
  // whole file: the first such open registers Effects::BackingFd with `registry`, later ones name
  // the same id (counted under the lock that read it, so that no Release closes it in between);
  // a failed registration opens in cached mode. Cached mode otherwise, direct where
  // `request.direct_reads` and the kernel holds no pages of the inode. EBUSY when the file
  // changed while its old contents are open in passthrough mode and stay so (after kReleaseWait
  // where `request.may_wait`): the kernel takes one backing file per inode. REQUIRES: `registry`
  // non-null where `request.passthrough`; every Opened is given back by one Release.
  Result<Opened> Open(const OpenRequest& request, BackingRegistry* registry, Effects& effects);

  // A handle is released: `passthrough`, opened with a backing id; else in cached mode, and
  // `watched` when the pusher watches it now (from its open or from a mapping's fault):
  // Effects::Unwatch. The last passthrough handle closes the backing id with `registry`, once,
  // after mu_.
  void Release(bool passthrough, bool watched, BackingRegistry* registry, Effects& effects);

  // The kernel's pages of the inode are to be `file`'s (a load of all of it into them, pinned by
  // Effects::PinWhole). ESTALE when the inode was last opened as another version, EBUSY while it
  // is open in passthrough mode (read from the store's file, not its pages), ENODATA when the
  // file is not whole in the cache.
  Status ClaimPagesFor(const FileKey& file, Effects& effects);

  // Whether an open of `identity` may wait for its whole file to be passed through (fill on
  // open): no handle of the inode is open in cached mode, nor in passthrough mode on other
  // contents.
  bool MayFill(const FileKey& identity);

  // A direct handle's READ looks like a mapping's fault: the kernel may hold pages of the inode
  // now, and its later opens are not direct. A hint, set without mu_: a late store only keeps the
  // next open in cached mode.
  void NoteKernelPages() { kernel_pages_.store(true, std::memory_order_relaxed); }

 private:
  // Decides under mu_ (Open's first step): EBUSY, or the identity's pages and whether the file is
  // pinned for passthrough; counts a passthrough open that reuses the registered id.
  struct Admission;
  Result<Admission> Admit(const OpenRequest& request, Effects& effects, MutexLock& lock)
      ACCELFS_REQUIRES(mu_);
  // Counts the open (Open's last step): passthrough with `backing_id`, else cached.
  void Count(const OpenRequest& request, int backing_id, Effects& effects, Opened& out)
      ACCELFS_REQUIRES(mu_);

  Mutex open_mu_;
  Mutex mu_;
  // The identity seen at the last open (or load): the one the kernel's pages belong to.
  FileKey opened_identity_ ACCELFS_GUARDED_BY(mu_);
  bool opened_before_ ACCELFS_GUARDED_BY(mu_) = false;
  int cached_opens_ ACCELFS_GUARDED_BY(mu_) = 0;  // direct handles included
  int passthrough_opens_ ACCELFS_GUARDED_BY(mu_) = 0;
  int backing_id_ ACCELFS_GUARDED_BY(mu_) = 0;  // registered while passthrough_opens_ > 0
  FileKey passthrough_identity_ ACCELFS_GUARDED_BY(mu_);
  std::condition_variable passthrough_closed_;  // notified when passthrough_opens_ drops to 0
  // The kernel's page cache of the inode may hold pages of opened_identity_: a handle in cached
  // mode read them, a mapping of a direct handle faulted them in, or a load wrote them. Read and
  // written under mu_ by Open, ClaimPagesFor; set without it by NoteKernelPages.
  std::atomic<bool> kernel_pages_{false};
};

}  // namespace accelfs
