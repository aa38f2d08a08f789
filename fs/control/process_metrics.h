// The daemon process's own resources, read from /proc/self at each scrape: what the conventional
// process_* metrics of Prometheus's client libraries export.
#pragma once

#include <cstdint>
#include <optional>

namespace accelfs {

struct ProcessStats {
  uint64_t resident_bytes = 0;
  uint64_t virtual_bytes = 0;
  uint64_t open_fds = 0;
  uint64_t max_fds = 0;  // RLIMIT_NOFILE's soft limit
  uint64_t threads = 0;
  double cpu_seconds = 0;         // user + system
  double start_time_seconds = 0;  // since the epoch
};

// Nullopt where /proc/self cannot be read (no /proc in a sandbox).
std::optional<ProcessStats> ReadProcessStats();

}  // namespace accelfs
