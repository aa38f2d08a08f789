// The open path of ReadThroughFs: check the file against SOURCE, open it for the backend, fill it
// where the open waits for its fill, choose the kernel's mode for it, start its streams; and the
// release of what an open made.
#include <fcntl.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>

#include <spdlog/spdlog.h>

#include "cache/block.h"
#include "cache/readahead.h"
#include "fs/read_through_fs.h"
#include "fs/read_through_handles.h"

namespace accelfs {

void ReadThroughFs::Open(uint64_t ino, int flags, const Caller& caller, OpenDone done) {
  const CallsInProgress::Scope store_call(store_calls_);  // calls SOURCE's filesystem
  if ((flags & O_ACCMODE) != O_RDONLY || (flags & (O_TRUNC | O_CREAT)) != 0) {
    return done(Error(EROFS));
  }
  auto inode = Find(ino);
  if (!inode.ok()) return done(inode.error());
  if (S_ISDIR((*inode)->mode)) return done(Error(EISDIR));
  if (window_.enabled()) {
    Status refused;
    if (std::unique_ptr<Handle> handle = OpenTrusted(ino, *inode, caller, &refused)) {
      trusted_opens_.fetch_add(1, std::memory_order_relaxed);
      return FinishOpen(std::move(handle), /*next_started=*/false, done, /*may_wait=*/true);
    }
    if (!refused.ok()) return done(refused.error());
  }
  // When this check began: the window of a check counts from before anything it read.
  const auto check_began = std::chrono::steady_clock::now();
  // Opened by the name it was last looked up by, in its directory: the file the name leads to now,
  // with the attributes the store shows for it now. Not through the inode's own descriptor: a
  // store that numbers a file by its path (rclone) gives a file renamed over it the same inode
  // number, and the old inode's attributes stay the kernel's for the store's attribute timeout;
  // and a store that lets a file go once it has no name left (zfs-fuse) cannot open it again.
  Result<SourceFile> file = Error(ENOENT);
  if (auto [dir, name] = PlaceOf(**inode); dir) {
    file = OpenSourceFile(dir->fd, name, options_.buffered_reads);
  } else {
    file = OpenSourceFileOf((*inode)->fd, options_.buffered_reads);
  }
  // No such name any more, or it leads to another file, or the file has no links left (deleted or
  // replaced by a rename since the kernel looked the name up, and the kernel trusts that name for
  // entry_timeout): ESTALE makes the kernel walk the path again with LOOKUP_REVAL, so the open
  // reaches what the name means now.
  if (!file.ok() && file.error().code() == ENOENT) return done(Error(ESTALE));
  if (!file.ok()) return done(StoreError(**inode, file.error()));
  const struct stat& st = file->st;
  if (st.st_nlink == 0 || st.st_dev != (*inode)->dev || st.st_ino != (*inode)->ino) {
    return done(Error(ESTALE));
  }
  if (Status s = CheckOpenable(ino, **inode, st, caller); !s.ok()) return done(s.error());
  auto handle = std::make_unique<Handle>();
  handle->safetensors = PlaceOf(**inode).second.ends_with(".safetensors");
  // The first and last page are read from the store (through the backend: a hung file answers
  // ETIMEDOUT after the store timeout): identity by content, not by inode (cache/file_key.h).
  // A larger file's head comes in the same round trip, for its first READs; not where the open
  // may wait for the whole file anyway (fill on open).
  Status identified =
      IdentifySourceFile(cache_, &file.value(), PlaceOfPath(SourcePath(*inode)),
                         /*head=*/!MayFill(static_cast<uint64_t>(st.st_size), handle->safetensors));
  if (!identified.ok()) return done(StoreError(**inode, identified.error()));
  window_.Note(file->key, check_began);
  handle->file = std::move(file->backing);
  handle->identity = file->key;
  handle->SetHeadUnpublished(KeepHead(std::move(file->head)));
  handle->inode = *inode;
  handle->ino = ino;
  if (!WantsFill(*handle)) {
    return FinishOpen(std::move(handle), /*next_started=*/false, done, /*may_wait=*/true);
  }
  StartFill(std::move(handle), std::move(done));
}

Status ReadThroughFs::CheckOpenable(uint64_t ino, Inode& node, const struct stat& st,
                                    const Caller& caller) {
  if (Status s = CheckFresh(ino, node, st, caller, R_OK); !s.ok()) return s;
  if (auto [dir, name] = PlaceOf(node); dir) {
    // Its directory too: a chmod 700 of a model's directory takes it from the others at once.
    struct stat dir_st {};
    const uint64_t dir_id = inodes_.FindBacking(dir->dev, dir->ino).first;
    if (dir_id != 0 && fstat(dir->fd, &dir_st) == 0) {
      if (Status s = CheckFresh(dir_id, *dir, dir_st, caller, X_OK); !s.ok()) return s;
    }
  }
  return Status::Ok();
}

std::unique_ptr<ReadThroughFs::Handle> ReadThroughFs::OpenTrusted(
    uint64_t ino, const std::shared_ptr<Inode>& inode, const Caller& caller, Status* refused) {
  // The inode's attributes as the store's kernel mount holds them (its own attribute cache
  // answers within its timeout: no round trip to its server): other ones than the last check's
  // key was made from (a rewrite in place, a rename over it that left it no link) end the window
  // at once; the permission bits are checked as at every open.
  const Place place = PlaceOfPath(SourcePath(inode));
  if (!window_.Holds(place)) return nullptr;  // nothing to trust: no call into SOURCE for it
  struct stat st {};
  if (fstatat(inode->fd, "", &st, AT_EMPTY_PATH | AT_SYMLINK_NOFOLLOW) != 0) return nullptr;
  const std::optional<FileKey> key = window_.Find(place, st);
  if (!key) return nullptr;
  if (Status s = CheckOpenable(ino, *inode, st, caller); !s.ok()) {
    *refused = s;
    return nullptr;
  }
  auto handle = std::make_unique<Handle>();
  if (key->size > 0 && !cache_.PinFile(*key, &handle->pinned)) return nullptr;
  handle->identity = *key;
  handle->inode = inode;
  handle->ino = ino;
  handle->safetensors = PlaceOf(*inode).second.ends_with(".safetensors");
  return handle;
}

std::pair<std::shared_ptr<Inode>, std::string> ReadThroughFs::PlaceOf(Inode& inode) {
  MutexLock lock(inode.mu);
  return {inode.parent, inode.name};
}

class ReadThroughFs::ModeEffects final : public InodeMode::Effects {
 public:
  // For the handle or load of `file` on inode `ino`: its blocks pinned into `pinned`, the pusher's
  // epoch at the open into `push_epoch` (nullptr: a load, which takes its own).
  ModeEffects(ReadThroughFs& fs, const FileKey& file, uint64_t ino,
              std::vector<BlockCache::Ref>* pinned, uint64_t* push_epoch = nullptr)
      : fs_(fs), file_(file), ino_(ino), pinned_(pinned), push_epoch_(push_epoch) {}

