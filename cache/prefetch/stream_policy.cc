#include "cache/prefetch/stream_policy.h"

#include <algorithm>

namespace accelfs {

void NoteStreamRead(StreamState& state, uint64_t first, uint64_t end, const StreamLimits& limits) {
  state.reader_end = std::max(state.reader_end, std::min(end, state.blocks));
  // A reader beyond everything the stream would fetch for it: follow it instead of fetching the
  // blocks it skipped.
  if (first > state.next + limits.ahead) state.next = std::min(first, state.blocks);
}

BlockRange NextStreamBlocks(const StreamState& state, const StreamLimits& limits) {
  if (state.in_flight >= limits.max_in_flight || state.next >= state.blocks) return {};
  const uint64_t window_end = std::min(state.blocks, state.reader_end + limits.ahead);
  const uint64_t end = std::min(window_end, state.next + (limits.max_in_flight - state.in_flight));
  if (end <= state.next) return {};
  return {state.next, end};
}

}  // namespace accelfs
