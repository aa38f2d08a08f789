// Blocks in files on a private tmpfs: one sparse file per backing file identity, each block at its
// own offset, mapped into the daemon while allocated. Because the file holds a fully cached backing
// file's bytes at their offsets, the kernel can read it directly (FUSE passthrough): native tmpfs
// speed, and one copy of the data in RAM.
//
// The tmpfs is created with the new mount API (fsopen/fsmount) and never attached to the tree, so
// no other process can see it and it disappears with the daemon. It uses huge=within_size (2 MiB
// pages for big files, small pages for small ones: DESIGN.md section 2 on daemon CPU).
#pragma once

#include <memory>
#include <mutex>
#include <unordered_map>

#include "cache/block_store.h"

namespace accelfs {

class ShmBlockStore final : public BlockStore {
 public:
  // Error when the kernel refuses (needs CAP_SYS_ADMIN); callers fall back to RamBlockStore.
  // size_limit caps the tmpfs as a safety net under the cache's own budget.
  static Result<std::unique_ptr<ShmBlockStore>> Create(uint32_t block_size, uint64_t size_limit);
  ~ShmBlockStore() override;

  Result<BlockBuffer> Allocate(const BlockKey& key, size_t bytes) override;
  void Commit(const BlockKey&, const BlockBuffer&, size_t) override {}
  void Release(const BlockKey& key, BlockBuffer buffer) override;
  size_t CapacityFor(size_t bytes) const override { return ChargeFor(bytes); }
  int FileDescriptor(const FileKey& file) const override;

  size_t file_count() const;

 private:
  ShmBlockStore(int root_fd, uint32_t block_size) : root_fd_(root_fd), block_size_(block_size) {}

  struct File {
    int fd = -1;
    size_t blocks = 0;  // allocated blocks; the file goes with the last
  };

  const int root_fd_;  // the detached tmpfs's root directory
  const uint32_t block_size_;
  mutable std::mutex mu_;                                 // a leaf lock
  std::unordered_map<FileKey, File, FileKeyHash> files_;  // GUARDED_BY(mu_)
};

}  // namespace accelfs