  void Admitted(bool changed, const FileKey& old) override {
    if (changed) {
      fs_.cache_.DropFile(old);
      if (fs_.prefetcher_ != nullptr) fs_.prefetcher_->Forget(old);
      // Before the reply drops the kernel's pages: none of the old data may be pushed after it.
      if (fs_.pusher_ != nullptr) fs_.pusher_->Forget(old);
    }
    // After the Forget above: a later change of this file moves the epoch past this handle's.
    if (fs_.pusher_ != nullptr && push_epoch_ != nullptr) *push_epoch_ = fs_.pusher_->Epoch();
  }
  // A handle opened within the validity window (OpenTrusted) holds every block already.
  bool PinWhole() override { return !pinned_->empty() || fs_.cache_.PinFile(file_, pinned_); }
  int BackingFd() override { return fs_.cache_.store().FileDescriptor(file_); }
  void Watch() override { fs_.pusher_->Watch(file_, ino_); }
  void Unwatch() override { fs_.pusher_->Unwatch(file_, ino_); }

 private:
  ReadThroughFs& fs_;
  const FileKey& file_;
  const uint64_t ino_;
  std::vector<BlockCache::Ref>* const pinned_;
  uint64_t* const push_epoch_;
};

Result<uint64_t> ReadThroughFs::LoadIntoPageCache(const FileKey& file, uint64_t dev, uint64_t ino) {
  if (pusher_ == nullptr) return Error(ENOTSUP);
  auto [id, node] = inodes_.FindBacking(static_cast<dev_t>(dev), static_cast<ino_t>(ino));
  if (!node) return Error(ENOENT);
  // Taken before the inode's pages are claimed for `file`: an open that finds the file changed
  // after that forgets the old version (FinishOpen), which ends the load.
  const uint64_t epoch = pusher_->Epoch();
  std::vector<BlockCache::Ref> blocks;
  ModeEffects effects(*this, file, id, &blocks);
  if (Status s = node->kernel_mode.ClaimPagesFor(file, effects); !s.ok()) return s.error();
  Result<uint64_t> loaded = pusher_->Load(id, blocks, epoch);
  blocks.clear();  // unpinned with no inode lock held
  return loaded;
}

void ReadThroughFs::FinishOpen(std::unique_ptr<Handle> handle, bool next_started,
                               const OpenDone& done, bool may_wait) {
  const bool direct_reads = direct_reads_.load(std::memory_order_relaxed);
  const InodeMode::OpenRequest request{
      .identity = handle->identity,
      .passthrough = registry_ != nullptr && registry_->Enabled(),
      .direct_reads = direct_reads,
      .watch_cached = pusher_ != nullptr && (options_.push_every_cached_open || direct_reads),
      .may_wait = may_wait};
  ModeEffects effects(*this, handle->identity, handle->ino, &handle->pinned, &handle->push_epoch);
  Result<InodeMode::Opened> mode = handle->inode->kernel_mode.Open(request, registry_, effects);
  if (!mode.ok()) return done(mode.error());  // EBUSY, answered with no lock held
  handle->backing_id = mode->backing_id;
  handle->direct = mode->direct;
  if (mode->watched) handle->watch.store(Handle::kWatched, std::memory_order_relaxed);
  if (handle->backing_id > 0) passthrough_files_.fetch_add(1, std::memory_order_relaxed);
  // Unpinned with no inode lock held; a handle with no store file (OpenTrusted) keeps its pins.
  if (handle->backing_id == 0 && handle->file) handle->pinned.clear();
  if (handle->backing_id > 0)
    handle->SetHeadUnpublished(nullptr);  // its READs never reach the daemon
  const OpenOut out{.fh = reinterpret_cast<uint64_t>(handle.get()),
                    .backing_id = mode->backing_id,
                    .keep_cache = mode->keep_cache,
                    .changed = mode->changed,
                    .direct = mode->direct};
  auto [dir, name] = PlaceOf(*handle->inode);
  // A file the daemon serves starts its stream after the reply: the stream's first fetches
  // (dozens of blocks) are no part of the open (time to first byte). One passed through or pinned
  // whole only queues the next shard's open, cheap, before the reply as it always did.
  const StreamStart streams{handle->identity, handle->file, handle->safetensors,
                            /*served=*/handle->backing_id == 0 && handle->file != nullptr};
  if (!streams.served) StartStreams(streams, dir, name, next_started);
  // A passed-through handle's reads never reach the daemon: its descriptor of the store's file
  // goes now, not at its RELEASE (which a mapping delays until it is unmapped): a file held open
  // costs some stores more than a descriptor (NextShardLead). After the reply: on a FUSE store the
  // close waits for the store's FLUSH and RELEASE (up to 9 ms on s3fs). Only on the OPEN's own
  // thread (`may_wait`): that wait must never hold the backend's thread that ended a fill.
  std::shared_ptr<BackingFile> closed_after_reply;
  if (handle->backing_id > 0 && may_wait) closed_after_reply = std::move(handle->file);
  {
    MutexLock lock(handles_mu_);
    handles_.emplace(out.fh, std::move(handle));
  }
  open_files_.fetch_add(1, std::memory_order_relaxed);
  done(out);
  if (streams.served) StartStreams(streams, dir, name, next_started);
  closed_after_reply.reset();
}

void ReadThroughFs::StartStreams(const StreamStart& open, const std::shared_ptr<Inode>& dir,
                                 const std::string& name, bool next_started) {
  if (prefetcher_ == nullptr) return;
  // A file served by the daemon starts streaming in at its first open (its first READs, which
  // may come before this, start it too: Prefetcher::OnRead).
  if (open.served) prefetcher_->OnOpen(open.identity, open.file, open.safetensors);
  // The shard a loader opens after this one streams in once this one's stream is done, or at
  // once when this one is already cached (passed through, or whole within the window).
  if (!open.safetensors || !dir || next_started) return;
  if (!open.served) {
    shard_opener_->StartNextAfter(dir, name, open.identity);
  } else {
    prefetcher_->SetSuccessor(open.identity,
                              [opener = shard_opener_.get(), dir, name, key = open.identity] {
                                opener->StartNextAfter(dir, name, key);
                              });
  }
}

void ReadThroughFs::Release(uint64_t fh) {
  const CallsInProgress::Scope store_call(store_calls_);  // calls SOURCE's filesystem
  std::unique_ptr<Handle> handle;
  {
    MutexLock lock(handles_mu_);
    handle = TakeHandle(handles_, fh);
  }
  if (!handle) return;
  const bool passthrough = handle->backing_id > 0;
  if (passthrough) passthrough_files_.fetch_sub(1, std::memory_order_relaxed);
  ModeEffects effects(*this, handle->identity, handle->ino, &handle->pinned);
  handle->inode->kernel_mode.Release(
      passthrough, handle->watch.load(std::memory_order_relaxed) == Handle::kWatched, registry_,
      effects);
  open_files_.fetch_sub(1, std::memory_order_relaxed);
}

}  // namespace accelfs
