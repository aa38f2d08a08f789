// What the block cache counts (BlockCache::Stats): a plain struct, so that the stats schema the
// daemon and the tools share (fs/common/daemon_stats.h) needs nothing of the cache itself.
#pragma once

#include <cstdint>

namespace accelfs {

struct CacheStats {
  uint64_t budget_bytes = 0;
  uint64_t used_bytes = 0;    // buffers held: ready, in flight and pinned-but-dropped blocks
  uint64_t pinned_bytes = 0;  // of them, blocks held by a Ref (replied from, passed through)
  uint64_t ready_blocks = 0;
  uint64_t fetching_blocks = 0;
  uint64_t queued_blocks = 0;
  // Counters for the tools (issue 5). They are updated under the lock the cache takes anyway, so
  // they add no lock to the read path; Stats() copies them under it.
  uint64_t hits = 0;            // Get calls answered from a ready block
  uint64_t misses = 0;          // Get calls that started or joined a fetch
  uint64_t hit_bytes = 0;       // bytes of the blocks those hits returned
  uint64_t miss_bytes = 0;      // bytes of the blocks those misses waited for
  uint64_t fetching_bytes = 0;  // bytes of store reads in flight
  uint64_t fetched_bytes = 0;   // bytes read from the backend into the cache
  uint64_t evicted_blocks = 0;
  uint64_t failed_fetches = 0;
  uint64_t prefetches = 0;       // fetches started by Prefetch
  uint64_t stalled_fetches = 0;  // fetches whose read outlived the store timeout
  uint64_t verified_bytes = 0;   // bytes of stored blocks that passed their check and were served
  uint64_t verify_failed_blocks = 0;  // stored blocks that failed their check: fetched anew
  uint64_t fallback_blocks = 0;  // blocks a full or failing cache dir could not take: in memory
};

}  // namespace accelfs
