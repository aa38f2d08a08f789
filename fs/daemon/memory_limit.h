// The memory limit of the daemon's own cgroup. The cache's tmpfs pages are charged to the memory
// cgroup of the process that faults them in and cannot be reclaimed without swap, so a cache sized
// from the host's MemAvailable inside a 1.5 GiB cgroup (systemd MemoryMax=, a Kubernetes pod
// limit, docker run -m) ended in an OOM kill and a stale mount. The budget is sized from this
// instead (fs/daemon/config.cc).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "fs/common/mountinfo.h"

namespace accelfs {

struct CgroupMemory {
  uint64_t limit = 0;  // bytes: the smallest limit of the cgroup and its ancestors
  uint64_t usage = 0;  // bytes charged to the cgroup now (page cache included)
  std::string file;    // the file that set `limit`, for messages
};

// The cgroup directories whose memory files apply to this process, deepest first: for each
// hierarchy that has memory (cgroup v2, or v1's memory controller) the process's cgroup as
// `proc_self_cgroup` names it, mapped through the hierarchy's mount in `mounts` (its root field,
// for a container that sees only its own subtree), then each ancestor up to the mount. Pure.
std::vector<std::string> CgroupMemoryDirs(std::string_view proc_self_cgroup,
                                          const std::vector<MountInfo>& mounts);

// A limit file's value: v2's memory.max / memory.high ("max" is none) or v1's
// memory.limit_in_bytes (a page-rounded 2^63 - 1 is none). nullopt for no limit or garbage.
std::optional<uint64_t> ParseMemoryLimit(std::string_view text);

// Reads the limits below `dirs` (CgroupMemoryDirs). nullopt when no limit applies.
std::optional<CgroupMemory> ReadCgroupMemory(const std::vector<std::string>& dirs);

// This process's: /proc/self/cgroup and /proc/self/mountinfo.
std::optional<CgroupMemory> OwnCgroupMemory();

// Whether `bytes` more memory fit in `cgroup` beside what it holds now, with `room` to spare; true
// when no limit applies. (A warm's load into the page cache is charged to the daemon's cgroup: at
// its limit the pages would only push out others, or themselves.)
bool CgroupHasRoom(const std::optional<CgroupMemory>& cgroup, uint64_t bytes, uint64_t room);

// MemAvailable and MemTotal in bytes; 0 when /proc/meminfo cannot be read.
void ReadMemInfo(uint64_t* available, uint64_t* total);

}  // namespace accelfs
