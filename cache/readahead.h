// Sequential read-ahead for one open handle: a pure policy, tested by table. It is the seam the
// prefetch engine replaces; the read path only asks it "which blocks should be fetched ahead now".
#pragma once

#include <cstdint>

namespace accelfs {

struct ReadaheadState {
  uint64_t next_offset = 0;       // where a sequential reader's next READ is expected
  uint64_t prefetched_until = 0;  // blocks below this index were already asked for
  bool seen_read = false;
};

struct BlockRange {
  uint64_t first = 0;
  uint64_t end = 0;  // exclusive
  bool empty() const { return first >= end; }
  bool operator==(const BlockRange&) const = default;
};

// Records a READ of [offset, offset + size) and returns the blocks to prefetch: up to
// `window_blocks` blocks past the one the READ ends in, when the handle reads sequentially.
// The kernel's own readahead sends several READs at once and they arrive out of order, so a READ
// within one window of the expected offset still counts as sequential.
BlockRange NextReadahead(ReadaheadState& state, uint64_t offset, uint64_t size, uint64_t file_size,
                         uint32_t block_size, uint32_t window_blocks);

}  // namespace accelfs
