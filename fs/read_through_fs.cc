#include "fs/read_through_fs.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <sys/sysmacros.h>
#include <sys/xattr.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <climits>
#include <mutex>

#include <spdlog/spdlog.h>

#include "cache/block.h"
#include "cache/readahead.h"
#include "fs/read_through_handles.h"

namespace accelfs {

namespace {

// The path the kernel gives descriptor `fd` (/proc/self/fd), or "" when it has none.
std::string DescriptorPath(int fd) {
  char buf[PATH_MAX];
  const ssize_t n = readlink(("/proc/self/fd/" + std::to_string(fd)).c_str(), buf, sizeof(buf) - 1);
  return n > 0 && buf[0] == '/' ? std::string(buf, static_cast<size_t>(n)) : "";
}

// One READ that spans one or more blocks; replies once every block has answered.
struct PendingRead {
  std::mutex mu;
  std::vector<ReadPiece> pieces;  // GUARDED_BY(mu)
  size_t remaining = 0;           // GUARDED_BY(mu)
  int error = 0;                  // GUARDED_BY(mu) first failure
  ReadDone done;
};

}  // namespace

ReadThroughFs::ReadThroughFs(int root_fd, BlockCache& cache, FsOptions options,
                             Prefetcher* prefetcher)
    : cache_(cache),
      options_(options),
      inodes_(root_fd,
              [root_fd] {
                struct stat st {};
                fstat(root_fd, &st);
                return st;
              }()),
      prefetcher_(prefetcher),
      // Shards stream ahead of the one being read while they and it fit in half the cache.
      shard_opener_(prefetcher != nullptr
                        ? std::make_unique<ShardOpener>(*prefetcher, cache.Stats().budget_bytes / 2,
                                                        &cache, options.buffered_reads)
                        : nullptr),
      window_(options.revalidate) {}

ReadThroughFs::~ReadThroughFs() = default;

bool LooksLikePageCacheRead(uint64_t offset, uint64_t size) {
  constexpr uint64_t kPage = 4096;
  return size > 0 && size <= kPageCacheReadMax && offset % kPage == 0 && size % kPage == 0;
}

namespace {

// SOURCE's directory, opened O_PATH (owned by the caller), with its attributes and its
// filesystem's type (statfs f_type): the root at the start, and again where SOURCE is mounted anew.
struct SourceDir {
  int fd = -1;
  struct stat st {};
  int64_t fs_type = 0;
};

Result<SourceDir> OpenSourceDir(const std::string& path) {
  SourceDir dir;
  dir.fd = open(path.c_str(), O_PATH | O_DIRECTORY | O_CLOEXEC);
  if (dir.fd < 0) return Error(errno);
  struct statfs sfs {};
  if (fstat(dir.fd, &dir.st) != 0 || fstatfs(dir.fd, &sfs) != 0) {
    const int err = errno;
    close(dir.fd);
    return Error(err);
  }
  dir.fs_type = static_cast<int64_t>(sfs.f_type);
  return dir;
}

}  // namespace

Result<std::unique_ptr<ReadThroughFs>> ReadThroughFs::Create(const std::string& source,
                                                             BlockCache& cache, FsOptions options,
                                                             Prefetcher* prefetcher) {
  Result<SourceDir> dir = OpenSourceDir(source);
  if (!dir.ok()) return dir.error();
  // A file's place is a SHA-256 digest (PlaceOfPath): libcrypto reads its configuration at its
  // first digest (5 ms here), which is taken now rather than in the first LOOKUP of a user's.
  PlaceOfPath("");
  auto fs = std::make_unique<ReadThroughFs>(dir->fd, cache, options, prefetcher);
  fs->source_ = source;
  fs->source_fs_type_ = dir->fs_type;
  return fs;
}

Result<std::shared_ptr<Inode>> ReadThroughFs::Find(uint64_t ino) const {
  auto inode = inodes_.Get(ino);
  if (!inode) return Error(ESTALE);
  return inode;
}

Error ReadThroughFs::StoreError(const Inode& node, Error error) {
  const int err = error.code();
  if (err != ENOTCONN && err != EIO && err != ENODEV && err != ESTALE) return error;
  FollowSource();
  return node.generation < inodes_.generation() ? Error(ESTALE) : error;
}

int ReadThroughFs::OpenRoot() {
  FollowSource();
  return fcntl(inodes_.Get(InodeTable::kRootId)->fd, F_DUPFD_CLOEXEC, 0);
}

void ReadThroughFs::FollowSource() {
  if (source_.empty()) return;
  std::lock_guard lock(follow_mu_);
  const std::shared_ptr<Inode> root = inodes_.Get(InodeTable::kRootId);
  struct stat st {};
  if (stat(source_.c_str(), &st) != 0 || (st.st_dev == root->dev && st.st_ino == root->ino)) {
    return;  // still the mount we have (or none answers there)
  }
  Result<SourceDir> dir = OpenSourceDir(source_);
  if (!dir.ok()) return;
  if (dir->fs_type != source_fs_type_) {
    close(dir->fd);  // the directory a dead store's mount covered, or something else
    return;
  }
  spdlog::warn("{} was mounted again (device {}:{}, was {}:{}): reading it from the new mount",
               source_, major(dir->st.st_dev), minor(dir->st.st_dev), major(root->dev),
               minor(root->dev));
  inodes_.ReplaceRoot(dir->fd, dir->st);
}

Status ReadThroughFs::CheckFresh(uint64_t id, Inode& node, const struct stat& fresh,
                                 const Caller& caller, int mask) {
  const AccessAttrs now = AccessAttrsOf(fresh);
  {
    std::lock_guard lock(node.mu);
    if (!node.told_known || node.told == now) return Status::Ok();  // the kernel checked these
  }
  if (kernel_attrs_ != nullptr) kernel_attrs_->Invalidate(id);
  if (!MayAccess(now, caller, mask)) return Error(EACCES);
  return Status::Ok();
}

void ReadThroughFs::NoteTold(Inode& node, const struct stat& st) {
  std::lock_guard lock(node.mu);
  node.told = AccessAttrsOf(st);
  node.told_known = true;
}

Result<EntryOut> ReadThroughFs::Lookup(uint64_t parent, std::string_view name,
                                       const Caller& caller) {
  {
    const CallsInProgress::Scope store_call(store_calls_);  // calls SOURCE's filesystem
    auto dir = Find(parent);
    if (!dir.ok()) return dir.error();
    struct stat st {};
    if (fstat((*dir)->fd, &st) == 0) {  // else the lookup itself says what is wrong
      if (Status s = CheckFresh(parent, **dir, st, caller, X_OK); !s.ok()) return s.error();
    }
  }
  return LookupEntry(parent, name);
}

Result<EntryOut> ReadThroughFs::LookupEntry(uint64_t parent, std::string_view name) {
  const CallsInProgress::Scope store_call(store_calls_);  // calls SOURCE's filesystem
  auto dir = Find(parent);
  if (!dir.ok()) return dir.error();
  if (name.find('/') != std::string_view::npos) return Error(EINVAL);
  const std::string child(name);
  const int fd = openat((*dir)->fd, child.c_str(), O_PATH | O_NOFOLLOW | O_CLOEXEC);
  if (fd < 0) return StoreError(**dir, Error(errno));
  EntryOut out;
  if (fstatat(fd, "", &out.attr, AT_EMPTY_PATH | AT_SYMLINK_NOFOLLOW) != 0) {
    const int err = errno;
    close(fd);
    return StoreError(**dir, Error(err));
  }
  auto [ino, node] = inodes_.Lookup(fd, out.attr, (*dir)->generation);
  out.ino = ino;
  NoteTold(*node, out.attr);
  // The name last looked up: the one Open checks (a file of several names, a rename); and, of a
  // directory, what a file's place in SOURCE is made of (SourcePath). Never one that would make a
  // directory its own ancestor (a bind mount of a directory inside itself).
  if (S_ISREG(out.attr.st_mode) || (S_ISDIR(out.attr.st_mode) && !IsAncestorOrSelf(node, *dir))) {
    std::lock_guard lock(node->mu);
    node->parent = *dir;
    node->name = child;
  }
  if (S_ISREG(out.attr.st_mode) && window_.enabled()) {
    window_.ForgetUnless(PlaceOfPath(SourcePath(node)), out.attr);
  }
  return out;
}

void ReadThroughFs::Forget(uint64_t ino, uint64_t nlookup) { inodes_.Forget(ino, nlookup); }

Result<struct stat> ReadThroughFs::GetAttr(uint64_t ino) {
  const CallsInProgress::Scope store_call(store_calls_);  // calls SOURCE's filesystem
  auto inode = Find(ino);
  if (!inode.ok()) return inode.error();
  struct stat st {};
  // A file's attributes by its name, as Open opens it: where the store gives a file renamed over
  // it the same inode number (rclone), the inode's own descriptor keeps the old file's for good.
  if (auto [dir, name] = PlaceOf(**inode); dir) {
    if (fstatat(dir->fd, name.c_str(), &st, AT_SYMLINK_NOFOLLOW) == 0 &&
        st.st_dev == (*inode)->dev && st.st_ino == (*inode)->ino) {
      NoteTold(**inode, st);
      if (S_ISREG(st.st_mode) && window_.enabled()) {
        window_.ForgetUnless(PlaceOfPath(SourcePath(*inode)), st);
      }
      return st;
    }
  }
  if (fstatat((*inode)->fd, "", &st, AT_EMPTY_PATH | AT_SYMLINK_NOFOLLOW) != 0) {
    return StoreError(**inode, Error(errno));
  }
  NoteTold(**inode, st);
  if (S_ISREG(st.st_mode) && window_.enabled()) {
    window_.ForgetUnless(PlaceOfPath(SourcePath(*inode)), st);
  }
  return st;
}

Result<std::string> ReadThroughFs::ReadLink(uint64_t ino) {
  const CallsInProgress::Scope store_call(store_calls_);  // calls SOURCE's filesystem
  auto inode = Find(ino);
  if (!inode.ok()) return inode.error();
  if (!S_ISLNK((*inode)->mode)) return Error(EINVAL);
  std::string target(PATH_MAX, '\0');
  const ssize_t n = readlinkat((*inode)->fd, "", target.data(), target.size());
  if (n < 0) return StoreError(**inode, Error(errno));
  if (static_cast<size_t>(n) >= target.size()) return Error(ENAMETOOLONG);
  target.resize(static_cast<size_t>(n));
  return target;
}

Result<struct statvfs> ReadThroughFs::StatFs(uint64_t ino) {
  const CallsInProgress::Scope store_call(store_calls_);  // calls SOURCE's filesystem
  auto inode = Find(ino);
  if (!inode.ok()) return inode.error();
  struct statvfs st {};
  if (fstatvfs((*inode)->fd, &st) != 0) return StoreError(**inode, Error(errno));
  return st;
}

Status ReadThroughFs::Access(uint64_t ino, int mask) {
  auto inode = Find(ino);
  if (!inode.ok()) return inode.error();
  if (mask & W_OK) return Error(EROFS);
  if (S_ISLNK((*inode)->mode)) return Status::Ok();
  if (faccessat(AT_FDCWD, FdPath((*inode)->fd).c_str(), mask, 0) != 0) {
    return StoreError(**inode, Error(errno));
  }
  return Status::Ok();
}

namespace {

// Calls fn(buffer, size) -> ssize_t until the value fits (xattrs may grow between the calls).
template <typename Fn>
Result<std::string> ReadSized(Fn fn) {
  for (;;) {
    const ssize_t size = fn(nullptr, 0);
    if (size < 0) return Error(errno);
    std::string value(static_cast<size_t>(size), '\0');
    const ssize_t n = fn(value.data(), value.size());
    if (n >= 0) {
      value.resize(static_cast<size_t>(n));
      return value;
    }
    if (errno != ERANGE) return Error(errno);
  }
}

}  // namespace

Result<std::string> ReadThroughFs::GetXattr(uint64_t ino, const std::string& name) {
  const CallsInProgress::Scope store_call(store_calls_);  // calls SOURCE's filesystem
  auto inode = Find(ino);
  if (!inode.ok()) return inode.error();
  // An O_PATH descriptor of a symlink cannot reach the link's own xattrs (user.* are not allowed
  // on symlinks anyway).
  if (S_ISLNK((*inode)->mode)) return Error(ENODATA);
  const std::string path = FdPath((*inode)->fd);
  Result<std::string> value = ReadSized(
      [&](char* buf, size_t size) { return getxattr(path.c_str(), name.c_str(), buf, size); });
  if (!value.ok()) return StoreError(**inode, value.error());
  return value;
}

Result<std::string> ReadThroughFs::ListXattr(uint64_t ino) {
  const CallsInProgress::Scope store_call(store_calls_);  // calls SOURCE's filesystem
  auto inode = Find(ino);
  if (!inode.ok()) return inode.error();
  if (S_ISLNK((*inode)->mode)) return std::string();
  const std::string path = FdPath((*inode)->fd);
  Result<std::string> names =
      ReadSized([&](char* buf, size_t size) { return listxattr(path.c_str(), buf, size); });
  if (!names.ok()) return StoreError(**inode, names.error());
  return names;
}

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
  // ETIMEDOUT after the backend timeout): identity by content, not by inode (cache/file_key.h).
  // A larger file's head comes in the same round trip, for its first READs; not where the open
  // may wait for the whole file anyway (fill on open).
  Status identified =
      IdentifySourceFile(cache_, &file.value(), PlaceOfPath(SourcePath(*inode)),
                         /*head=*/!MayFill(static_cast<uint64_t>(st.st_size), handle->safetensors));
  if (!identified.ok()) return done(StoreError(**inode, identified.error()));
  window_.Note(file->key, check_began);
  handle->file = std::move(file->backing);
  handle->identity = file->key;
  handle->head = KeepHead(std::move(file->head));
  handle->inode = *inode;
  handle->ino = ino;
  if (!WantsFill(*handle)) {
    return FinishOpen(std::move(handle), /*next_started=*/false, done, /*may_wait=*/true);
  }

