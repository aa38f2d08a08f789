#include "cache/file_block_store.h"

#include <dirent.h>
#include <fcntl.h>
#include <linux/magic.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/vfs.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cinttypes>
#include <cstdio>
#include <cstring>
#include <new>
#include <string>

#include "cache/block.h"
#include "cache/block_record.h"
#include "cache/cache_dir_trust.h"
#include "cache/ram_block_store.h"

#include <spdlog/spdlog.h>

namespace accelfs {

using block_record::kDataSuffix;
using block_record::kMagic;
using block_record::kMapSuffix;
using block_record::MarkOffset;
using block_record::RecordBytes;
using block_record::RecordHeader;
using block_record::WriteAll;

namespace {

constexpr char kLockName[] = "lock";

}  // namespace

FileBlockStore::FileBlockStore(std::string dir, int root_fd, int lock_fd, uint32_t block_size,
                               bool persistent, bool sync, std::optional<BlockMac> mac)
    : dir_(std::move(dir)),
      root_fd_(root_fd),
      lock_fd_(lock_fd),
      block_size_(block_size),
      persistent_(persistent),
      sync_(sync),
      mac_(std::move(mac)) {}

Result<std::unique_ptr<FileBlockStore>> FileBlockStore::Create(uint32_t block_size,
                                                               uint64_t size_limit) {
  const int fs_fd = fsopen("tmpfs", FSOPEN_CLOEXEC);
  if (fs_fd < 0) return Error(errno);
  const std::string size = std::to_string(size_limit);
  int mnt_fd = -1;
  if (fsconfig(fs_fd, FSCONFIG_SET_STRING, "huge", "within_size", 0) == 0 &&
      fsconfig(fs_fd, FSCONFIG_SET_STRING, "size", size.c_str(), 0) == 0 &&
      fsconfig(fs_fd, FSCONFIG_SET_STRING, "mode", "0700", 0) == 0 &&
      fsconfig(fs_fd, FSCONFIG_CMD_CREATE, nullptr, nullptr, 0) == 0) {
    mnt_fd =
        fsmount(fs_fd, FSMOUNT_CLOEXEC, MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV | MOUNT_ATTR_NOEXEC);
  }
  const int err = errno;
  close(fs_fd);
  if (mnt_fd < 0) return Error(err);
  return std::unique_ptr<FileBlockStore>(new FileBlockStore("", mnt_fd, -1, block_size,
                                                            /*persistent=*/false, /*sync=*/false,
                                                            /*mac=*/std::nullopt));
}

Result<std::unique_ptr<FileBlockStore>> FileBlockStore::OpenDir(const std::string& dir,
                                                                uint32_t block_size) {
  // `err`: what the syscall said; 0 when it set no errno (the line then names none, the code is
  // EIO).
  const auto fail = [&](const std::string& what, int err) {
    return Error(err != 0 ? err : EIO, "cache dir '" + dir + "': " + what +
                                           (err != 0 ? ": " + Error(err).Message() : ""));
  };
  // Owned by this daemon's user, and nobody else may write in it or replace it
  // (cache/cache_dir_trust.h).
  const uid_t euid = geteuid();
  Result<int> opened = OpenCacheDir(dir, euid);
  if (!opened.ok()) return opened.error();
  const int root_fd = opened.value();
  const int lock_fd =
      openat(root_fd, kLockName, O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK, 0600);
  if (lock_fd < 0) {
    const int err = errno;
    close(root_fd);
    return fail("cannot create its lock file", err);
  }
  struct stat lock_st {};
  std::optional<std::string> lock_problem =
      fstat(lock_fd, &lock_st) == 0 ? EntryProblem(lock_st, euid) : "not readable";
  if (lock_problem) {
    close(lock_fd);
    close(root_fd);
    return Error(EPERM, "cache dir '" + dir + "': its lock file is " + *lock_problem);
  }
  if (flock(lock_fd, LOCK_EX | LOCK_NB) != 0) {
    const int err = errno;
    char pid[32] = {};
    [[maybe_unused]] ssize_t n = pread(lock_fd, pid, sizeof(pid) - 1, 0);
    close(lock_fd);
    close(root_fd);
    if (err == EWOULDBLOCK) {
      std::string holder(pid);
      holder.erase(holder.find_last_not_of(" \n") + 1);
      return Error(EBUSY, "cache dir '" + dir + "': in use by another accelfs" +
                              (holder.empty() ? "" : " (pid " + holder + ")") +
                              "; give each mount its own cache dir");
    }
    return fail("cannot lock it", err);
  }
  // RAM-backed directories lose their pages only with the machine, never halfway through a
  // write; anything else must have the data on disk before the record says it is there.
  struct statfs fs {};
  const bool ram =
      fstatfs(root_fd, &fs) == 0 && (fs.f_type == TMPFS_MAGIC || fs.f_type == RAMFS_MAGIC);
  Result<BlockMac::Key> key = LoadCacheKey(root_fd, dir, euid, /*sync=*/!ram);
  if (!key.ok()) {
    close(lock_fd);
    close(root_fd);
    return key.error();
  }
  std::unique_ptr<FileBlockStore> store(new FileBlockStore(
      dir, root_fd, lock_fd, block_size, /*persistent=*/true, /*sync=*/!ram, BlockMac(*key)));
  if (!store->NoteOwner()) return fail("cannot write its lock file", errno);
  store->LoadStored();
  return store;
}

bool FileBlockStore::NoteOwner() {
  if (lock_fd_ < 0) return true;
  const std::string pid = std::to_string(getpid()) + "\n";
  return ftruncate(lock_fd_, 0) == 0 && WriteAll(lock_fd_, pid.data(), pid.size(), 0);
}

FileBlockStore::~FileBlockStore() {
  for (auto& [key, file] : files_) {
    Unmap(file);
    close(file.fd);
    if (file.map_fd >= 0) close(file.map_fd);
  }
  if (lock_fd_ >= 0) close(lock_fd_);  // releases the flock
  close(root_fd_);
}

void FileBlockStore::RemoveFiles(const std::string& stem) const {
  // The record first: data without its record is removed at the next start.
  unlinkat(root_fd_, (stem + kMapSuffix).c_str(), 0);
  unlinkat(root_fd_, (stem + kDataSuffix).c_str(), 0);
}

std::vector<StoredBlock> FileBlockStore::TakeStored() {
  MutexLock lock(mu_);
  return std::move(stored_);
}

Status FileBlockStore::OpenFile(const FileKey& key, File* file) {
  if (!persistent_) {
    file->fd = openat(root_fd_, ".", O_TMPFILE | O_RDWR | O_CLOEXEC, 0600);
    if (file->fd < 0 || ftruncate(file->fd, static_cast<off_t>(key.size)) != 0) {
      const int err = errno;
      if (file->fd >= 0) close(file->fd);
      file->fd = -1;
      return Error(err);
    }
    return Status();
  }
  // A new record starts with every block absent, written before any data: a crash leaves either
  // no record or one that marks nothing present.
  const std::string stem = StoredName(key);
  const uint64_t blocks = BlockCount(key.size, block_size_);
  RecordHeader header{};
  std::memcpy(header.magic, kMagic, sizeof(kMagic));
  header.block_size = block_size_;
  header.size = key.size;
  header.mtime_ns = key.mtime_ns;
  header.ctime_ns = key.ctime_ns;
  header.fingerprint = key.fingerprint;
  header.place[0] = key.place[0];
  header.place[1] = key.place[1];
  // Files of our own, new: whatever had these names (a file no record claimed, left by a daemon
  // killed halfway) goes first, so that nothing another link or name leads to is written.
  RemoveFiles(stem);
  file->map_fd = openat(root_fd_, (stem + kMapSuffix).c_str(),
                        O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0600);
  file->fd = openat(root_fd_, (stem + kDataSuffix).c_str(),
                    O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0600);
  if (file->map_fd < 0 || file->fd < 0 ||
      ftruncate(file->map_fd, static_cast<off_t>(RecordBytes(blocks))) != 0 ||
      !WriteAll(file->map_fd, &header, sizeof(header), 0) ||
      ftruncate(file->fd, static_cast<off_t>(key.size)) != 0) {
    const int err = errno;
    if (file->fd >= 0) close(file->fd);
    if (file->map_fd >= 0) close(file->map_fd);
    file->fd = file->map_fd = -1;
    RemoveFiles(stem);
    return Error(err);
  }
  return Status();
}

Result<BlockBuffer> FileBlockStore::Allocate(const BlockKey& key, size_t bytes) {
  // A buffer covers whole pages up to the one holding the file's last byte; the file keeps the
  // backing file's exact size, so a passthrough reader sees exactly its bytes.
  const size_t length = RoundUp(bytes == 0 ? 1 : bytes, 4096);
  const uint64_t offset = key.index * block_size_;
  int fd = -1;
  BlockBuffer mapped;
  bool fresh = false;  // no other buffer of this block is allocated
  int err = 0;         // why the block cannot be in the file: it is then given from memory
  {
    MutexLock lock(mu_);
    File& file = files_[key.file];
    if (file.fd < 0 && !file.in_memory) {
      if (Status s = OpenFile(key.file, &file); !s.ok()) {
        // A private store has no other home; a cache dir that cannot take a file (full, failing)
        // still has memory.
        if (!persistent_) {
          files_.erase(key.file);
          return s.error();
        }
        file.in_memory = true;
        file.open_error = s.error().code();
      }
    }
    if (file.in_memory) err = file.open_error;
    // One mapping of the whole file, not one per block: the kernel allows a process 65530
    // mappings (vm.max_map_count), fewer than the blocks of a large cache. Pages come only as
    // blocks are written, and go when a block's range is punched out.
    if (!file.in_memory && file.base == nullptr) {
      file.length = RoundUp(key.file.size == 0 ? 1 : key.file.size, 4096);
      file.base = MapAligned(file.length, file.fd, 0);
      if (file.base == nullptr) {
        const int map_err = errno == 0 ? ENOMEM : errno;
        CloseIfUnused(key.file, file);
        return Error(map_err);
      }
      file.view = MapAligned(file.length, file.fd, 0, /*writable=*/false);
    }
    ++file.blocks;
    fresh = file.live[key.index]++ == 0;
    if (auto retry = retry_in_memory_.find(key); err == 0 && retry != retry_in_memory_.end()) {
      err = retry->second;  // its Commit failed, with this errno: see there
      retry_in_memory_.erase(retry);
    }
    if (!file.in_memory) {
      fd = file.fd;
      mapped = BlockBuffer{file.base + offset, length,
                           file.view != nullptr ? file.view + offset : nullptr};
    }
  }
  // Outside the lock: on a disk this is I/O.
  if (err == 0 && persistent_) err = Reserve(fd, offset, length, fresh);
  if (err == 0) return mapped;
  return AllocateInMemory(key, length, err);
}

int FileBlockStore::Reserve(int fd, uint64_t offset, size_t length, bool fresh) {
  if (const int failed = failed_.load(std::memory_order_relaxed); failed != 0) return failed;
  // Room taken now, where a failure is an errno: a write into a mapping of a full filesystem
  // cannot fail cleanly (the read filling the block would get EFAULT, a store by the daemon a
  // SIGBUS). KEEP_SIZE: the last block's page may reach past the file's end.
  if (fallocate(fd, FALLOC_FL_KEEP_SIZE, static_cast<off_t>(offset), static_cast<off_t>(length)) ==
      0) {
    if (short_of_room_.exchange(false, std::memory_order_relaxed)) {
      spdlog::info("cache dir '{}': has room again: new blocks are kept in it", dir_);
    }
    return 0;
  }
  const int err = errno;
  // A filesystem without fallocate: its writes are what they always were.
  if (err == EOPNOTSUPP) return 0;
  // What a failed fallocate took in part goes back, unless another buffer of the block holds it.
  if (fresh) {
    fallocate(fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, static_cast<off_t>(offset),
              static_cast<off_t>(length));
  }
  return err;
}

Result<BlockBuffer> FileBlockStore::AllocateInMemory(const BlockKey& key, size_t length, int why) {
  std::byte* data = MapAligned(length, /*fd=*/-1, 0);
  {
    MutexLock lock(mu_);
    auto it = files_.find(key.file);  // there: counted in Allocate, not released yet
    if (data == nullptr) {
      Unlive(it->second, key.index);
      --it->second.blocks;
      CloseIfUnused(key.file, it->second);
      return Error(ENOMEM);
    }
    ++it->second.memory_blocks;
  }
  fallbacks_.fetch_add(1, std::memory_order_relaxed);
  if (why == ENOSPC || why == EDQUOT) {
    if (!short_of_room_.exchange(true, std::memory_order_relaxed)) {
      spdlog::warn(
          "cache dir '{}': no room for a block ({}): blocks that do not fit are kept in "
          "memory, not in the cache dir, until it has room again",
          dir_, Error(why).Message());
    }
  } else if (why == EIO || why == EROFS) {
    NoteFailure(why);  // the disk failed (or its filesystem stopped writing after errors)
  } else if (!other_logged_.exchange(true, std::memory_order_relaxed)) {
    // Anything else (out of descriptors, a permission changed) is tried again for every block.
    spdlog::warn(
        "cache dir '{}': cannot keep a block in it ({}): kept in memory instead; "
        "further blocks it cannot keep are counted in fallback_blocks",
        dir_, Error(why).Message());
  }
  return BlockBuffer{data, length, nullptr};
}

void FileBlockStore::NoteFailure(int err) {
  int none = 0;
  if (failed_.compare_exchange_strong(none, err, std::memory_order_relaxed)) {
    spdlog::warn(
        "cache dir '{}': failed ({}): new blocks are kept in memory from now on, and "
        "what it holds already is still served from it",
        dir_, Error(err).Message());
  }
}

bool FileBlockStore::InMemory(const File& file, const BlockBuffer& buffer) {
  return buffer.data != nullptr && (file.base == nullptr || buffer.data < file.base ||
                                    buffer.data >= file.base + file.length);
}

bool FileBlockStore::Unlive(File& file, uint64_t index) {
  auto it = file.live.find(index);
  if (it == file.live.end()) return false;
  if (--it->second > 0) return true;
  file.live.erase(it);
  return false;
}

void FileBlockStore::Unmap(File& file) {
  if (file.base != nullptr) munmap(file.base, file.length);
  if (file.view != nullptr) munmap(const_cast<std::byte*>(file.view), file.length);
  file.base = nullptr;
  file.view = nullptr;
}

void FileBlockStore::Mark(const File& file, uint64_t index, bool present) const {
  const uint8_t byte = present ? 1 : 0;
  // A record that cannot be written only costs a refetch after a restart.
  [[maybe_unused]] bool ok = WriteAll(file.map_fd, &byte, 1, MarkOffset(index));
}

void FileBlockStore::CloseIfUnused(const FileKey& key, File& file) {
  if (file.blocks != 0) return;
  if (file.fd < 0) {  // its blocks were all in memory: nothing on disk
    files_.erase(key);
    return;
  }
  if (persistent_) {
    // Blocks kept by Retain, or stored ones not yet taken, are recorded without being allocated.
    const uint64_t blocks = BlockCount(key.size, block_size_);
    std::vector<uint8_t> present(blocks);
    if (pread(file.map_fd, present.data(), blocks, sizeof(RecordHeader)) !=
            static_cast<ssize_t>(blocks) ||
        std::find(present.begin(), present.end(), 1) != present.end()) {
      return;
    }
    RemoveFiles(StoredName(key));
    close(file.map_fd);
  }
  Unmap(file);
  close(file.fd);
  files_.erase(key);
}

void FileBlockStore::Release(const BlockKey& key, BlockBuffer buffer) {
  MutexLock lock(mu_);
  auto it = files_.find(key.file);
  if (it == files_.end()) return;
  File& file = it->second;
  // An evicted block's buffer is released after the cache's lock, so the same block may have been
  // allocated again meanwhile (and be filling, or ready): its range is the new buffer's now, and
  // punching it would turn the new block's bytes into zeros.
  const bool reallocated = Unlive(file, key.index);
  if (InMemory(file, buffer)) {
    munmap(buffer.data, buffer.capacity);
    --file.memory_blocks;
  } else if (buffer.data != nullptr && !reallocated && !HeldByOthers(file.fd)) {
    // Not while the kernel maps the file for a reader (the cache keeps such blocks, but one can
    // still come here when the cache goes with a passthrough file open): its bytes stay until the
    // file goes, with the last of its blocks.
    // Unmarked first: a crash between the two leaves unrecorded data, never a recorded hole.
    if (persistent_) Mark(file, key.index, false);
    fallocate(file.fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE,
              static_cast<off_t>(key.index * block_size_), static_cast<off_t>(buffer.capacity));
  }
  --file.blocks;
  CloseIfUnused(key.file, file);
}

void FileBlockStore::Retain(const BlockKey& key, BlockBuffer buffer) {
  if (!persistent_) return Release(key, buffer);
  {
    MutexLock lock(mu_);
    auto it = files_.find(key.file);
    if (it == files_.end()) return;
    if (!InMemory(it->second, buffer)) {
      // The file stays open and mapped (until the store goes) with its blocks recorded:
      // allocating them again finds their data.
      Unlive(it->second, key.index);
      --it->second.blocks;
      return;
    }
  }
  Release(key, buffer);  // a block in memory: nothing of it is kept
}

void FileBlockStore::Discard(const BlockKey& key) {
  MutexLock lock(mu_);
  auto it = files_.find(key.file);
  if (it == files_.end()) return;
  File& file = it->second;
  Mark(file, key.index, false);
  // A reader that outlived the last daemon may still map this file (passthrough): its bytes stay,
  // unrecorded, until the file goes.
  if (!HeldByOthers(file.fd)) {
    fallocate(file.fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE,
              static_cast<off_t>(key.index * block_size_), static_cast<off_t>(block_size_));
  }
  CloseIfUnused(key.file, file);
}

bool FileBlockStore::HeldElsewhere(const FileKey& file) const {
  MutexLock lock(mu_);
  auto it = files_.find(file);
  return it != files_.end() && HeldByOthers(it->second.fd);
}

bool FileBlockStore::HeldByOthers(int fd) {
  if (fd < 0) return false;
  // The kernel grants a write lease only while no open file other than the caller's refers to the
  // inode, and the backing file a passthrough open or mapping uses is one. Taken and given back at
  // once: a lease break in between (an open of the file) only waits for the F_UNLCK, and its
  // SIGIO is ignored by the daemon. Where leases are not supported (EINVAL: fs.leases-enable off,
  // or a filesystem without them) nothing can be known and nothing is held back.
  if (fcntl(fd, F_SETLEASE, F_WRLCK) == 0) {
    fcntl(fd, F_SETLEASE, F_UNLCK);
    return false;
  }
  return errno == EAGAIN || errno == EBUSY;
}

int FileBlockStore::FileDescriptor(const FileKey& file) const {
  MutexLock lock(mu_);
  auto it = files_.find(file);
  // A file with a block in memory is not whole in its store file: the kernel cannot read it there.
  return it == files_.end() || it->second.memory_blocks > 0 ? -1 : it->second.fd;
}

size_t FileBlockStore::file_count() const {
  MutexLock lock(mu_);
  return files_.size();
}

}  // namespace accelfs
