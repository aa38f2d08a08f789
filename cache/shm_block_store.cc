#include "cache/shm_block_store.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/mount.h>
#include <unistd.h>

#include <cerrno>
#include <string>

#include "cache/block.h"
#include "cache/ram_block_store.h"

namespace accelfs {

Result<std::unique_ptr<ShmBlockStore>> ShmBlockStore::Create(uint32_t block_size,
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
  return std::unique_ptr<ShmBlockStore>(new ShmBlockStore(mnt_fd, block_size));
}

ShmBlockStore::~ShmBlockStore() {
  for (auto& [key, file] : files_) close(file.fd);
  close(root_fd_);
}

Result<BlockBuffer> ShmBlockStore::Allocate(const BlockKey& key, size_t bytes) {
  // The mapping covers whole pages up to the one holding the file's last byte; the file keeps the
  // backing file's exact size, so a passthrough reader sees exactly its bytes.
  const size_t length = RoundUp(bytes == 0 ? 1 : bytes, 4096);
  const uint64_t offset = key.index * block_size_;
  int fd;
  {
    std::lock_guard lock(mu_);
    File& file = files_[key.file];
    if (file.fd < 0) {
      file.fd = openat(root_fd_, ".", O_TMPFILE | O_RDWR | O_CLOEXEC, 0600);
      if (file.fd < 0 || ftruncate(file.fd, static_cast<off_t>(key.file.size)) != 0) {
        const int err = errno;
        if (file.fd >= 0) close(file.fd);
        files_.erase(key.file);
        return Error(err);
      }
    }
    ++file.blocks;
    fd = file.fd;
  }
  std::byte* data = MapAligned(length, fd, offset);
  if (data == nullptr) {
    const int err = errno;
    Release(key, BlockBuffer{});
    return Error(err == 0 ? ENOMEM : err);
  }
  return BlockBuffer{data, length};
}

void ShmBlockStore::Release(const BlockKey& key, BlockBuffer buffer) {
  int fd_to_close = -1;
  {
    std::lock_guard lock(mu_);
    auto it = files_.find(key.file);
    if (it == files_.end()) return;
    if (buffer.data != nullptr) {
      munmap(buffer.data, buffer.capacity);
      fallocate(it->second.fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE,
                static_cast<off_t>(key.index * block_size_), static_cast<off_t>(buffer.capacity));
    }
    if (--it->second.blocks == 0) {
      fd_to_close = it->second.fd;
      files_.erase(it);
    }
  }
  if (fd_to_close >= 0) close(fd_to_close);
}

int ShmBlockStore::FileDescriptor(const FileKey& file) const {
  std::lock_guard lock(mu_);
  auto it = files_.find(file);
  return it == files_.end() ? -1 : it->second.fd;
}

size_t ShmBlockStore::file_count() const {
  std::lock_guard lock(mu_);
  return files_.size();
}

}  // namespace accelfs