  // Fill on open. The next shard of a set streams in beside this file's fetches (the backend
  // serves demand reads first), so it is on its way while the loader reads this one: at once
  // where this file alone cannot take all its store gives, else once its last blocks are on their
  // way (Fill::next, NextShardLead). The identity samples just read told which.
  auto fill = std::make_shared<Fill>();
  {
    auto [dir, name] = PlaceOf(*handle->inode);
    if (dir && handle->safetensors) {
      fill->next = [opener = shard_opener_.get(), dir, name, key = handle->identity] {
        opener->StartNextAfter(dir, name, key);
      };
      if (!handle->file->alone_fills_store()) fill->StartNext();
    }
  }
  fill->handle = std::move(handle);
  fill->done = std::move(done);
  fill->started = std::chrono::steady_clock::now();
  filling_opens_.fetch_add(1, std::memory_order_relaxed);
  RunFill(fill);
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
  std::lock_guard lock(inode.mu);
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
  if (handle->backing_id > 0) handle->head.reset();  // its READs never reach the daemon
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
    std::lock_guard lock(handles_mu_);
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

void ReadThroughFs::Read(uint64_t fh, uint64_t offset, size_t size, ReadDone done) {
  auto* handle = reinterpret_cast<Handle*>(fh);
  // Nothing below may touch the handle after the first Get: once the last block answers, the
  // reply can let the kernel send RELEASE, which deletes the handle while this thread is still
  // here.
  const FileKey identity = handle->identity;
  const bool safetensors = handle->safetensors;
  const std::shared_ptr<BackingFile> file = handle->file;
  const uint32_t block_size = options_.block_size;
  if (handle->direct && LooksLikePageCacheRead(offset, size)) {
    handle->inode->kernel_mode.NoteKernelPages();  // a mapping's fault
    // The mapping reads through the inode's page cache: pushes may go there from now on. A
    // handle only read() never is, so no push is a copy that nobody reads.
    int state = Handle::kNotWatched;
    if (pusher_ != nullptr &&
        handle->watch.compare_exchange_strong(state, Handle::kWatched, std::memory_order_relaxed) &&
        // Not every block of a file larger than the cache (a sparse one claiming terabytes):
        // only those fetched from now on.
        !pusher_->WatchFrom(identity, handle->ino, offset / block_size,
                            PlansBlocks(identity.size, cache_.budget_bytes())
                                ? BlockCount(identity.size, block_size)
                                : 0,
                            handle->push_epoch)) {
      handle->watch.store(Handle::kRefused, std::memory_order_relaxed);
    }
  }
  const std::vector<BlockSlice> slices = SliceRange(offset, size, identity.size, block_size);
  if (slices.empty()) {
    done(std::vector<ReadPiece>());  // at or past the end of the file
    return;
  }
  if (!file) return ReadPinned(*handle, slices, done);
  // A streamed file's stream follows the reader; smaller files get the handle's read-ahead.
  const bool streamed = prefetcher_ != nullptr && prefetcher_->Streams(identity, safetensors);
  BlockRange ahead;
  std::shared_ptr<const std::vector<std::byte>> head;
  {
    std::lock_guard lock(handle->mu);
    if (!streamed) {
      ahead = NextReadahead(handle->readahead, offset, size, identity.size, block_size,
                            options_.readahead_blocks);
    }
    // Within the file's head: answered from it, without waiting for its block (time to first
    // byte). Past it: the blocks answer from now on.
    const uint64_t end =
        slices.back().index * block_size + slices.back().offset + slices.back().length;
    if (handle->head && end <= handle->head->size()) {
      head = handle->head;
    } else {
      handle->head.reset();
    }
  }
  if (head) {
    // Answered first; its blocks are asked for all the same (the next READs need them), never
    // waited for. The handle may be gone once answered: nothing below touches it.
    done(HeadPieces(head, offset, slices));
    ahead.first = std::min(ahead.first, slices.front().index);
    ahead.end = std::max(ahead.end, slices.back().index + 1);
  } else {
    GetSlices(identity, file, slices, std::move(done));
  }
  if (streamed) {
    prefetcher_->OnRead(identity, file, offset, size, safetensors);
  } else {
    for (uint64_t b = ahead.first; b < ahead.end; ++b) {
      // Skipped when cached, in flight, or without room: read-ahead never waits.
      cache_.Prefetch(BlockKey{identity, b}, BlockBytes(b, identity.size, block_size), file);
    }
  }
}

std::shared_ptr<const std::vector<std::byte>> ReadThroughFs::KeepHead(std::vector<std::byte> head) {
  const uint64_t bytes = head.size();
  if (bytes == 0) return nullptr;
  if (head_bytes_->fetch_add(bytes, std::memory_order_relaxed) + bytes > kMaxHeadBytes) {
    head_bytes_->fetch_sub(bytes, std::memory_order_relaxed);
    return nullptr;  // READs wait for their blocks, as they would without a head
  }
  // Counted until its last holder goes: a READ's reply may outlive its handle.
  return std::shared_ptr<const std::vector<std::byte>>(
      new std::vector<std::byte>(std::move(head)),
      [count = head_bytes_, bytes](const std::vector<std::byte>* kept) {
        count->fetch_sub(bytes, std::memory_order_relaxed);
        delete kept;
      });
}

std::vector<ReadPiece> ReadThroughFs::HeadPieces(
    const std::shared_ptr<const std::vector<std::byte>>& head, uint64_t offset,
    const std::vector<BlockSlice>& slices) {
  std::vector<ReadPiece> pieces(1);
  pieces[0].bytes = head;
  pieces[0].offset = static_cast<uint32_t>(offset);
  for (const BlockSlice& slice : slices) pieces[0].length += slice.length;
  return pieces;
}

void ReadThroughFs::GetSlices(const FileKey& identity, const std::shared_ptr<BackingFile>& file,
                              const std::vector<BlockSlice>& slices, ReadDone done) {
  const uint32_t block_size = options_.block_size;
  auto pending = std::make_shared<PendingRead>();
  pending->pieces.resize(slices.size());
  pending->remaining = slices.size();
  pending->done = std::move(done);
  for (size_t i = 0; i < slices.size(); ++i) {
    const BlockSlice slice = slices[i];
    cache_.Get(
        BlockKey{identity, slice.index}, BlockBytes(slice.index, identity.size, block_size), file,
        [pending, i, slice](Result<BlockCache::Ref> block) {
          std::unique_lock lock(pending->mu);
          if (block.ok()) {
            pending->pieces[i] = {std::move(block.value()), slice.offset, slice.length, nullptr};
          } else if (pending->error == 0) {
            pending->error = block.error().code();
          }
          if (--pending->remaining > 0) return;
          lock.unlock();
          if (pending->error != 0) {
            pending->pieces.clear();  // unpin before replying
            pending->done(Error(pending->error));
          } else {
            pending->done(std::move(pending->pieces));
          }
        });
  }
}

void ReadThroughFs::ReadPinned(const Handle& handle, const std::vector<BlockSlice>& slices,
                               const ReadDone& done) {
  // Its blocks are the handle's own: dropped from the cache meanwhile (a change seen by another
  // open, an evict), they live on while pinned here.
  std::vector<ReadPiece> pieces;
  for (const BlockSlice& slice : slices) {
    if (slice.index >= handle.pinned.size()) return done(Error(EIO));  // not within its key's size
    pieces.push_back({handle.pinned[slice.index].Share(), slice.offset, slice.length, nullptr});
  }
  done(std::move(pieces));
}

void ReadThroughFs::Release(uint64_t fh) {
  const CallsInProgress::Scope store_call(store_calls_);  // calls SOURCE's filesystem
  std::unique_ptr<Handle> handle = TakeHandle(handles_mu_, handles_, fh);
  if (!handle) return;
  const bool passthrough = handle->backing_id > 0;
  if (passthrough) passthrough_files_.fetch_sub(1, std::memory_order_relaxed);
  ModeEffects effects(*this, handle->identity, handle->ino, &handle->pinned);
  handle->inode->kernel_mode.Release(
      passthrough, handle->watch.load(std::memory_order_relaxed) == Handle::kWatched, registry_,
      effects);
  open_files_.fetch_sub(1, std::memory_order_relaxed);
}

std::vector<OpenFileInfo> ReadThroughFs::OpenFiles() {
  std::vector<std::pair<std::shared_ptr<Inode>, OpenFileInfo>> open;
  {
    std::lock_guard lock(handles_mu_);
    for (const auto& [fh, handle] : handles_) {
      open.push_back(
          {handle->inode, {"", "", handle->identity.size, handle->backing_id > 0, handle->direct}});
    }
  }
  std::vector<OpenFileInfo> out;
  // Where each file is now below SOURCE's root: the kernel's name of its descriptor (renames
  // followed) below the root's. Empty when it is not below it (deleted, another root).
  const std::string root = DescriptorPath(inodes_.Get(InodeTable::kRootId)->fd);
  for (auto& [inode, info] : open) {  // handles_mu_ is a leaf: names are read after it
    const std::string at = DescriptorPath(inode->fd);
    const std::string prefix = root == "/" ? root : root + "/";
    if (!root.empty() && at.size() > prefix.size() && at.starts_with(prefix) &&
        !at.ends_with(" (deleted)")) {
      info.path = at.substr(prefix.size());
    }
    std::lock_guard lock(inode->mu);
    info.name = inode->name;
    out.push_back(std::move(info));
  }
  return out;
}

}  // namespace accelfs
