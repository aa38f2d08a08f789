#include "fs/read_through_fs.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <climits>

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
  explicit PendingRead(size_t count) : pieces(count), remaining(count) {}

  Mutex mu;
  std::vector<ReadPiece> pieces ACCELFS_GUARDED_BY(mu);
  size_t remaining ACCELFS_GUARDED_BY(mu) = 0;
  int error ACCELFS_GUARDED_BY(mu) = 0;  // first failure
  ReadDone done;

  // The reply, once the last block has answered: without mu, since no other answer writes any
  // more.
  void Reply() ACCELFS_NO_THREAD_SAFETY_ANALYSIS {
    if (error != 0) {
      pieces.clear();  // unpin before replying
      done(Error(error));
    } else {
      done(std::move(pieces));
    }
  }
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
  MutexLock lock(follow_mu_);
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
    MutexLock lock(node.mu);
    if (!node.told_known || node.told == now) return Status::Ok();  // the kernel checked these
  }
  if (kernel_attrs_ != nullptr) kernel_attrs_->Invalidate(id);
  if (!MayAccess(now, caller, mask)) return Error(EACCES);
  return Status::Ok();
}

void ReadThroughFs::NoteTold(Inode& node, const struct stat& st) {
  MutexLock lock(node.mu);
  node.told = AccessAttrsOf(st);
  node.told_known = true;
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
    MutexLock lock(handle->mu);
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
  auto pending = std::make_shared<PendingRead>(slices.size());
  pending->done = std::move(done);
  for (size_t i = 0; i < slices.size(); ++i) {
    const BlockSlice slice = slices[i];
    cache_.Get(
        BlockKey{identity, slice.index}, BlockBytes(slice.index, identity.size, block_size), file,
        [pending, i, slice](Result<BlockCache::Ref> block) {
          {
            MutexLock lock(pending->mu);
            if (block.ok()) {
              pending->pieces[i] = {std::move(block.value()), slice.offset, slice.length, nullptr};
            } else if (pending->error == 0) {
              pending->error = block.error().code();
            }
            if (--pending->remaining > 0) return;
          }
          pending->Reply();
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

std::vector<OpenFileInfo> ReadThroughFs::OpenFiles() {
  std::vector<std::pair<std::shared_ptr<Inode>, OpenFileInfo>> open;
  {
    MutexLock lock(handles_mu_);
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
    MutexLock lock(inode->mu);
    info.name = inode->name;
    out.push_back(std::move(info));
  }
  return out;
}

}  // namespace accelfs
