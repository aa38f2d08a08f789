// Blocks in anonymous memory, on transparent huge pages where the kernel allows it: writing a
// reply to /dev/fuse pins the source pages one by one, and 2 MiB pages halve the daemon's CPU per
// GiB served (DESIGN.md section 2).
#pragma once

#include "cache/block_store.h"

namespace accelfs {

class RamBlockStore final : public BlockStore {
 public:
  Result<BlockBuffer> Allocate(const BlockKey& key, size_t bytes) override;
  void Commit(const BlockKey&, const BlockBuffer&, size_t) override {}
  void Release(const BlockKey& key, BlockBuffer buffer) override;
  size_t CapacityFor(size_t bytes) const override;
};

}  // namespace accelfs
