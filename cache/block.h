// Range <-> block arithmetic. A file is cut into blocks of block_size bytes (the last one shorter);
// block i covers [i * block_size, min((i + 1) * block_size, file_size)).
#pragma once

#include <algorithm>
#include <cstdint>
#include <vector>

namespace accelfs {

// The cache block every layer defaults to (--block-size): large enough that one backend request
// amortises a network store's latency, small enough that a 1 MiB kernel READ rarely waits on much
// more than itself.
inline constexpr uint32_t kDefaultBlockSize = 4u << 20;

struct BlockSlice {
  uint64_t index = 0;   // block number in the file
  uint32_t offset = 0;  // first byte wanted, relative to the block's start
  uint32_t length = 0;  // bytes wanted from this block (> 0)
  bool operator==(const BlockSlice&) const = default;
};

inline uint64_t BlockCount(uint64_t file_size, uint32_t block_size) {
  return (file_size + block_size - 1) / block_size;
}

// Whether anything is kept per block of a file of `size` bytes (a plan of its blocks, a queue of
// them) in a cache of `budget_bytes`: only where it fits in the cache. Its st_size is the
// file's word alone (a sparse file may claim terabytes it never stored): a larger file is read
// through, as any file too big for the cache, and nothing is allocated per block of it.
inline bool PlansBlocks(uint64_t size, uint64_t budget_bytes) { return size <= budget_bytes; }

// Bytes of file data in block `index` (0 past EOF).
inline uint32_t BlockBytes(uint64_t index, uint64_t file_size, uint32_t block_size) {
  const uint64_t start = index * block_size;
  if (start >= file_size) return 0;
  return static_cast<uint32_t>(std::min<uint64_t>(block_size, file_size - start));
}

// The blocks that [offset, offset + length) touches, clipped at file_size. Empty at or past EOF.
inline std::vector<BlockSlice> SliceRange(uint64_t offset, uint64_t length, uint64_t file_size,
                                          uint32_t block_size) {
  std::vector<BlockSlice> slices;
  if (offset >= file_size || length == 0) return slices;
  const uint64_t end = offset + std::min(length, file_size - offset);
  for (uint64_t pos = offset; pos < end;) {
    const uint64_t index = pos / block_size;
    const uint64_t block_end = std::min<uint64_t>((index + 1) * block_size, end);
    slices.push_back({index, static_cast<uint32_t>(pos - index * block_size),
                      static_cast<uint32_t>(block_end - pos)});
    pos = block_end;
  }
  return slices;
}

inline uint64_t RoundUp(uint64_t value, uint64_t alignment) {
  return (value + alignment - 1) / alignment * alignment;
}

}  // namespace accelfs
