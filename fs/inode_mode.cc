#include "fs/inode_mode.h"

#include <cerrno>

namespace accelfs {

struct InodeMode::Admission {
  bool keep_cache = false;
  bool changed = false;
  bool pinned = false;   // Effects::PinWhole pinned the file for passthrough
  int register_fd = -1;  // pinned as the inode's first passthrough open: register this
  int reused_id = 0;     // pinned beside other passthrough handles: counted, naming this id
};

Result<InodeMode::Admission> InodeMode::Admit(const OpenRequest& request, Effects& effects,
                                              MutexLock& lock) {
  if (passthrough_opens_ > 0 && passthrough_identity_ != request.identity) {
    // The file changed while open in passthrough mode: the kernel takes one backing file per
    // inode, so the new contents can be served only once the old handles are closed. The kernel
    // sends RELEASE asynchronously, so a handle closed just now may still count: wait a little
    // (not on the backend's thread, after a fill: its fetches took longer than that).
    if (request.may_wait) {
      passthrough_closed_.wait_for(lock.native(), kReleaseWait,
                                   [&]() ACCELFS_REQUIRES(mu_) { return passthrough_opens_ == 0; });
    }
    if (passthrough_opens_ > 0) return Error(EBUSY);
  }
  Admission admission;
  admission.keep_cache = opened_before_ && opened_identity_ == request.identity;
  admission.changed = opened_before_ && !admission.keep_cache;
  if (admission.changed) kernel_pages_.store(false, std::memory_order_relaxed);  // reply drops them
  effects.Admitted(admission.changed, opened_identity_);
  opened_identity_ = request.identity;
  opened_before_ = true;
  // Passthrough when every block is cached (and stays pinned while the handle is open) and no
  // handle of the inode is open in cached mode: the kernel keeps an inode in one mode at a time.
  if (request.passthrough && cached_opens_ == 0 && effects.PinWhole()) {
    admission.pinned = true;
    if (passthrough_opens_ == 0) {
      admission.register_fd = effects.BackingFd();
      passthrough_identity_ = request.identity;
    } else {
      // Counted under the lock that read the id: the RELEASE of the inode's last other handle
      // must not see the count reach 0 and close the id this reply is about to name (the kernel
      // answers an open naming a closed backing id with EIO).
      admission.reused_id = backing_id_;
      ++passthrough_opens_;
    }
  }
  return admission;
}

void InodeMode::Count(const OpenRequest& request, int backing_id, Effects& effects, Opened& out) {
  if (backing_id > 0) {
    backing_id_ = backing_id;
    ++passthrough_opens_;
    out.backing_id = backing_id;
    return;
  }
  ++cached_opens_;
  out.direct = request.direct_reads && !kernel_pages_.load(std::memory_order_relaxed);
  if (out.direct) return;
  kernel_pages_.store(true, std::memory_order_relaxed);
  if (request.watch_cached) {
    effects.Watch();
    out.watched = true;
  }
}

Result<InodeMode::Opened> InodeMode::Open(const OpenRequest& request, BackingRegistry* registry,
                                          Effects& effects) {
  MutexLock open_lock(open_mu_);
  Admission admission;
  {
    MutexLock lock(mu_);
    Result<Admission> admitted = Admit(request, effects, lock);
    if (!admitted.ok()) return admitted.error();
    admission = admitted.value();
  }
  Opened out;
  out.keep_cache = admission.keep_cache;
  out.changed = admission.changed;
  if (admission.reused_id > 0) {
    out.backing_id = admission.reused_id;
    return out;
  }
  int backing_id = 0;
  if (admission.pinned) {
    // The first passthrough open of the inode: its cache file is registered with open_mu_ alone
    // held (no other open runs, and no handle of the inode is in passthrough mode for a Release
    // to close).
    Result<int> id = admission.register_fd >= 0 ? registry->Open(admission.register_fd)
                                                : Result<int>(Error(ENOTSUP));
    backing_id = id.ok() ? id.value() : 0;
  }
  MutexLock lock(mu_);
  Count(request, backing_id, effects, out);
  return out;
}

void InodeMode::Release(bool passthrough, bool watched, BackingRegistry* registry,
                        Effects& effects) {
  int close_backing = 0;  // the inode's backing file, unregistered after mu_
  {
    MutexLock lock(mu_);
    if (passthrough) {
      if (--passthrough_opens_ == 0) {
        close_backing = backing_id_;
        backing_id_ = 0;
        passthrough_closed_.notify_all();
      }
    } else {
      --cached_opens_;
      if (watched) effects.Unwatch();
    }
  }
  // A new open may already have registered the file again: ids are the kernel's, each closed once.
  if (close_backing > 0) registry->Close(close_backing);
}

Status InodeMode::ClaimPagesFor(const FileKey& file, Effects& effects) {
  MutexLock lock(mu_);
  if (opened_before_ && opened_identity_ != file) return Error(ESTALE);
  // An inode open in passthrough mode is read from the store's file, not from its pages.
  if (passthrough_opens_ > 0) return Error(EBUSY);
  if (!effects.PinWhole()) return Error(ENODATA);
  opened_identity_ = file;
  opened_before_ = true;
  kernel_pages_.store(true, std::memory_order_relaxed);
  return Status::Ok();
}

bool InodeMode::MayFill(const FileKey& identity) {
  // A handle of the inode open in cached mode keeps it out of passthrough mode anyway, and so do
  // passthrough handles of the file's old contents (the kernel binds one backing file to an
  // inode).
  MutexLock lock(mu_);
  if (cached_opens_ > 0) return false;
  return passthrough_opens_ == 0 || passthrough_identity_ == identity;
}

}  // namespace accelfs
