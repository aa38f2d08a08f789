// Blocks in anonymous memory, on transparent huge pages where the kernel allows it: writing a
// reply to /dev/fuse pins the source pages one by one, and 2 MiB pages halve the daemon's CPU per
// GiB served (docs/DESIGN.md section 2).
#pragma once

#include "cache/block_store.h"

namespace accelfs {

class RamBlockStore final : public BlockStore {
 public:
  Result<BlockBuffer> Allocate(const BlockKey& key, size_t bytes) override;
  Status Commit(const BlockKey&, const BlockBuffer&, size_t) override { return Status::Ok(); }
  void Release(const BlockKey& key, BlockBuffer buffer) override;
  size_t CapacityFor(size_t bytes) const override { return ChargeFor(bytes); }
  int FileDescriptor(const FileKey&) const override { return -1; }
  bool KeepsFiles() const override { return false; }
};

// Maps `bytes` (a multiple of 4096) at a 2 MiB-aligned address, so that huge pages can back it:
// mmap(fd, offset) of a file when fd >= 0 (read-only unless `writable`), anonymous memory
// otherwise. nullptr on failure.
std::byte* MapAligned(size_t bytes, int fd, uint64_t offset, bool writable = true);

}  // namespace accelfs
