#include "cache/readahead.h"

#include <algorithm>

#include "cache/block.h"

namespace accelfs {

BlockRange NextReadahead(ReadaheadState& state, uint64_t offset, uint64_t size, uint64_t file_size,
                         uint32_t block_size, uint32_t window_blocks) {
  const uint64_t end = offset + size;
  const uint64_t tolerance = static_cast<uint64_t>(window_blocks) * block_size;
  const bool sequential = state.seen_read ? (offset + tolerance >= state.next_offset &&
                                             offset <= state.next_offset + tolerance)
                                          : offset == 0;
  state.seen_read = true;
  if (!sequential) {
    state.next_offset = end;
    state.prefetched_until = 0;
    return {};
  }
  state.next_offset = std::max(state.next_offset, end);
  if (window_blocks == 0 || size == 0 || offset >= file_size) return {};
  const uint64_t last_block = (std::min(end, file_size) - 1) / block_size;
  const uint64_t want_end =
      std::min(last_block + 1 + window_blocks, BlockCount(file_size, block_size));
  const uint64_t first = std::max(state.prefetched_until, last_block + 1);
  if (first >= want_end) return {};
  state.prefetched_until = want_end;
  return {first, want_end};
}

}  // namespace accelfs
