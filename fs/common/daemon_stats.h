// One snapshot of what the daemon is doing: what accelfs-stat shows and /metrics exports. The
// daemon builds it on request (fs/daemon/main.cc wires the sources); nothing here is on the read path.
#pragma once

#include <cstdint>
#include <functional>
#include <string>

#include "cache/cache_stats.h"

namespace accelfs {

struct DaemonStats {
  std::string source;      // SOURCE, as resolved at start
  std::string mountpoint;  // MOUNTPOINT, as resolved at start
  std::string store;       // where cached blocks live: "private tmpfs", a --cache-dir, "anonymous memory"
  bool passthrough = false;  // whether fully cached files are passed through to the store
  double uptime_s = 0;

  CacheStats cache;          // budget, used, hits/misses (count and bytes), fetched, in flight...
  uint32_t depth = 0;        // backend reads the adaptive depth allows now
  uint32_t depth_limit = 0;  // --backend-depth
  uint64_t stuck_requests = 0;      // backend reads in flight past --backend-timeout (lost slots)
  uint64_t timed_out_requests = 0;  // backend reads given up on since start
  uint64_t waiting_requests = 0;    // backend reads held back: their file has its share in flight
  uint64_t open_files = 0;         // file handles open (cached or passthrough)
  uint64_t passthrough_files = 0;  // of them, open in passthrough mode
  uint64_t filling_opens = 0;      // opens waiting for their file to be cached (fill on open)
  uint64_t pushed_bytes = 0;       // bytes written into the kernel page cache (--push)
};

using StatsSource = std::function<DaemonStats()>;

}  // namespace accelfs
